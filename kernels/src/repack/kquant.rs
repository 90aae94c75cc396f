//! Repacked K-quant layouts (Q4_K, Q6_K: the bulk of a `Q4_K_M` file) for the lanes of
//! `sdot` by element, and the scalar reference of the arithmetic their kernels use.
//!
//! Both keep the Q8_0x4s idea: a group of four rows, every 16-byte chunk holding four
//! bytes of each of the four rows (chunk `k`: byte `4r + j` is byte `4k + j` of row `r`),
//! so that one `sdot` by element (or, without dotprod, one `smull`/`smull2` pair against
//! a broadcast activation word) leaves the four rows' partial sums in four lanes and a
//! 16- or 32-weight scale group is one chain of them plus one multiply-add by the four
//! rows' scales. The scales of the four rows are stored transposed (sub-block major, the
//! four rows adjacent), so once decoded each sub-block's four scales are one vector.
//!
//! - [`BlockQ4Kx4`] (`Layout::Q4Kx4`): the four rows' `d`, then their `dmin`; the three
//!   4-byte words of the packed 6-bit scales, word `w` as one vector with byte `4j + r` =
//!   byte `4w + j` of row `r` (every step of [`crate::quant::q4_k::scales_mins_k4_packed`]
//!   works byte by byte, so it decodes the four rows at once); then the nibble chunks.
//! - [`BlockQ6Kx4`] (`Layout::Q6Kx4`): the 6-bit quants re-cut so that every 16-byte
//!   vector of weights is one or three instructions away. Each weight is stored as
//!   `s = u - 32` (6-bit two's complement) in the top six bits of a byte, so masking
//!   the low two bits off gives `4s` as an exact int8 (`sdot` then sums `4 s a`; the
//!   `- 32` needs no correction and the factor 4 comes off the block's integer with one
//!   shift). Three such bytes hold weights A, B, C and, in their low bit pairs, the six
//!   bits of a fourth weight D: `4 s_D = sli(sli(X << 2, Y, 4), Z, 6)`. Part `p` (groups
//!   `4p..4p + 4`) is twelve chunks: X, Y, Z for chunk position `m` at `12p + m`,
//!   `12p + 4 + m`, `12p + 8 + m`; byte `4r + j` of them holds weights `16(4p + k) + 4m + j`
//!   of row `r`, `k` = 0 (A, in X), 1 (B, Y), 2 (C, Z), 3 (D, the low bits). Then the
//!   sixteen signed scales transposed (vector `v`, byte `4j + r` = scale `4v + j` of row
//!   `r`) and the four `d`.
//!
//! # Arithmetic ([`q8_k::kquant_dot_blocksum`])
//! The plain K-quant kernels compute llama.cpp's x86 eight-lane order
//! ([`crate::quant::q8_k::kquant_dot`]); a four-row lane holds one row, not a lane of
//! eight, so the repacked kernels sum each block *exactly* in one int32 (wrapping):
//! `I = sum_g scale[g] * sum_{i in g} u[i] q8[i] - offset`, and per (row, token) keep two
//! f32 accumulators, `acc = fma(d * d_a, I, acc)` and `accm = fma(dmin * d_a, M, accm)`
//! (`M` the minimums' integer, Q4_K only), giving `acc - accm`: the same order as
//! `q8_0::Order::BlockSum` for the block-32 formats, and the one the plain aarch64 NEON
//! K-quant kernels compute too (so repacking never changes a bit). It differs from the
//! eight-lane sum by float rounding only (a few ulp of the row's magnitude).
use crate::quant::q4_k::{self, BlockQ4K};
use crate::quant::q6_k::{self, BlockQ6K};
use crate::quant::q8_0::Order;
use crate::quant::q8_k;

use super::{row_block, Group, Layout};

/// One block of four Q4_K rows for `sdot` by element.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4Kx4 {
    /// `d` of rows 0..4, then `dmin` of rows 0..4 (f16 little-endian).
    pub d: [[u8; 2]; 8],
    /// Word `w` of the packed scales: byte `4j + r` is scale byte `4w + j` of row `r`.
    pub scales: [[u8; 16]; 3],
    /// Chunk `k`: nibble bytes `4k..4k+4` of rows 0, 1, 2, 3 (low nibbles are weights
    /// `64(k / 8) + 4(k % 8)..`, high nibbles the same plus 32).
    pub qs: [[u8; 16]; 32],
}
crate::pod_block!(BlockQ4Kx4);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ4Kx4>(), 4 * q4_k::BLOCK_BYTES);

/// One block of four Q6_K rows for `sdot` by element (see the module doc).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6Kx4 {
    /// Four parts of twelve chunks (X, Y, Z for chunk positions 0..4).
    pub q: [[u8; 16]; 48],
    /// Vector `v`: byte `4j + r` is the (signed) scale of group `4v + j` of row `r`.
    pub scales: [[u8; 16]; 4],
    /// `d` of rows 0..4 (f16 little-endian).
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockQ6Kx4);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ6Kx4>(), 4 * q6_k::BLOCK_BYTES);

/// Chunks of four bytes of each of four rows: `out[k][4r + j] = row r [4k + j]`.
fn interleave<const K: usize>(rows: [&[u8]; 4]) -> [[u8; 16]; K] {
    core::array::from_fn(|k| core::array::from_fn(|i| rows[i / 4][4 * k + i % 4]))
}

/// The inverse of [`interleave`] for row `r`.
fn deinterleave<const N: usize>(chunks: &[[u8; 16]], r: usize) -> [u8; N] {
    core::array::from_fn(|q| chunks[q / 4][4 * r + q % 4])
}

