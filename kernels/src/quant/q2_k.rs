//! Q2_K: 2-bit K-quant with 4-bit scales and minimums per 16 weights (the `Q2_K` mix,
//! and the embedding/FFN fallback of the IQ2 mixes).
//!
//! `dequantize_row` and `vec_dot` reproduce llama.cpp's `dequantize_row_q2_K` and
//! `ggml_vec_dot_q2_K_q8_K_generic` (commit 0c1e570). Unlike Q3_K..Q6_K, llama.cpp's
//! generic Q2_K dot product keeps one int32 sum per block (no eight-lane split).
use crate::blocks::cast;
use crate::f16::read_f16;
use crate::quant::q8_k;

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 84;

/// Q2_K super-block, 2.625 bits per weight: for 16-weight group `g`,
/// `x = d * (scales[g] & 0xF) * q - dmin * (scales[g] >> 4)` with `q` in 0..4.
///
/// Weight `128h + 32k + l` (`k` 0..4, `l` 0..32) is bits `2k..2k+2` of `qs[32h + l]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2K {
    /// Per 16 weights: scale in the low nibble, minimum in the high nibble.
    pub scales: [u8; 16],
    /// 2-bit quants, four per byte.
    pub qs: [u8; 64],
    /// Super-block scale of the scales, f16 LE.
    pub d: [u8; 2],
    /// Super-block scale of the minimums, f16 LE.
    pub dmin: [u8; 2],
}
crate::pod_block!(BlockQ2K);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ2K>(), BLOCK_BYTES);

impl BlockQ2K {
    /// The 256 2-bit quants in weight order.
    #[inline]
    pub fn quants(&self) -> [i8; QK] {
        let mut a = [0i8; QK];
        for h in 0..2 {
            for k in 0..4 {
                for l in 0..32 {
                    a[128 * h + 32 * k + l] = ((self.qs[32 * h + l] >> (2 * k)) & 3) as i8;
                }
            }
        }
        a
    }
}

/// View a Q2_K row as blocks; empty when the length is not whole blocks.
#[inline]
pub fn blocks(w: &[u8]) -> &[BlockQ2K] {
    cast::<BlockQ2K>(w).unwrap_or(&[])
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        let min = read_f16(b.dmin);
        let a = b.quants();
        for (i, o) in out.iter_mut().enumerate() {
            let sc = b.scales[i / 16];
            let dl = d * (sc & 0xF) as f32;
            let ml = min * (sc >> 4) as f32;
            *o = dl * a[i] as f32 - ml;
        }
    }
}

/// Scalar reference dot product of one weight row with one Q8_K activation row, in the
/// arithmetic every pinch K-quant path shares ([`q8_k::kquant_dot`]).
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    vec_dot_in(crate::quant::q8_0::Order::Lanes8, w, act)
}

/// [`vec_dot`] in `order` ([`q8_k::kquant_dot_in`]).
pub fn vec_dot_in(order: crate::quant::q8_0::Order, w: &[u8], act: &[u8]) -> f32 {
    q8_k::kquant_dot_in(
        order,
        blocks(w)
            .iter()
            .zip(q8_k::act_blocks(act))
            .map(|(x, y)| (terms(x, y), x.quants().map(|q| q as u8), y)),
    )
}

/// The block's scales, minimums and factors for the SIMD kernels; quants unsigned (0..4).
#[inline]
pub fn terms(x: &BlockQ2K, y: &q8_k::BlockQ8K) -> q8_k::KTerms {
    let mut scales = [0i16; 16];
    let mut mins = 0i32;
    for (g, s) in scales.iter_mut().enumerate() {
        *s = (x.scales[g] & 0xF) as i16;
        mins += y.bsum(g) * (x.scales[g] >> 4) as i32;
    }
    q8_k::KTerms {
        d: y.scale() * read_f16(x.d),
        scales,
        offset: 0,
        dmin: y.scale() * read_f16(x.dmin),
        mins,
    }
}

/// Scalar reference of the *block-sum* arithmetic of the repacked Q2_K kernels
/// ([`crate::repack::Layout::Q2Kx8`]): per super-block one exact integer
/// `isum = sum_g (scales[g] & 0xF) * sum_{i in g} q[i] * q8[i]` and one
/// `mins = sum_g (scales[g] >> 4) * bsums[g]`, then `acc = fma(d_w * d_a, isum, acc)` and
/// `macc = fma(dmin_w * d_a, mins, macc)`; the result is `acc - macc`.
///
/// It is the arithmetic of [`vec_dot`] with the eight integer lanes of each block summed
/// before the conversion (two fused steps per block instead of eight): the same integers,
/// other float roundings than llama.cpp's x86 order (`tests/q2k_pack.rs` bounds the
/// difference), and exactly [`vec_dot_in`] in [`crate::quant::q8_0::Order::BlockSum`]
/// ([`q8_k::kquant_dot_blocksum`], the plain aarch64 NEON kernels' order), which
/// `tests/q2k_pack.rs` checks bit for bit.
pub fn vec_dot_block_sum<'a>(blocks: impl Iterator<Item = (BlockQ2K, &'a q8_k::BlockQ8K)>) -> f32 {
    let (mut acc, mut macc) = (0f32, 0f32);
    for (x, y) in blocks {
        let q = x.quants();
        let (mut isum, mut mins) = (0i32, 0i32);
        for g in 0..16 {
            let s: i32 = (16 * g..16 * g + 16).map(|i| q[i] as i32 * y.q(i)).sum();
            isum += (x.scales[g] & 0xF) as i32 * s;
            mins += (x.scales[g] >> 4) as i32 * y.bsum(g);
        }
        let da = y.scale();
        acc = libm::fmaf(read_f16(x.d) * da, isum as f32, acc);
        macc = libm::fmaf(read_f16(x.dmin) * da, mins as f32, macc);
    }
    acc - macc
}
