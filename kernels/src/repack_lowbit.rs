//! Repacked group-blocks of the 2-bit formats (see [`crate::repack`] for the scheme: a
//! group of rows interleaved block by block in the bytes the plain rows occupied).
//!
//! - [`BlockQ2Kx8`] ([`crate::repack::Layout::Q2Kx8`]): eight Q2_K rows. The 2-bit
//!   quants are regrouped so that one 16-byte vector holds one 16-weight group (one
//!   scale) of four rows, four bytes per row, each byte four weights that are four
//!   activations apart: field `k` of the vector's bytes pairs with activation word `k` of
//!   the group, so one `sdot` by element per field leaves the four rows' sums in four
//!   lanes (and the no-dotprod path multiplies the same fields with the word broadcast).
//!   The scale bytes of two groups of the eight rows fill one vector.
//! - [`BlockTq2_0x4`], [`BlockQ2_0x4`] ([`crate::repack::Layout::Tq2_0x4`],
//!   [`crate::repack::Layout::Q2_0x4`]): four ternary / 2-bit rows, the codes regrouped the
//!   same way (one 16-weight group of four rows per vector), the four scales adjacent.
//! - [`BlockTq1_0x4`] ([`crate::repack::Layout::Tq1_0x4`]): four TQ1_0 rows, base-3 bytes
//!   moved four at a time per row (each digit of a vector is four consecutive weights of
//!   four rows). Ternary in 2-bit fields would need 66 bytes per 54 (it cannot be done in
//!   place); the base-3 digits cost about five instructions per 16 weights to decode.
use crate::quant::q2_0::{self, BlockQ2_0};
use crate::quant::q2_k::{self, BlockQ2K};
use crate::quant::tq1_0::{self, BlockTq1_0};
use crate::quant::tq2_0::{self, BlockTq2_0};
use crate::repack::Group;

/// Eight Q2_K rows (8 x 84 bytes).
///
/// - `qs[g][h][4r + j]`, bits `2k..2k + 2`: the quant of weight `16g + 4k + j` of row
///   `4h + r` (`g`: 16-weight group, `h`: rows 0..4 or 4..8).
/// - `scales[p][8s + r]`: the scale byte (scale low nibble, minimum high nibble) of group
///   `2p + s` of row `r`.
/// - `d[r]`, `dmin[r]`: the rows' super-block scales (f16 little-endian), adjacent.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2Kx8 {
    /// Quants, regrouped as above.
    pub qs: [[[u8; 16]; 2]; 16],
    /// Scale bytes, two groups of eight rows per vector.
    pub scales: [[u8; 16]; 8],
    /// Super-block scales of rows 0..8.
    pub d: [[u8; 2]; 8],
    /// Super-block minimum scales of rows 0..8.
    pub dmin: [[u8; 2]; 8],
}
crate::pod_block!(BlockQ2Kx8);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ2Kx8>(), 8 * q2_k::BLOCK_BYTES);

impl Group for BlockQ2Kx8 {
    const ROWS: usize = 8;
    type Plain = BlockQ2K;
    fn pack(rows: &[&BlockQ2K]) -> Self {
        // The expert pager repacks each Q2_K expert it reads (`--moe-repack`), so this
        // runs per read, not once per load: the quants go by vector (NEON) or by word.
        let mut x = BlockQ2Kx8 {
            qs: [[[0; 16]; 2]; 16],
            scales: [[0; 16]; 8],
            d: [[0; 2]; 8],
            dmin: [[0; 2]; 8],
        };
        pack_q2k_qs(rows, &mut x.qs);
        pack_q2k_scales(rows, &mut x.scales);
        for (r, row) in rows.iter().enumerate().take(8) {
            x.d[r] = row.d;
            x.dmin[r] = row.dmin;
        }
        x
    }
    fn unpack(&self, r: usize) -> BlockQ2K {
        let (h, i) = (r / 4, 4 * (r % 4));
        // Weight 128c + 32k + l is bits 2k.. of plain byte 32c + l.
        let quant = |w: usize| (self.qs[w / 16][h][i + w % 4] >> (2 * (w % 16 / 4))) & 3;
        BlockQ2K {
            scales: core::array::from_fn(|g| self.scales[g / 2][8 * (g % 2) + r]),
            qs: core::array::from_fn(|b| {
                let (c, l) = (b / 32, b % 32);
                (0..4).fold(0u8, |acc, k| acc | quant(128 * c + 32 * k + l) << (2 * k))
            }),
            d: self.d[r],
            dmin: self.dmin[r],
        }
    }
}

