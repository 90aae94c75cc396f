//! Q2_K over the repacked [`crate::repack::Layout::Q2Kx8`] layout (eight rows per
//! group-block), with `sdot` by element (dotprod) and without (baseline NEON: Cortex-A53,
//! Apple A7).
//!
//! Per super-block and eight rows the kernels compute, exactly in integers, each row's
//! `isum = sum_g scale_g * S_g` (`S_g`: the 16-weight group's sum of quant x activation)
//! and `mins = sum_g min_g * bsum_g`, then feed two f32 accumulators per row
//! (`acc = fma(d_w * d_a, isum, acc)`, `macc = fma(dmin_w * d_a, mins, macc)`): the
//! block-sum arithmetic of [`crate::quant::q2_k::vec_dot_block_sum`], bit for bit.
//!
//! A group's vector holds four rows x four bytes whose 2-bit field `k` pairs with
//! activation word `k` of the group:
//! - dotprod: four masks/shifts give the fields, four `sdot` by element leave the four
//!   rows' `S_g` in four lanes (no reduction, no activation shuffles);
//! - baseline: the four activation words are broadcast once per group (shared by the
//!   eight rows), `smull`/`smlal` give per-lane products in i16 (at most 4 x 3 x 128),
//!   two pairwise adds reduce them to the eight rows' `S_g` (|S_g| <= 6144).
//!
//! Either way the eight `S_g` end in one i16 vector, multiplied by the eight rows' scales
//! into two i32 vectors (`smlal`); the minimums are one `smlal` by element with the
//! activation's `bsums` per group and four rows. The plain tail rows (`rows % 8`) go to
//! the plain row kernel (and its arithmetic).
#![allow(unsafe_code)]

use core::arch::aarch64::*;
use core::ops::Range;

use super::neon_legacy::h2f4;
use super::neon_repack::sdot_lane;
use super::neon_ternary_pack::{fields, packed_fn, plain_rows};
use super::table::{KernelTable, PackedJob};
use crate::blocks::cast;
use crate::quant::q2_k::BLOCK_BYTES;
use crate::quant::q8_k::{self, BlockQ8K};
use crate::repack::BlockQ2Kx8;
use crate::GgmlType;

/// Rows per group-block.
const R: usize = 8;

/// The eight rows' exact sums `S_g` of one 16-weight group: `q[h]` holds rows `4h..4h+4`,
/// `a` the group's 16 activation quants.
trait Sums {
    unsafe fn group(q: &[[u8; 16]; 2], a: int8x16_t) -> int16x8_t;
}

/// Four `sdot` by element per four rows.
struct Sdot;
impl Sums for Sdot {
    #[inline(always)]
    unsafe fn group(q: &[[u8; 16]; 2], a: int8x16_t) -> int16x8_t {
        let s = q.map(|h| {
            let f = fields(vld1q_u8(h.as_ptr()));
            let s = sdot_lane::<0>(vdupq_n_s32(0), f[0], a);
            let s = sdot_lane::<1>(s, f[1], a);
            let s = sdot_lane::<2>(s, f[2], a);
            sdot_lane::<3>(s, f[3], a)
        });
        // |S_g| <= 16 * 3 * 128: the low halves of the i32 lanes are exact.
        vuzp1q_s16(vreinterpretq_s16_s32(s[0]), vreinterpretq_s16_s32(s[1]))
    }
}

/// Widening multiplies with the activation words broadcast.
struct Mull;
impl Sums for Mull {
    #[inline(always)]
    unsafe fn group(q: &[[u8; 16]; 2], a: int8x16_t) -> int16x8_t {
        let w = vreinterpretq_s32_s8(a);
        let b = [
            vdupq_laneq_s32::<0>(w),
            vdupq_laneq_s32::<1>(w),
            vdupq_laneq_s32::<2>(w),
            vdupq_laneq_s32::<3>(w),
        ]
        .map(|v| vreinterpretq_s8_s32(v));
        let p = q.map(|h| {
            let f = fields(vld1q_u8(h.as_ptr()));
            // `lo`: rows 0, 1 (four lanes each), `hi`: rows 2, 3.
            let mut lo = vmull_s8(vget_low_s8(f[0]), vget_low_s8(b[0]));
            let mut hi = vmull_high_s8(f[0], b[0]);
            for k in 1..4 {
                lo = vmlal_s8(lo, vget_low_s8(f[k]), vget_low_s8(b[k]));
                hi = vmlal_high_s8(hi, f[k], b[k]);
            }
            vpaddq_s16(lo, hi)
        });
        vpaddq_s16(p[0], p[1])
    }
}

