//! AVX2 + FMA dot products of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) with Q8_K.
//!
//! One shape for every format: each 256-weight block is unpacked into eight 32-byte
//! vectors of *unsigned* quants (0..64) in weight order; `vpmaddubsw` multiplies them with
//! the int8 activations (pairs stay below 2 * 63 * 127, so the i16 saturation never
//! triggers) and `vpmaddwd` applies the per-16-weight scale, leaving eight exact int32
//! lanes per block. The block's float factor is applied with one FMA per block; offsets
//! (Q3_K/Q6_K) and minimums (Q2_K/Q4_K/Q5_K) come from the activation `bsums` through
//! [`KTerms`], so integer results equal the scalar reference exactly and only the f32
//! summation order differs from it.
//!
//! Only called when the platform reports `avx2` (which in pinch implies FMA, see
//! [`CpuFeatures::avx2`]).
//!
//! # Safety (for every `unsafe fn` here)
//! Callers must run on a CPU with AVX2 and FMA; memory is only read through `load32`,
//! which stays inside the slice it is given.
#![allow(unsafe_code)]
use core::arch::x86_64::*;

use crate::quant::q8_k::{BlockQ8K, KTerms};
use crate::quant::{q2_k, q3_k, q4_k, q5_k, q6_k};

#[inline(always)]
pub(super) unsafe fn load32(p: &[u8]) -> __m256i {
    let Some(p) = p.get(..32) else {
        return _mm256_setzero_si256();
    };
    _mm256_loadu_si256(p.as_ptr() as *const __m256i)
}

/// Sum over the block of `scales[i / 16] * u[i] * q8[i]`, as eight int32 lanes.
#[inline(always)]
unsafe fn block_isum(u: &[__m256i; 8], y: &BlockQ8K, scales: &[i16; 16]) -> __m256i {
    let mut acc = _mm256_setzero_si256();
    for (c, &uc) in u.iter().enumerate() {
        let q8 = load32(&y.qs[32 * c..]);
        let p16 = _mm256_maddubs_epi16(uc, q8);
        // Low 128 bits hold weights 32c..32c+16 (group 2c), high 128 bits group 2c+1.
        let sc = _mm256_set_m128i(
            _mm_set1_epi16(scales[2 * c + 1]),
            _mm_set1_epi16(scales[2 * c]),
        );
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, sc));
    }
    acc
}

#[inline(always)]
pub(super) unsafe fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// A K-quant block as the AVX2 kernel sees it. Methods are `inline(always)` so they are
/// compiled inside [`dot_avx2`] with its target features.
pub(super) trait KBlock {
    fn terms(&self, y: &BlockQ8K) -> KTerms;
    /// The 256 quants as unsigned bytes in weight order, 32 per vector.
    unsafe fn unpack(&self) -> [__m256i; 8];
}

macro_rules! kblock {
    ($t:ty, $m:ident, $unpack:ident) => {
        impl KBlock for $t {
            #[inline(always)]
            fn terms(&self, y: &BlockQ8K) -> KTerms {
                $m::terms(self, y)
            }
            #[inline(always)]
            unsafe fn unpack(&self) -> [__m256i; 8] {
                $unpack(self)
            }
        }
    };
}
kblock!(q2_k::BlockQ2K, q2_k, unpack_q2k);
kblock!(q3_k::BlockQ3K, q3_k, unpack_q3k);
kblock!(q4_k::BlockQ4K, q4_k, unpack_q4k);
kblock!(q5_k::BlockQ5K, q5_k, unpack_q5k);
kblock!(q6_k::BlockQ6K, q6_k, unpack_q6k);

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_avx2<B: KBlock>(w: &[B], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (x, y) in w.iter().zip(a) {
        let t = x.terms(y);
        let u = x.unpack();
        let mut isum = block_isum(&u, y, &t.scales);
        isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(t.offset, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(t.d), _mm256_cvtepi32_ps(isum), acc);
        mins += t.dmin * t.mins as f32;
    }
    hsum_f32(acc) - mins
}

#[inline(always)]
unsafe fn unpack_q4k(x: &q4_k::BlockQ4K) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut u = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        let q = load32(&x.qs[32 * c..]);
        u[2 * c] = _mm256_and_si256(q, m4);
        u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    u
}

#[inline(always)]
unsafe fn unpack_q5k(x: &q5_k::BlockQ5K) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut qh = load32(&x.qh);
    let mut u = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        let q = load32(&x.qs[32 * c..]);
        // Bit 2c of qh[l] (now bit 0) and bit 2c+1; masking to one bit before the 16-bit
        // shift by 4 keeps every byte's bit inside its own byte.
        let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
        let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4);
        u[2 * c] = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
        u[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
        qh = _mm256_srli_epi16(qh, 2);
    }
    u
}

#[inline(always)]
unsafe fn unpack_q6k(x: &q6_k::BlockQ6K) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    let mut u = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let ql0 = load32(&x.ql[64 * h..]);
        let ql1 = load32(&x.ql[64 * h + 32..]);
        let qh = load32(&x.qh[32 * h..]);
        // Top 2 bits of the four 32-weight chunks: bits 0-1, 2-3, 4-5, 6-7 of qh, masked
        // before the shift by 4 so no bit crosses into the next byte.
        let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4);
        let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4);
        let h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4);
        let h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4);
        u[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), h0);
        u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), h1);
        u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), h2);
        u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), h3);
    }
    u
}

#[inline(always)]
unsafe fn unpack_q2k(x: &q2_k::BlockQ2K) -> [__m256i; 8] {
    let m2 = _mm256_set1_epi8(0x03);
    let mut u = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let mut q = load32(&x.qs[32 * h..]);
        for k in 0..4 {
            u[4 * h + k] = _mm256_and_si256(q, m2);
            q = _mm256_srli_epi16(q, 2);
        }
    }
    u
}

#[inline(always)]
unsafe fn unpack_q3k(x: &q3_k::BlockQ3K) -> [__m256i; 8] {
    let m2 = _mm256_set1_epi8(0x03);
    let one = _mm256_set1_epi8(1);
    let mut hm = load32(&x.hmask);
    let mut u = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let mut q = load32(&x.qs[32 * h..]);
        for k in 0..4 {
            // Chunk 4h + k uses bit 4h + k of hmask, now shifted down to bit 0.
            let hb = _mm256_slli_epi16(_mm256_and_si256(hm, one), 2);
            u[4 * h + k] = _mm256_or_si256(_mm256_and_si256(q, m2), hb);
            q = _mm256_srli_epi16(q, 2);
            hm = _mm256_srli_epi16(hm, 1);
        }
    }
    u
}
