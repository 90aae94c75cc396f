//! Q4_K: 4-bit K-quant with 6-bit sub-block scales and minimums (the bulk of a
//! `Q4_K_M` file, and Gemma 3 270M's main weight type).
//!
//! A 256-weight super-block has two f16 factors (`d`, `dmin`) and eight 32-weight
//! sub-blocks, each with a 6-bit scale and a 6-bit minimum packed into 12 bytes. The
//! packing of those 12 bytes ([`scale_min_k4`]) is shared with Q5_K.
//!
//! `dequantize_row` and `vec_dot` reproduce llama.cpp's `dequantize_row_q4_K` and
//! `ggml_vec_dot_q4_K_q8_K_generic` (commit 0c1e570), including the order of the f32
//! operations, so the scalar path is the reference for every SIMD kernel.
use crate::blocks::cast;
use crate::f16::read_f16;
use crate::quant::q8_k::{self, BlockQ8K};

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 144;

/// Q4_K super-block, 4.5 bits per weight.
///
/// For sub-block `s` (0..8) with `(sc, m) = scale_min_k4(s)` and 4-bit `q`:
/// `x = d * sc * q - dmin * m`. Weight `64c + l` (`l < 32`) is the low nibble of
/// `qs[32c + l]`; weight `64c + 32 + l` is its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    /// Super-block scale of the sub-block scales, f16 LE.
    pub d: [u8; 2],
    /// Super-block scale of the sub-block minimums, f16 LE.
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit minimums, packed (see [`scale_min_k4`]).
    pub scales: [u8; 12],
    /// 4-bit quants, two per byte.
    pub qs: [u8; 128],
}
crate::pod_block!(BlockQ4K);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ4K>(), BLOCK_BYTES);

/// Scale and minimum of sub-block `j` (0..8) from the 12 packed bytes shared by Q4_K
/// and Q5_K: sub-blocks 0..4 keep their 6 bits in the low bits of bytes `j` and `j + 4`;
/// sub-blocks 4..8 put 4 bits in byte `j + 4` and their top 2 bits in the spare top bits
/// of bytes `j - 4` (scale) and `j` (minimum).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight (scales, minimums) of a Q4_K/Q5_K block.
#[inline]
pub fn scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, q);
        sc[j] = s;
        mn[j] = m;
    }
    (sc, mn)
}

/// [`scales_mins_k4`] with word operations instead of a branch per sub-block (what the
/// SIMD kernels call once per block): the 12 bytes as three little-endian words, the
/// low 6 bits of bytes 0..8 and the nibbles of bytes 8..12 masked out per byte, the two
/// spare top bits of bytes 0..8 shifted into place. Returns the eight scales and the
/// eight minimums packed as little-endian `u64`s (byte `j` = sub-block `j`).
#[inline]
pub fn scales_mins_k4_packed(q: &[u8; 12]) -> (u64, u64) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let w0 = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
    let w1 = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
    let w2 = u32::from_le_bytes([q[8], q[9], q[10], q[11]]);
    let sc_lo = w0 & LOW6;
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mn_lo = w1 & LOW6;
    let mn_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        mn_lo as u64 | (mn_hi as u64) << 32,
    )
}

impl BlockQ4K {
    /// The 256 4-bit quants in weight order.
    #[inline]
    pub fn quants(&self) -> [i8; QK] {
        let mut a = [0i8; QK];
        for c in 0..4 {
            for l in 0..32 {
                let b = self.qs[32 * c + l];
                a[64 * c + l] = (b & 0xF) as i8;
                a[64 * c + 32 + l] = (b >> 4) as i8;
            }
        }
        a
    }
}

/// View a Q4_K row as blocks; empty when the length is not whole blocks.
#[inline]
pub fn blocks(w: &[u8]) -> &[BlockQ4K] {
    cast::<BlockQ4K>(w).unwrap_or(&[])
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
            // llama.cpp: d1 = d * sc; m1 = min * m; y = d1 * q - m1 (three roundings).
            let d1 = d * sc[s] as f32;
            let m1 = min * mn[s] as f32;
            *o = d1 * a[i] as f32 - m1;
        }
    }
}

/// `sum_g bsums[g] * mins[g / 2]`: the minimums' share of a Q4_K/Q5_K block dot product.
#[inline]
pub(crate) fn min_sum(y: &BlockQ8K, mn: &[u8; 8]) -> i32 {
    (0..16).map(|g| y.bsum(g) * mn[g / 2] as i32).sum()
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

/// The block's scales, minimums and factors in the form the SIMD kernels use
/// ([`q8_k::KTerms`]); quants stay unsigned (0..16).
#[inline]
pub fn terms(x: &BlockQ4K, y: &BlockQ8K) -> q8_k::KTerms {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_unpacking_matches_the_bit_layout() {
        // Sub-block 5: scale = low nibble of byte 9 | top bits of byte 1 << 4;
        // minimum = high nibble of byte 9 | top bits of byte 5 << 4.
        let mut q = [0u8; 12];
        q[9] = 0xA7;
        q[1] = 0b1100_0000 | 17;
        q[5] = 0b0100_0000 | 33;
        assert_eq!(scale_min_k4(5, &q), (0x7 | (0b11 << 4), 0xA | (0b01 << 4)));
        assert_eq!(scale_min_k4(1, &q), (17, 33));
    }

    #[test]
    fn packed_scales_and_mins_equal_the_per_sub_block_unpacking() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..1000 {
            let mut q = [0u8; 12];
            for b in q.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let (sc, mn) = scales_mins_k4_packed(&q);
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, &q);
                assert_eq!(
                    ((sc >> (8 * j)) as u8, (mn >> (8 * j)) as u8),
                    (s, m),
                    "{q:?} j={j}"
                );
            }
        }
    }
}
