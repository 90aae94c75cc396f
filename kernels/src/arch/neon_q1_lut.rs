//! Q1_0 by table lookup on baseline NEON (Four-Russians / T-MAC style), over the
//! repacked [`crate::repack::Layout::Q1_0x16`] layout. Runs on every aarch64 core
//! (Cortex-A53, Apple A7: no dotprod needed; the dotprod table uses it too, as `sdot`
//! would not count fewer instructions here).
//!
//! A Q1_0 weight is a sign: row `r` dotted with a Q8_0 block is `sum(s_j * q_j)` with
//! `s_j = ±1`, i.e. `2 * sum(q_j over set bits) - sum(q_j)`. Per group of four
//! activations the subset sums over the 16 patterns of four sign bits are looked up
//! instead of computed: one `tbl` gives 16 rows' subset sums for four weights each
//! (the layout puts 16 rows' bytes side by side, so a byte's low and high nibbles are two
//! groups' indices for one row).
//!
//! Exactness. A subset sum of four int8 spans -512..508 and a `tbl` entry is a byte, so
//! each activation is split as `q = 16 h + l` (`l = q & 15` in 0..16, `h = q >> 4` in
//! -8..8) and each group has two tables: `L` (subset sums of `l`, 0..=60) and `H` (of `h`,
//! -32..=28). Four groups' `L` bytes add up in u8 (at most 240) and their `H` bytes in
//! i8 (-128..=112) exactly; they then go into an i16 accumulator per row as `32 H + 2 L`
//! (`smlal`/`umlal`), which starts at `-sum(q)` of the Q8_0 block, so it ends at the
//! exact `sum(s_j q_j)` (|.| <= 4096) for any int8 activations. From there the float
//! steps are the scalar reference's ([`crate::quant::q1_0::vec_dot`]), lane by lane:
//! `sumi = sumi + d_a * isum` per Q8_0 block (multiply, then add), `sum = sum + d_w *
//! sumi` per Q1_0 block, so the result is the reference's bit for bit.
//!
//! Cost (qemu counts, see the crate README): per 16 rows x 16 weights two loads are
//! shared by all rows, and per 16 rows x 4 weights one `tbl` pair; the per-row float
//! steps (three per row and Q8_0 block) are a quarter of the total.
#![allow(unsafe_code)]

use core::arch::aarch64::*;
use core::ops::Range;

use super::neon_legacy::{h2f, h2f4};
use super::table::{KernelTable, PackedJob};
use crate::blocks::cast;
use crate::quant::q1_0::BLOCK_BYTES;
use crate::quant::q8_0::{self, BlockQ8_0};
use crate::repack::BlockQ1_0x16;
use crate::GgmlType;

/// Rows per group-block.
const R: usize = 16;
/// Q8_0 blocks per Q1_0 block.
const SUB: usize = 4;
/// Groups of four activations per Q1_0 block.
const GROUPS: usize = 32;
/// Q1_0 blocks whose tables are built at once (8 KiB of tables on the stack).
const KC: usize = 8;
/// Row groups computed side by side (they share each table load).
const RG: usize = 2;

/// The lookup tables of up to [`KC`] Q1_0 blocks of one activation row.
struct Tables {
    /// Per group: subset sums of the four activations' low nibbles (`q & 15`).
    lo: [[u8; 16]; KC * GROUPS],
    /// Per group: subset sums of their high parts (`q >> 4`, i8 as bytes).
    hi: [[u8; 16]; KC * GROUPS],
    /// Per Q8_0 block: `-sum(q)`.
    neg_sum: [i16; KC * SUB],
    /// Per Q8_0 block: the scale.
    d: [f32; KC * SUB],
}

/// `m[i]`: lane `n` is 0xff when bit `i` of `n` is set.
const BIT_MASKS: [[u8; 16]; 4] = {
    let mut m = [[0u8; 16]; 4];
    let mut i = 0;
    while i < 4 {
        let mut n = 0;
        while n < 16 {
            if (n >> i) & 1 == 1 {
                m[i][n] = 0xff;
            }
            n += 1;
        }
        i += 1;
    }
    m
};

