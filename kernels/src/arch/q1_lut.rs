//! Q1_0 by table lookup (Four-Russians / T-MAC style) over the repacked
//! [`crate::repack::Layout::Q1_0x16`] layout: the ISA-independent driver (shapes, table
//! chunks, row groups, the padded last group), instantiated per ISA through
//! [`LutKernel`] ([`super::neon_q1_lut`]: `tbl`; [`super::x86_q1_lut`]: `vpshufb`;
//! [`super::x86_q1_lut512`]: `vpermb`, four groups' tables per lookup; and
//! [`super::neon_q1_lut8`]: the inexact 8-bit tables of `--lut8`, [`crate::quant::lut8`],
//! which run Q2_0 as well: its 18-byte blocks and 16-row groups have Q1_0's layout).
//! Only what costs nothing is shared: the table building and the inner loops, where
//! the instructions are, stay in the ISA files.
//!
//! A Q1_0 weight is a sign: row `r` dotted with a Q8_0 block is `sum(s_j * q_j)` with
//! `s_j = ±1`, i.e. `2 * sum(q_j over set bits) - sum(q_j)`. Per group of four
//! activations the subset sums over the 16 patterns of four sign bits are looked up
//! instead of computed: one 16-byte table lookup gives 16 rows' subset sums for four
//! weights each (the layout puts 16 rows' bytes side by side, so a byte's low and high
//! nibbles are two groups' indices for one row).
//!
//! Exactness. A subset sum of four int8 spans -512..508 and a table entry is a byte, so
//! each activation is split as `q = 16 h + l` (`l = q & 15` in 0..16, `h = q >> 4` in
//! -8..8) and each group has two tables: `L` (subset sums of `l`, 0..=60) and `H` (of
//! `h`, -32..=28). Four groups' `L` bytes add up in u8 (at most 240) and their `H` bytes
//! in i8 (-128..=112) exactly; per row they become `32 H + 2 L - sum(q)`, the exact
//! `sum(s_j q_j)` (|.| <= 4096) for any int8 activations. From there the float steps
//! are the scalar reference's ([`crate::quant::q1_0::vec_dot`]), lane by lane: `sumi =
//! sumi + d_a * isum` per Q8_0 block, `sum = sum + d_w * sumi` per Q1_0 block. The
//! product `d_a * isum` is exact in f32 (an f16 scale has 11 significant bits and
//! `|isum| <= 4096` at most 12 more, and it cannot underflow), so the kernels may fuse
//! that multiply-add (`fmla`): one rounding either way. The result is the reference's
//! bit for bit.
//!
//! Row counts that are not a multiple of 16: the last rows stay plain in the tensor
//! (the layout never pads, see [`crate::repack`]); the driver packs them into one
//! zero-padded group-block per table chunk on the stack and runs the same group kernel
//! on it, so no row of any matrix takes the one-row kernel.
#![allow(unsafe_code)]

use core::ops::Range;

use super::table::{KernelTable, PackedJob};
use crate::blocks::cast;
use crate::quant::lut8;
use crate::quant::q1_0::{BlockQ1_0, BLOCK_BYTES};
use crate::quant::q8_0::{self, BlockQ8_0};
use crate::repack::BlockQ1_0x16;

// Q2_0x16 is read through this driver's `BlockQ1_0x16` (the 8-bit table kernels).
static_assertions::const_assert_eq!(
    core::mem::size_of::<crate::repack::BlockQ2_0x16>(),
    core::mem::size_of::<BlockQ1_0x16>()
);
static_assertions::const_assert_eq!(
    core::mem::offset_of!(crate::repack::BlockQ2_0x16, d),
    core::mem::offset_of!(BlockQ1_0x16, d)
);

/// Rows per group-block.
pub(super) const R: usize = 16;
/// Q8_0 blocks per Q1_0 block.
pub(super) const SUB: usize = 4;
/// Groups of four activations per Q1_0 block.
pub(super) const GROUPS: usize = 32;
/// Q1_0 blocks whose tables are built at once (16 KiB of tables on the stack).
pub(super) const KC: usize = 16;
/// Row groups computed side by side (they share each table load).
pub(super) const RG: usize = 2;

