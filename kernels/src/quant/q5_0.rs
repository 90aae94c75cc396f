//! Q5_0: blocks of 32 weights, 5-bit quants (4 low bits in nibbles, the 5th bit packed
//! in a 32-bit mask) with an f16 scale and an implicit offset of 16. Dotted with Q8_0.
use super::q8_0::{act_blocks, dot_in, Order};
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 22;

/// Q5_0 block, 5.5 bits per weight. With `h = u32::from_le_bytes(qh)`:
/// `x[j] = d * (((qs[j] & 0xf) | (bit j of h) << 4) - 16)` and
/// `x[j + 16] = d * (((qs[j] >> 4) | (bit j+16 of h) << 4) - 16)` for `j < 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Fifth bits of the 32 quants, little-endian u32, bit j = weight j.
    pub qh: [u8; 4],
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK / 2],
}
crate::pod_block!(BlockQ5_0);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ5_0>(), BLOCK_BYTES);

/// The 32 five-bit quants (0..32, before any offset) of a block given its `qh` and `qs`.
#[inline]
pub(crate) fn quants5(qh: [u8; 4], qs: &[u8; 16]) -> [i32; QK] {
    let h = u32::from_le_bytes(qh);
    let mut q = [0i32; QK];
    for j in 0..QK / 2 {
        q[j] = ((qs[j] & 0x0f) as u32 | ((h >> j) & 1) << 4) as i32;
        q[j + QK / 2] = ((qs[j] >> 4) as u32 | ((h >> (j + 16)) & 1) << 4) as i32;
    }
    q
}

impl BlockQ5_0 {
    /// The 32 signed quants in weight order.
    #[inline]
    pub fn quants(&self) -> [i32; QK] {
        quants5(self.qh, &self.qs).map(|q| q - 16)
    }
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockQ5_0>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (o, q) in out.iter_mut().zip(b.quants()) {
            *o = q as f32 * d;
        }
    }
}

/// Scalar reference dot product with one Q8_0 activation row, with llama.cpp's x86
/// arithmetic ([`super::q8_0::lanes8_dot`]: tinyBLAS for prompts, the AVX2
/// `ggml_vec_dot_q5_0_q8_0` for one token, same bits).
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    vec_dot_in(Order::Lanes8, w, act)
}

/// [`vec_dot`] in either [`Order`] (NEON: [`Order::BlockSum`]).
pub fn vec_dot_in(order: Order, w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ5_0>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    dot_in(
        order,
        w.iter()
            .zip(a)
            .map(|(x, y)| (read_f16(x.d) * y.scale(), x.quants(), y)),
    )
}
