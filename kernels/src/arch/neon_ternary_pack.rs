//! TQ2_0 and Q2_0 over the repacked [`crate::repack::Layout::Tq2_0x4`] /
//! [`crate::repack::Layout::Q2_0x4`] layouts (four rows per group-block, 2-bit codes
//! regrouped so that one vector is one 16-weight group of four rows and field `k` of its
//! bytes pairs with activation word `k`), with `sdot` by element (dotprod) and without.
//!
//! Per row the kernels compute the reference's exact integer sums `sum(level * a)` as
//! `sum(code * a) - sum(a)` (`code = level + 1` in 0..4, `-sum(a)` once per activation
//! block for all rows, where the `sdot` accumulators start), then its float steps lane by
//! lane (Q2_0's `sumi += d_a * isum` fused: the product is exact), so the result is the
//! plain reference's ([`crate::quant::tq2_0::vec_dot`], [`crate::quant::q2_0::vec_dot`]) bit for
//! bit:
//! - dotprod: the fields are taken with one mask each and not shifted (`code`, `4 code`,
//!   `16 code`, and the top field with one shift), four `sdot` by element go into three
//!   accumulators, which are merged once per activation block as `A + (B >> 2) + (C >> 4)`
//!   (exact: `B` and `C` are multiples of 4 and 16): eight instructions per 64 weights;
//! - baseline: the four activation words are broadcast once per group (shared by the
//!   eight rows of a pass), `smlal` gives per-lane products in i16 (at most 16 groups x 4
//!   x 3 x 128 < 2^15 before they are reduced), two pairwise adds leave the four rows.
//!
//! Two group-blocks (eight rows) go through together so that the activation loads, the
//! broadcasts and `sum(a)` are shared; the plain tail rows (`rows % 4`) go to the plain
//! one-row kernel.
#![allow(unsafe_code)]

use core::arch::aarch64::*;
use core::ops::Range;

use super::neon_legacy::{h2f, h2f4};
use super::neon_repack::sdot_lane;
use super::table::{KernelTable, PackedJob};
use crate::blocks::{cast, Pod};
use crate::quant::q8_0;
use crate::quant::q8_k;
use crate::quant::{q2_0, tq1_0, tq2_0};
use crate::repack::{BlockQ2_0x4, BlockTq1_0x4, BlockTq2_0x4};
use crate::GgmlType;

/// How one 16-weight group of four rows is multiplied with its 16 activation quants.
trait Sums {
    /// The activation vector as the products need it.
    type A: Copy;
    /// Integer accumulators of four rows.
    type Acc: Copy;
    unsafe fn act(a: int8x16_t) -> Self::A;
    /// `-sum(a)` of an activation block, as [`Sums::start`] and [`Sums::finish`] take it.
    type Neg: Copy;
    unsafe fn neg(s: i32) -> Self::Neg;
    /// Accumulators for one activation block with `-sum(a)` `n`.
    unsafe fn start(n: &Self::Neg) -> Self::Acc;
    unsafe fn group(acc: &mut Self::Acc, v: uint8x16_t, a: &Self::A);
    /// The four rows' `sum(code * a) - sum(a)` = `sum(level * a)` (lanes 0..4).
    unsafe fn finish(acc: Self::Acc, n: &Self::Neg) -> int32x4_t;
    /// Activation word `L` of a vector, prepared for [`Sums::lane`].
    type P: Copy;
    unsafe fn prep<const L: i32>(a: int8x16_t) -> Self::P;
    /// `acc += w x word L` (`w`: four bytes of each of four rows, values 0..4).
    unsafe fn lane<const L: i32>(acc: &mut Self::Acc, w: int8x16_t, p: &Self::P);
}

