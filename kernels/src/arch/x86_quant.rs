//! AVX2 activation quantizers, same bits as the scalar ones: Q8_0 in llama.cpp's x86
//! arithmetic ([`crate::quant::q8_0::quantize_row_x86`]) and Q8_K
//! ([`crate::quant::q8_k::quantize_row`]). A prompt quantizes every matrix input of every
//! token; the scalar loops (a software `rintf` per value for Q8_0) took about 8 % of a
//! Gemma 3 270M prompt.
//!
//! Why the bits agree: the absolute maximum is a `max` whose NaN lanes keep the running
//! value (as the scalar fold, where `NaN > m` is false); the quants are `v * scale`
//! rounded to nearest even by `vcvtps2dq` (the default rounding mode, as `rintf` and as
//! Q8_K's `x + 1.5 * 2^23` trick for |x| < 2^22), and for finite input with a finite
//! scale every product lies within 127 (1 + 2^-22), so the conversion and packing are
//! exact. A block with a NaN or an infinity, or whose scale overflows, goes to the
//! scalar code, which defines what such blocks give.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use crate::cpu::Avx2;
use crate::f16::f32_to_f16;
use crate::quant::q8_0::{quantize_block_x86, BLOCK_BYTES, QK};

/// [`crate::quant::q8_0::quantize_row_x86`] of `x` into `dst`, same bits and shape rules.
pub fn q8_0_row(_: Avx2, x: &[f32], dst: &mut [u8]) {
    let n = (dst.len() / BLOCK_BYTES).min(x.len() / QK);
    for (xs, b) in x
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
        .take(n)
    {
        let (d, qs) = b.split_at_mut(2);
        let qs: &mut [u8; QK] = qs.try_into().expect("a Q8_0 block holds 32 quants");
        // SAFETY: the `Avx2` token proves AVX2; `xs` holds 32 floats and `qs` 32 bytes.
        let scale = match unsafe { q8_0_block(xs, qs) } {
            Some(s) => s,
            None => quantize_block_x86(xs, qs),
        };
        d.copy_from_slice(&f32_to_f16(scale).to_le_bytes());
    }
}

/// Absolute maximum of 32 floats (NaN lanes ignored) and whether all are finite.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn amax_finite(v: &[__m256; 4]) -> (f32, bool) {
    let sign = _mm256_set1_ps(-0.0);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let mut m = _mm256_setzero_ps();
    let mut ok = _mm256_setzero_ps();
    for &x in v {
        let a = _mm256_andnot_ps(sign, x);
        // `max(a, m)` returns `m` when `a` is NaN.
        m = _mm256_max_ps(a, m);
        // Not (a < inf): NaN or infinite.
        ok = _mm256_or_ps(ok, _mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_max_ss(h, _mm_shuffle_ps::<1>(h, h));
    (_mm_cvtss_f32(h), _mm256_movemask_ps(ok) == 0)
}

/// Round `v * s` to nearest even and pack the 32 results to bytes in order.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn round_pack(v: &[__m256; 4], s: f32) -> __m256i {
    let s = _mm256_set1_ps(s);
    let q: [__m256i; 4] = core::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], s)));
    // packs work within 128-bit halves: bytes come out as 4-value groups
    // 0,2,4,6 | 1,3,5,7 of the eight; the permute restores their order.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load32(xs: &[f32]) -> [__m256; 4] {
    let p = xs[..32].as_ptr();
    core::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)))
}

/// One Q8_0 block, or `None` for the scalar code (non-finite input or scale).
#[target_feature(enable = "avx2")]
unsafe fn q8_0_block(xs: &[f32], qs: &mut [u8; QK]) -> Option<f32> {
    let v = load32(xs);
    let (amax, finite) = amax_finite(&v);
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    if !finite || !id.is_finite() {
        return None;
    }
    _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, round_pack(&v, id));
    Some(amax / 127.0)
}

/// Values per Q8_K block and bytes of one (f32 scale, 256 quants, 16 i16 sums).
const QK_K: usize = 256;
const Q8K_BYTES: usize = 4 + QK_K + 32;

/// [`crate::quant::q8_k::quantize_row`] of `x` into `dst`, same bits; `false` (nothing
/// promised about `dst`) when a block holds a NaN or an infinity or its scale
/// overflows: the caller then runs the scalar row.
pub fn q8_k_row(_: Avx2, x: &[f32], dst: &mut [u8]) -> bool {
    for (xs, b) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q8K_BYTES)) {
        // SAFETY: the `Avx2` token proves AVX2; `xs` holds 256 floats and `b` 292 bytes.
        if !unsafe { q8_k_block(xs, b) } {
            return false;
        }
    }
    true
}

#[target_feature(enable = "avx2")]
unsafe fn q8_k_block(xs: &[f32], b: &mut [u8]) -> bool {
    let mut amax = 0.0f32;
    let mut finite = true;
    for c in xs.chunks_exact(32) {
        let (m, f) = amax_finite(&load32(c));
        amax = amax.max(m);
        finite &= f;
    }
    if !finite {
        return false;
    }
    let (d, rest) = b.split_at_mut(4);
    let (qs, bsums) = rest.split_at_mut(QK_K);
    if amax == 0.0 {
        d.fill(0);
        qs.fill(0);
        bsums.fill(0);
        return true;
    }
    // The scalar keeps the first value whose magnitude is the maximum.
    let max = xs[xs.iter().position(|v| v.abs() == amax).unwrap_or(0)];
    let iscale = -127.0f32 / max;
    if !iscale.is_finite() {
        return false;
    }
    let top = _mm256_set1_epi8(127);
    for (c, (xc, qc)) in xs.chunks_exact(32).zip(qs.chunks_exact_mut(32)).enumerate() {
        // The products reach -127 at least, so only 127 needs the scalar's `min`.
        let q = _mm256_min_epi8(round_pack(&load32(xc), iscale), top);
        _mm256_storeu_si256(qc.as_mut_ptr() as *mut __m256i, q);
        // Sums of each 16 quants: byte pairs, then pairs of those, then the rest.
        let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
        let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        let mut s = [0i32; 8];
        _mm256_storeu_si256(s.as_mut_ptr() as *mut __m256i, quads);
        for (g, four) in s.chunks_exact(4).enumerate() {
            let sum = four.iter().sum::<i32>() as i16;
            bsums[4 * c + 2 * g..4 * c + 2 * g + 2].copy_from_slice(&sum.to_le_bytes());
        }
    }
    d.copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
    true
}
