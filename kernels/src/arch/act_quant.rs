//! SIMD activation quantizers, same bytes as the scalar ones: Q8_0 and Q8_1 in llama.cpp's
//! x86 arithmetic ([`crate::quant::q8_0::quantize_row_x86`], which every ISA uses so that
//! one set of goldens holds, and its Q8_1 twin) and Q8_K
//! ([`crate::quant::q8_k::quantize_row`]). The ISA-independent driver (blocks, scales,
//! the scalar fallback) lives here, the three per-block steps per ISA behind
//! [`Quantizer`] ([`super::x86_quant`]: AVX2; [`super::neon_quant`]: NEON). A prompt
//! quantizes every matrix input of every token: the scalar loops, a software `rintf` per
//! value for Q8_0, took about 8 % of a Gemma 3 270M prompt on x86.
//!
//! Why the bytes agree: for finite input the absolute maximum is the same in any order;
//! with a finite scale every product `x * scale` lies within 127 (1 + 2^-22), so rounding
//! it to nearest even (`vcvtps2dq` in the default rounding mode, `fcvtns`; the scalar
//! `rintf` and Q8_K's `x + 1.5 * 2^23` do the same) and narrowing to bytes are exact.
//! A block holding a NaN or an infinity, or whose scale overflows (a subnormal maximum),
//! goes to the scalar code, which defines what such blocks give.
use crate::f16::f32_to_f16;
use crate::quant::q8_0::{quantize_block_x86, QK};

/// The per-block steps one ISA provides (implemented on its feature token, so that only
/// a proven CPU runs them).
pub trait Quantizer: Copy {
    /// The largest `|x|` of 32 values, or `None` when one is NaN or infinite.
    fn amax_finite(self, xs: &[f32; QK]) -> Option<f32>;
    /// `qs[i] = round_to_nearest_even(xs[i] * s)` as i8 bytes; the caller guarantees
    /// every product lies within 127.5.
    fn round_pack(self, xs: &[f32; QK], s: f32, qs: &mut [u8; QK]);
    /// `q = min(q, 127)` for 16 i8 bytes in place, and their sum.
    fn clamp_sum16(self, qs: &mut [u8; 16]) -> i16;
}

/// Bytes of one Q8_0 block (f16 scale, 32 quants) and one Q8_1 block (f16 scale, f16
/// scaled sum, 32 quants).
const Q8_0_BYTES: usize = 2 + QK;
const Q8_1_BYTES: usize = 4 + QK;
/// Values per Q8_K block and bytes of one (f32 scale, 256 quants, 16 i16 sums).
const QK_K: usize = 256;
const Q8K_BYTES: usize = 4 + QK_K + 32;

/// One block in the x86 Q8_0 arithmetic: writes the quants, returns the unrounded scale.
fn block_x86<Q: Quantizer>(isa: Q, xs: &[f32; QK], qs: &mut [u8; QK]) -> f32 {
    if let Some(amax) = isa.amax_finite(xs) {
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        if id.is_finite() {
            isa.round_pack(xs, id, qs);
            return amax / 127.0;
        }
    }
    quantize_block_x86(xs, qs)
}

/// A block's first `HEAD` bytes (its scales) and its 32 quants.
fn split<const HEAD: usize>(b: &mut [u8]) -> (&mut [u8], &mut [u8; QK]) {
    let (head, qs) = b.split_at_mut(HEAD);
    (head, qs.try_into().expect("a block holds 32 quants"))
}

/// [`crate::quant::q8_0::quantize_row_x86`] of `x` into `dst`, same bytes and shape rules.
pub fn q8_0_row<Q: Quantizer>(isa: Q, x: &[f32], dst: &mut [u8]) {
    for (xs, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let (d, qs) = split::<2>(b);
        let scale = block_x86(isa, xs.try_into().expect("32 values"), qs);
        d.copy_from_slice(&f32_to_f16(scale).to_le_bytes());
    }
}

/// [`crate::quant::q8_1::quantize_row_x86`] of `x` into `dst`, same bytes and shape rules:
/// Q8_0's quants and scale, and `s = f16(d * sum(q))`.
pub fn q8_1_row<Q: Quantizer>(isa: Q, x: &[f32], dst: &mut [u8]) {
    for (xs, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let (ds, qs) = split::<4>(b);
        let d = block_x86(isa, xs.try_into().expect("32 values"), qs);
        let sum: i32 = qs.iter().map(|&q| q as i8 as i32).sum();
        ds[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        ds[2..].copy_from_slice(&f32_to_f16(d * sum as f32).to_le_bytes());
    }
}

/// [`crate::quant::q8_k::quantize_row`] of `x` into `dst`, same bytes; `false` (nothing
/// promised about `dst`) when a block holds a NaN or an infinity or its scale
/// overflows: the caller then runs the scalar row.
pub fn q8_k_row<Q: Quantizer>(isa: Q, x: &[f32], dst: &mut [u8]) -> bool {
    x.chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(Q8K_BYTES))
        .all(|(xs, b)| q8_k_block(isa, xs, b))
}

fn q8_k_block<Q: Quantizer>(isa: Q, xs: &[f32], b: &mut [u8]) -> bool {
    let mut amax = 0.0f32;
    for c in xs.chunks_exact(QK) {
        match isa.amax_finite(c.try_into().expect("32 values")) {
            Some(m) => amax = amax.max(m),
            None => return false,
        }
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
    for (xc, qc) in xs.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)) {
        isa.round_pack(
            xc.try_into().expect("32 values"),
            iscale,
            qc.try_into().expect("32 quants"),
        );
    }
    for (q16, s) in qs.chunks_exact_mut(16).zip(bsums.chunks_exact_mut(2)) {
        // The products reach -127 at least, so only 127 needs the scalar's `min`.
        let sum = isa.clamp_sum16(q16.try_into().expect("16 quants"));
        s.copy_from_slice(&sum.to_le_bytes());
    }
    d.copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
    true
}
