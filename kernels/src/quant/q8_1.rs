//! Q8_1: blocks of 32 int8 activations with an f16 scale and an f16 `s = d * sum(q)`:
//! the activation format llama.cpp dots Q4_1 and Q5_1 with (their minimum `m` meets the
//! block's sum once per block instead of once per weight).
//!
//! [`quantize_row_x86`] is llama.cpp's x86 `quantize_row_q8_1` (AVX2), where the goldens
//! were made: the quants and `d` are [`super::q8_0::quantize_row_x86`]'s (`127 / amax`,
//! ties to even), and `s` is the f16 of the *unrounded* f32 `d` times the integer sum of
//! the quants. (Rebuilding `s` from the stored f16 `d`, as pinch did before this format,
//! differs in the last f16 bit for about one block in three.)
//!
//! Dot products with Q4_1/Q5_1 follow llama.cpp's x86 `ggml_vec_dot_q4_1_q8_1` /
//! `_q5_1_q8_1` ([`min_lanes8_dot`]): the integer products in eight lanes of four
//! consecutive weights fused into eight f32 lanes per block, reduced by
//! [`super::q8_0::hsum8`], plus `m_w * s_a` summed block by block in one f32. The SIMD
//! kernels of every ISA compute exactly this, so one set of goldens holds everywhere.
use super::q8_0::{hsum8, quantize_block_x86};
use crate::blocks::{cast, cast_mut};
use crate::f16::{f32_to_f16, read_f16};

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 36;

/// Q8_1 block, 9 bits per value: `x[j] = d * qs[j]`; `s = f16(d_f32 * sum(qs))`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Scale times the sum of the quants, f16 little-endian.
    pub s: [u8; 2],
    /// Quants, i8 stored as bytes.
    pub qs: [u8; QK],
}
crate::pod_block!(BlockQ8_1);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ8_1>(), BLOCK_BYTES);

/// View a Q8_1 activation row as blocks; an empty slice when the length is not whole
/// blocks (callers check shapes once per call).
#[inline]
pub fn act_blocks(act: &[u8]) -> &[BlockQ8_1] {
    cast::<BlockQ8_1>(act).unwrap_or(&[])
}

/// Scalar dequantization of whole blocks (`d * q`; `s` is redundant).
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = act_blocks(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (o, q) in out.iter_mut().zip(b.qs) {
            *o = q as i8 as f32 * d;
        }
    }
}

/// Quantize `x` (whole blocks of 32) into Q8_1 blocks in `dst` as llama.cpp's x86
/// backend does (see the module doc). Extra input or a too-short `dst` is ignored: only
/// whole blocks that fit both are written.
pub fn quantize_row_x86(x: &[f32], dst: &mut [u8]) {
    let n = (dst.len() / BLOCK_BYTES).min(x.len() / QK);
    let Some(blocks) = cast_mut::<BlockQ8_1>(&mut dst[..n * BLOCK_BYTES]) else {
        return;
    };
    for (b, xs) in blocks.iter_mut().zip(x.chunks_exact(QK)) {
        let d = quantize_block_x86(xs, &mut b.qs);
        let sum: i32 = b.qs.iter().map(|&q| q as i8 as i32).sum();
        b.d = f32_to_f16(d).to_le_bytes();
        b.s = f32_to_f16(d * sum as f32).to_le_bytes();
    }
}

/// The float arithmetic of llama.cpp's x86 Q4_1/Q5_1 dot products. Per block: the
/// scale product `d_w * d_a` (exact in f32), the eight exact lane sums of four
/// consecutive products, and `m_w * s_a` (exact in f32: two f16). Lane `l` accumulates
/// `fma(d_w * d_a, lane_l, acc_l)`, the minimum terms accumulate in one f32 in block
/// order, and the result is `hsum8(acc) + summs`.
#[inline]
pub fn min_lanes8_dot(blocks: impl Iterator<Item = (f32, [i32; 8], f32)>) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (d, lanes, ms) in blocks {
        summs += ms;
        for (a, s) in acc.iter_mut().zip(lanes) {
            *a = libm::fmaf(d, s as f32, *a);
        }
    }
    hsum8(acc) + summs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s_uses_the_unrounded_scale() {
        // s must be f16(d * sum) with the f32 d = amax / 127, not with f16(d): over 64
        // blocks the two differ for some (else this test would not tell them apart).
        let mut differ = 0;
        for k in 0..64 {
            let x: [f32; QK] = core::array::from_fn(|j| {
                (1.0 + k as f32 * 0.173) * ((j * 7 + k) as f32 * 0.37).sin()
            });
            let mut b = [0u8; BLOCK_BYTES];
            quantize_row_x86(&x, &mut b);
            let blk = act_blocks(&b)[0];
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let sum: i32 = blk.qs.iter().map(|&q| q as i8 as i32).sum();
            let want = f32_to_f16(amax / 127.0 * sum as f32);
            assert_eq!(u16::from_le_bytes(blk.s), want, "block {k}");
            differ += usize::from(want != f32_to_f16(read_f16(blk.d) * sum as f32));
            // The quants and d are Q8_0's.
            let mut q0 = [0u8; 34];
            super::super::q8_0::quantize_row_x86(&x, &mut q0);
            assert_eq!(&q0[..2], &blk.d);
            assert_eq!(&q0[2..], &blk.qs);
        }
        assert!(differ > 0);
    }

    #[test]
    fn all_zero_block_has_zero_scale_sum_and_quants() {
        let mut b = [0xffu8; BLOCK_BYTES];
        quantize_row_x86(&[0.0; QK], &mut b);
        assert!(b.iter().all(|&v| v == 0));
    }
}
