//! AVX2 dot products for the legacy formats: Q8_0, Q4_0, Q5_0, Q1_0, Q2_0 (with Q8_0
//! activations), TQ2_0 (with Q8_K), and F32/F16 rows (with f32 activations).
//!
//! x86 is the development host, not a target device, so these kernels favour being
//! *bit-identical* to the scalar references in `crate::quant` over the last few percent:
//! every integer block sum is computed exactly with SIMD (widening to i16 before any
//! product that could overflow, so even an out-of-range `-128` activation is handled),
//! and the float arithmetic is the reference's, step for step: Q8_0/Q5_0 and F16 keep
//! llama.cpp's x86 lanes (eight lanes of four weights with `vfmadd` per block; sixteen
//! f32 lanes) in vector registers and reduce them in the reference's tree; the others
//! do their per-block float steps in scalar code in the reference's order. Only F32
//! reassociates its f64 accumulation, so only it differs from the reference (in the
//! last f32 bit at most).
//!
//! Entry points check shapes and return `None` on anything they do not handle, and the
//! caller falls back to the scalar reference.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_f16::read_f16;

use crate::quant::q1_0::BlockQ1_0;
use crate::quant::q2_0::BlockQ2_0;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::tq2_0::BlockTq2_0;

// ---------------------------------------------------------------- integer helpers

/// Horizontal sum of eight i32 lanes (exact: wrapping adds of in-range sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `sum(u[i] * a[i])` per group of 4 bytes, as i32 lanes, for `u` in 0..=63
/// (so `maddubs` cannot saturate: 2 * 63 * 128 < 32767).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u6_i8(u: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1))
}

/// `sum(a[i])` per group of 4 bytes, as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_i8(a: __m256i) -> __m256i {
    dot_u6_i8(_mm256_set1_epi8(1), a)
}

/// 32 bits (little-endian `bits`) to 32 bytes: 0xff where the bit is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bits_to_mask(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    // Byte i takes source byte i / 8 ...
    let idx = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0x0000_0000_0000_0000,
    );
    let spread = _mm256_shuffle_epi8(v, idx);
    // ... and tests bit i % 8 of it.
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load32(p: &[u8; 32]) -> __m256i {
    // SAFETY: 32 readable bytes; unaligned load.
    _mm256_loadu_si256(p.as_ptr() as *const __m256i)
}

/// Low and high nibbles of 16 bytes as 32 bytes: weights 0..16 then 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: 16 readable bytes; unaligned load.
    let q = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m);
    _mm256_set_m128i(hi, lo)
}

// ------------------------------------------------------------------- kernels

/// Exact `sum(w[j] * a[j])` over groups of four consecutive bytes, for any i8 values:
/// widened to i16, `madd` gives pair sums, `hadd` joins neighbouring pairs. `hadd` works
/// per 128-bit half, so the groups come out as [g0 g1 g4 g5 | g2 g3 g6 g7]; lanes are
/// independent until [`hsum_groups`], which undoes that order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_i8_i8(w: __m256i, a: __m256i) -> __m256i {
    let wl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
    let wh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w));
    let al = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a));
    let ah = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(a));
    _mm256_hadd_epi32(_mm256_madd_epi16(wl, al), _mm256_madd_epi16(wh, ah))
}

