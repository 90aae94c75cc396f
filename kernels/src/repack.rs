//! Repacked (row-interleaved) weight layouts.
//!
//! A weight matrix in GGUF is stored row after row, so a kernel that computes four rows
//! at once reads four streams a whole row apart (for the 262144 x 640 Q8_0 head of
//! Gemma 3 270M, 680 bytes apart), which the hardware prefetcher follows badly. A
//! repacked matrix stores the rows of a group of four interleaved block by block, so the
//! same tile reads one sequential stream, and arranges each group-block for the
//! instructions that consume it:
//!
//! - [`Layout::Q8_0x4`] ([`BlockQ8_0x4`]): the four rows' 32 quants, then the four f16
//!   scales (one `fcvtl` on NEON). x86 (AVX2/AVX-512) and baseline NEON, whose products
//!   run along one row.
//! - [`Layout::Q8_0x4s`] ([`BlockQ8_0x4s`]): eight 16-byte chunks, chunk `k` holding
//!   quants `4k..4k+4` of rows 0, 1, 2, 3, then the scales: one `sdot` by element multiplies a
//!   chunk by four activation bytes and leaves the four rows' sums in its four lanes,
//!   so a group-block costs eight `sdot` and no reduction. NEON with dotprod.
//! - [`Layout::Q5_0x4s`] ([`BlockQ5_0x4s`]): four chunks of the rows' nibble
//!   bytes in the same order (chunk `k`: bytes `4k..4k+4` of each row, whose low nibbles
//!   are weights `4k..` and high nibbles `16 + 4k..`), then the 128 fifth bits
//!   bit-sliced over 16 bytes: byte `4r + j`, bit `k` is weight `4k + j` of row `r`, bit
//!   `4 + k` weight `16 + 4k + j`, then the scales. A shift and a mask then give any chunk's fifth bits
//!   (the plain layout needs a table lookup and a compare per 16 weights). NEON, and x86
//!   with AVX-512 VNNI, where the 64 nibble bytes are one vector whose 32-bit element
//!   `(k, r)` is row `r`'s x86 lane `k` (`crate::arch` `x86_q5_0x4s`).
//! - [`Layout::Q5_0x4d`] ([`BlockQ5_0x4d`]): Q5_0 for `sdot` by element, each weight
//!   as `8 (q - 16)` in the top five bits of a byte (one mask away), the low three bits
//!   of those bytes and a 16-byte word of bit pairs carrying the other sixteen weights
//!   (three instructions per 16 weights); no `- 16` term. NEON with dotprod.
//! - [`Layout::Q4_0x4s`] ([`BlockQ4_0x4s`]): Q4_0's nibble bytes in Q5_0x4s's chunk
//!   order, then the scales; the kernels mask or shift a chunk into sixteen unsigned
//!   quants `q` (`and` / `ushr`) and start the sums at `-8 sum(a)` (the `- 8` of every
//!   weight, once per block and token). NEON.
//! - [`Layout::Q4Kx4`] ([`BlockQ4Kx4`]), [`Layout::Q6Kx4`] ([`BlockQ6Kx4`]): the same
//!   chunks for the K-quants' quant bytes, the scales transposed so each sub-block's four
//!   scales are one vector; their kernels sum each block exactly (see [`kquant`]). NEON.
//!
//! The group-blocks of group `g` (rows `4g..4g+4`) fill bytes `4g * row_bytes ..
//! 4(g+1) * row_bytes`, exactly the bytes the four plain rows occupied, so a repacked
//! tensor has the plain tensor's size and [`repack_in_place`] needs no second copy of
//! it. When the row count is not a multiple of four, the last `rows % 4` rows stay plain
//! at the end (no padding, so sizes never change and offsets into a cache file are the
//! plain ones).
//!
//! Every product over a repacked matrix ([`matmul_rows`]) gives, per (row, token), the
//! plain kernels' bits for the same CPU features: the same blocks in the same order with
//! the same float steps ([`crate::quant::q8_0::Order`]). The K-quant layouts (Q4Kx4,
//! Q6Kx4, Q2Kx8) sum each block exactly before one float step per block, which is the
//! plain kernels' order wherever they have kernels (aarch64 NEON,
//! [`crate::quant::q8_k::order_of`]); elsewhere only their scalar loop runs, and
//! [`has_fast_kernel`] keeps them from being chosen. So any layout can hold any copy of a
//! matrix (a resident stack of experts, an expert paged into a slot) without changing a
//! bit.
use core::ops::Range;

pub mod kquant;
pub use kquant::{BlockQ4Kx4, BlockQ6Kx4};

use crate::blocks::{cast, cast_mut, Pod};
use crate::matvec::KernelError;
use crate::quant::q1_0::{self, BlockQ1_0};
use crate::quant::q4_0::{self, BlockQ4_0};
use crate::quant::q5_0::{self, BlockQ5_0};
use crate::quant::q8_0::{self, BlockQ8_0, Order, QK};
use crate::quant::{q2_k, q8_k};
use crate::{CpuFeatures, GgmlType};

pub use crate::repack_lowbit::{BlockQ2Kx8, BlockQ2_0x4, BlockTq1_0x4, BlockTq2_0x4};
pub use crate::repack_lowbit::{BlockQ2_0x16, BlockQ2_0x16d, BlockTq2_0x16, BlockTq2_0x16d};

