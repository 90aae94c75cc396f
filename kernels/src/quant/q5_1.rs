//! Q5_1: blocks of 32 weights, 5-bit quants with an f16 scale and an f16 minimum.
//!
//! Like Q4_1 it is dotted with Q8_1 in llama.cpp; pinch rebuilds Q8_1's `s` from the
//! Q8_0 activation block (see [`super::q4_1`] for the last-bit caveat).
use super::q4_1::q8_1_s;
use super::q5_0::quants5;
use super::q8_0::act_blocks;
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

/// Scalar reference dot product with one Q8_0 activation row, as
/// `ggml_vec_dot_q5_1_q8_1_generic`: `sum += (d_w * d_a) * sumi + m_w * s_a` per block.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ5_1>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let q = quants5(x.qh, &x.qs);
        let sumi: i32 = (0..QK).map(|j| q[j] * y.q(j)).sum();
        sum += (read_f16(x.d) * y.scale()) * sumi as f32 + read_f16(x.m) * q8_1_s(y);
    }
    sum
}