/// The eight f32 lanes of `acc` (in the [`groups_i8_i8`] order when `hadd_order`, else
/// in natural order) reduced by [`crate::quant::q8_0::hsum8`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_groups(acc: __m256, hadd_order: bool) -> f32 {
    let mut l = [0.0f32; 8];
    // SAFETY: 8 writable f32.
    _mm256_storeu_ps(l.as_mut_ptr(), acc);
    if hadd_order {
        l = [l[0], l[1], l[4], l[5], l[2], l[3], l[6], l[7]];
    }
    crate::quant::q8_0::hsum8(l)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.iter().zip(y) {
        let g = groups_i8_i8(load32(&bx.qs), load32(&by.qs));
        let d = _mm256_set1_ps(read_f16(bx.d) * read_f16(by.d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(g), acc);
    }
    hsum_groups(acc, true)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let a = load32(&by.qs);
        // sum((u - 8) * a) = sum(u * a) - 8 * sum(a), with u in 0..16.
        let v = _mm256_sub_epi32(
            dot_u6_i8(nibbles(&bx.qs), a),
            _mm256_slli_epi32::<3>(sum_i8(a)),
        );
        let sumi = hsum_i32(v);
        sum += sumi as f32 * read_f16(bx.d) * read_f16(by.d);
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.iter().zip(y) {
        let a = load32(&by.qs);
        let high = _mm256_and_si256(
            bits_to_mask(u32::from_le_bytes(bx.qh)),
            _mm256_set1_epi8(0x10),
        );
        let u = _mm256_or_si256(nibbles(&bx.qs), high);
        // Per group of four weights: sum((u - 16) * a) = sum(u * a) - 16 * sum(a), with
        // u in 0..32; `maddubs` + `madd` group bytes 4l..4l+4 in natural order.
        let g = _mm256_sub_epi32(dot_u6_i8(u, a), _mm256_slli_epi32::<4>(sum_i8(a)));
        let d = _mm256_set1_ps(read_f16(bx.d) * read_f16(by.d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(g), acc);
    }
    hsum_groups(acc, false)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q1_0(x: &[BlockQ1_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, ys) in x.iter().zip(y.chunks_exact(4)) {
        let mut sumi = 0.0f32;
        for (k, by) in ys.iter().enumerate() {
            let bits = u32::from_le_bytes([
                bx.qs[4 * k],
                bx.qs[4 * k + 1],
                bx.qs[4 * k + 2],
                bx.qs[4 * k + 3],
            ]);
            let a = load32(&by.qs);
            let set01 = _mm256_and_si256(bits_to_mask(bits), _mm256_set1_epi8(1));
            // sum(±a) = 2 * sum(a where set) - sum(a).
            let v = _mm256_sub_epi32(_mm256_slli_epi32::<1>(dot_u6_i8(set01, a)), sum_i8(a));
            let sumi_block = hsum_i32(v);
            sumi += read_f16(by.d) * sumi_block as f32;
        }
        sum += read_f16(bx.d) * sumi;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_0(x: &[BlockQ2_0], y: &[BlockQ8_0]) -> f32 {
    // Codes come out "planar" (plane t = bits 2t of the 8 bytes, i.e. weights 4b + t),
    // so the activations are permuted to the same order instead of interleaving codes.
    let shifts = _mm256_set_epi64x(6, 4, 2, 0);
    let three = _mm256_set1_epi8(3);
    // In each 128-bit lane (bytes 4b'+t, b' = 0..4): group by t.
    let by_t = _mm256_set_epi8(
        15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0, //
        15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0,
    );
    // Dwords (lane, t) -> qword t = [lane 0 t, lane 1 t].
    let join = _mm256_set_epi32(7, 3, 6, 2, 5, 1, 4, 0);
    let mut sum = 0.0f32;
    for (bx, ys) in x.iter().zip(y.chunks_exact(2)) {
        let mut sumi = 0.0f32;
        for (k, by) in ys.iter().enumerate() {
            let mut q8 = [0u8; 8];
            q8.copy_from_slice(&bx.qs[8 * k..8 * k + 8]);
            let codes = _mm256_and_si256(
                _mm256_srlv_epi64(_mm256_set1_epi64x(u64::from_le_bytes(q8) as i64), shifts),
                three,
            );
            let a = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(load32(&by.qs), by_t), join);
            // sum((c - 1) * a) = sum(c * a) - sum(a), with c in 0..4.
            let v = _mm256_sub_epi32(dot_u6_i8(codes, a), sum_i8(a));
            let sumi_block = hsum_i32(v);
            sumi += read_f16(by.d) * sumi_block as f32;
        }
        sum += read_f16(bx.d) * sumi;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tq2_0(x: &[BlockTq2_0], y: &[BlockQ8K]) -> f32 {
    let three = _mm256_set1_epi8(3);
    let ones16 = _mm256_set1_epi16(1);
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut acc = _mm256_setzero_si256();
        let mut asum = _mm256_setzero_si256();
        for c in 0..2 {
            let mut q = [0u8; 32];
            q.copy_from_slice(&bx.qs[32 * c..32 * c + 32]);
            let q = load32(&q);
            // Four planes of 2-bit codes, each against 32 contiguous activations; i16
            // partial sums stay below 4 * 2 * 3 * 128 = 3072.
            let mut p16 = _mm256_setzero_si256();
            let mut s16 = _mm256_setzero_si256();
            for l in 0..4 {
                let codes = match l {
                    0 => _mm256_and_si256(q, three),
                    1 => _mm256_and_si256(_mm256_srli_epi16::<2>(q), three),
                    2 => _mm256_and_si256(_mm256_srli_epi16::<4>(q), three),
                    _ => _mm256_and_si256(_mm256_srli_epi16::<6>(q), three),
                };
                let mut a = [0u8; 32];
                a.copy_from_slice(&by.qs[128 * c + 32 * l..128 * c + 32 * l + 32]);
                let a = load32(&a);
                p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(codes, a));
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_set1_epi8(1), a));
            }
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, ones16));
            asum = _mm256_add_epi32(asum, _mm256_madd_epi16(s16, ones16));
        }
        // sum((c - 1) * a) = sum(c * a) - sum(a).
        let sumi = hsum_i32(_mm256_sub_epi32(acc, asum));
        sum += sumi as f32 * (by.scale() * read_f16(bx.d));
    }
    sum
}