/// How a weight tensor's bytes are arranged in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// As in GGUF: row after row.
    #[default]
    Plain,
    /// Q8_0, groups of four rows interleaved block by block ([`BlockQ8_0x4`]).
    Q8_0x4,
    /// Q8_0, groups of four rows interleaved four bytes at a time ([`BlockQ8_0x4s`]).
    Q8_0x4s,
    /// Q5_0, groups of four rows, nibbles four bytes at a time and fifth bits
    /// bit-sliced ([`BlockQ5_0x4s`]).
    Q5_0x4s,
    /// Q1_0, groups of sixteen rows, the rows' sign bytes side by side
    /// ([`BlockQ1_0x16`], for the lookup-table kernel).
    Q1_0x16,
    /// Q1_0 in the bytes of [`Layout::Q1_0x16`], multiplied through 8-bit tables: the
    /// inexact arithmetic of [`crate::quant::lut8`], chosen only on request (`--lut8`),
    /// never by [`Layout::preferred`].
    Q1_0x16Lut8,
    /// Q2_0 in the bytes of [`Layout::Q2_0x16`] through 8-bit tables, as
    /// [`Layout::Q1_0x16Lut8`].
    Q2_0x16Lut8,
    /// Q2_K, groups of eight rows, quants regrouped per 16-weight group for `sdot` by
    /// element ([`BlockQ2Kx8`], block-sum arithmetic: [`crate::quant::q2_k::vec_dot_block_sum`]).
    Q2Kx8,
    /// TQ2_0, groups of four rows, codes regrouped per 16-weight group ([`BlockTq2_0x4`]).
    Tq2_0x4,
    /// Q2_0, groups of four rows, codes regrouped per 16-weight group ([`BlockQ2_0x4`]).
    Q2_0x4,
    /// TQ1_0, groups of four rows, base-3 bytes four at a time per row ([`BlockTq1_0x4`]).
    Tq1_0x4,
    /// Q4_K, groups of four rows, nibbles four bytes at a time ([`BlockQ4Kx4`]).
    Q4Kx4,
    /// Q5_0, groups of four rows, weights as `8 (q - 16)` for `sdot` ([`BlockQ5_0x4d`]).
    Q5_0x4d,
    /// Q6_K, groups of four rows, quant bytes four at a time ([`BlockQ6Kx4`]).
    Q6Kx4,
    /// TQ2_0, groups of sixteen rows, each byte four consecutive codes
    /// ([`BlockTq2_0x16`], for the pair-table kernel).
    Tq2_0x16,
    /// Q2_0, groups of sixteen rows, the rows' bytes side by side ([`BlockQ2_0x16`], for
    /// the pair-table kernel).
    Q2_0x16,
    /// Q2_0, groups of sixteen rows interleaved across the 2-bit fields of each byte
    /// ([`BlockQ2_0x16d`], for `sdot` by element without accumulator merges).
    Q2_0x16d,
    /// TQ2_0, groups of sixteen rows interleaved as [`Layout::Q2_0x16d`]
    /// ([`BlockTq2_0x16d`]).
    Tq2_0x16d,
    /// Q4_0, groups of four rows, nibble bytes four at a time ([`BlockQ4_0x4s`]).
    Q4_0x4s,
}

impl Layout {
    /// Stable id (stored in repack cache files).
    pub fn id(self) -> u32 {
        match self {
            Layout::Plain => 0,
            // 1 was Q8_0x4 with the scales first (caches holding it are rebuilt).
            Layout::Q8_0x4 => 4,
            Layout::Q8_0x4s => 2,
            Layout::Q5_0x4s => 3,
            Layout::Q1_0x16 => 5,
            Layout::Q1_0x16Lut8 => 19,
            Layout::Q2_0x16Lut8 => 20,
            Layout::Q2Kx8 => 10,
            Layout::Tq2_0x4 => 11,
            Layout::Q2_0x4 => 12,
            Layout::Tq1_0x4 => 13,
            Layout::Q4Kx4 => 6,
            Layout::Q6Kx4 => 7,
            Layout::Q5_0x4d => 8,
            Layout::Tq2_0x16 => 14,
            Layout::Q2_0x16 => 15,
            Layout::Q2_0x16d => 16,
            Layout::Tq2_0x16d => 17,
            Layout::Q4_0x4s => 18,
        }
    }
    /// The layout of id `id`, if known.
    pub fn from_id(id: u32) -> Option<Layout> {
        match id {
            0 => Some(Layout::Plain),
            4 => Some(Layout::Q8_0x4),
            2 => Some(Layout::Q8_0x4s),
            3 => Some(Layout::Q5_0x4s),
            5 => Some(Layout::Q1_0x16),
            19 => Some(Layout::Q1_0x16Lut8),
            20 => Some(Layout::Q2_0x16Lut8),
            10 => Some(Layout::Q2Kx8),
            11 => Some(Layout::Tq2_0x4),
            12 => Some(Layout::Q2_0x4),
            13 => Some(Layout::Tq1_0x4),
            6 => Some(Layout::Q4Kx4),
            7 => Some(Layout::Q6Kx4),
            8 => Some(Layout::Q5_0x4d),
            14 => Some(Layout::Tq2_0x16),
            15 => Some(Layout::Q2_0x16),
            16 => Some(Layout::Q2_0x16d),
            17 => Some(Layout::Tq2_0x16d),
            18 => Some(Layout::Q4_0x4s),
            _ => None,
        }
    }
    /// Rows per interleaved group (1 for [`Layout::Plain`]).
    pub fn group_rows(self) -> usize {
        match self {
            Layout::Plain => 1,
            Layout::Q1_0x16
            | Layout::Q1_0x16Lut8
            | Layout::Q2_0x16Lut8
            | Layout::Tq2_0x16
            | Layout::Q2_0x16
            | Layout::Q2_0x16d
            | Layout::Tq2_0x16d => 16,
            Layout::Q2Kx8 => 8,
            _ => 4,
        }
    }
    /// Short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Plain => "plain",
            Layout::Q8_0x4 => "q8_0x4",
            Layout::Q8_0x4s => "q8_0x4s",
            Layout::Q5_0x4s => "q5_0x4s",
            Layout::Q1_0x16 => "q1_0x16",
            Layout::Q1_0x16Lut8 => "q1_0x16-lut8",
            Layout::Q2_0x16Lut8 => "q2_0x16-lut8",
            Layout::Q2Kx8 => "q2_kx8",
            Layout::Tq2_0x4 => "tq2_0x4",
            Layout::Q2_0x4 => "q2_0x4",
            Layout::Tq1_0x4 => "tq1_0x4",
            Layout::Q4Kx4 => "q4_kx4",
            Layout::Q6Kx4 => "q6_kx4",
            Layout::Q5_0x4d => "q5_0x4d",
            Layout::Tq2_0x16 => "tq2_0x16",
            Layout::Q2_0x16 => "q2_0x16",
            Layout::Q2_0x16d => "q2_0x16d",
            Layout::Tq2_0x16d => "tq2_0x16d",
            Layout::Q4_0x4s => "q4_0x4s",
        }
    }
    /// The repacked layout pinch uses for weights of type `ty` on a CPU with `feat`, if
    /// any: the first one the CPU's kernel table lists for `ty` (only layouts with a SIMD
    /// kernel there: without one, plain rows are faster).
    pub fn preferred(ty: GgmlType, feat: &CpuFeatures) -> Option<Layout> {
        crate::arch::table(feat).preferred_layout(ty)
    }
    /// [`Layout::preferred`], or with `lut8` (`--lut8`) the 8-bit table layout of Q1_0
    /// and Q2_0 where the CPU's table has a kernel for it.
    pub fn preferred_with(ty: GgmlType, feat: &CpuFeatures, lut8: bool) -> Option<Layout> {
        let t = crate::arch::table(feat);
        let l8 = match ty {
            GgmlType::Q1_0 => Some(Layout::Q1_0x16Lut8),
            GgmlType::Q2_0 => Some(Layout::Q2_0x16Lut8),
            _ => None,
        };
        match l8 {
            Some(l) if lut8 && t.has_packed(l) => Some(l),
            _ => t.preferred_layout(ty),
        }
    }
    /// Whether this layout's kernels compute the type's reference arithmetic (every
    /// layout but the 8-bit table ones of `--lut8`, which [`Layout::preferred`] skips).
    pub fn is_exact(self) -> bool {
        !matches!(self, Layout::Q1_0x16Lut8 | Layout::Q2_0x16Lut8)
    }
    /// The type tensors in this layout have (`None` for [`Layout::Plain`]: any).
    fn ty(self) -> Option<GgmlType> {
        match self {
            Layout::Plain => None,
            Layout::Q8_0x4 | Layout::Q8_0x4s => Some(GgmlType::Q8_0),
            Layout::Q5_0x4s | Layout::Q5_0x4d => Some(GgmlType::Q5_0),
            Layout::Q4_0x4s => Some(GgmlType::Q4_0),
            Layout::Q1_0x16 | Layout::Q1_0x16Lut8 => Some(GgmlType::Q1_0),
            Layout::Q2Kx8 => Some(GgmlType::Q2_K),
            Layout::Tq2_0x4 | Layout::Tq2_0x16 | Layout::Tq2_0x16d => Some(GgmlType::TQ2_0),
            Layout::Q2_0x4 | Layout::Q2_0x16 | Layout::Q2_0x16d | Layout::Q2_0x16Lut8 => {
                Some(GgmlType::Q2_0)
            }
            Layout::Tq1_0x4 => Some(GgmlType::TQ1_0),
            Layout::Q4Kx4 => Some(GgmlType::Q4_K),
            Layout::Q6Kx4 => Some(GgmlType::Q6_K),
        }
    }
    /// The most rows a group of any repacked layout of `ty` has (1: none), whatever the
    /// CPU: what a plan sizes repack scratch by before it knows the layout.
    pub fn max_group_rows(ty: GgmlType) -> usize {
        (1..=u8::MAX as u32)
            .filter_map(Layout::from_id)
            .filter(|l| l.ty() == Some(ty))
            .map(Layout::group_rows)
            .max()
            .unwrap_or(1)
    }
    /// Whether tensors of type `ty` can have this layout.
    pub fn fits(self, ty: GgmlType) -> bool {
        self.ty().is_none_or(|t| t == ty)
    }
    /// Scratch bytes [`repack_in_place`] / [`unpack_in_place`] need for rows of
    /// `row_bytes`: one group of rows.
    pub fn scratch_bytes(self, row_bytes: usize) -> usize {
        self.group_rows() * row_bytes * usize::from(self != Layout::Plain)
    }
}

