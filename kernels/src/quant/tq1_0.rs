//! TQ1_0: ternary weights in blocks of 256 packed five (or four) per byte in base 3,
//! one f16 scale at the end. Dotted with Q8_K activations.
use super::q8_k::act_blocks as q8k_blocks;
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 54;

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// TQ1_0 block, 1.6875 bits per weight. A byte `b` holds base-3 digits scaled so that
/// digit `n` is `((b * 3^n mod 256) * 3) >> 8` (llama.cpp's fixed-point packing);
/// `x = (digit - 1) * d`. Weight order: `qs[0..32]` give weights `32n + m` (n = 0..5),
/// `qs[32..48]` give `160 + 16n + m` (n = 0..5), `qh[0..4]` give `240 + 4n + j`
/// (n = 0..4).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockTq1_0 {
    /// Five digits per byte.
    pub qs: [u8; 48],
    /// Four digits per byte.
    pub qh: [u8; 4],
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
}
crate::pod_block!(BlockTq1_0);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockTq1_0>(), BLOCK_BYTES);

/// Digit `n` of a packed byte, as a level -1..=1.
#[inline]
fn trit(byte: u8, n: usize) -> i32 {
    let q = byte.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as i32 - 1
}

impl BlockTq1_0 {
    /// The 256 levels in weight order.
    pub fn levels(&self) -> [i8; QK] {
        let mut out = [0i8; QK];
        let mut i = 0;
        for n in 0..5 {
            for m in 0..32 {
                out[i] = trit(self.qs[m], n) as i8;
                i += 1;
            }
        }
        for n in 0..5 {
            for m in 0..16 {
                out[i] = trit(self.qs[32 + m], n) as i8;
                i += 1;
            }
        }
        for n in 0..4 {
            for j in 0..4 {
                out[i] = trit(self.qh[j], n) as i8;
                i += 1;
            }
        }
        out
    }
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockTq1_0>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (o, l) in out.iter_mut().zip(b.levels()) {
            *o = l as f32 * d;
        }
    }
}

/// Scalar reference dot product with one Q8_K activation row, as
/// `ggml_vec_dot_tq1_0_q8_K_generic`: `sum += sumi * (d_w * d_a)` per block.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockTq1_0>(w).unwrap_or(&[]);
    let a = q8k_blocks(act);
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let l = x.levels();
        let sumi: i32 = (0..QK).map(|i| l[i] as i32 * y.q(i)).sum();
        sum += sumi as f32 * (read_f16(x.d) * y.scale());
    }
    sum
}
