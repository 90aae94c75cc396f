//! Q2_0 (GGUF type 42): blocks of 64 weights, 2-bit codes {0,1,2,3} meaning
//! {-1,0,1,2}, one f16 scale. Dotted with Q8_0: one Q2_0 block spans two Q8_0 blocks.
use super::q8_0::act_blocks;
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 64;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// Q2_0 block, 2.25 bits per weight: `x[j] = (code(j) - 1) * d`, where `code(j)` is
/// bits `2 * (j % 4)` .. of `qs[j / 4]` (four consecutive weights per byte).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Codes, weight j at bits 2*(j%4) of byte j/4.
    pub qs: [u8; QK / 4],
}
crate::pod_block!(BlockQ2_0);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ2_0>(), BLOCK_BYTES);

impl BlockQ2_0 {
    /// Signed level (-1..=2) of weight `j`.
    #[inline]
    pub fn level(&self, j: usize) -> i32 {
        ((self.qs[j / 4] >> (2 * (j % 4))) & 3) as i32 - 1
    }
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockQ2_0>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (j, o) in out.iter_mut().enumerate() {
            *o = b.level(j) as f32 * d;
        }
    }
}

/// Scalar reference dot product with one Q8_0 activation row, as
/// `ggml_vec_dot_q2_0_q8_0_generic`: per Q8_0 sub-block an integer sum, accumulated in
/// f32 as `sumi += d_a * sumi_block`; then `sum += d_w * sumi`.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ2_0>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    let mut sum = 0.0f32;
    for (x, ys) in w.iter().zip(a.chunks_exact(2)) {
        let mut sumi = 0.0f32;
        for (k, y) in ys.iter().enumerate() {
            let sumi_block: i32 = (0..32).map(|j| x.level(k * 32 + j) * y.q(j)).sum();
            sumi += y.scale() * sumi_block as f32;
        }
        sum += read_f16(x.d) * sumi;
    }
    sum
}
