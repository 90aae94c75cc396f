//! IQ4_XS (GGUF type 23): super-blocks of 256 weights in 136 bytes, 4.25 bits per
//! weight. Dotted with Q8_K activations (llama.cpp's pairing).
//!
//! Format (ggml-common.h / ggml-quants.c at llama.cpp 0c1e570, read from the sdist): an
//! f16 scale `d`, a little-endian u16 `scales_h`, four bytes `scales_l` and 128 bytes of
//! 4-bit indices. The super-block is eight sub-blocks of 32 weights; sub-block `ib` has a
//! 6-bit scale `ls` whose low four bits are nibble `ib % 2` of `scales_l[ib / 2]` and whose
//! high two bits are bits `2ib..2ib + 2` of `scales_h`, used as the signed `ls - 32`
//! (-32..=31). Its indices are `qs[16ib..16ib + 16]`: low nibbles for weights `0..16`,
//! high nibbles for `16..32`, each selecting a level of IQ4_NL's table
//! ([`super::iq4_nl::KVALUES`]). A weight is `d * (ls - 32) * KVALUES[index]`.
use super::iq4_nl::KVALUES;
use super::q8_0::{self, Order};
use super::q8_k::{act_blocks as q8k_blocks, BlockQ8K};
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 136;
/// Weights per sub-block (one 6-bit scale each).
pub const SUB: usize = 32;

/// IQ4_XS block, 4.25 bits per weight (see the module doc for the layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIq4Xs {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// High two bits of the eight sub-block scales, u16 little-endian.
    pub scales_h: [u8; 2],
    /// Low four bits of the sub-block scales, two per byte (sub-block `2i` low nibble).
    pub scales_l: [u8; QK / 64],
    /// Sixteen bytes per sub-block: low nibbles weights 0..16, high nibbles 16..32.
    pub qs: [u8; QK / 2],
}
crate::pod_block!(BlockIq4Xs);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockIq4Xs>(), BLOCK_BYTES);

impl BlockIq4Xs {
    /// The signed scales `ls - 32` of the eight sub-blocks.
    #[inline]
    pub fn scales(&self) -> [i32; QK / SUB] {
        let h = u16::from_le_bytes(self.scales_h) as u32;
        let mut out = [0i32; QK / SUB];
        for (ib, o) in out.iter_mut().enumerate() {
            let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) as u32 & 0xf;
            let hi = (h >> (2 * ib)) & 3;
            *o = (lo | hi << 4) as i32 - 32;
        }
        out
    }

    /// The 32 table values of sub-block `ib`, in weight order.
    #[inline]
    pub fn values(&self, ib: usize) -> [i32; SUB] {
        let q = &self.qs[16 * ib..16 * ib + 16];
        let mut v = [0i32; SUB];
        for (j, &b) in q.iter().enumerate() {
            v[j] = KVALUES[(b & 0x0f) as usize] as i32;
            v[j + 16] = KVALUES[(b >> 4) as usize] as i32;
        }
        v
    }
}

/// Scalar reference dequantization of whole blocks, as `dequantize_row_iq4_xs`:
/// `dl = d * (ls - 32)` per sub-block, `x = dl * KVALUES[index]`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockIq4Xs>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (ib, (os, ls)) in out.chunks_exact_mut(SUB).zip(b.scales()).enumerate() {
            let dl = d * ls as f32;
            for (o, v) in os.iter_mut().zip(b.values(ib)) {
                *o = dl * v as f32;
            }
        }
    }
}

/// The exact integer products of one block with one Q8_K block in llama.cpp's eight x86
/// lanes: lane `l` is `sum over sub-blocks of (ls - 32) * sum(KVALUES[index] * q)` over
/// weights `4l..4l + 4` of each sub-block (what `vpmaddubsw` + `vpmaddwd` by the scale
/// leave). |lane| <= 8 * 32 * 4 * 127 * 128 < 2^24, so its f32 conversion is exact.
#[inline]
pub fn lane_sums(x: &BlockIq4Xs, y: &BlockQ8K) -> [i32; 8] {
    let mut s = [0i32; 8];
    for (ib, ls) in x.scales().into_iter().enumerate() {
        let v = x.values(ib);
        for (l, sl) in s.iter_mut().enumerate() {
            let t: i32 = (4 * l..4 * l + 4).map(|j| v[j] * y.q(SUB * ib + j)).sum();
            *sl += ls * t;
        }
    }
    s
}

/// Scalar reference dot product with one Q8_K activation row, with llama.cpp's x86
/// arithmetic (AVX2 `ggml_vec_dot_iq4_xs_q8_K`): per block `acc[l] = fma(d_w * d_a,
/// lane[l], acc[l])` over the [`lane_sums`], reduced by [`q8_0::hsum8`] at the end.
///
/// llama.cpp's generic C fallback instead rounds one float product per sub-block, which
/// differs in the last bits only.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    vec_dot_in(Order::Lanes8, w, act)
}

/// [`vec_dot`] in either [`Order`]: [`Order::BlockSum`] is llama.cpp's NEON arithmetic,
/// one integer sum per block (|sum| < 2^28; its f32 conversion rounds, as NEON's does)
/// and `acc = fma(d_w * d_a, sum, acc)`.
pub fn vec_dot_in(order: Order, w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockIq4Xs>(w).unwrap_or(&[]);
    let blocks = w
        .iter()
        .zip(q8k_blocks(act))
        .map(|(x, y)| (read_f16(x.d) * y.scale(), lane_sums(x, y)));
    match order {
        Order::Lanes8 => q8_0::lanes8_dot(blocks),
        Order::BlockSum => q8_0::block_sum_dot(blocks.map(|(d, l)| (d, l.iter().sum()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_take_low_nibbles_and_high_bit_pairs() {
        let mut b = BlockIq4Xs {
            d: [0; 2],
            scales_h: 0b11_10_01_00_11_10_01_00u16.to_le_bytes(),
            scales_l: [0x10, 0x32, 0x54, 0xf6],
            qs: [0; QK / 2],
        };
        // ls = nibble | (2 bits << 4), minus 32.
        assert_eq!(b.scales(), [-32, -15, 2, 19, -28, -11, 6, 31]);
        b.scales_h = [0xff, 0xff];
        b.scales_l = [0xff; 4];
        assert_eq!(b.scales(), [31; 8]);
    }
}
