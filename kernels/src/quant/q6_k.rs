//! Q6_K: 6-bit K-quant with signed 8-bit scales per 16 weights (the LM head and
//! attention V of most `_M` mixes, and Gemma 3 270M's output/embedding type).
//!
//! `dequantize_row` and `vec_dot` reproduce llama.cpp's `dequantize_row_q6_K` and
//! `ggml_vec_dot_q6_K_q8_K_generic` (commit 0c1e570).
use crate::blocks::cast;
use crate::f16::read_f16;
use crate::quant::q8_k;

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 210;

/// Q6_K super-block, 6.5625 bits per weight: `x = d * scales[i / 16] * (q - 32)` with
/// `q` in 0..64.
///
/// In each 128-weight half `h`, weight `128h + 32k + l` (`k` 0..4, `l` 0..32) takes its
/// low 4 bits from `ql[64h + 32(k % 2) + l]` (low nibble for `k < 2`, high for `k >= 2`)
/// and its top 2 bits from bits `2k..2k+2` of `qh[32h + l]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; 128],
    /// High 2 bits of the quants, four per byte.
    pub qh: [u8; 64],
    /// Signed 8-bit scale per 16 weights.
    pub scales: [u8; 16],
    /// Super-block scale, f16 LE.
    pub d: [u8; 2],
}
crate::pod_block!(BlockQ6K);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ6K>(), BLOCK_BYTES);

impl BlockQ6K {
    /// The 256 quants in weight order, already offset to -32..32.
    #[inline]
    pub fn quants(&self) -> [i8; QK] {
        let mut a = [0i8; QK];
        for h in 0..2 {
            for l in 0..32 {
                let ql0 = self.ql[64 * h + l];
                let ql1 = self.ql[64 * h + 32 + l];
                let qh = self.qh[32 * h + l];
                let base = 128 * h + l;
                a[base] = ((ql0 & 0xF) | ((qh & 3) << 4)) as i8 - 32;
                a[base + 32] = ((ql1 & 0xF) | (((qh >> 2) & 3) << 4)) as i8 - 32;
                a[base + 64] = ((ql0 >> 4) | (((qh >> 4) & 3) << 4)) as i8 - 32;
                a[base + 96] = ((ql1 >> 4) | (((qh >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        a
    }
    /// Scale of 16-weight group `g`.
    #[inline]
    pub fn scale(&self, g: usize) -> i32 {
        self.scales[g] as i8 as i32
    }
}

/// View a Q6_K row as blocks; empty when the length is not whole blocks.
#[inline]
pub fn blocks(w: &[u8]) -> &[BlockQ6K] {
    cast::<BlockQ6K>(w).unwrap_or(&[])
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        let a = b.quants();
        for (i, o) in out.iter_mut().enumerate() {
            // llama.cpp: y = d * sc * q, evaluated left to right.
            *o = d * b.scale(i / 16) as f32 * a[i] as f32;
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
            .map(|(x, y)| (terms(x, y), x.quants().map(|q| (q as i32 + 32) as u8), y)),
    )
}

/// The block's scales and factor for the SIMD kernels, which use the quants unsigned
/// (0..64): the `- 32` becomes `offset = 32 * sum_g scale[g] * bsum[g]`.
#[inline]
pub fn terms(x: &BlockQ6K, y: &q8_k::BlockQ8K) -> q8_k::KTerms {
    let mut scales = [0i16; 16];
    let mut offset = 0i32;
    for (g, s) in scales.iter_mut().enumerate() {
        *s = x.scale(g) as i16;
        // Wrapping: with consistent bsums the total stays below 2^26, but bytes that are
        // not a real Q8_K block may reach 2^31, and bad input must not panic.
        offset = offset.wrapping_add(x.scale(g) * y.bsum(g));
    }
    q8_k::KTerms {
        d: read_f16(x.d) * y.scale(),
        scales,
        offset: offset.wrapping_mul(32),
        dmin: 0.0,
        mins: 0,
    }
}
