//! Q5_1: blocks of 32 weights, 5-bit quants with an f16 scale and an f16 minimum.
//!
//! Dotted with Q8_1 activations ([`super::q8_1`]), in llama.cpp's x86 arithmetic.
use super::q5_0::quants5;
use super::q8_0::lane_sums_of;
use super::q8_1::{act_blocks, min_lanes8_dot};
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 24;

/// Q5_1 block, 6 bits per weight. With `h = u32::from_le_bytes(qh)`:
/// `x[j] = d * ((qs[j] & 0xf) | (bit j of h) << 4) + m` and
/// `x[j + 16] = d * ((qs[j] >> 4) | (bit j+16 of h) << 4) + m` for `j < 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum (offset), f16 little-endian.
    pub m: [u8; 2],
    /// Fifth bits of the 32 quants, little-endian u32, bit j = weight j.
    pub qh: [u8; 4],
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK / 2],
}
crate::pod_block!(BlockQ5_1);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ5_1>(), BLOCK_BYTES);

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockQ5_1>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        let m = read_f16(b.m);
        for (o, q) in out.iter_mut().zip(quants5(b.qh, &b.qs)) {
            *o = q as f32 * d + m;
        }
    }
}

/// Scalar reference dot product with one Q8_1 activation row, with llama.cpp's x86
/// arithmetic (`ggml_vec_dot_q5_1_q8_1` under AVX2: [`min_lanes8_dot`]).
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ5_1>(w).unwrap_or(&[]);
    min_lanes8_dot(w.iter().zip(act_blocks(act)).map(|(x, y)| {
        (
            read_f16(x.d) * read_f16(y.d),
            lane_sums_of(&quants5(x.qh, &x.qs), &y.qs),
            read_f16(x.m) * read_f16(y.s),
        )
    }))
}
