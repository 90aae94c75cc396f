//! Q4_1: blocks of 32 weights, 4-bit quants with an f16 scale and an f16 minimum.
//!
//! Dotted with Q8_1 activations ([`super::q8_1`]), in llama.cpp's x86 arithmetic.
use super::q8_0::lane_sums_of;
use super::q8_1::{act_blocks, min_lanes8_dot};
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 20;

/// Q4_1 block, 5 bits per weight: `x[j] = d * (qs[j] & 0xf) + m` and
/// `x[j + 16] = d * (qs[j] >> 4) + m` for `j < 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum (offset), f16 little-endian.
    pub m: [u8; 2],
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK / 2],
}
crate::pod_block!(BlockQ4_1);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ4_1>(), BLOCK_BYTES);

impl BlockQ4_1 {
    /// The 32 unsigned quants in weight order.
    #[inline]
    pub fn quants(&self) -> [i32; QK] {
        let mut q = [0i32; QK];
        for j in 0..QK / 2 {
            q[j] = (self.qs[j] & 0x0f) as i32;
            q[j + QK / 2] = (self.qs[j] >> 4) as i32;
        }
        q
    }
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockQ4_1>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        let m = read_f16(b.m);
        for (o, q) in out.iter_mut().zip(b.quants()) {
            *o = q as f32 * d + m;
        }
    }
}

/// Scalar reference dot product with one Q8_1 activation row, with llama.cpp's x86
/// arithmetic (`ggml_vec_dot_q4_1_q8_1` under AVX2: [`min_lanes8_dot`]).
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ4_1>(w).unwrap_or(&[]);
    min_lanes8_dot(w.iter().zip(act_blocks(act)).map(|(x, y)| {
        (
            read_f16(x.d) * read_f16(y.d),
            lane_sums_of(&x.quants(), &y.qs),
            read_f16(x.m) * read_f16(y.s),
        )
    }))
}