/// `qs` of [`BlockQ2Kx8`] from eight Q2_K rows: NEON on aarch64
/// ([`crate::arch::neon_q2k_repack`]), else [`pack_q2k_qs_scalar`]; the same bytes.
fn pack_q2k_qs(rows: &[&BlockQ2K], qs: &mut [[[u8; 16]; 2]; 16]) {
    #[cfg(target_arch = "aarch64")]
    crate::arch::neon_q2k_repack::pack_qs(rows, qs);
    #[cfg(not(target_arch = "aarch64"))]
    pack_q2k_qs_scalar(rows, qs);
}

/// `scales` of [`BlockQ2Kx8`] from eight Q2_K rows (NEON on aarch64, the same bytes).
fn pack_q2k_scales(rows: &[&BlockQ2K], scales: &mut [[u8; 16]; 8]) {
    #[cfg(target_arch = "aarch64")]
    crate::arch::neon_q2k_repack::pack_scales(rows, scales);
    #[cfg(not(target_arch = "aarch64"))]
    pack_q2k_scales_scalar(rows, scales);
}

/// [`pack_q2k_scales`] byte by byte.
#[cfg(any(test, not(target_arch = "aarch64")))]
pub(crate) fn pack_q2k_scales_scalar(rows: &[&BlockQ2K], scales: &mut [[u8; 16]; 8]) {
    for (r, row) in rows.iter().enumerate().take(8) {
        for (g, &sc) in row.scales.iter().enumerate() {
            scales[g / 2][8 * (g % 2) + r] = sc;
        }
    }
}

/// [`pack_q2k_qs`] with 32-bit words (the reference the NEON version is tested against).
#[cfg(any(test, not(target_arch = "aarch64")))]
pub(crate) fn pack_q2k_qs_scalar(rows: &[&BlockQ2K], qs: &mut [[[u8; 16]; 2]; 16]) {
    for (r, row) in rows.iter().enumerate().take(8) {
        let (h, at) = (r / 4, 4 * (r % 4));
        // Group g = 8c + 2k' + s (weights 128c + 32k' + 16s ..) is bit pair k' of
        // plain bytes 32c + 16s + 4k + j; byte j of word k holds weight 4k + j of the
        // group, and field k of output byte j is word k's.
        for (c, s) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let base = 32 * c + 16 * s;
            let w: [u32; 4] = core::array::from_fn(|k| {
                let b = &row.qs[base + 4 * k..base + 4 * k + 4];
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            });
            for kp in 0..4 {
                let mut v = 0u32;
                for (k, wk) in w.iter().enumerate() {
                    v |= ((wk >> (2 * kp)) & 0x0303_0303) << (2 * k);
                }
                qs[8 * c + 2 * kp + s][h][at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// Four TQ2_0 rows (4 x 66 bytes) for `sdot` by element: `qs[g][4r + j]`, bits
/// `2k..2k + 2`, is the code (level + 1) of weight `16g + 4k + j` of row `r`, so field `k`
/// of a group's vector pairs with activation word `k` of the group (as in [`BlockQ2Kx8`]);
/// then the four scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockTq2_0x4 {
    /// Codes, regrouped as above.
    pub qs: [[u8; 16]; 16],
    /// Scales (f16 little-endian) of rows 0..4.
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockTq2_0x4);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockTq2_0x4>(), 4 * tq2_0::BLOCK_BYTES);

/// Four Q2_0 rows (4 x 18 bytes), arranged as [`BlockTq2_0x4`]: `qs[g][4r + j]`, bits
/// `2k..`, is the code of weight `16g + 4k + j` of row `r` (groups 0, 1 pair with the first
/// Q8_0 activation block, 2, 3 with the second); then the four scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2_0x4 {
    /// Codes, regrouped as above.
    pub qs: [[u8; 16]; 4],
    /// Scales (f16 little-endian) of rows 0..4.
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockQ2_0x4);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ2_0x4>(), 4 * q2_0::BLOCK_BYTES);