struct Sdot;
impl Sums for Sdot {
    type A = int8x16_t;
    /// `A` (fields 0 and 3), `B` (field 1, times 4), `C` (field 2, times 16).
    type Acc = [int32x4_t; 3];
    #[inline(always)]
    unsafe fn act(a: int8x16_t) -> int8x16_t {
        a
    }
    /// `-sum(a)` in every lane: `A` starts there.
    type Neg = int32x4_t;
    #[inline(always)]
    unsafe fn neg(s: i32) -> int32x4_t {
        vdupq_n_s32(s)
    }
    #[inline(always)]
    unsafe fn start(n: &int32x4_t) -> Self::Acc {
        [*n, vdupq_n_s32(0), vdupq_n_s32(0)]
    }
    #[inline(always)]
    unsafe fn group(acc: &mut Self::Acc, v: uint8x16_t, a: &int8x16_t) {
        let f = |m: u8| vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(m)));
        acc[0] = sdot_lane::<0>(acc[0], f(0x03), *a);
        acc[1] = sdot_lane::<1>(acc[1], f(0x0c), *a);
        acc[2] = sdot_lane::<2>(acc[2], f(0x30), *a);
        acc[0] = sdot_lane::<3>(acc[0], vreinterpretq_s8_u8(vshrq_n_u8::<6>(v)), *a);
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc, _: &int32x4_t) -> int32x4_t {
        vsraq_n_s32::<4>(vsraq_n_s32::<2>(acc[0], acc[1]), acc[2])
    }
    type P = int8x16_t;
    #[inline(always)]
    unsafe fn prep<const L: i32>(a: int8x16_t) -> int8x16_t {
        a
    }
    #[inline(always)]
    unsafe fn lane<const L: i32>(acc: &mut Self::Acc, w: int8x16_t, a: &int8x16_t) {
        acc[0] = sdot_lane::<L>(acc[0], w, *a);
    }
}

struct Mull;
impl Sums for Mull {
    /// Activation word `k` in every lane.
    type A = [int8x16_t; 4];
    /// Rows 0, 1 (four lanes each) and rows 2, 3, in i16.
    type Acc = [int16x8_t; 2];
    #[inline(always)]
    unsafe fn act(a: int8x16_t) -> Self::A {
        let w = vreinterpretq_s32_s8(a);
        [
            vdupq_laneq_s32::<0>(w),
            vdupq_laneq_s32::<1>(w),
            vdupq_laneq_s32::<2>(w),
            vdupq_laneq_s32::<3>(w),
        ]
        .map(|v| vreinterpretq_s8_s32(v))
    }
    /// `-sum(a)` in every lane, added to the reduced rows.
    type Neg = int32x4_t;
    #[inline(always)]
    unsafe fn neg(s: i32) -> int32x4_t {
        vdupq_n_s32(s)
    }
    #[inline(always)]
    unsafe fn start(_: &int32x4_t) -> Self::Acc {
        [vdupq_n_s16(0); 2]
    }
    #[inline(always)]
    unsafe fn group(acc: &mut Self::Acc, v: uint8x16_t, b: &Self::A) {
        let f = fields(v);
        for k in 0..4 {
            acc[0] = vmlal_s8(acc[0], vget_low_s8(f[k]), vget_low_s8(b[k]));
            acc[1] = vmlal_high_s8(acc[1], f[k], b[k]);
        }
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc, n: &int32x4_t) -> int32x4_t {
        vaddq_s32(vpaddq_s32(vpaddlq_s16(acc[0]), vpaddlq_s16(acc[1])), *n)
    }
    /// Word `L` in every lane.
    type P = int8x16_t;
    #[inline(always)]
    unsafe fn prep<const L: i32>(a: int8x16_t) -> int8x16_t {
        vreinterpretq_s8_s32(vdupq_laneq_s32::<L>(vreinterpretq_s32_s8(a)))
    }
    #[inline(always)]
    unsafe fn lane<const L: i32>(acc: &mut Self::Acc, w: int8x16_t, b: &int8x16_t) {
        acc[0] = vmlal_s8(acc[0], vget_low_s8(w), vget_low_s8(*b));
        acc[1] = vmlal_high_s8(acc[1], w, *b);
    }
}

