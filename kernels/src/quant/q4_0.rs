//! Q4_0: blocks of 32 weights, 4-bit quants with an f16 scale and an implicit offset of 8.
//! Dotted with Q8_0 activations.
use super::q8_0::act_blocks;
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// Q4_0 block, 4.5 bits per weight: `x[j] = d * ((qs[j] & 0xf) - 8)` and
/// `x[j + 16] = d * ((qs[j] >> 4) - 8)` for `j < 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK / 2],
}
crate::pod_block!(BlockQ4_0);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ4_0>(), BLOCK_BYTES);

impl BlockQ4_0 {
    /// The 32 signed quants in weight order.
    #[inline]
    pub fn quants(&self) -> [i32; QK] {
        let mut q = [0i32; QK];
        for j in 0..QK / 2 {
            q[j] = (self.qs[j] & 0x0f) as i32 - 8;
            q[j + QK / 2] = (self.qs[j] >> 4) as i32 - 8;
        }
        q
    }
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockQ4_0>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (o, q) in out.iter_mut().zip(b.quants()) {
            *o = q as f32 * d;
        }
    }
}

/// Scalar reference dot product with one Q8_0 activation row, as
/// `ggml_vec_dot_q4_0_q8_0_generic`: `sum += (sumi * d_w) * d_a` per block.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ4_0>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let q = x.quants();
        let sumi: i32 = (0..QK).map(|j| q[j] * y.q(j)).sum();
        sum += sumi as f32 * read_f16(x.d) * y.scale();
    }
    sum
}