/// The lookup tables of up to [`KC`] Q1_0 blocks of one activation row.
pub(super) struct Tables {
    /// Per run of four groups `4c..4c + 4`: their `L` tables (subset sums of the four
    /// activations' low nibbles, `q & 15`), then their `H` tables (of the high parts,
    /// `q >> 4`, i8 as bytes), so the eight registers a kernel needs at once are 128
    /// contiguous bytes ([`Tables::lo`], [`Tables::hi`] index them).
    pub(super) lh: [[u8; 16]; 2 * KC * GROUPS],
    /// Per Q8_0 block: `-sum(q)` (|.| <= 32 x 128, an i16), twice: NEON's `ld2r` starts
    /// both 16-bit accumulators of a row group with it in one instruction.
    pub(super) neg_sum: [[i16; 2]; KC * SUB],
    /// Per Q8_0 block: the scale.
    pub(super) d: [f32; KC * SUB],
}

impl Tables {
    /// Index into `lh` of group `g`'s `L` table.
    #[inline(always)]
    pub(super) const fn lo(g: usize) -> usize {
        g / 4 * 8 + g % 4
    }
    /// Index into `lh` of group `g`'s `H` table.
    #[inline(always)]
    pub(super) const fn hi(g: usize) -> usize {
        g / 4 * 8 + 4 + g % 4
    }
    pub(super) const fn new() -> Tables {
        Tables {
            lh: [[0; 16]; 2 * KC * GROUPS],
            neg_sum: [[0; 2]; KC * SUB],
            d: [0.0; KC * SUB],
        }
    }
}

/// The 8-bit tables of up to [`KC`] weight blocks of one activation row (the inexact
/// arithmetic of [`crate::quant::lut8`], `--lut8`; Q1_0 and Q2_0 alike).
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))] // NEON only so far
pub(super) struct Tables8 {
    /// Per weight block, its 32 tables in nibble order.
    pub(super) t: [lut8::BlockTables; KC],
    /// Per weight block, the table scale.
    pub(super) s: [f32; KC],
    /// Per weight block, the offset the accumulators start at (0 for Q1_0), twice: one
    /// `ld2r` starts both.
    pub(super) o: [[i16; 2]; KC],
}

#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
impl Tables8 {
    pub(super) const fn new() -> Tables8 {
        Tables8 {
            t: [[[0; 16]; GROUPS]; KC],
            s: [0.0; KC],
            o: [[0; 2]; KC],
        }
    }
}

/// One ISA's half of the kernel.
pub(super) trait LutKernel {
    /// Q8_0 activation blocks per weight block (4 for Q1_0; the 8-bit table kernels also
    /// run Q2_0, whose 18-byte blocks and 16-row groups have Q1_0's layout: 2).
    const SUB: usize = SUB;
    /// The tables this kernel looks up.
    type Tables;
    fn tables() -> Self::Tables;
    /// Build the tables of `act` (whole Q8_0 blocks, at most `KC * Self::SUB`).
    ///
    /// # Safety
    /// The CPU has the ISA of the implementation.
    unsafe fn build(act: &[BlockQ8_0], t: &mut Self::Tables);
    /// `sums[i][r]` (row `r` of row group `i`) plus the dot products of the group-blocks
    /// `blocks[i][..nkb]` with the tabled activations, in the reference's float steps.
    ///
    /// # Safety
    /// The CPU has the ISA of the implementation; every `blocks[i]` has at least `nkb`
    /// blocks and `t` holds their tables.
    unsafe fn groups(
        blocks: [&[BlockQ1_0x16]; RG],
        nkb: usize,
        t: &Self::Tables,
        sums: &mut [[f32; R]; RG],
    );
}

