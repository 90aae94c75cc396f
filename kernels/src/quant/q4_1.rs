//! Q4_1: blocks of 32 weights, 4-bit quants with an f16 scale and an f16 minimum.
//!
//! llama.cpp dots Q4_1 with Q8_1 activations (Q8_0 plus `s = f16(d * sum(q))`); pinch
//! quantizes activations once per matvec as Q8_0 and rebuilds `s` from the Q8_0 block
//! (`f16(f16(d) * sum(q))`). The quants and `d` are identical to llama.cpp's Q8_1
//! (same `amax/127`, same `roundf`); `s` can differ from llama.cpp's in its last f16 bit
//! because llama.cpp multiplies by the unrounded f32 `d`.
use super::q8_0::{act_blocks, BlockQ8_0};
use crate::blocks::cast;
use crate::f16::{f16_to_f32, f32_to_f16, read_f16};

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

/// `s` of the Q8_1 block llama.cpp would have made from the same activations (see the
/// module doc for the last-bit caveat).
#[inline]
pub(crate) fn q8_1_s(y: &BlockQ8_0) -> f32 {
    f16_to_f32(f32_to_f16(y.scale() * y.q_sum() as f32))
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

/// Scalar reference dot product with one Q8_0 activation row, as
/// `ggml_vec_dot_q4_1_q8_1_generic`: `sum += (d_w * d_a) * sumi + m_w * s_a` per block.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ4_1>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let q = x.quants();
        let sumi: i32 = (0..QK).map(|j| q[j] * y.q(j)).sum();
        sum += (read_f16(x.d) * y.scale()) * sumi as f32 + read_f16(x.m) * q8_1_s(y);
    }
    sum
}
