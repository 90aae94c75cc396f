//! Q3_K: 3-bit K-quant (2 low bits + 1 high bit) with signed 6-bit scales per 16
//! weights (the `Q3_K_*` mixes and part of the `Q2_K` mix).
//!
//! `dequantize_row` and `vec_dot` reproduce llama.cpp's `dequantize_row_q3_K` and
//! `ggml_vec_dot_q3_K_q8_K_generic` (commit 0c1e570).
use crate::blocks::cast;
use crate::f16::read_f16;
use crate::quant::q8_k;

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 110;

/// Q3_K super-block, 3.4375 bits per weight: `x = d * (s[i / 16] - 32) * q` with `s` the
/// 6-bit scales of [`unpack_scales`] and `q = low2 - 4 * (1 - high)` in -4..4.
///
/// Weight `128h + 32k + l` (`k` 0..4, `l` 0..32) takes bits `2k..2k+2` of `qs[32h + l]`
/// and bit `4h + k` of `hmask[l]` (a *clear* bit subtracts 4).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ3K {
    /// High bits.
    pub hmask: [u8; 32],
    /// Low 2 bits, four per byte.
    pub qs: [u8; 64],
    /// Sixteen 6-bit scales, packed (see [`unpack_scales`]).
    pub scales: [u8; 12],
    /// Super-block scale, f16 LE.
    pub d: [u8; 2],
}
crate::pod_block!(BlockQ3K);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ3K>(), BLOCK_BYTES);

/// The sixteen scales, already offset by -32: group `i` takes its low 4 bits from the
/// low (i < 8) or high (i >= 8) nibble of byte `i % 8`, and its top 2 bits from bits
/// `2 * (i / 4)..` of byte `8 + i % 4`.
#[inline]
pub fn unpack_scales(b: &[u8; 12]) -> [i32; 16] {
    let mut s = [0i32; 16];
    for (i, v) in s.iter_mut().enumerate() {
        let low = if i < 8 { b[i] & 0xF } else { b[i - 8] >> 4 };
        let high = (b[8 + i % 4] >> (2 * (i / 4))) & 3;
        *v = (low | (high << 4)) as i32 - 32;
    }
    s
}

impl BlockQ3K {
    /// The 256 quants in weight order, in -4..4.
    #[inline]
    pub fn quants(&self) -> [i8; QK] {
        let mut a = [0i8; QK];
        for h in 0..2 {
            for k in 0..4 {
                let bit = 4 * h + k;
                for l in 0..32 {
                    let low = ((self.qs[32 * h + l] >> (2 * k)) & 3) as i8;
                    let sub = if (self.hmask[l] >> bit) & 1 != 0 {
                        0
                    } else {
                        4
                    };
                    a[128 * h + 32 * k + l] = low - sub;
                }
            }
        }
        a
    }
}

/// View a Q3_K row as blocks; empty when the length is not whole blocks.
#[inline]
pub fn blocks(w: &[u8]) -> &[BlockQ3K] {
    cast::<BlockQ3K>(w).unwrap_or(&[])
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d_all = read_f16(b.d);
        let sc = unpack_scales(&b.scales);
        let a = b.quants();
        for (i, o) in out.iter_mut().enumerate() {
            let dl = d_all * sc[i / 16] as f32;
            *o = dl * a[i] as f32;
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
            .map(|(x, y)| (terms(x, y), x.quants().map(|q| (q as i32 + 4) as u8), y)),
    )
}

/// The block's scales and factor for the SIMD kernels, which use the quants unsigned
/// (`low2 | high << 2`, 0..8): the `- 4` becomes `offset = 4 * sum_g scale[g] * bsum[g]`.
#[inline]
pub fn terms(x: &BlockQ3K, y: &q8_k::BlockQ8K) -> q8_k::KTerms {
    let sc = unpack_scales(&x.scales);
    let mut scales = [0i16; 16];
    let mut offset = 0i32;
    for (g, s) in scales.iter_mut().enumerate() {
        *s = sc[g] as i16;
        offset += sc[g] * y.bsum(g);
    }
    q8_k::KTerms {
        d: read_f16(x.d) * y.scale(),
        scales,
        offset: 4 * offset,
        dmin: 0.0,
        mins: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_unpacking_matches_the_bit_layout() {
        let mut b = [0u8; 12];
        b[2] = 0x5A; // group 2: low nibble 0xA; group 10: high nibble 0x5
        b[10] = 0b11_10_01_00; // group 2 top bits 0b00, group 6: 0b01, 10: 0b10, 14: 0b11
        b[6] = 0x0F; // group 6 low nibble 0xF
        let s = unpack_scales(&b);
        assert_eq!(s[2], 0xA - 32);
        assert_eq!(s[6], (0xF | (0b01 << 4)) - 32);
        assert_eq!(s[10], (0x5 | (0b10 << 4)) - 32);
        assert_eq!(s[14], (0b11 << 4) - 32);
    }
}
