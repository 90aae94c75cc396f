//! TQ2_0: ternary weights in blocks of 256, 2 bits each, one f16 scale at the end.
//! Dotted with Q8_K activations.
use super::q8_k::act_blocks as q8k_blocks;
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 66;

/// TQ2_0 block, 2.0625 bits per weight. Byte `qs[32*c + m]` (chunk `c` of 2) holds
/// weights `128*c + 32*l + m` for `l = 0..4` at bits `2*l`;
/// `x = ((qs >> 2l) & 3) - 1) * d`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockTq2_0 {
    /// 2-bit codes, see the layout above.
    pub qs: [u8; QK / 4],
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
}
crate::pod_block!(BlockTq2_0);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockTq2_0>(), BLOCK_BYTES);

impl BlockTq2_0 {
    /// Ternary level (-1..=2; 2 never appears in valid files) of weight `i`.
    #[inline]
    pub fn level(&self, i: usize) -> i32 {
        let (c, r) = (i / 128, i % 128);
        let (l, m) = (r / 32, r % 32);
        ((self.qs[32 * c + m] >> (2 * l)) & 3) as i32 - 1
    }
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockTq2_0>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (i, o) in out.iter_mut().enumerate() {
            *o = b.level(i) as f32 * d;
        }
    }
}

/// Scalar reference dot product with one Q8_K activation row, as
/// `ggml_vec_dot_tq2_0_q8_K_generic`: `sum += sumi * (d_a * d_w)` per block.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockTq2_0>(w).unwrap_or(&[]);
    let a = q8k_blocks(act);
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = (0..QK).map(|i| x.level(i) * y.q(i)).sum();
        sum += sumi as f32 * (y.scale() * read_f16(x.d));
    }
    sum
}