/// The 16 subset sums of lanes `4g..4g+4` of `v` (bytes, wrapping: callers keep them in
/// range).
#[inline(always)]
unsafe fn subset_sums<const G: i32>(v: uint8x16_t, m: &[uint8x16_t; 4]) -> uint8x16_t {
    // Lanes 4G + i broadcast by `tbl` with a constant index (no lane-generic `dup`).
    let sel = |i: i32| vdupq_n_u8((4 * G + i) as u8);
    let t0 = vandq_u8(m[0], vqtbl1q_u8(v, sel(0)));
    let t1 = vandq_u8(m[1], vqtbl1q_u8(v, sel(1)));
    let t2 = vandq_u8(m[2], vqtbl1q_u8(v, sel(2)));
    let t3 = vandq_u8(m[3], vqtbl1q_u8(v, sel(3)));
    vaddq_u8(vaddq_u8(t0, t1), vaddq_u8(t2, t3))
}

/// Build the tables of `act` (whole Q8_0 blocks, at most `KC * SUB`).
#[target_feature(enable = "neon")]
unsafe fn build(act: &[BlockQ8_0], t: &mut Tables) {
    let m = BIT_MASKS.map(|x| vld1q_u8(x.as_ptr()));
    let m15 = vdupq_n_u8(15);
    for (k, y) in act.iter().enumerate().take(KC * SUB) {
        t.d[k] = h2f(y.d);
        t.neg_sum[k] = -(y.q_sum() as i16);
        for half in 0..2 {
            let v = vld1q_u8(y.qs[16 * half..].as_ptr());
            let l = vandq_u8(v, m15);
            let h = vreinterpretq_u8_s8(vshrq_n_s8::<4>(vreinterpretq_s8_u8(v)));
            let g = 8 * k + 4 * half;
            vst1q_u8(t.lo[g].as_mut_ptr(), subset_sums::<0>(l, &m));
            vst1q_u8(t.lo[g + 1].as_mut_ptr(), subset_sums::<1>(l, &m));
            vst1q_u8(t.lo[g + 2].as_mut_ptr(), subset_sums::<2>(l, &m));
            vst1q_u8(t.lo[g + 3].as_mut_ptr(), subset_sums::<3>(l, &m));
            vst1q_u8(t.hi[g].as_mut_ptr(), subset_sums::<0>(h, &m));
            vst1q_u8(t.hi[g + 1].as_mut_ptr(), subset_sums::<1>(h, &m));
            vst1q_u8(t.hi[g + 2].as_mut_ptr(), subset_sums::<2>(h, &m));
            vst1q_u8(t.hi[g + 3].as_mut_ptr(), subset_sums::<3>(h, &m));
        }
    }
}

