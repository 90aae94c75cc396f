//! IQ2_XXS (GGUF type 16): blocks of 256 weights in 66 bytes, 2.0625 bits per weight.
//! Dotted with Q8_K activations (llama.cpp's pairing).
//!
//! Format (ggml-common.h / ggml-quants.c at llama.cpp 0c1e570, read from the sdist; the
//! grid below is that file's `iq2xxs_grid` table, data needed to read the format): an
//! f16 scale `d`, then eight 8-byte groups, one per 32 weights. Group `g` read as two
//! little-endian u32 `a0, a1`: byte `l` of `a0` indexes [`GRID`] for weights `8l..8l + 8`
//! (each grid entry is eight magnitudes from {8, 25, 43}, byte `j` for weight `j`); bits
//! `7l..7l + 7` of `a1` are the signs of those eight weights in [`signs`]' form (seven
//! stored bits, the eighth makes the count of minus signs even); `a1 >> 28` is the
//! group's 4-bit scale `s`. A weight is `d * (0.5 + s) * 0.25 * grid * sign`.
use super::q8_k::act_blocks as q8k_blocks;
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 66;

/// IQ2_XXS block, 2.0625 bits per weight (see the module doc for the layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIq2Xxs {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Eight groups of 8 bytes: four grid indices, then signs and scale (u32 LE).
    pub qs: [u8; QK / 4],
}
crate::pod_block!(BlockIq2Xxs);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockIq2Xxs>(), BLOCK_BYTES);