/// Row-major bytes transposed per 4-byte word: `out[w][4j + r] = row r [4w + j]`.
fn transpose<const W: usize>(rows: [&[u8]; 4]) -> [[u8; 16]; W] {
    core::array::from_fn(|w| core::array::from_fn(|i| rows[i % 4][4 * w + i / 4]))
}

/// The inverse of [`transpose`] for row `r`.
fn untranspose<const N: usize>(v: &[[u8; 16]], r: usize) -> [u8; N] {
    core::array::from_fn(|q| v[q / 4][4 * (q % 4) + r])
}

impl Group for BlockQ4Kx4 {
    const ROWS: usize = 4;
    type Plain = BlockQ4K;
    fn pack(rows: &[&BlockQ4K]) -> Self {
        let rows: [&BlockQ4K; 4] = core::array::from_fn(|r| rows[r]);
        BlockQ4Kx4 {
            d: core::array::from_fn(|i| if i < 4 { rows[i].d } else { rows[i - 4].dmin }),
            scales: transpose(rows.map(|b| &b.scales[..])),
            qs: interleave(rows.map(|b| &b.qs[..])),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ4K {
        BlockQ4K {
            d: self.d[r],
            dmin: self.d[4 + r],
            scales: untranspose(&self.scales, r),
            qs: deinterleave(&self.qs, r),
        }
    }
}

impl Group for BlockQ6Kx4 {
    const ROWS: usize = 4;
    type Plain = BlockQ6K;
    fn pack(rows: &[&BlockQ6K]) -> Self {
        // 6-bit two's complement of q - 32 (= the unsigned quant with its top bit flipped).
        let s: [[u8; 256]; 4] =
            core::array::from_fn(|r| rows[r].quants().map(|q| (q as u8) & 0x3f));
        let q = core::array::from_fn(|c| {
            let (p, kind, m) = (c / 12, c % 12 / 4, c % 4);
            core::array::from_fn(|b| {
                let (r, j) = (b / 4, b % 4);
                let w = |k: usize| s[r][16 * (4 * p + k) + 4 * m + j];
                (w(kind) << 2) | ((w(3) >> (2 * kind)) & 3)
            })
        });
        BlockQ6Kx4 {
            q,
            scales: transpose(core::array::from_fn(|r| &rows[r].scales[..])),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ6K {
        let mut u = [0u8; 256];
        for c in 0..48 {
            let (p, kind, m) = (c / 12, c % 12 / 4, c % 4);
            for j in 0..4 {
                let b = self.q[c][4 * r + j];
                let base = 16 * 4 * p + 4 * m + j;
                // Back to unsigned: flip the top bit of the 6-bit value.
                u[base + 16 * kind] = (b >> 2) ^ 0x20;
                u[base + 48] ^= (b & 3) << (2 * kind);
            }
        }
        for p in 0..4 {
            for i in 0..16 {
                u[64 * p + 48 + i] ^= 0x20;
            }
        }
        q6_k_block(&u, untranspose(&self.scales, r), self.d[r])
    }
}

/// A Q6_K block from its 256 unsigned quants (0..64, weight order), scales and `d`.
fn q6_k_block(u: &[u8; 256], scales: [u8; 16], d: [u8; 2]) -> BlockQ6K {
    let mut b = BlockQ6K {
        ql: [0; 128],
        qh: [0; 64],
        scales,
        d,
    };
    // Weight 128h + 32k + l: low bits in ql[64h + 32(k % 2) + l] (high nibble for k >= 2),
    // top bits in bits 2k.. of qh[32h + l].
    for (i, &q) in u.iter().enumerate() {
        let (h, k, l) = (i / 128, i % 128 / 32, i % 32);
        b.ql[64 * h + 32 * (k % 2) + l] |= (q & 0xf) << (4 * (k / 2));
        b.qh[32 * h + l] |= (q >> 4) << (2 * k);
    }
    b
}

/// Scalar reference of row `r` of a tensor of `n_rows` rows in a K-quant layout (`w`:
/// all of its rows) dotted with one Q8_K row: whole groups in the order of their kernels
/// ([`q8_k::kquant_dot_blocksum`]), plain tail rows in `order` (the plain kernels').
pub(super) fn dot_row(
    layout: Layout,
    order: Order,
    w: &[u8],
    row_bytes: usize,
    r: usize,
    act: &[u8],
) -> f32 {
    let n_rows = w.len() / row_bytes.max(1);
    let o = if r < n_rows / 4 * 4 {
        Order::BlockSum
    } else {
        order
    };
    let ys = q8_k::act_blocks(act);
    match layout {
        Layout::Q4Kx4 => {
            let nb = row_bytes / q4_k::BLOCK_BYTES;
            let x = (0..nb).map(|b| row_block::<BlockQ4Kx4>(w, row_bytes, n_rows, r, b));
            q8_k::kquant_dot_in(
                o,
                x.zip(ys)
                    .map(|(x, y)| (q4_k::terms(&x, y), x.quants().map(|q| q as u8), y)),
            )
        }
        _ => {
            let nb = row_bytes / q6_k::BLOCK_BYTES;
            let x = (0..nb).map(|b| row_block::<BlockQ6Kx4>(w, row_bytes, n_rows, r, b));
            q8_k::kquant_dot_in(
                o,
                x.zip(ys).map(|(x, y)| {
                    let u = x.quants().map(|q| (q as i32 + 32) as u8);
                    (q6_k::terms(&x, y), u, y)
                }),
            )
        }
    }
}