/// `acc + high(a) * high(b)` (signed bytes into i16): one `smlal2` (the intrinsic
/// becomes an `ext` and an `smlal`).
#[inline(always)]
fn smlal2(acc: int16x8_t, a: int8x16_t, b: int8x16_t) -> int16x8_t {
    let mut acc = acc;
    // SAFETY: `smlal2` is base Advanced SIMD; it touches only the named registers.
    unsafe {
        core::arch::asm!(
            "smlal2 {acc:v}.8h, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `acc + high(a) * high(b)` (unsigned bytes into 16-bit lanes, wrapping): `umlal2`.
#[inline(always)]
fn umlal2(acc: int16x8_t, a: uint8x16_t, b: uint8x16_t) -> int16x8_t {
    let mut acc = acc;
    // SAFETY: as in `smlal2`.
    unsafe {
        core::arch::asm!(
            "umlal2 {acc:v}.8h, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `sums[gi]` (16 rows as four vectors) plus the dot products of `RG` row groups'
/// group-blocks `blocks[gi][..nkb]` with the tabled activations.
// `b` indexes the row groups' blocks and the tables alike.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "neon")]
unsafe fn groups(
    blocks: [&[BlockQ1_0x16]; RG],
    nkb: usize,
    t: &Tables,
    sums: &mut [[float32x4_t; 4]; RG],
) {
    let m15 = vdupq_n_u8(15);
    // Opaque to the optimizer: with a known 32 or 2 it turns each `smlal`/`umlal` into
    // a shift and an add (twice the instructions).
    let c32q = core::hint::black_box(vdupq_n_s8(32));
    let c2q = core::hint::black_box(vdupq_n_u8(2));
    let c32 = vget_low_s8(c32q);
    let c2 = vget_low_u8(c2q);
    for b in 0..nkb {
        let mut sumi = [[vdupq_n_f32(0.0); 4]; RG];
        for sb in 0..SUB {
            let k = b * SUB + sb;
            let start = vdupq_n_s16(t.neg_sum[k]);
            let mut acc = [[start; 2]; RG];
            for half in 0..2 {
                let g = b * GROUPS + sb * 8 + half * 4;
                let lt = vld1q_u8_x4(t.lo[g].as_ptr());
                let ht = vld1q_u8_x4(t.hi[g].as_ptr());
                let p = sb * 4 + half * 2;
                for r in 0..RG {
                    let blk = &blocks[r][b];
                    let p0 = vld1q_u8(blk.qs[p].as_ptr());
                    let p1 = vld1q_u8(blk.qs[p + 1].as_ptr());
                    let i0 = vandq_u8(p0, m15);
                    let i1 = vshrq_n_u8::<4>(p0);
                    let i2 = vandq_u8(p1, m15);
                    let i3 = vshrq_n_u8::<4>(p1);
                    let lb = vaddq_u8(
                        vaddq_u8(vqtbl1q_u8(lt.0, i0), vqtbl1q_u8(lt.1, i1)),
                        vaddq_u8(vqtbl1q_u8(lt.2, i2), vqtbl1q_u8(lt.3, i3)),
                    );
                    let hb = vaddq_s8(
                        vaddq_s8(
                            vreinterpretq_s8_u8(vqtbl1q_u8(ht.0, i0)),
                            vreinterpretq_s8_u8(vqtbl1q_u8(ht.1, i1)),
                        ),
                        vaddq_s8(
                            vreinterpretq_s8_u8(vqtbl1q_u8(ht.2, i2)),
                            vreinterpretq_s8_u8(vqtbl1q_u8(ht.3, i3)),
                        ),
                    );
                    let a = &mut acc[r];
                    a[0] = vmlal_s8(a[0], vget_low_s8(hb), c32);
                    a[1] = smlal2(a[1], hb, c32q);
                    a[0] = vreinterpretq_s16_u16(vmlal_u8(
                        vreinterpretq_u16_s16(a[0]),
                        vget_low_u8(lb),
                        c2,
                    ));
                    a[1] = umlal2(a[1], lb, c2q);
                }
            }
            let d = t.d[k];
            for r in 0..RG {
                let a = &acc[r];
                let s = [
                    vmovl_s16(vget_low_s16(a[0])),
                    vmovl_high_s16(a[0]),
                    vmovl_s16(vget_low_s16(a[1])),
                    vmovl_high_s16(a[1]),
                ];
                for (q, sq) in s.into_iter().enumerate() {
                    // `sumi += d_a * isum`: multiply, then add (no fused step).
                    sumi[r][q] = vaddq_f32(sumi[r][q], vmulq_n_f32(vcvtq_f32_s32(sq), d));
                }
            }
        }
        for r in 0..RG {
            let blk = &blocks[r][b];
            for q in 0..4 {
                let h = [
                    u16::from_le_bytes(blk.d[4 * q]),
                    u16::from_le_bytes(blk.d[4 * q + 1]),
                    u16::from_le_bytes(blk.d[4 * q + 2]),
                    u16::from_le_bytes(blk.d[4 * q + 3]),
                ];
                let dw = h2f4(vld1_u16(h.as_ptr()));
                sums[r][q] = vaddq_f32(sums[r][q], vmulq_f32(dw, sumi[r][q]));
            }
        }
    }
}

/// The product over a Q1_0x16 tensor (`w`: all of its rows) for `rows` and every
/// activation row in `acts`; `false` (nothing written) when the shapes do not fit. Rows
/// past the last whole group of 16 are plain and go to `table`'s one-row Q1_0 kernel.
///
/// # Safety
/// The CPU has Advanced SIMD, and `table` is a table for this CPU.
pub(super) unsafe fn matmul(
    table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let act_per_block = SUB * q8_0::BLOCK_BYTES;
    let shape = (BLOCK_BYTES, act_per_block, R);
    let Some(PackedJob { n_tok, arb, split }) =
        PackedJob::new(w, row_bytes, &rows, acts, out.len(), shape)
    else {
        return false;
    };
    let nb = row_bytes / BLOCK_BYTES;
    let dot = table.dot_kernel(GgmlType::Q1_0);
    for r in split..rows.end {
        let wr = &w[r * row_bytes..(r + 1) * row_bytes];
        for t in 0..n_tok {
            let a = &acts[t * arb..(t + 1) * arb];
            let Some(v) = dot.and_then(|k| k.call(wr, a)) else {
                return false;
            };
            out[(r - rows.start) * n_tok + t] = v;
        }
    }
    if split == rows.start {
        return true;
    }
    let group_bytes = R * row_bytes;
    let g_range = rows.start / R..split.div_ceil(R);
    let mut tabs = Tables {
        lo: [[0; 16]; KC * GROUPS],
        hi: [[0; 16]; KC * GROUPS],
        neg_sum: [0; KC * SUB],
        d: [0.0; KC * SUB],
    };
    for t in 0..n_tok {
        let Some(a) = cast::<BlockQ8_0>(&acts[t * arb..(t + 1) * arb]) else {
            return false;
        };
        for b0 in (0..nb).step_by(KC) {
            let nkb = KC.min(nb - b0);
            // SAFETY: Advanced SIMD (the caller's contract); `a` has `nb * SUB` blocks.
            unsafe { build(&a[b0 * SUB..(b0 + nkb) * SUB], &mut tabs) };
            let mut g = g_range.start;
            while g < g_range.end {
                let n_groups = RG.min(g_range.end - g);
                let mut sums = [[vdupq_n_f32(0.0); 4]; RG];
                let mut blocks: [&[BlockQ1_0x16]; RG] = [&[]; RG];
                for i in 0..n_groups {
                    let gb = &w[(g + i) * group_bytes..(g + i + 1) * group_bytes];
                    let Some(x) = cast::<BlockQ1_0x16>(gb) else {
                        return false;
                    };
                    blocks[i] = &x[b0..b0 + nkb];
                    let first = (g + i) * R;
                    if b0 > 0 && n_tok == 1 && rows.start <= first && first + R <= split {
                        // The whole group in range: the partial sums are contiguous.
                        let o = &out[first - rows.start..first - rows.start + R];
                        for q in 0..4 {
                            sums[i][q] = vld1q_f32(o[4 * q..].as_ptr());
                        }
                    } else if b0 > 0 {
                        let mut l = [0.0f32; R];
                        for (j, v) in l.iter_mut().enumerate() {
                            let r = (g + i) * R + j;
                            if rows.contains(&r) {
                                *v = out[(r - rows.start) * n_tok + t];
                            }
                        }
                        for q in 0..4 {
                            sums[i][q] = vld1q_f32(l[4 * q..].as_ptr());
                        }
                    }
                }
                // An odd last group is computed twice (written once).
                for i in n_groups..RG {
                    blocks[i] = blocks[0];
                    sums[i] = sums[0];
                }
                // SAFETY: Advanced SIMD; every slice is in bounds (checked above).
                unsafe { groups(blocks, nkb, &tabs, &mut sums) };
                for (i, s) in sums.iter().enumerate().take(n_groups) {
                    let first = (g + i) * R;
                    if n_tok == 1 && rows.start <= first && first + R <= split {
                        let o = &mut out[first - rows.start..first - rows.start + R];
                        for q in 0..4 {
                            vst1q_f32(o[4 * q..].as_mut_ptr(), s[q]);
                        }
                        continue;
                    }
                    let mut l = [0.0f32; R];
                    for q in 0..4 {
                        vst1q_f32(l[4 * q..].as_mut_ptr(), s[q]);
                    }
                    for (j, v) in l.iter().enumerate() {
                        let r = (g + i) * R + j;
                        if rows.contains(&r) && r < split {
                            out[(r - rows.start) * n_tok + t] = *v;
                        }
                    }
                }
                g += n_groups;
            }
        }
    }
    true
}
