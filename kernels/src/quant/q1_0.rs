//! Q1_0 (GGUF type 41): blocks of 128 weights, one sign bit each and one f16 scale.
//! Dotted with Q8_0 activations: one Q1_0 block spans four Q8_0 blocks.
use super::q8_0::act_blocks;
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 128;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// Q1_0 block, 1.125 bits per weight: `x[j] = bit(j) ? d : -d`, where bit `j` is bit
/// `j % 8` of `qs[j / 8]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ1_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Sign bits, weight j at bit j % 8 of byte j / 8.
    pub qs: [u8; QK / 8],
}
crate::pod_block!(BlockQ1_0);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ1_0>(), BLOCK_BYTES);

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockQ1_0>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (j, o) in out.iter_mut().enumerate() {
            *o = if (b.qs[j / 8] >> (j % 8)) & 1 != 0 {
                d
            } else {
                -d
            };
        }
    }
}

/// Scalar reference dot product with one Q8_0 activation row, as
/// `ggml_vec_dot_q1_0_q8_0_generic`: for each of the four Q8_0 sub-blocks an integer
/// `±q` sum, accumulated in f32 as `sumi += d_a * sumi_block`; then `sum += d_w * sumi`.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ1_0>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    let mut sum = 0.0f32;
    for (x, ys) in w.iter().zip(a.chunks_exact(4)) {
        let mut sumi = 0.0f32;
        for (k, y) in ys.iter().enumerate() {
            let mut sumi_block = 0i32;
            for j in 0..32 {
                let bit = (x.qs[k * 4 + j / 8] >> (j % 8)) & 1;
                let q = y.q(j);
                sumi_block += if bit != 0 { q } else { -q };
            }
            sumi += y.scale() * sumi_block as f32;
        }
        sum += read_f16(x.d) * sumi;
    }
    sum
}
