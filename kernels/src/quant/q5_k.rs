//! Q5_K: Q4_K plus one high bit per weight (the `Q5_K_M` mix, and the LM head of some
//! 2-bit mixes).
//!
//! Scales and minimums are packed exactly as in Q4_K ([`super::q4_k::scale_min_k4`]).
//! `dequantize_row` and `vec_dot` reproduce llama.cpp's `dequantize_row_q5_K` and
//! `ggml_vec_dot_q5_K_q8_K_generic` (commit 0c1e570).
use crate::blocks::cast;
use crate::f16::read_f16;
use crate::quant::q4_k::{min_sum, scales_mins_k4};
use crate::quant::q8_k;

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 176;

/// Q5_K super-block, 5.5 bits per weight.
///
/// For sub-block `s` with `(sc, m) = scale_min_k4(s)`: `x = d * sc * q - dmin * m`, where
/// `q` (0..32) is the Q4_K nibble plus 16 times bit `2c` (low nibbles of chunk `c`) or
/// `2c + 1` (high nibbles) of `qh[l]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5K {
    /// Super-block scale of the sub-block scales, f16 LE.
    pub d: [u8; 2],
    /// Super-block scale of the sub-block minimums, f16 LE.
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and minimums, packed as in Q4_K.
    pub scales: [u8; 12],
    /// High bits: bit `j` of `qh[l]` belongs to weight `32j + l`.
    pub qh: [u8; 32],
    /// Low 4 bits, two per byte, laid out as in Q4_K.
    pub qs: [u8; 128],
}
crate::pod_block!(BlockQ5K);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ5K>(), BLOCK_BYTES);

impl BlockQ5K {
    /// The 256 5-bit quants in weight order.
    #[inline]
    pub fn quants(&self) -> [i8; QK] {
        let mut a = [0i8; QK];
        for c in 0..4 {
            for l in 0..32 {
                let b = self.qs[32 * c + l];
                let h = self.qh[l];
                a[64 * c + l] = ((b & 0xF) | (((h >> (2 * c)) & 1) << 4)) as i8;
                a[64 * c + 32 + l] = ((b >> 4) | (((h >> (2 * c + 1)) & 1) << 4)) as i8;
            }
        }
        a
    }
}

/// View a Q5_K row as blocks; empty when the length is not whole blocks.
#[inline]
pub fn blocks(w: &[u8]) -> &[BlockQ5K] {
    cast::<BlockQ5K>(w).unwrap_or(&[])
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        let min = read_f16(b.dmin);
        let (sc, mn) = scales_mins_k4(&b.scales);
        let a = b.quants();
        for (i, o) in out.iter_mut().enumerate() {
            let s = i / 32;
            let d1 = d * sc[s] as f32;
            let m1 = min * mn[s] as f32;
            *o = d1 * a[i] as f32 - m1;
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

/// The block's scales, minimums and factors for the SIMD kernels; quants unsigned (0..32).
#[inline]
pub fn terms(x: &BlockQ5K, y: &q8_k::BlockQ8K) -> q8_k::KTerms {
    let (sc, mn) = scales_mins_k4(&x.scales);
    let mut scales = [0i16; 16];
    for (g, s) in scales.iter_mut().enumerate() {
        *s = sc[g / 2] as i16;
    }
    q8_k::KTerms {
        d: read_f16(x.d) * y.scale(),
        scales,
        offset: 0,
        dmin: read_f16(x.dmin) * y.scale(),
        mins: min_sum(y, &mn),
    }
}