// -------------------------------------------------------------------- floats

/// Add the f64 widening of the eight f32 lanes of `p` to two f64x4 accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn acc_f64(acc: &mut [__m256d; 2], p: __m256) {
    acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
    acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(p)));
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_f64(acc: [__m256d; 2]) -> f64 {
    let mut lanes = [0.0f64; 4];
    // SAFETY: 4 writable f64.
    _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(acc[0], acc[1]));
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

/// F32 weights: f32 products (as the reference), f64 sums in 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f32_row(w: &[u8], act: &[u8]) -> f32 {
    let n = w.len() / 4;
    let mut acc = [_mm256_setzero_pd(); 2];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: bytes 4i..4i+32 are inside both slices (i + 8 <= n).
        let x = _mm256_loadu_ps(w.as_ptr().add(4 * i) as *const f32);
        let a = _mm256_loadu_ps(act.as_ptr().add(4 * i) as *const f32);
        acc_f64(&mut acc, _mm256_mul_ps(x, a));
        i += 8;
    }
    let mut s = hsum_f64(acc);
    for j in i..n {
        let x = f32::from_le_bytes([w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]]);
        let a = f32::from_le_bytes([act[4 * j], act[4 * j + 1], act[4 * j + 2], act[4 * j + 3]]);
        s += (x * a) as f64;
    }
    s as f32
}

/// F16 weights (converted exactly with F16C) against f16-rounded activations: sixteen
/// f32 lanes in two registers (products are exact, so `vfmadd` equals multiply-then-add),
/// reduced by [`crate::quant::float::hsum16`]; a tail of fewer than 16 goes through f64
/// like the reference.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_row(w: &[u8], act: &[u8]) -> f32 {
    let n = w.len() / 2;
    let body = n / 16 * 16;
    let mut lo = _mm256_setzero_ps();
    let mut hi = _mm256_setzero_ps();
    let mut i = 0;
    while i < body {
        // SAFETY: bytes 2i..2i+32 of w and 4i..4i+64 of act are in bounds (i + 16 <= n).
        let h0 = _mm_loadu_si128(w.as_ptr().add(2 * i) as *const __m128i);
        let h1 = _mm_loadu_si128(w.as_ptr().add(2 * i + 16) as *const __m128i);
        let a0 = _mm256_loadu_ps(act.as_ptr().add(4 * i) as *const f32);
        let a1 = _mm256_loadu_ps(act.as_ptr().add(4 * i + 32) as *const f32);
        lo = _mm256_fmadd_ps(_mm256_cvtph_ps(h0), a0, lo);
        hi = _mm256_fmadd_ps(_mm256_cvtph_ps(h1), a1, hi);
        i += 16;
    }
    let mut lanes = [0.0f32; 16];
    // SAFETY: 16 writable f32.
    _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    let mut s = crate::quant::float::hsum16(lanes) as f64;
    for j in body..n {
        let x = read_f16([w[2 * j], w[2 * j + 1]]);
        let a = f32::from_le_bytes([act[4 * j], act[4 * j + 1], act[4 * j + 2], act[4 * j + 3]]);
        s += (x * a) as f64;
    }
    s as f32
}