/// Whether `layout` has a SIMD kernel on this CPU (without one, [`matmul_rows`] falls
/// back to a scalar loop slower than the plain scalar path: do not repack then).
pub fn has_fast_kernel(layout: Layout, feat: &CpuFeatures) -> bool {
    layout == Layout::Plain || crate::arch::table(feat).has_packed(layout)
}

/// One block of four Q8_0 rows: the four rows' quants, then their four scales (last,
/// so the quants sit at multiples of 16 bytes from the block's start and load in pairs).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0x4 {
    /// Quants (i8 as bytes) of rows 0..4 of the group.
    pub qs: [[u8; QK]; 4],
    /// Scales (f16 little-endian) of rows 0..4 of the group.
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockQ8_0x4);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ8_0x4>(), 4 * q8_0::BLOCK_BYTES);

/// One block of four Q8_0 rows for `sdot` by element: `qs[k][4r + j]` is quant `4k + j`
/// of row `r`. The scales come last, so the chunks sit at multiples of 16 bytes from
/// the block's start and load in pairs (`ldp`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0x4s {
    /// Chunk `k`: quants `4k..4k+4` of rows 0, 1, 2, 3.
    pub qs: [[u8; 16]; 8],
    /// Scales (f16 little-endian) of rows 0..4 of the group.
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockQ8_0x4s);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ8_0x4s>(), 4 * q8_0::BLOCK_BYTES);

/// One block of four Q5_0 rows: `qs[k][4r + j]` is byte `4k + j` of row `r`'s nibbles;
/// `qh[4r + j]` bit `k` is the fifth bit of weight `4k + j` of row `r`, bit `4 + k` of
/// weight `16 + 4k + j`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0x4s {
    /// Chunk `k`: nibble bytes `4k..4k+4` of rows 0, 1, 2, 3.
    pub qs: [[u8; 16]; 4],
    /// The fifth bits, bit-sliced.
    pub qh: [u8; 16],
    /// Scales (f16 little-endian) of rows 0..4 of the group (last, as in Q8_0x4s).
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockQ5_0x4s);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ5_0x4s>(), 4 * q5_0::BLOCK_BYTES);

/// One block of four Q4_0 rows: `qs[k][4r + j]` is byte `4k + j` of row `r`'s nibbles
/// (low nibble weight `4k + j`, high nibble weight `16 + 4k + j`), as the nibble part of
/// [`BlockQ5_0x4s`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0x4s {
    /// Chunk `k`: nibble bytes `4k..4k+4` of rows 0, 1, 2, 3.
    pub qs: [[u8; 16]; 4],
    /// Scales (f16 little-endian) of rows 0..4 of the group.
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockQ4_0x4s);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ4_0x4s>(), 4 * q4_0::BLOCK_BYTES);

impl Group for BlockQ4_0x4s {
    const ROWS: usize = 4;
    type Plain = BlockQ4_0;
    fn pack(rows: &[&BlockQ4_0]) -> Self {
        let rows: [&BlockQ4_0; 4] = core::array::from_fn(|r| rows[r]);
        BlockQ4_0x4s {
            d: rows.map(|b| b.d),
            qs: interleave4(rows.map(|b| &b.qs)),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ4_0 {
        BlockQ4_0 {
            d: self.d[r],
            qs: deinterleave4(&self.qs, r),
        }
    }
}

/// One block of sixteen Q1_0 rows: `qs[p][r]` is sign byte `p` of row `r` (weights
/// `8p..8p + 8`: its low nibble is the index of group `2p` of four weights, its high
/// nibble of group `2p + 1`), so one 16-byte load gives sixteen rows' indices for two
/// groups; then the sixteen scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ1_0x16 {
    /// Byte `p` of rows 0..16.
    pub qs: [[u8; 16]; q1_0::QK / 8],
    /// Scales (f16 little-endian) of rows 0..16.
    pub d: [[u8; 2]; 16],
}
crate::pod_block!(BlockQ1_0x16);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ1_0x16>(), 16 * q1_0::BLOCK_BYTES);