/// Regroup the codes of four rows (`code(r, i)`: code of weight `i` of row `r`) into
/// vectors of 16 weights x 4 rows: byte `4r + j` of group `g`, field `k` = weight
/// `16g + 4k + j`.
fn regroup<const G: usize>(code: impl Fn(usize, usize) -> u8) -> [[u8; 16]; G] {
    core::array::from_fn(|g| {
        core::array::from_fn(|i| {
            let (r, j) = (i / 4, i % 4);
            (0..4).fold(0u8, |b, k| b | code(r, 16 * g + 4 * k + j) << (2 * k))
        })
    })
}

/// The code of weight `i` of row `r` in [`regroup`]'s vectors.
fn regrouped(qs: &[[u8; 16]], r: usize, i: usize) -> u8 {
    (qs[i / 16][4 * r + i % 4] >> (2 * (i % 16 / 4))) & 3
}

impl Group for BlockTq2_0x4 {
    const ROWS: usize = 4;
    type Plain = BlockTq2_0;
    fn pack(rows: &[&BlockTq2_0]) -> Self {
        BlockTq2_0x4 {
            qs: regroup(|r, i| (rows[r].level(i) + 1) as u8),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockTq2_0 {
        // Weight 128c + 32l + m is bits 2l.. of plain byte 32c + m.
        BlockTq2_0 {
            qs: core::array::from_fn(|b| {
                let (c, m) = (b / 32, b % 32);
                (0..4).fold(0u8, |acc, l| {
                    acc | regrouped(&self.qs, r, 128 * c + 32 * l + m) << (2 * l)
                })
            }),
            d: self.d[r],
        }
    }
}

impl Group for BlockQ2_0x4 {
    const ROWS: usize = 4;
    type Plain = BlockQ2_0;
    fn pack(rows: &[&BlockQ2_0]) -> Self {
        BlockQ2_0x4 {
            qs: regroup(|r, i| (rows[r].level(i) + 1) as u8),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ2_0 {
        BlockQ2_0 {
            d: self.d[r],
            qs: core::array::from_fn(|b| {
                (0..4).fold(0u8, |acc, t| {
                    acc | regrouped(&self.qs, r, 4 * b + t) << (2 * t)
                })
            }),
        }
    }
}

/// Four TQ1_0 rows (4 x 54 bytes), their base-3 bytes moved (not re-encoded) so that one
/// vector holds four bytes of each of four rows: digit `n` of the bytes of chunk `c`
/// (`qa[c][4r + j]` = plain `qs[4c + j]` of row `r`) is weight `32n + 4c + j`, of chunk
/// `c` of `qb` (plain `qs[32 + 4c + j]`) weight `160 + 16n + 4c + j`, of `qh` (plain
/// `qh[j]`) weight `240 + 4n + j`: four consecutive weights of four rows, one `sdot` by
/// element per digit. Then the four scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockTq1_0x4 {
    /// Plain bytes `qs[0..32]` of the four rows, four at a time.
    pub qa: [[u8; 16]; 8],
    /// Plain bytes `qs[32..48]`, four at a time.
    pub qb: [[u8; 16]; 4],
    /// Plain bytes `qh[0..4]`.
    pub qh: [u8; 16],
    /// Scales (f16 little-endian) of rows 0..4.
    pub d: [[u8; 2]; 4],
}
crate::pod_block!(BlockTq1_0x4);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockTq1_0x4>(), 4 * tq1_0::BLOCK_BYTES);

impl Group for BlockTq1_0x4 {
    const ROWS: usize = 4;
    type Plain = BlockTq1_0;
    fn pack(rows: &[&BlockTq1_0]) -> Self {
        let four = |base: usize, c: usize| -> [u8; 16] {
            core::array::from_fn(|i| rows[i / 4].qs[base + 4 * c + i % 4])
        };
        BlockTq1_0x4 {
            qa: core::array::from_fn(|c| four(0, c)),
            qb: core::array::from_fn(|c| four(32, c)),
            qh: core::array::from_fn(|i| rows[i / 4].qh[i % 4]),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockTq1_0 {
        BlockTq1_0 {
            qs: core::array::from_fn(|b| {
                if b < 32 {
                    self.qa[b / 4][4 * r + b % 4]
                } else {
                    self.qb[(b - 32) / 4][4 * r + b % 4]
                }
            }),
            qh: core::array::from_fn(|j| self.qh[4 * r + j]),
            d: self.d[r],
        }
    }
}

/// Sixteen TQ2_0 rows (16 x 66 bytes) for the pair-table kernel
/// ([`crate::repack::Layout::Tq2_0x16`]): `qs[p][r]` holds the codes (level + 1) of
/// weights `4p..4p + 4` of row `r`, weight `4p + t` in bits `2t..2t + 2`, so its low
/// nibble indexes the table of the activation pair `(4p, 4p + 1)` and its high nibble
/// that of `(4p + 2, 4p + 3)`, and one 16-byte vector holds sixteen rows' indices of two
/// pairs; then the sixteen scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockTq2_0x16 {
    /// Byte `p` of rows 0..16, as above.
    pub qs: [[u8; 16]; tq2_0::QK / 4],
    /// Scales (f16 little-endian) of rows 0..16.
    pub d: [[u8; 2]; 16],
}
crate::pod_block!(BlockTq2_0x16);
static_assertions::const_assert_eq!(
    core::mem::size_of::<BlockTq2_0x16>(),
    16 * tq2_0::BLOCK_BYTES
);

/// Sixteen Q2_0 rows (16 x 18 bytes), arranged as [`BlockTq2_0x16`] (a plain Q2_0 byte
/// already holds four consecutive weights in that order, so `qs[p][r]` is plain byte `p`
/// of row `r`); then the sixteen scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2_0x16 {
    /// Byte `p` of rows 0..16.
    pub qs: [[u8; 16]; q2_0::QK / 4],
    /// Scales (f16 little-endian) of rows 0..16.
    pub d: [[u8; 2]; 16],
}
crate::pod_block!(BlockQ2_0x16);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ2_0x16>(), 16 * q2_0::BLOCK_BYTES);

/// Four consecutive codes `code(4p..4p + 4)` as one byte, weight `4p + t` in bits `2t..`.
fn seq_byte(code: impl Fn(usize) -> u8, p: usize) -> u8 {
    (0..4).fold(0u8, |b, t| b | code(4 * p + t) << (2 * t))
}

impl Group for BlockTq2_0x16 {
    const ROWS: usize = 16;
    type Plain = BlockTq2_0;
    fn pack(rows: &[&BlockTq2_0]) -> Self {
        BlockTq2_0x16 {
            qs: core::array::from_fn(|p| {
                core::array::from_fn(|r| seq_byte(|i| (rows[r].level(i) + 1) as u8, p))
            }),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockTq2_0 {
        let code = |i: usize| (self.qs[i / 4][r] >> (2 * (i % 4))) & 3;
        // Weight 128c + 32l + m is bits 2l.. of plain byte 32c + m.
        BlockTq2_0 {
            qs: core::array::from_fn(|b| {
                let (c, m) = (b / 32, b % 32);
                (0..4).fold(0u8, |acc, l| acc | code(128 * c + 32 * l + m) << (2 * l))
            }),
            d: self.d[r],
        }
    }
}

impl Group for BlockQ2_0x16 {
    const ROWS: usize = 16;
    type Plain = BlockQ2_0;
    fn pack(rows: &[&BlockQ2_0]) -> Self {
        BlockQ2_0x16 {
            qs: core::array::from_fn(|p| core::array::from_fn(|r| rows[r].qs[p])),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ2_0 {
        BlockQ2_0 {
            d: self.d[r],
            qs: core::array::from_fn(|p| self.qs[p][r]),
        }
    }
}

/// Sixteen Q2_0 rows (16 x 18 bytes) for `sdot` by element with the rows interleaved
/// across the four 2-bit fields of a byte: `qs[i][4l + j]`, bits `2f..`, is the code
/// of weight `4i + j` of row `4f + l`. Vector `i` is then sixteen rows times activation
/// word `i`: field `f`, masked in place, is an `sdot` operand for rows `4f..4f + 4`
/// (scaled by `4^f`, undone for free by the fixed-point `scvtf`), so no accumulator
/// needs merging. Then the sixteen scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2_0x16d {
    /// Codes, regrouped as above.
    pub qs: [[u8; 16]; q2_0::QK / 4],
    /// Scales (f16 little-endian) of rows 0..16.
    pub d: [[u8; 2]; 16],
}
crate::pod_block!(BlockQ2_0x16d);
static_assertions::const_assert_eq!(
    core::mem::size_of::<BlockQ2_0x16d>(),
    16 * q2_0::BLOCK_BYTES
);

impl Group for BlockQ2_0x16d {
    const ROWS: usize = 16;
    type Plain = BlockQ2_0;
    fn pack(rows: &[&BlockQ2_0]) -> Self {
        BlockQ2_0x16d {
            qs: field_rows(|r, i| (rows[r].level(i) + 1) as u8),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockQ2_0 {
        let code = |w: usize| field_code(&self.qs, r, w);
        BlockQ2_0 {
            d: self.d[r],
            qs: core::array::from_fn(|p| {
                (0..4).fold(0u8, |acc, t| acc | code(4 * p + t) << (2 * t))
            }),
        }
    }
}

/// The vectors of a row-interleaved 16-row layout ([`BlockQ2_0x16d`],
/// [`BlockTq2_0x16d`]) from `code(row, weight)`: vector `i`, byte `4l + j`, bits `2f..`
/// is the code of weight `4i + j` of row `4f + l`.
fn field_rows<const N: usize>(code: impl Fn(usize, usize) -> u8) -> [[u8; 16]; N] {
    core::array::from_fn(|i| {
        core::array::from_fn(|b| {
            let (l, j) = (b / 4, b % 4);
            (0..4).fold(0u8, |acc, f| acc | code(4 * f + l, 4 * i + j) << (2 * f))
        })
    })
}

/// Code of weight `w` of row `r` in the vectors of [`field_rows`].
fn field_code(qs: &[[u8; 16]], r: usize, w: usize) -> u8 {
    (qs[w / 4][4 * (r % 4) + w % 4] >> (2 * (r / 4))) & 3
}

/// Sixteen TQ2_0 rows (16 x 66 bytes) interleaved across the 2-bit fields of each byte
/// as [`BlockQ2_0x16d`] (`qs[i][4l + j]`, bits `2f..`: the code of weight `4i + j` of
/// row `4f + l`), for `sdot` by element; then the sixteen scales.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockTq2_0x16d {
    /// Codes, regrouped as above.
    pub qs: [[u8; 16]; tq2_0::QK / 4],
    /// Scales (f16 little-endian) of rows 0..16.
    pub d: [[u8; 2]; 16],
}
crate::pod_block!(BlockTq2_0x16d);
static_assertions::const_assert_eq!(
    core::mem::size_of::<BlockTq2_0x16d>(),
    16 * tq2_0::BLOCK_BYTES
);

impl Group for BlockTq2_0x16d {
    const ROWS: usize = 16;
    type Plain = BlockTq2_0;
    fn pack(rows: &[&BlockTq2_0]) -> Self {
        BlockTq2_0x16d {
            qs: field_rows(|r, i| (rows[r].level(i) + 1) as u8),
            d: core::array::from_fn(|r| rows[r].d),
        }
    }
    fn unpack(&self, r: usize) -> BlockTq2_0 {
        let code = |w: usize| field_code(&self.qs, r, w);
        // Weight 128c + 32l + m is bits 2l.. of plain byte 32c + m.
        BlockTq2_0 {
            qs: core::array::from_fn(|b| {
                let (c, m) = (b / 32, b % 32);
                (0..4).fold(0u8, |acc, l| acc | code(128 * c + 32 * l + m) << (2 * l))
            }),
            d: self.d[r],
        }
    }
}