/// Groups `2p`, `2p + 1` of one super-block (their activation group sums are lanes `L0`,
/// `L1` of `bs`) into the eight rows' `isum` and `mins`.
#[inline(always)]
unsafe fn pair<S: Sums, const L0: i32, const L1: i32>(
    x: &BlockQ2Kx8,
    y: &BlockQ8K,
    p: usize,
    bs: int16x8_t,
    isum: &mut [int32x4_t; 2],
    mins: &mut [int32x4_t; 2],
) {
    let s = vld1q_u8(x.scales[p].as_ptr());
    let sc = vandq_u8(s, vdupq_n_u8(15));
    let mn = vshrq_n_u8::<4>(s);
    let sc = [vmovl_u8(vget_low_u8(sc)), vmovl_high_u8(sc)].map(|v| vreinterpretq_s16_u16(v));
    let mn = [vmovl_u8(vget_low_u8(mn)), vmovl_high_u8(mn)].map(|v| vreinterpretq_s16_u16(v));
    mins[0] = vmlal_laneq_s16::<L0>(mins[0], vget_low_s16(mn[0]), bs);
    mins[1] = vmlal_high_laneq_s16::<L0>(mins[1], mn[0], bs);
    mins[0] = vmlal_laneq_s16::<L1>(mins[0], vget_low_s16(mn[1]), bs);
    mins[1] = vmlal_high_laneq_s16::<L1>(mins[1], mn[1], bs);
    for (i, sc) in sc.into_iter().enumerate() {
        let g = 2 * p + i;
        let a = vld1q_s8(y.qs[16 * g..].as_ptr() as *const i8);
        let s = S::group(&x.qs[g], a);
        isum[0] = vmlal_s16(isum[0], vget_low_s16(s), vget_low_s16(sc));
        isum[1] = vmlal_high_s16(isum[1], s, sc);
    }
}

/// The eight rows of group-blocks `x` dotted with activation row `a` (as many blocks).
#[inline(always)]
unsafe fn rows8<S: Sums>(x: &[BlockQ2Kx8], a: &[BlockQ8K]) -> [f32; R] {
    let mut acc = [vdupq_n_f32(0.0); 2];
    let mut macc = [vdupq_n_f32(0.0); 2];
    for (x, y) in x.iter().zip(a) {
        let bp = y.bsums.as_ptr() as *const i16;
        let (b0, b1) = (vld1q_s16(bp), vld1q_s16(bp.add(8)));
        let mut isum = [vdupq_n_s32(0); 2];
        let mut mins = [vdupq_n_s32(0); 2];
        pair::<S, 0, 1>(x, y, 0, b0, &mut isum, &mut mins);
        pair::<S, 2, 3>(x, y, 1, b0, &mut isum, &mut mins);
        pair::<S, 4, 5>(x, y, 2, b0, &mut isum, &mut mins);
        pair::<S, 6, 7>(x, y, 3, b0, &mut isum, &mut mins);
        pair::<S, 0, 1>(x, y, 4, b1, &mut isum, &mut mins);
        pair::<S, 2, 3>(x, y, 5, b1, &mut isum, &mut mins);
        pair::<S, 4, 5>(x, y, 6, b1, &mut isum, &mut mins);
        pair::<S, 6, 7>(x, y, 7, b1, &mut isum, &mut mins);
        let da = y.scale();
        let h = |v: &[[u8; 2]; 8], i: usize| h2f4(vld1_u16(v[4 * i..].as_ptr() as *const u16));
        for i in 0..2 {
            // d_w * d_a, then one fused step per block, as the reference.
            let d = vmulq_n_f32(h(&x.d, i), da);
            let dm = vmulq_n_f32(h(&x.dmin, i), da);
            acc[i] = vfmaq_f32(acc[i], vcvtq_f32_s32(isum[i]), d);
            macc[i] = vfmaq_f32(macc[i], vcvtq_f32_s32(mins[i]), dm);
        }
    }
    let mut out = [0f32; R];
    vst1q_f32(out.as_mut_ptr(), vsubq_f32(acc[0], macc[0]));
    vst1q_f32(out[4..].as_mut_ptr(), vsubq_f32(acc[1], macc[1]));
    out
}

/// The product over a Q2Kx8 tensor for `rows` and every activation row of `acts`;
/// `false` (nothing written) when the shapes do not fit.
///
/// # Safety
/// NEON (and dotprod where `S` uses `sdot`); `table` is a table for this CPU.
#[inline(always)]
unsafe fn run<S: Sums>(
    table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let shape = (BLOCK_BYTES, q8_k::BLOCK_BYTES, R);
    let Some(PackedJob { n_tok, arb, split }) =
        PackedJob::new(w, row_bytes, &rows, acts, out.len(), shape)
    else {
        return false;
    };
    let (head, tail) = out.split_at_mut((split - rows.start) * n_tok);
    let gb = R * row_bytes;
    let groups = if split > rows.start {
        rows.start / R..split.div_ceil(R)
    } else {
        0..0
    };
    for g in groups {
        let Some(x) = cast::<BlockQ2Kx8>(&w[g * gb..(g + 1) * gb]) else {
            return false;
        };
        for t in 0..n_tok {
            let a = q8_k::act_blocks(&acts[t * arb..(t + 1) * arb]);
            let v = rows8::<S>(x, a);
            for (j, v) in v.into_iter().enumerate() {
                let r = g * R + j;
                if (rows.start..split).contains(&r) {
                    head[(r - rows.start) * n_tok + t] = v;
                }
            }
        }
    }
    plain_rows(
        table,
        GgmlType::Q2_K,
        w,
        row_bytes,
        split..rows.end,
        acts,
        arb,
        tail,
    )
}

packed_fn!(base, base_in, "neon", run::<Mull>);
packed_fn!(dot, dot_in, "neon,dotprod", run::<Sdot>);