/// The four 2-bit fields of each byte of `v`, shifted down (0..4).
#[inline(always)]
pub(super) unsafe fn fields(v: uint8x16_t) -> [int8x16_t; 4] {
    let m3 = vdupq_n_u8(3);
    [
        vandq_u8(v, m3),
        vandq_u8(vshrq_n_u8::<2>(v), m3),
        vandq_u8(vshrq_n_u8::<4>(v), m3),
        vshrq_n_u8::<6>(v),
    ]
    .map(|f| vreinterpretq_s8_u8(f))
}

/// `-sum(a)` of int8 quants (whole 16-byte vectors), pairwise in i16.
#[inline(always)]
unsafe fn neg_sum(qs: &[u8]) -> i32 {
    let mut s = vdupq_n_s16(0);
    for v in qs.chunks_exact(16) {
        s = vpadalq_s8(s, vld1q_s8(v.as_ptr() as *const i8));
    }
    -vaddlvq_s16(s)
}

/// A repacked ternary format: its group-block, plain type and the float steps.
trait Fmt {
    type G: Pod;
    const TY: GgmlType;
    /// Plain block bytes.
    const BLOCK: usize;
    /// Activation bytes per plain block.
    const ACT: usize;
    /// `N` group-blocks' rows (`g[i]`: the row group's blocks) dotted with one
    /// activation row.
    unsafe fn rows<S: Sums, const N: usize>(g: [&[Self::G]; N], act: &[u8]) -> [float32x4_t; N];
}

/// The four rows' scales as f32.
#[inline(always)]
unsafe fn scales4(d: &[[u8; 2]; 4]) -> float32x4_t {
    h2f4(vld1_u16(d.as_ptr() as *const u16))
}

/// The Q8_K formats' block loop ([`Tq2`], [`Tq1`]): per block, `body` adds the `N` row
/// groups' `sum(code * a)` to accumulators started at `-sum(a)`; then
/// `sum += sumi * (d_a * d_w)` (multiply, then add), as the references.
#[inline(always)]
unsafe fn q8k_blocks<G, S: Sums, const N: usize>(
    g: [&[G]; N],
    act: &[u8],
    scales: impl Fn(&G) -> &[[u8; 2]; 4],
    mut body: impl FnMut(&q8_k::BlockQ8K, [&G; N], &mut [S::Acc; N]),
) -> [float32x4_t; N] {
    let a = q8_k::act_blocks(act);
    let mut sum = [vdupq_n_f32(0.0); N];
    let nb = g.iter().map(|x| x.len()).min().unwrap_or(0);
    for (b, y) in a.iter().enumerate().take(nb) {
        let x: [&G; N] = core::array::from_fn(|k| &g[k][b]);
        let n = S::neg(neg_sum(&y.qs));
        let mut acc = [S::start(&n); N];
        body(y, x, &mut acc);
        let da = y.scale();
        for k in 0..N {
            let d = vmulq_n_f32(scales4(scales(x[k])), da);
            sum[k] = vaddq_f32(sum[k], vmulq_f32(vcvtq_f32_s32(S::finish(acc[k], &n)), d));
        }
    }
    sum
}

struct Tq2;
impl Fmt for Tq2 {
    type G = BlockTq2_0x4;
    const TY: GgmlType = GgmlType::TQ2_0;
    const BLOCK: usize = tq2_0::BLOCK_BYTES;
    const ACT: usize = q8_k::BLOCK_BYTES;
    #[inline(always)]
    unsafe fn rows<S: Sums, const N: usize>(
        g: [&[BlockTq2_0x4]; N],
        act: &[u8],
    ) -> [float32x4_t; N] {
        q8k_blocks::<_, S, N>(
            g,
            act,
            |x| &x.d,
            |y, x, acc| {
                let mut step = |i: usize| {
                    let ap = S::act(vld1q_s8(y.qs[16 * i..].as_ptr() as *const i8));
                    for k in 0..N {
                        S::group(&mut acc[k], vld1q_u8(x[k].qs[i].as_ptr()), &ap);
                    }
                };
                // Four groups per trip: the loop counter costs less than with one.
                for i in (0..16).step_by(4) {
                    step(i);
                    step(i + 1);
                    step(i + 2);
                    step(i + 3);
                }
            },
        )
    }
}