/// The 256 grid points: eight magnitudes each (byte `j` = weight `j`), llama.cpp's
/// `iq2xxs_grid`.
pub const GRID: [u64; 256] = [
    0x0808080808080808,
    0x080808080808082b,
    0x0808080808081919,
    0x0808080808082b08,
    0x0808080808082b2b,
    0x0808080808190819,
    0x0808080808191908,
    0x08080808082b0808,
    0x08080808082b082b,
    0x08080808082b2b08,
    0x08080808082b2b2b,
    0x0808080819080819,
    0x0808080819081908,
    0x0808080819190808,
    0x0808080819192b08,
    0x08080808192b0819,
    0x08080808192b1908,
    0x080808082b080808,
    0x080808082b08082b,
    0x080808082b082b2b,
    0x080808082b2b082b,
    0x0808081908080819,
    0x0808081908081908,
    0x0808081908190808,
    0x0808081908191919,
    0x0808081919080808,
    0x080808192b081908,
    0x080808192b192b08,
    0x0808082b08080808,
    0x0808082b0808082b,
    0x0808082b082b082b,
    0x0808082b2b08082b,
    0x0808190808080819,
    0x0808190808081908,
    0x0808190808190808,
    0x08081908082b0819,
    0x08081908082b1908,
    0x0808190819080808,
    0x080819081908082b,
    0x0808190819082b08,
    0x08081908192b0808,
    0x080819082b080819,
    0x080819082b081908,
    0x080819082b190808,
    0x080819082b2b1908,
    0x0808191908080808,
    0x080819190808082b,
    0x0808191908082b08,
    0x08081919082b0808,
    0x080819191908192b,
    0x08081919192b2b19,
    0x080819192b080808,
    0x080819192b190819,
    0x0808192b08082b19,
    0x0808192b08190808,
    0x0808192b19080808,
    0x0808192b2b081908,
    0x0808192b2b2b1908,
    0x08082b0808080808,
    0x08082b0808081919,
    0x08082b0808082b08,
    0x08082b0808191908,
    0x08082b08082b2b08,
    0x08082b0819080819,
    0x08082b0819081908,
    0x08082b0819190808,
    0x08082b081919082b,
    0x08082b082b082b08,
    0x08082b1908081908,
    0x08082b1919080808,
    0x08082b2b0808082b,
    0x08082b2b08191908,
    0x0819080808080819,
    0x0819080808081908,
    0x0819080808190808,
    0x08190808082b0819,
    0x0819080819080808,
    0x08190808192b0808,
    0x081908082b081908,
    0x081908082b190808,
    0x081908082b191919,
    0x0819081908080808,
    0x0819081908082b08,
    0x08190819082b0808,
    0x0819081919190808,
    0x0819081919192b2b,
    0x081908192b080808,
    0x0819082b082b1908,
    0x0819082b19081919,
    0x0819190808080808,
    0x0819190808082b08,
    0x08191908082b0808,
    0x08191908082b1919,
    0x0819190819082b19,
    0x081919082b080808,
    0x0819191908192b08,
    0x08191919192b082b,
    0x0819192b08080808,
    0x0819192b0819192b,
    0x08192b0808080819,
    0x08192b0808081908,
    0x08192b0808190808,
    0x08192b0819080808,
    0x08192b082b080819,
    0x08192b1908080808,
    0x08192b1908081919,
    0x08192b192b2b0808,
    0x08192b2b19190819,
    0x082b080808080808,
    0x082b08080808082b,
    0x082b080808082b2b,
    0x082b080819081908,
    0x082b0808192b0819,
    0x082b08082b080808,
    0x082b08082b08082b,
    0x082b0819082b2b19,
    0x082b081919082b08,
    0x082b082b08080808,
    0x082b082b0808082b,
    0x082b190808080819,
    0x082b190808081908,
    0x082b190808190808,
    0x082b190819080808,
    0x082b19081919192b,
    0x082b191908080808,
    0x082b191919080819,
    0x082b1919192b1908,
    0x082b192b2b190808,
    0x082b2b0808082b08,
    0x082b2b08082b0808,
    0x082b2b082b191908,
    0x082b2b2b19081908,
    0x1908080808080819,
    0x1908080808081908,
    0x1908080808190808,
    0x1908080808192b08,
    0x19080808082b0819,
    0x19080808082b1908,
    0x1908080819080808,
    0x1908080819082b08,
    0x190808081919192b,
    0x19080808192b0808,
    0x190808082b080819,
    0x190808082b081908,
    0x190808082b190808,
    0x1908081908080808,
    0x19080819082b0808,
    0x19080819192b0819,
    0x190808192b080808,
    0x190808192b081919,
    0x1908082b08080819,
    0x1908082b08190808,
    0x1908082b19082b08,
    0x1908082b1919192b,
    0x1908082b192b2b08,
    0x1908190808080808,
    0x1908190808082b08,
    0x19081908082b0808,
    0x190819082b080808,
    0x190819082b192b19,
    0x190819190819082b,
    0x19081919082b1908,
    0x1908192b08080808,
    0x19082b0808080819,
    0x19082b0808081908,
    0x19082b0808190808,
    0x19082b0819080808,
    0x19082b0819081919,
    0x19082b1908080808,
    0x19082b1919192b08,
    0x19082b19192b0819,
    0x19082b192b08082b,
    0x19082b2b19081919,
    0x19082b2b2b190808,
    0x1919080808080808,
    0x1919080808082b08,
    0x1919080808190819,
    0x1919080808192b19,
    0x19190808082b0808,
    0x191908082b080808,
    0x191908082b082b08,
    0x1919081908081908,
    0x191908191908082b,
    0x191908192b2b1908,
    0x1919082b2b190819,
    0x191919082b190808,
    0x191919082b19082b,
    0x1919191908082b2b,
    0x1919192b08080819,
    0x1919192b19191908,
    0x19192b0808080808,
    0x19192b0808190819,
    0x19192b0808192b19,
    0x19192b08192b1908,
    0x19192b1919080808,
    0x19192b2b08082b08,
    0x192b080808081908,
    0x192b080808190808,
    0x192b080819080808,
    0x192b0808192b2b08,
    0x192b081908080808,
    0x192b081919191919,
    0x192b082b08192b08,
    0x192b082b192b0808,
    0x192b190808080808,
    0x192b190808081919,
    0x192b191908190808,
    0x192b19190819082b,
    0x192b19192b081908,
    0x192b2b081908082b,
    0x2b08080808080808,
    0x2b0808080808082b,
    0x2b08080808082b2b,
    0x2b08080819080819,
    0x2b0808082b08082b,
    0x2b08081908081908,
    0x2b08081908192b08,
    0x2b08081919080808,
    0x2b08082b08190819,
    0x2b08190808080819,
    0x2b08190808081908,
    0x2b08190808190808,
    0x2b08190808191919,
    0x2b08190819080808,
    0x2b081908192b0808,
    0x2b08191908080808,
    0x2b0819191908192b,
    0x2b0819192b191908,
    0x2b08192b08082b19,
    0x2b08192b19080808,
    0x2b08192b192b0808,
    0x2b082b080808082b,
    0x2b082b1908081908,
    0x2b082b2b08190819,
    0x2b19080808081908,
    0x2b19080808190808,
    0x2b190808082b1908,
    0x2b19080819080808,
    0x2b1908082b2b0819,
    0x2b1908190819192b,
    0x2b1908192b080808,
    0x2b19082b19081919,
    0x2b19190808080808,
    0x2b191908082b082b,
    0x2b19190819081908,
    0x2b19191919190819,
    0x2b192b082b080819,
    0x2b192b19082b0808,
    0x2b2b08080808082b,
    0x2b2b080819190808,
    0x2b2b08082b081919,
    0x2b2b081908082b19,
    0x2b2b082b08080808,
    0x2b2b190808192b08,
    0x2b2b2b0819190808,
    0x2b2b2b1908081908,
];