/// The product over a Q1_0x16 tensor (`w`: all of its rows) for `rows` and every
/// activation row in `acts`; `false` (nothing written) when the shapes do not fit. The
/// repacked-layout entry ([`super::table::PackedFn`]) of the tables of `K`'s ISA (it
/// needs no one-row kernel from `_table`: the tail rows run as a padded group).
///
/// # Safety
/// The CPU has `K`'s ISA.
pub(super) unsafe fn matmul<K: LutKernel>(
    _table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let act_per_block = K::SUB * q8_0::BLOCK_BYTES;
    let shape = (BLOCK_BYTES, act_per_block, R);
    let Some(PackedJob { n_tok, arb, .. }) =
        PackedJob::new(w, row_bytes, &rows, acts, out.len(), shape)
    else {
        return false;
    };
    if rows.is_empty() {
        return true;
    }
    let nb = row_bytes / BLOCK_BYTES;
    let n_rows = w.len() / row_bytes;
    // Rows from `whole` on are plain: the padded group `whole / R` holds them.
    let whole = n_rows / R * R;
    let group_bytes = R * row_bytes;
    let g_range = rows.start / R..rows.end.div_ceil(R);
    let in_range = |r: usize| rows.contains(&r);
    // A whole group in range with one token: its sums are 16 contiguous outputs.
    let contiguous = |first: usize| n_tok == 1 && rows.start <= first && first + R <= rows.end;
    let mut tabs = K::tables();
    let zero = BlockQ1_0x16 {
        qs: [[0; 16]; 16],
        d: [[0; 2]; 16],
    };
    let mut pad = [zero; KC];
    for t in 0..n_tok {
        let Some(a) = cast::<BlockQ8_0>(&acts[t * arb..(t + 1) * arb]) else {
            return false;
        };
        for b0 in (0..nb).step_by(KC) {
            let nkb = KC.min(nb - b0);
            // SAFETY: `K`'s ISA (the caller's contract); `a` has `nb * K::SUB` blocks.
            unsafe { K::build(&a[b0 * K::SUB..(b0 + nkb) * K::SUB], &mut tabs) };
            if g_range.end * R > whole && !pack_tail(w, row_bytes, whole, b0, &mut pad[..nkb]) {
                return false;
            }
            let mut g = g_range.start;
            while g < g_range.end {
                let n_groups = RG.min(g_range.end - g);
                let mut sums = [[0.0f32; R]; RG];
                let mut blocks: [&[BlockQ1_0x16]; RG] = [&[]; RG];
                for i in 0..n_groups {
                    let first = (g + i) * R;
                    blocks[i] = if first >= whole {
                        &pad[..nkb]
                    } else {
                        let gb = &w[first * row_bytes..first * row_bytes + group_bytes];
                        let Some(x) = cast::<BlockQ1_0x16>(gb) else {
                            return false;
                        };
                        &x[b0..b0 + nkb]
                    };
                    if b0 == 0 {
                        continue;
                    }
                    if contiguous(first) {
                        let o = &out[first - rows.start..first - rows.start + R];
                        sums[i].copy_from_slice(o);
                    } else {
                        for (j, v) in sums[i].iter_mut().enumerate() {
                            if in_range(first + j) {
                                *v = out[(first + j - rows.start) * n_tok + t];
                            }
                        }
                    }
                }
                // An odd last group is computed twice (written once).
                for i in n_groups..RG {
                    blocks[i] = blocks[0];
                    sums[i] = sums[0];
                }
                // SAFETY: `K`'s ISA; every block slice has `nkb` blocks (checked above).
                unsafe { K::groups(blocks, nkb, &tabs, &mut sums) };
                for (i, s) in sums.iter().enumerate().take(n_groups) {
                    let first = (g + i) * R;
                    if contiguous(first) {
                        out[first - rows.start..first - rows.start + R].copy_from_slice(s);
                        continue;
                    }
                    for (j, v) in s.iter().enumerate() {
                        if in_range(first + j) {
                            out[(first + j - rows.start) * n_tok + t] = *v;
                        }
                    }
                }
                g += n_groups;
            }
        }
    }
    true
}

/// Pack blocks `b0..b0 + pad.len()` of the plain rows `whole..` (fewer than 16) of `w`
/// into `pad`, the missing rows' bytes and scales zero; `false` if the bytes do not cast.
/// (Q2_0 rows too: a Q2_0 block has Q1_0's 18-byte layout, a scale then 16 code bytes.)
fn pack_tail(
    w: &[u8],
    row_bytes: usize,
    whole: usize,
    b0: usize,
    pad: &mut [BlockQ1_0x16],
) -> bool {
    let Some(tail) = cast::<BlockQ1_0>(&w[whole * row_bytes..]) else {
        return false;
    };
    let nb = row_bytes / BLOCK_BYTES;
    for (b, g) in pad.iter_mut().enumerate() {
        for (j, x) in tail.chunks_exact(nb).enumerate() {
            let x = &x[b0 + b];
            g.d[j] = x.d;
            for (p, q) in x.qs.iter().enumerate() {
                g.qs[p][j] = *q;
            }
        }
    }
    true
}