struct Q20;
impl Fmt for Q20 {
    type G = BlockQ2_0x4;
    const TY: GgmlType = GgmlType::Q2_0;
    const BLOCK: usize = q2_0::BLOCK_BYTES;
    const ACT: usize = 2 * q8_0::BLOCK_BYTES;
    /// Per Q8_0 block `sumi += d_a * isum` (fused: `|isum| <= 2 * 128 * 32 = 2^13` and an
    /// f16 scale has at most 11 significant bits, so the product is exact in f32 and
    /// both ways round once), per Q2_0 block `sum += d_w * sumi` (multiply, then add), as
    /// the reference.
    #[inline(always)]
    unsafe fn rows<S: Sums, const N: usize>(
        g: [&[BlockQ2_0x4]; N],
        act: &[u8],
    ) -> [float32x4_t; N] {
        let a = q8_0::act_blocks(act);
        let mut sum = [vdupq_n_f32(0.0); N];
        let nb = g.iter().map(|x| x.len()).min().unwrap_or(0);
        for (b, ys) in a.chunks_exact(2).enumerate().take(nb) {
            let x: [&BlockQ2_0x4; N] = core::array::from_fn(|k| &g[k][b]);
            let mut sumi = [vdupq_n_f32(0.0); N];
            for (s, y) in ys.iter().enumerate() {
                let n = S::neg(neg_sum(&y.qs));
                let mut acc = [S::start(&n); N];
                for i in 0..2 {
                    let ap = S::act(vld1q_s8(y.qs[16 * i..].as_ptr() as *const i8));
                    for k in 0..N {
                        S::group(&mut acc[k], vld1q_u8(x[k].qs[2 * s + i].as_ptr()), &ap);
                    }
                }
                let da = h2f(y.d);
                for k in 0..N {
                    let isum = vcvtq_f32_s32(S::finish(acc[k], &n));
                    sumi[k] = vfmaq_n_f32(sumi[k], isum, da);
                }
            }
            for k in 0..N {
                sum[k] = vaddq_f32(sum[k], vmulq_f32(scales4(&x[k].d), sumi[k]));
            }
        }
        sum
    }
}

/// The base-3 digits of `N` group-blocks' vectors `w` (digit `n` of byte `b`:
/// `((b * 3^n mod 256) * 3) >> 8`, 0..3, as [`crate::quant::tq1_0`]) dotted with word `L` of
/// `a[n]`, `N` digits.
#[inline(always)]
unsafe fn digits<S: Sums, const L: i32, const D: usize, const N: usize>(
    acc: &mut [S::Acc; N],
    w: [&[u8; 16]; N],
    a: [int8x16_t; D],
) {
    let mut q: [uint8x16_t; N] = w.map(|w| vld1q_u8(w.as_ptr()));
    for (n, a) in a.iter().enumerate() {
        let p = S::prep::<L>(*a);
        for k in 0..N {
            if n > 0 {
                q[k] = vmulq_u8(q[k], vdupq_n_u8(3));
            }
            // (3q) >> 8 = ((q + q / 2) / 2) / 64, every step flooring (no 16-bit product).
            let d = vshrq_n_u8::<6>(vhaddq_u8(q[k], vshrq_n_u8::<1>(q[k])));
            S::lane::<L>(&mut acc[k], vreinterpretq_s8_u8(d), &p);
        }
    }
}