/// The eight sign bits of code `c` (0..128): the seven stored bits, and bit 7 set when
/// their count is odd (so every group of eight has an even number of minus signs).
#[inline]
pub const fn signs(c: u32) -> u8 {
    let c = (c & 127) as u8;
    c | (((c.count_ones() & 1) as u8) << 7)
}

impl BlockIq2Xxs {
    /// Group `g` (0..8) as `(grid indices, sign and scale word)`.
    #[inline]
    fn group(&self, g: usize) -> ([u8; 4], u32) {
        let q = &self.qs[8 * g..8 * g + 8];
        (
            [q[0], q[1], q[2], q[3]],
            u32::from_le_bytes([q[4], q[5], q[6], q[7]]),
        )
    }

    /// `(magnitude, negative)` of the eight weights `8l..8l + 8` of group `g`, and the
    /// group's 4-bit scale.
    #[inline]
    pub fn octet(&self, g: usize, l: usize) -> ([u8; 8], u8, u32) {
        let (idx, a1) = self.group(g);
        (
            GRID[idx[l] as usize].to_le_bytes(),
            signs(a1 >> (7 * l)),
            a1 >> 28,
        )
    }
}

/// Scalar reference dequantization of whole blocks, as `dequantize_row_iq2_xxs`:
/// `db = d * (0.5 + s) * 0.25` per group, `x = db * grid * sign`.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockIq2Xxs>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (g, og) in out.chunks_exact_mut(32).enumerate() {
            for (l, o8) in og.chunks_exact_mut(8).enumerate() {
                let (grid, sg, s) = b.octet(g, l);
                let db = d * (0.5 + s as f32) * 0.25;
                for (j, o) in o8.iter_mut().enumerate() {
                    let sign = if sg & (1 << j) != 0 { -1.0 } else { 1.0 };
                    *o = db * grid[j] as f32 * sign;
                }
            }
        }
    }
}

/// Integer sum of one block with one Q8_K block: `sum over groups of (2s + 1) *
/// sum(grid * sign * q)` (exact in i32).
#[inline]
pub fn block_isum(x: &BlockIq2Xxs, qs: &[u8; QK]) -> i32 {
    let mut bsum = 0i32;
    for g in 0..8 {
        let mut sumi = 0i32;
        let mut s = 0;
        for l in 0..4 {
            let (grid, sg, sc) = x.octet(g, l);
            s = sc;
            for (j, m) in grid.iter().enumerate() {
                let q = qs[32 * g + 8 * l + j] as i8 as i32;
                let v = *m as i32 * q;
                sumi += if sg & (1 << j) != 0 { -v } else { v };
            }
        }
        bsum += sumi * (2 * s as i32 + 1);
    }
    bsum
}

/// Scalar reference dot product with one Q8_K activation row, as
/// `ggml_vec_dot_iq2_xxs_q8_K_generic`: per block `sumf += (d_w * d_a) * bsum` with the
/// exact integer [`block_isum`], then `0.125 * sumf`.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockIq2Xxs>(w).unwrap_or(&[]);
    let a = q8k_blocks(act);
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let d = read_f16(x.d) * y.scale();
        sumf += d * block_isum(x, &y.qs) as f32;
    }
    0.125 * sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_have_even_parity_and_keep_the_stored_bits() {
        for c in 0..128u32 {
            let s = signs(c);
            assert_eq!(s & 127, c as u8);
            assert_eq!(s.count_ones() % 2, 0);
        }
        // Spot values of llama.cpp's `ksigns_iq2xs`.
        assert_eq!(
            [signs(1), signs(3), signs(7), signs(127)],
            [129, 3, 135, 255]
        );
    }

    #[test]
    fn grid_holds_only_the_three_magnitudes() {
        for v in GRID {
            assert!(v.to_le_bytes().iter().all(|b| matches!(b, 8 | 25 | 43)));
        }
    }
}