/// Four rows' bytes in chunks of four per row: `out[k][4r + j] = rows[r][4k + j]` (the
/// quant or nibble part of the `x4s` layouts, one 16-byte load per chunk for `sdot`).
fn interleave4<const N: usize, const K: usize>(rows: [&[u8; N]; 4]) -> [[u8; 16]; K] {
    const { assert!(4 * K == N) };
    core::array::from_fn(|k| core::array::from_fn(|i| rows[i / 4][4 * k + i % 4]))
}

/// Row `r`'s bytes back out of [`interleave4`].
fn deinterleave4<const N: usize, const K: usize>(chunks: &[[u8; 16]; K], r: usize) -> [u8; N] {
    const { assert!(4 * K == N) };
    core::array::from_fn(|q| chunks[q / 4][4 * r + q % 4])
}

/// A group-block layout: `ROWS` plain blocks (one per row) in, `ROWS` out.
pub(crate) trait Group: Pod {
    /// Rows per group.
    const ROWS: usize;
    type Plain: Pod;
    /// `rows.len() == ROWS`.
    fn pack(rows: &[&Self::Plain]) -> Self;
    fn unpack(&self, r: usize) -> Self::Plain;
}

impl Group for BlockQ1_0x16 {
    const ROWS: usize = 16;
    type Plain = BlockQ1_0;
    fn pack(rows: &[&BlockQ1_0]) -> Self {
        BlockQ1_0x16 {
            d: core::array::from_fn(|r| rows[r].d),
            qs: core::array::from_fn(|p| core::array::from_fn(|r| rows[r].qs[p])),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ1_0 {
        BlockQ1_0 {
            d: self.d[r],
            qs: core::array::from_fn(|p| self.qs[p][r]),
        }
    }
}

impl Group for BlockQ8_0x4 {
    const ROWS: usize = 4;
    type Plain = BlockQ8_0;
    fn pack(rows: &[&BlockQ8_0]) -> Self {
        let rows: [&BlockQ8_0; 4] = core::array::from_fn(|r| rows[r]);
        BlockQ8_0x4 {
            d: rows.map(|b| b.d),
            qs: rows.map(|b| b.qs),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ8_0 {
        BlockQ8_0 {
            d: self.d[r],
            qs: self.qs[r],
        }
    }
}

impl Group for BlockQ8_0x4s {
    const ROWS: usize = 4;
    type Plain = BlockQ8_0;
    fn pack(rows: &[&BlockQ8_0]) -> Self {
        let rows: [&BlockQ8_0; 4] = core::array::from_fn(|r| rows[r]);
        BlockQ8_0x4s {
            d: rows.map(|b| b.d),
            qs: interleave4(rows.map(|b| &b.qs)),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ8_0 {
        BlockQ8_0 {
            d: self.d[r],
            qs: deinterleave4(&self.qs, r),
        }
    }
}

impl Group for BlockQ5_0x4s {
    const ROWS: usize = 4;
    type Plain = BlockQ5_0;
    fn pack(rows: &[&BlockQ5_0]) -> Self {
        let rows: [&BlockQ5_0; 4] = core::array::from_fn(|r| rows[r]);
        let h = rows.map(|b| u32::from_le_bytes(b.qh));
        BlockQ5_0x4s {
            d: rows.map(|b| b.d),
            qs: interleave4(rows.map(|b| &b.qs)),
            qh: core::array::from_fn(|i| {
                let (r, j) = (i / 4, i % 4);
                (0..4).fold(0u8, |acc, k| {
                    let lo = (h[r] >> (4 * k + j)) & 1;
                    let hi = (h[r] >> (16 + 4 * k + j)) & 1;
                    acc | (lo as u8) << k | (hi as u8) << (4 + k)
                })
            }),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ5_0 {
        let mut h = 0u32;
        for j in 0..4 {
            let b = self.qh[4 * r + j] as u32;
            for k in 0..4 {
                h |= ((b >> k) & 1) << (4 * k + j) | ((b >> (4 + k)) & 1) << (16 + 4 * k + j);
            }
        }
        BlockQ5_0 {
            d: self.d[r],
            qh: h.to_le_bytes(),
            qs: deinterleave4(&self.qs, r),
        }
    }
}

/// One block of four Q5_0 rows for `sdot` by element, weights as `s = q - 16` (5-bit
/// two's complement): `x[k][4r + j]` holds `8 s` of weight `4k + j` of row `r` in bits
/// 3..8 and bits 0..3 of `s` of weight `16 + 4k + j` in bits 0..3; bits `2k`, `2k + 1`
/// of `e[4r + j]` are bits 3, 4 of that second weight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0x4d {
    /// Chunk `k`: weights `4k..4k+4` (and the low bits of `16 + 4k..`) of rows 0..4.
    pub x: [[u8; 16]; 4],
    /// The top bit pairs of weights `16..32`.
    pub e: [u8; 16],
    /// Scales (f16 little-endian) of rows 0..4.
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockQ5_0x4d);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ5_0x4d>(), 4 * q5_0::BLOCK_BYTES);

impl Group for BlockQ5_0x4d {
    const ROWS: usize = 4;
    type Plain = BlockQ5_0;
    fn pack(rows: &[&BlockQ5_0]) -> Self {
        // q - 16 in 5-bit two's complement.
        let s: [[u8; QK]; 4] = core::array::from_fn(|r| rows[r].quants().map(|q| q as u8 & 0x1f));
        BlockQ5_0x4d {
            x: core::array::from_fn(|k| {
                core::array::from_fn(|i| {
                    let (r, j) = (i / 4, i % 4);
                    s[r][4 * k + j] << 3 | (s[r][16 + 4 * k + j] & 7)
                })
            }),
            e: core::array::from_fn(|i| {
                let (r, j) = (i / 4, i % 4);
                (0..4).fold(0u8, |acc, k| acc | (s[r][16 + 4 * k + j] >> 3) << (2 * k))
            }),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ5_0 {
        // Back to unsigned q = s + 16 (flip the sign bit of the 5-bit value).
        let mut q = [0u8; QK];
        for k in 0..4 {
            for j in 0..4 {
                let (x, e) = (self.x[k][4 * r + j], self.e[4 * r + j]);
                q[4 * k + j] = (x >> 3) ^ 0x10;
                q[16 + 4 * k + j] = ((x & 7) | ((e >> (2 * k)) & 3) << 3) ^ 0x10;
            }
        }
        let h = (0..QK).fold(0u32, |h, i| h | ((q[i] >> 4) as u32) << i);
        BlockQ5_0 {
            d: self.d[r],
            qh: h.to_le_bytes(),
            qs: core::array::from_fn(|b| (q[b] & 0xf) | (q[16 + b] & 0xf) << 4),
        }
    }
}

/// Run `$body` with `$G` bound to the group-block type of `$layout` (not `Plain`).
macro_rules! with_group {
    ($layout:expr, $G:ident => $body:expr, plain => $plain:expr) => {
        match $layout {
            Layout::Plain => $plain,
            Layout::Q8_0x4 => {
                type $G = BlockQ8_0x4;
                $body
            }
            Layout::Q8_0x4s => {
                type $G = BlockQ8_0x4s;
                $body
            }
            Layout::Q5_0x4s => {
                type $G = BlockQ5_0x4s;
                $body
            }
            Layout::Q1_0x16 | Layout::Q1_0x16Lut8 => {
                type $G = BlockQ1_0x16;
                $body
            }
            Layout::Q2Kx8 => {
                type $G = BlockQ2Kx8;
                $body
            }
            Layout::Tq2_0x4 => {
                type $G = BlockTq2_0x4;
                $body
            }
            Layout::Q2_0x4 => {
                type $G = BlockQ2_0x4;
                $body
            }
            Layout::Tq1_0x4 => {
                type $G = BlockTq1_0x4;
                $body
            }
            Layout::Q4Kx4 => {
                type $G = BlockQ4Kx4;
                $body
            }
            Layout::Q6Kx4 => {
                type $G = BlockQ6Kx4;
                $body
            }
            Layout::Q5_0x4d => {
                type $G = BlockQ5_0x4d;
                $body
            }
            Layout::Tq2_0x16 => {
                type $G = BlockTq2_0x16;
                $body
            }
            Layout::Q2_0x16 | Layout::Q2_0x16Lut8 => {
                type $G = BlockQ2_0x16;
                $body
            }
            Layout::Q2_0x16d => {
                type $G = BlockQ2_0x16d;
                $body
            }
            Layout::Tq2_0x16d => {
                type $G = BlockTq2_0x16d;
                $body
            }
            Layout::Q4_0x4s => {
                type $G = BlockQ4_0x4s;
                $body
            }
        }
    };
}

/// Check that `data` is whole rows of `row_bytes` of type `ty` that `layout` fits.
fn check_shape(
    layout: Layout,
    ty: GgmlType,
    data_len: usize,
    row_bytes: usize,
) -> Result<(), KernelError> {
    if !layout.fits(ty) {
        return Err(KernelError::Unsupported(ty));
    }
    let (_, bytes) = ty.block_geometry();
    if row_bytes == 0 || !row_bytes.is_multiple_of(bytes) || !data_len.is_multiple_of(row_bytes) {
        return Err(KernelError::BadLength {
            what: "repack: tensor bytes (whole rows of whole blocks)",
            expected: data_len / row_bytes.max(1) * row_bytes,
            found: data_len,
        });
    }
    Ok(())
}

fn check_scratch(layout: Layout, row_bytes: usize, scratch: &[u8]) -> Result<(), KernelError> {
    let need = layout.scratch_bytes(row_bytes);
    if scratch.len() < need {
        return Err(KernelError::BadLength {
            what: "repack scratch",
            expected: need,
            found: scratch.len(),
        });
    }
    Ok(())
}

/// Most rows a group of any layout has.
const MAX_GROUP_ROWS: usize = 16;

fn pack_groups<G: Group>(data: &mut [u8], row_bytes: usize, scratch: &mut [u8]) {
    let nb = row_bytes / core::mem::size_of::<G::Plain>();
    let scratch = &mut scratch[..G::ROWS * row_bytes];
    for group in data.chunks_exact_mut(G::ROWS * row_bytes) {
        scratch.copy_from_slice(group);
        let src = cast::<G::Plain>(scratch).unwrap_or(&[]);
        let dst = cast_mut::<G>(group).unwrap_or(&mut []);
        for (b, out) in dst.iter_mut().enumerate() {
            let rows: [&G::Plain; MAX_GROUP_ROWS] =
                core::array::from_fn(|r| &src[(r % G::ROWS) * nb + b]);
            *out = G::pack(&rows[..G::ROWS]);
        }
    }
}

fn unpack_groups<G: Group>(data: &mut [u8], row_bytes: usize, scratch: &mut [u8]) {
    let nb = row_bytes / core::mem::size_of::<G::Plain>();
    let scratch = &mut scratch[..G::ROWS * row_bytes];
    for group in data.chunks_exact_mut(G::ROWS * row_bytes) {
        scratch.copy_from_slice(group);
        let src = cast::<G>(scratch).unwrap_or(&[]);
        let dst = cast_mut::<G::Plain>(group).unwrap_or(&mut []);
        for (b, x) in src.iter().enumerate() {
            for r in 0..G::ROWS {
                dst[r * nb + b] = x.unpack(r);
            }
        }
    }
}

/// Rearrange a plain tensor of type `ty` (`data`: whole rows of `row_bytes`) into
/// `layout`, in place, one group of rows at a time through `scratch` (at least
/// [`Layout::scratch_bytes`]). The tensor never exists twice.
pub fn repack_in_place(
    layout: Layout,
    ty: GgmlType,
    data: &mut [u8],
    row_bytes: usize,
    scratch: &mut [u8],
) -> Result<(), KernelError> {
    check_shape(layout, ty, data.len(), row_bytes)?;
    check_scratch(layout, row_bytes, scratch)?;
    with_group!(layout, G => pack_groups::<G>(data, row_bytes, scratch), plain => ());
    Ok(())
}

/// The inverse of [`repack_in_place`]: back to plain rows.
pub fn unpack_in_place(
    layout: Layout,
    ty: GgmlType,
    data: &mut [u8],
    row_bytes: usize,
    scratch: &mut [u8],
) -> Result<(), KernelError> {
    check_shape(layout, ty, data.len(), row_bytes)?;
    check_scratch(layout, row_bytes, scratch)?;
    with_group!(layout, G => unpack_groups::<G>(data, row_bytes, scratch), plain => ());
    Ok(())
}

/// Block `b` of row `r` of a tensor of `n_rows` rows in `G`'s layout (plain blocks for
/// the tail rows).
#[inline]
fn row_block<G: Group>(w: &[u8], row_bytes: usize, n_rows: usize, r: usize, b: usize) -> G::Plain {
    let n = G::ROWS;
    let whole = n_rows / n * n;
    let size = core::mem::size_of::<G::Plain>();
    if r >= whole {
        let o = r * row_bytes + b * size;
        return cast::<G::Plain>(&w[o..o + size]).unwrap_or(&[])[0];
    }
    let o = (r / n) * n * row_bytes + b * n * size;
    cast::<G>(&w[o..o + n * size]).unwrap_or(&[])[0].unpack(r % n)
}

/// Copy row `r` of a tensor in `layout` (`w`: all of its rows) out as a plain row
/// (`dst.len() == row_bytes`).
pub fn row_to_plain(
    layout: Layout,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    r: usize,
    dst: &mut [u8],
) -> Result<(), KernelError> {
    check_shape(layout, ty, w.len(), row_bytes)?;
    let n_rows = w.len() / row_bytes;
    if r >= n_rows || dst.len() != row_bytes {
        return Err(KernelError::BadLength {
            what: "repack: row",
            expected: row_bytes,
            found: if r >= n_rows { 0 } else { dst.len() },
        });
    }
    with_group!(layout, G => {
        let out = cast_mut::<<G as Group>::Plain>(dst).unwrap_or(&mut []);
        for (b, o) in out.iter_mut().enumerate() {
            *o = row_block::<G>(w, row_bytes, n_rows, r, b);
        }
    }, plain => dst.copy_from_slice(&w[r * row_bytes..(r + 1) * row_bytes]));
    Ok(())
}

/// Dequantize row `r` of a tensor in `layout` into `dst` (`cols` values).
pub fn dequantize_row(
    layout: Layout,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    r: usize,
    dst: &mut [f32],
) -> Result<(), KernelError> {
    let n_rows = w.len() / row_bytes.max(1);
    if r >= n_rows {
        return Err(KernelError::BadLength {
            what: "dequantize: row",
            expected: row_bytes,
            found: 0,
        });
    }
    if layout == Layout::Plain {
        return crate::matvec::dequantize_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], dst);
    }
    check_shape(layout, ty, w.len(), row_bytes)?;
    let (qk, bytes) = ty.block_geometry();
    let nb = row_bytes / bytes;
    if dst.len() != nb * qk {
        return Err(KernelError::BadLength {
            what: "dequantize: row",
            expected: nb * qk,
            found: dst.len(),
        });
    }
    with_group!(layout, G => {
        for (b, out) in dst.chunks_exact_mut(qk).enumerate() {
            let x = row_block::<G>(w, row_bytes, n_rows, r, b);
            crate::matvec::dequantize_row(ty, crate::blocks::bytes_of(core::slice::from_ref(&x)), out)?;
        }
    }, plain => ());
    Ok(())
}

/// Scalar reference: dot product of row `r` of a tensor in `layout` (`w`: all of its
/// rows) with one activation row (Q8_0; Q8_K for the K-quant layouts, whose whole
/// groups take [`kquant::kquant_dot_blocksum`]'s order and plain tail rows the plain
/// kernels'), in `order`.
pub fn dot_row_scalar(
    layout: Layout,
    order: Order,
    w: &[u8],
    row_bytes: usize,
    r: usize,
    act: &[u8],
) -> f32 {
    let n_rows = w.len() / row_bytes.max(1);
    if matches!(layout, Layout::Q4Kx4 | Layout::Q6Kx4) {
        return kquant::dot_row(layout, order, w, row_bytes, r, act);
    }
    if matches!(layout, Layout::Q1_0x16Lut8 | Layout::Q2_0x16Lut8) {
        return lut8_dot_row(layout, w, row_bytes, r, act);
    }
    if matches!(
        layout,
        Layout::Q1_0x16
            | Layout::Tq2_0x4
            | Layout::Q2_0x4
            | Layout::Tq1_0x4
            | Layout::Tq2_0x16
            | Layout::Q2_0x16
            | Layout::Q2_0x16d
            | Layout::Tq2_0x16d
            | Layout::Q4_0x4s
    ) {
        // Block by block through the plain reference: each block's `d_w * sumi` added
        // to the row sum in order, as the type's `vec_dot` does over the whole row.
        let Some(ty) = layout.ty() else { return 0.0 };
        let Some(dot) = crate::quant::scalar_kernels(ty).and_then(|k| k.vec_dot) else {
            return 0.0;
        };
        let ab = act_row_bytes_of(ty, ty.block_geometry().1);
        let mut sum = 0.0f32;
        with_group!(layout, G => {
            for b in 0..row_bytes / core::mem::size_of::<<G as Group>::Plain>() {
                let x = row_block::<G>(w, row_bytes, n_rows, r, b);
                let y = act.get(b * ab..(b + 1) * ab).unwrap_or(&[]);
                sum += dot(crate::blocks::bytes_of(core::slice::from_ref(&x)), y);
            }
        }, plain => ());
        return sum;
    }
    if layout == Layout::Q2Kx8 {
        return q2_kx8_dot_scalar(order, w, row_bytes, n_rows, r, act);
    }
    let a = q8_0::act_blocks(act);
    with_group!(layout, G => {
        let nb = row_bytes / core::mem::size_of::<<G as Group>::Plain>();
        q8_0::dot_in(order, (0..nb).zip(a).map(|(b, y)| {
            let x = row_block::<G>(w, row_bytes, n_rows, r, b);
            let (d, q) = quants_of(crate::blocks::bytes_of(core::slice::from_ref(&x)), layout);
            (d * y.scale(), q, y)
        }))
    }, plain => 0.0)
}

/// [`dot_row_scalar`] for the 8-bit table layouts: their own arithmetic
/// ([`crate::quant::lut8`]) over the whole row, one fused step per block.
fn lut8_dot_row(layout: Layout, w: &[u8], row_bytes: usize, r: usize, act: &[u8]) -> f32 {
    use crate::quant::lut8::{self, Block, Lut8Format, Q1, Q2};
    fn row<F: Lut8Format, G: Group>(w: &[u8], row_bytes: usize, r: usize, act: &[u8]) -> f32 {
        let n_rows = w.len() / row_bytes.max(1);
        let nb = row_bytes / core::mem::size_of::<Block>();
        let mut sum = 0.0f32;
        let mut t = [[0i8; 16]; lut8::GROUPS];
        let a = q8_0::act_blocks(act);
        for (b, ys) in (0..nb).zip(a.chunks_exact(F::SUB)) {
            let x = row_block::<G>(w, row_bytes, n_rows, r, b);
            let bytes = crate::blocks::bytes_of(core::slice::from_ref(&x));
            let Some(x) = crate::blocks::cast::<Block>(bytes).and_then(|x| x.first()) else {
                return f32::NAN;
            };
            sum = lut8::block_dot::<F>(x, ys, &mut t, sum);
        }
        sum
    }
    if layout == Layout::Q2_0x16Lut8 {
        row::<Q2, BlockQ2_0x16>(w, row_bytes, r, act)
    } else {
        row::<Q1, BlockQ1_0x16>(w, row_bytes, r, act)
    }
}

/// [`dot_row_scalar`] for [`Layout::Q2Kx8`]: rows in whole groups in the block-sum
/// arithmetic of its kernels (the plain NEON kernels' order too:
/// [`q2_k::vec_dot_block_sum`] is [`q8_k::kquant_dot_blocksum`] for Q2_K), the plain tail
/// rows in the plain one (as the kernels, which hand them to the plain row kernel).
fn q2_kx8_dot_scalar(
    order: Order,
    w: &[u8],
    row_bytes: usize,
    n_rows: usize,
    r: usize,
    act: &[u8],
) -> f32 {
    if r >= n_rows / 8 * 8 {
        // The plain tail rows, in the plain K-quant kernels' order: block sums where
        // `order` says so on aarch64 (`q8_k::order_of`), llama.cpp's eight lanes elsewhere
        // (armv7 NEON sums Q8_0 blocks whole but K-quants in eight lanes).
        let kq = if cfg!(target_arch = "aarch64") {
            order
        } else {
            Order::Lanes8
        };
        return q2_k::vec_dot_in(kq, &w[r * row_bytes..(r + 1) * row_bytes], act);
    }
    let nb = row_bytes / q2_k::BLOCK_BYTES;
    let blocks = (0..nb).map(|b| row_block::<BlockQ2Kx8>(w, row_bytes, n_rows, r, b));
    q2_k::vec_dot_block_sum(blocks.zip(q8_k::act_blocks(act)))
}

/// Scale and signed quants of one plain block of `layout`'s type.
fn quants_of(block: &[u8], layout: Layout) -> (f32, [i32; QK]) {
    match layout.ty() {
        Some(GgmlType::Q5_0) => {
            let b = cast::<BlockQ5_0>(block).unwrap_or(&[])[0];
            (crate::f16::read_f16(b.d), b.quants())
        }
        _ => {
            let b = cast::<BlockQ8_0>(block).unwrap_or(&[])[0];
            (b.scale(), core::array::from_fn(|j| b.q(j)))
        }
    }
}

/// [`crate::matvec::matmul_rows`] for a tensor in `layout`: `w` holds *all* rows of the
/// tensor (the layout's groups are counted from row 0), `rows` is any range of them
/// (ranges aligned to [`Layout::group_rows`] are fastest), `out[i * n_tok + t] =
/// dot(row rows.start + i, activation t)`, bit for bit what the plain kernels give for
/// `feat`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows(
    layout: Layout,
    ty: GgmlType,
    feat: &CpuFeatures,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_row_bytes: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if layout == Layout::Plain {
        return crate::matvec::matmul_rows(ty, feat, w, row_bytes, rows, acts, act_row_bytes, out);
    }
    check_shape(layout, ty, w.len(), row_bytes)?;
    let n_rows = w.len() / row_bytes;
    let act_bytes = act_row_bytes_of(ty, row_bytes);
    if act_row_bytes != act_bytes || !acts.len().is_multiple_of(act_row_bytes) {
        // Activation rows of the weight type's format, of the same length.
        return Err(KernelError::BadLength {
            what: "activation rows",
            expected: act_bytes,
            found: act_row_bytes,
        });
    }
    let n_tok = acts.len() / act_row_bytes;
    if rows.start > rows.end || rows.end > n_rows {
        return Err(KernelError::BadLength {
            what: "weight rows",
            expected: rows.end * row_bytes,
            found: w.len(),
        });
    }
    if out.len() != rows.len() * n_tok {
        return Err(KernelError::BadLength {
            what: "output",
            expected: rows.len() * n_tok,
            found: out.len(),
        });
    }
    if crate::arch::repack_matmul_rows(layout, feat, w, row_bytes, rows.clone(), acts, out) {
        return Ok(());
    }
    matmul_rows_scalar(layout, Order::of(feat), w, row_bytes, rows, acts, out);
    Ok(())
}

/// Bytes of the activation row (in `ty`'s activation format) that a weight row of
/// `row_bytes` of `ty` pairs with.
fn act_row_bytes_of(ty: GgmlType, row_bytes: usize) -> usize {
    let (qk, bytes) = ty.block_geometry();
    let cols = row_bytes / bytes * qk;
    ty.act_format().and_then(|f| f.row_bytes(cols)).unwrap_or(0)
}

/// The scalar loop of [`matmul_rows`] (shapes already checked).
pub fn matmul_rows_scalar(
    layout: Layout,
    order: Order,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) {
    let arb = act_row_bytes_of(layout.ty().unwrap_or(GgmlType::Q8_0), row_bytes);
    let n_tok = acts.len() / arb.max(1);
    for (i, r) in rows.enumerate() {
        for t in 0..n_tok {
            out[i * n_tok + t] = dot_row_scalar(
                layout,
                order,
                w,
                row_bytes,
                r,
                &acts[t * arb..(t + 1) * arb],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::f16::f32_to_f16;
    use crate::quant::q8_0::BLOCK_BYTES;
    use crate::testutil::Rng;

    /// A random Q8_0 tensor with realistic scales and the activation rows for it.
    fn tensor(rows: usize, nb: usize, seed: u64) -> ([u8; 4096], usize) {
        tensor_of(GgmlType::Q8_0, rows, nb, seed)
    }

    fn tensor_of(ty: GgmlType, rows: usize, nb: usize, seed: u64) -> ([u8; 4096], usize) {
        let bb = ty.block_geometry().1;
        let mut rng = Rng(seed);
        let mut w = [0u8; 4096];
        let n = rows * nb * bb;
        rng.fill_bytes(&mut w[..n]);
        for blk in w[..n].chunks_mut(bb) {
            let d = 0.001 + (rng.f32().abs() * 0.05);
            blk[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        }
        (w, n)
    }

    fn acts(n_tok: usize, nb: usize, seed: u64) -> ([u8; 1024], usize) {
        let mut rng = Rng(seed);
        let mut x = [0.0f32; 256];
        let mut a = [0u8; 1024];
        let n = nb * QK;
        for t in 0..n_tok {
            rng.fill_f32(&mut x[..n], 2.0);
            q8_0::quantize_row_x86(
                &x[..n],
                &mut a[t * nb * BLOCK_BYTES..(t + 1) * nb * BLOCK_BYTES],
            );
        }
        (a, n_tok * nb * BLOCK_BYTES)
    }

    #[test]
    fn max_group_rows_is_the_largest_group_of_the_types_layouts() {
        assert_eq!(Layout::max_group_rows(GgmlType::Q2_K), 8);
        assert_eq!(Layout::max_group_rows(GgmlType::TQ2_0), 16);
        assert_eq!(Layout::max_group_rows(GgmlType::Q4_K), 4);
        assert_eq!(Layout::max_group_rows(GgmlType::Q8_0), 4);
        assert_eq!(Layout::max_group_rows(GgmlType::F32), 1);
    }

    #[test]
    fn repack_then_unpack_is_the_identity_and_rows_read_back() {
        for (layout, ty) in [
            (Layout::Q8_0x4, GgmlType::Q8_0),
            (Layout::Q8_0x4s, GgmlType::Q8_0),
            (Layout::Q5_0x4s, GgmlType::Q5_0),
            (Layout::Q5_0x4d, GgmlType::Q5_0),
            (Layout::Q4_0x4s, GgmlType::Q4_0),
        ] {
            for rows in [1usize, 3, 4, 5, 8, 9, 11] {
                let nb = 3;
                let rb = nb * ty.block_geometry().1;
                let (orig, n) = tensor_of(ty, rows, nb, rows as u64 + 1);
                let mut w = orig;
                let mut scratch = [0u8; 4 * 3 * BLOCK_BYTES];
                repack_in_place(layout, ty, &mut w[..n], rb, &mut scratch).unwrap();
                if rows >= 4 {
                    assert_ne!(
                        &w[..n],
                        &orig[..n],
                        "{layout:?} rows {rows}: nothing changed"
                    );
                }
                // Tail rows stay plain.
                let n4 = rows / 4 * 4;
                assert_eq!(&w[n4 * rb..n], &orig[n4 * rb..n]);
                let mut row = [0u8; 3 * BLOCK_BYTES];
                let mut f1 = [0.0f32; 3 * QK];
                let mut f2 = [0.0f32; 3 * QK];
                for r in 0..rows {
                    row_to_plain(layout, ty, &w[..n], rb, r, &mut row[..rb]).unwrap();
                    assert_eq!(
                        &row[..rb],
                        &orig[r * rb..(r + 1) * rb],
                        "{layout:?} {rows} row {r}"
                    );
                    dequantize_row(layout, ty, &w[..n], rb, r, &mut f1).unwrap();
                    dequantize_row(Layout::Plain, ty, &orig[..n], rb, r, &mut f2).unwrap();
                    assert_eq!(f1, f2);
                }
                unpack_in_place(layout, ty, &mut w[..n], rb, &mut scratch).unwrap();
                assert_eq!(&w[..n], &orig[..n], "{layout:?} rows {rows}");
            }
        }
    }

    /// The bit-sliced fifth bits of Q5_0x4s: every single bit of every row lands where
    /// the layout's doc says and comes back.
    #[test]
    fn q5_0x4s_fifth_bits_are_sliced_as_documented() {
        for r in 0..4 {
            for bit in 0..32 {
                let mut rows = [q5_0::BlockQ5_0 {
                    d: [0; 2],
                    qh: [0; 4],
                    qs: [0; 16],
                }; 4];
                rows[r].qh = (1u32 << bit).to_le_bytes();
                let g = BlockQ5_0x4s::pack(&[&rows[0], &rows[1], &rows[2], &rows[3]]);
                let (half, w) = (bit / 16, bit % 16);
                let (k, j) = (w / 4, w % 4);
                let mut want = [0u8; 16];
                want[4 * r + j] = 1 << (4 * half + k);
                assert_eq!(g.qh, want, "row {r} bit {bit}");
                assert_eq!(g.unpack(r).qh, rows[r].qh);
            }
        }
    }

    #[test]
    fn bad_shapes_and_types_are_errors() {
        let mut w = [0u8; 4 * BLOCK_BYTES];
        let mut s = [0u8; 4 * BLOCK_BYTES];
        assert!(
            repack_in_place(Layout::Q8_0x4, GgmlType::Q4_0, &mut w, BLOCK_BYTES, &mut s).is_err()
        );
        assert!(repack_in_place(Layout::Q8_0x4, GgmlType::Q8_0, &mut w, 33, &mut s).is_err());
        assert!(repack_in_place(
            Layout::Q8_0x4,
            GgmlType::Q8_0,
            &mut w,
            BLOCK_BYTES,
            &mut s[..10]
        )
        .is_err());
        let mut out = [0.0f32; 1];
        let a = [0u8; BLOCK_BYTES];
        let f = CpuFeatures::SCALAR;
        assert!(matmul_rows(
            Layout::Q8_0x4,
            GgmlType::Q8_0,
            &f,
            &w,
            BLOCK_BYTES,
            3..5,
            &a,
            BLOCK_BYTES,
            &mut out
        )
        .is_err());
        assert!(matmul_rows(
            Layout::Q8_0x4,
            GgmlType::Q8_0,
            &f,
            &w,
            BLOCK_BYTES,
            0..2,
            &a,
            BLOCK_BYTES,
            &mut out
        )
        .is_err());
        assert_eq!(Layout::from_id(Layout::Q8_0x4.id()), Some(Layout::Q8_0x4));
        assert_eq!(Layout::from_id(99), None);
    }

    /// Scalar repacked products equal the plain scalar reference bit for bit, per (row,
    /// token), over odd row counts and unaligned ranges (the SIMD paths are checked in
    /// `tests/repack.rs`, for every feature set of the running CPU).
    #[test]
    fn repacked_products_equal_plain_reference_bits() {
        let feats = [CpuFeatures::SCALAR];
        for rows in [1usize, 4, 7, 12, 13] {
            for nb in [1usize, 2, 5] {
                let rb = nb * BLOCK_BYTES;
                let (orig, n) = tensor(rows, nb, (rows * 31 + nb) as u64);
                let mut w = orig;
                let mut scratch = [0u8; 4 * 5 * BLOCK_BYTES];
                repack_in_place(
                    Layout::Q8_0x4,
                    GgmlType::Q8_0,
                    &mut w[..n],
                    rb,
                    &mut scratch,
                )
                .unwrap();
                for n_tok in [1usize, 2, 3, 4, 5, 9] {
                    if n_tok * rb > 1024 {
                        continue;
                    }
                    let (a, an) = acts(n_tok, nb, (n_tok * 7 + rows) as u64);
                    let a = &a[..an];
                    let ranges = [0..rows, 1..rows, 0..rows.min(3), rows / 2..rows, rows..rows];
                    for range in ranges {
                        let mut out = [0.0f32; 13 * 9];
                        let out = &mut out[..range.len() * n_tok];
                        for f in &feats {
                            out.fill(f32::NAN);
                            matmul_rows(
                                Layout::Q8_0x4,
                                GgmlType::Q8_0,
                                f,
                                &w[..n],
                                rb,
                                range.clone(),
                                a,
                                rb,
                                out,
                            )
                            .unwrap();
                            for (i, r) in range.clone().enumerate() {
                                for t in 0..n_tok {
                                    let want = q8_0::vec_dot(
                                        &orig[r * rb..(r + 1) * rb],
                                        &a[t * rb..(t + 1) * rb],
                                    );
                                    let got = out[i * n_tok + t];
                                    assert_eq!(got.to_bits(), want.to_bits(), "{f:?} rows {rows} nb {nb} n_tok {n_tok} range {range:?} r {r} t {t}: {got} vs {want}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