/// The `qh` digits: digit `n` pairs with word `n` of `a`.
#[inline(always)]
unsafe fn qh_digits<S: Sums, const N: usize>(
    acc: &mut [S::Acc; N],
    w: [&[u8; 16]; N],
    a: int8x16_t,
) {
    let mut q: [uint8x16_t; N] = w.map(|w| vld1q_u8(w.as_ptr()));
    let p = [
        S::prep::<0>(a),
        S::prep::<1>(a),
        S::prep::<2>(a),
        S::prep::<3>(a),
    ];
    for (n, p) in p.iter().enumerate() {
        for k in 0..N {
            if n > 0 {
                q[k] = vmulq_u8(q[k], vdupq_n_u8(3));
            }
            let d = vreinterpretq_s8_u8(vshrq_n_u8::<6>(vhaddq_u8(q[k], vshrq_n_u8::<1>(q[k]))));
            match n {
                0 => S::lane::<0>(&mut acc[k], d, p),
                1 => S::lane::<1>(&mut acc[k], d, p),
                2 => S::lane::<2>(&mut acc[k], d, p),
                _ => S::lane::<3>(&mut acc[k], d, p),
            }
        }
    }
}

struct Tq1;
impl Fmt for Tq1 {
    type G = BlockTq1_0x4;
    const TY: GgmlType = GgmlType::TQ1_0;
    const BLOCK: usize = tq1_0::BLOCK_BYTES;
    const ACT: usize = q8_k::BLOCK_BYTES;
    #[inline(always)]
    unsafe fn rows<S: Sums, const N: usize>(
        g: [&[BlockTq1_0x4]; N],
        act: &[u8],
    ) -> [float32x4_t; N] {
        q8k_blocks::<_, S, N>(
            g,
            act,
            |x| &x.d,
            |y, x, acc| {
                let av = |i: usize| vld1q_s8(y.qs[16 * i..].as_ptr() as *const i8);
                // `qa` chunk 4h + L: digit n is weights 32n + 16h + 4L.., word L of vector 2n + h.
                for h in 0..2 {
                    let ah = [av(h), av(2 + h), av(4 + h), av(6 + h), av(8 + h)];
                    digits::<S, 0, 5, N>(acc, x.map(|x| &x.qa[4 * h]), ah);
                    digits::<S, 1, 5, N>(acc, x.map(|x| &x.qa[4 * h + 1]), ah);
                    digits::<S, 2, 5, N>(acc, x.map(|x| &x.qa[4 * h + 2]), ah);
                    digits::<S, 3, 5, N>(acc, x.map(|x| &x.qa[4 * h + 3]), ah);
                }
                // `qb` chunk L: digit n is weights 160 + 16n + 4L.., word L of vector 10 + n.
                let ab = [av(10), av(11), av(12), av(13), av(14)];
                digits::<S, 0, 5, N>(acc, x.map(|x| &x.qb[0]), ab);
                digits::<S, 1, 5, N>(acc, x.map(|x| &x.qb[1]), ab);
                digits::<S, 2, 5, N>(acc, x.map(|x| &x.qb[2]), ab);
                digits::<S, 3, 5, N>(acc, x.map(|x| &x.qb[3]), ab);
                // `qh`: digit n is weights 240 + 4n.., word n of vector 15.
                qh_digits::<S, N>(acc, x.map(|x| &x.qh), av(15));
            },
        )
    }
}

/// Rows `range` of plain rows of `ty` through `table`'s row-range kernel, else its one-row
/// kernel, else the scalar reference; `false` when `ty` has none.
#[allow(clippy::too_many_arguments)]
pub(super) fn plain_rows(
    table: &'static KernelTable,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    range: Range<usize>,
    acts: &[u8],
    arb: usize,
    out: &mut [f32],
) -> bool {
    if range.is_empty() || table.rows(ty, w, row_bytes, range.clone(), acts, arb, out) {
        return true;
    }
    let dot = table.dot_kernel(ty);
    let Some(scalar) = crate::quant::scalar_kernels(ty).and_then(|k| k.vec_dot) else {
        return false;
    };
    let n_tok = acts.len() / arb;
    for (i, r) in range.enumerate() {
        let wr = &w[r * row_bytes..(r + 1) * row_bytes];
        for t in 0..n_tok {
            let a = &acts[t * arb..(t + 1) * arb];
            let v = match dot {
                Some(k) => k.call(wr, a),
                None => Some(scalar(wr, a)),
            };
            let Some(v) = v else {
                return false;
            };
            out[i * n_tok + t] = v;
        }
    }
    true
}

