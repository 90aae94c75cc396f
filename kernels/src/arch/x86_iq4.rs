//! IQ4_XS against Q8_K and IQ4_NL against Q8_0 on AVX2, one row at a time.
//!
//! Per 32-weight sub-block: the 16 index bytes and their copy shifted right by four fill
//! one 256-bit register (low half: weights 0..16, high half: 16..32), masked to nibbles
//! and turned into table values by one `vpshufb` (IQ4_NL's 16 levels, broadcast to both
//! halves). `vpmaddubsw` needs one unsigned operand, so the sign moves to the weights:
//! `|a| * sign(a) w`. That is exact for every activation, -128 included (its magnitude is
//! 128 as an unsigned byte; a level is never -128, so negating one cannot wrap), and a
//! pair sum stays within 2 * 128 * 127 < 32767. `vpmaddwd` by the sub-block's signed
//! scale leaves eight exact int32 lanes per super-block: llama.cpp's x86 lanes, fed to
//! eight f32 accumulators by one `vfmadd` per block and reduced at the end of the row in
//! `hsum_float_8`'s order, as the scalar reference ([`crate::quant::iq4_xs::vec_dot`])
//! does, so the result is its bits (and llama.cpp's AVX2 kernel's).
//!
//! IQ4_NL is the same 32-weight sub-block without a scale (`vpmaddwd` by ones), in
//! llama.cpp's AVX2 float order: even and odd blocks feed two lane accumulators, reduced
//! as `hsum_float_8(acc_even + acc_odd)`, and an odd last block is added as
//! `fma(d, sumi, sum)` ([`crate::quant::iq4_nl::vec_dot`]).
//!
//! # Safety (for every `unsafe fn` here)
//! Callers must run on a CPU with AVX2; memory is read only through slices of the
//! blocks.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_f16::read_f16;
use super::x86_kquant::{hsum_f32, load32};
use crate::quant::iq4_nl::{BlockIq4Nl, KVALUES};
use crate::quant::iq4_xs::{BlockIq4Xs, SUB};
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_k::BlockQ8K;

/// IQ4_NL's 16 levels in both 128-bit halves.
#[inline(always)]
pub(super) unsafe fn levels() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES.as_ptr() as *const __m128i))
}

/// The sixteen i16 pair sums `w[2i] a[2i] + w[2i+1] a[2i+1]` of one 32-weight sub-block:
/// table values of the 16 index bytes `q` (low nibbles weights 0..16, high 16..32)
/// against the 32 activation quants `a`, exact (see the module doc).
#[inline(always)]
unsafe fn pair_sums(levels: __m256i, q: &[u8], a: &[u8]) -> __m256i {
    let q = _mm_loadu_si128(q[..16].as_ptr() as *const __m128i);
    let idx = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(q), q),
        _mm256_set1_epi8(0x0f),
    );
    let w = _mm256_shuffle_epi8(levels, idx);
    let a = load32(a);
    _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(w, a))
}

/// One IQ4_NL block's eight exact lane sums with its Q8_0 block, as f32, and `d_w * d_a`.
#[inline(always)]
unsafe fn nl_block(levels: __m256i, x: &BlockIq4Nl, y: &BlockQ8_0) -> (__m256, __m256) {
    let p32 = _mm256_madd_epi16(pair_sums(levels, &x.qs, &y.qs), _mm256_set1_epi16(1));
    (
        _mm256_set1_ps(read_f16(x.d) * y.scale()),
        _mm256_cvtepi32_ps(p32),
    )
}

/// AVX2 dot product of IQ4_NL blocks with Q8_0 blocks.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nl_avx2(x: &[BlockIq4Nl], y: &[BlockQ8_0]) -> f32 {
    let levels = levels();
    let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (xp, xt) = x.as_chunks::<2>();
    let (yp, yt) = y.as_chunks::<2>();
    for (bx, by) in xp.iter().zip(yp) {
        let (d0, s0) = nl_block(levels, &bx[0], &by[0]);
        let (d1, s1) = nl_block(levels, &bx[1], &by[1]);
        even = _mm256_fmadd_ps(d0, s0, even);
        odd = _mm256_fmadd_ps(d1, s1, odd);
    }
    let mut sum = hsum_f32(_mm256_add_ps(even, odd));
    if let (Some(bx), Some(by)) = (xt.first(), yt.first()) {
        let sumi = nl_block(levels, bx, by).1;
        let s = hsum_f32(sumi); // exact: the lanes are integers summing below 2^24
        sum = libm::fmaf(read_f16(bx.d) * by.scale(), s, sum);
    }
    sum
}

/// AVX2 dot product of IQ4_XS blocks with Q8_K blocks.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_avx2(x: &[BlockIq4Xs], y: &[BlockQ8K]) -> f32 {
    let levels = levels();
    let mut accf = _mm256_setzero_ps();
    for (bx, by) in x.iter().zip(y) {
        let mut acc = _mm256_setzero_si256();
        for (ib, ls) in bx.scales().into_iter().enumerate() {
            let p16 = pair_sums(levels, &bx.qs[16 * ib..16 * ib + 16], &by.qs[SUB * ib..]);
            let p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(ls as i16));
            acc = _mm256_add_epi32(acc, p32);
        }
        let d = _mm256_set1_ps(read_f16(bx.d) * by.scale());
        accf = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(acc), accf);
    }
    hsum_f32(accf)
}