/// The product over a repacked tensor of format `F` for `rows` and every activation row;
/// `false` (nothing written) when the shapes do not fit.
///
/// # Safety
/// NEON (and dotprod where `S` uses `sdot`); `table` is a table for this CPU.
#[inline(always)]
unsafe fn run<F: Fmt, S: Sums, const N: usize>(
    table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let shape = (F::BLOCK, F::ACT, 4);
    let Some(PackedJob { n_tok, arb, split }) =
        PackedJob::new(w, row_bytes, &rows, acts, out.len(), shape)
    else {
        return false;
    };
    let (head, tail) = out.split_at_mut((split - rows.start) * n_tok);
    if !plain_rows(table, F::TY, w, row_bytes, split..rows.end, acts, arb, tail) {
        return false;
    }
    if split == rows.start {
        return true;
    }
    let gb = 4 * row_bytes;
    let group = |g: usize| cast::<F::G>(&w[g * gb..(g + 1) * gb]);
    let (mut g, end) = (rows.start / 4, split.div_ceil(4));
    while g < end {
        // Past the last group, the last one is computed again (not written).
        let mut x: [&[F::G]; N] = [&[]; N];
        for (i, x) in x.iter_mut().enumerate() {
            let Some(b) = group((g + i).min(end - 1)) else {
                return false;
            };
            *x = b;
        }
        for t in 0..n_tok {
            let v = F::rows::<S, N>(x, &acts[t * arb..(t + 1) * arb]);
            for (i, v) in v.iter().enumerate().take((end - g).min(N)) {
                let mut l = [0f32; 4];
                vst1q_f32(l.as_mut_ptr(), *v);
                for (j, v) in l.into_iter().enumerate() {
                    let r = 4 * (g + i) + j;
                    if (rows.start..split).contains(&r) {
                        head[(r - rows.start) * n_tok + t] = v;
                    }
                }
            }
        }
        g += N;
    }
    true
}

/// A `PackedFn` `$name` running `$run` (a generic `run` instantiated for one kernel)
/// compiled with `$feat`, through the inner function `$inner`.
macro_rules! packed_fn {
    ($name:ident, $inner:ident, $feat:literal, $run:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $inner(
            table: &'static KernelTable,
            w: &[u8],
            row_bytes: usize,
            rows: Range<usize>,
            acts: &[u8],
            out: &mut [f32],
        ) -> bool {
            // SAFETY: the caller's contract (the CPU has `$feat`).
            unsafe { $run(table, w, row_bytes, rows, acts, out) }
        }

        /// # Safety
        /// The CPU has the ISA of the table that lists this function; `table` is that table.
        pub(super) unsafe fn $name(
            table: &'static KernelTable,
            w: &[u8],
            row_bytes: usize,
            rows: Range<usize>,
            acts: &[u8],
            out: &mut [f32],
        ) -> bool {
            // SAFETY: the caller's contract.
            unsafe { $inner(table, w, row_bytes, rows, acts, out) }
        }
    };
}
pub(super) use packed_fn;
packed_fn!(tq2_0x4_base, tq2_0x4_base_in, "neon", run::<Tq2, Mull, 4>);
packed_fn!(
    tq2_0x4_dot,
    tq2_0x4_dot_in,
    "neon,dotprod",
    run::<Tq2, Sdot, 4>
);
packed_fn!(q2_0x4_base, q2_0x4_base_in, "neon", run::<Q20, Mull, 4>);
packed_fn!(
    q2_0x4_dot,
    q2_0x4_dot_in,
    "neon,dotprod",
    run::<Q20, Sdot, 2>
);
packed_fn!(tq1_0x4_base, tq1_0x4_base_in, "neon", run::<Tq1, Mull, 4>);
packed_fn!(
    tq1_0x4_dot,
    tq1_0x4_dot_in,
    "neon,dotprod",
    run::<Tq1, Sdot, 4>
);
