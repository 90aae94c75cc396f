//! NEON (and NEON + dotprod) row-range products over the repacked K-quant layouts
//! Q4Kx4 and Q6Kx4 ([`crate::repack::kquant`]), with Q8_K activations.
//!
//! Every 16-byte weight chunk holds four bytes of each of four rows, so four chunks
//! against the four 4-byte words of one 16-byte activation vector are one *quad*:
//! - dotprod: four `sdot` by element, the rows' sums landing in the four lanes;
//! - baseline NEON: each activation word broadcast (`dup`), `smull`/`smull2` into i16
//!   (rows 0, 1 and rows 2, 3), accumulated over the scale group with `smlal`/`smlal2`
//!   (exact: Q4_K's sub-block is 8 chunks, |sum| <= 8 * 15 * 128; Q6_K's group 4 chunks,
//!   <= 4 * 63 * 128; both below 2^15), then `saddlp` and one `addp` give the four rows.
//!
//! A scale group's four row sums are then one `mla` by the four rows' scales (decoded
//! for four rows at once: the layouts store them transposed). Q4_K: a sub-block is two
//! quads (low or high nibbles of eight chunks); its minimums come from the activation's
//! `bsums` (`smlal` by element). Q6_K: a 16-weight group is one quad whose chain starts
//! at `-32 * bsum`, which takes the `- 32` of every weight out of the products.
//!
//! Each block's exact integer then feeds `acc = fma(d * d_a, I, acc)` (and `accm` for the
//! minimums) per row: the order of [`crate::repack::kquant::kquant_dot_blocksum`], which
//! the tests hold these kernels to bit for bit. Rows of a partial group at the ends of
//! the range are computed with their group and dropped; plain tail rows (`rows % 4`) go
//! to the plain kernel.
#![allow(unsafe_code)]

use core::arch::aarch64::*;
use core::ops::Range;

use super::neon_legacy::h2f4;
use super::neon_repack::sdot_lane;
use super::neon_rows::lane;
use super::table::{KernelTable, PackedJob};
use crate::blocks::{cast, Pod};
use crate::quant::q8_k::{self, BlockQ8K};
use crate::quant::{q4_k, q6_k};
use crate::repack::{BlockQ4Kx4, BlockQ6Kx4};
use crate::GgmlType;

/// Tokens per tile of a prompt.
const T: usize = 2;

/// How four chunks (4 rows x 4 unsigned bytes < 64 each) meet the four words of one
/// activation vector; a chain of quads sums one scale group of the four rows.
pub(super) trait Quad {
    type Acc: Copy;
    /// An empty chain whose sum will be offset by `init` (per row).
    unsafe fn start(init: int32x4_t) -> Self::Acc;
    /// `acc` plus chunk `c` against word `c` of `a`, for `c` in 0..4.
    unsafe fn quad(acc: Self::Acc, w: [int8x16_t; 4], a: int8x16_t) -> Self::Acc;
    /// The four rows' sums (row `r` in lane `r`), `init` included.
    unsafe fn finish(acc: Self::Acc, init: int32x4_t) -> int32x4_t;
}

/// `sdot` by element (dotprod).
pub(super) struct SdotQ;
impl Quad for SdotQ {
    type Acc = int32x4_t;
    #[inline(always)]
    unsafe fn start(init: int32x4_t) -> int32x4_t {
        init
    }
    #[inline(always)]
    unsafe fn quad(acc: int32x4_t, w: [int8x16_t; 4], a: int8x16_t) -> int32x4_t {
        let s = sdot_lane::<0>(acc, w[0], a);
        let s = sdot_lane::<1>(s, w[1], a);
        let s = sdot_lane::<2>(s, w[2], a);
        sdot_lane::<3>(s, w[3], a)
    }
    #[inline(always)]
    unsafe fn finish(acc: int32x4_t, _: int32x4_t) -> int32x4_t {
        acc
    }
}

/// Broadcast words and i16 products (baseline NEON); `None` before the first quad.
pub(super) struct MullQ;
impl Quad for MullQ {
    type Acc = Option<(int16x8_t, int16x8_t)>;
    #[inline(always)]
    unsafe fn start(_: int32x4_t) -> Self::Acc {
        None
    }
    #[inline(always)]
    unsafe fn quad(acc: Self::Acc, w: [int8x16_t; 4], a: int8x16_t) -> Self::Acc {
        let a = vreinterpretq_s32_s8(a);
        let b = [
            vdupq_laneq_s32::<0>(a),
            vdupq_laneq_s32::<1>(a),
            vdupq_laneq_s32::<2>(a),
            vdupq_laneq_s32::<3>(a),
        ]
        .map(|v| vreinterpretq_s8_s32(v));
        let mut acc = acc;
        for c in 0..4 {
            acc = Some(match acc {
                None => (
                    vmull_s8(vget_low_s8(w[c]), vget_low_s8(b[c])),
                    vmull_high_s8(w[c], b[c]),
                ),
                Some((p01, p23)) => (
                    vmlal_s8(p01, vget_low_s8(w[c]), vget_low_s8(b[c])),
                    vmlal_high_s8(p23, w[c], b[c]),
                ),
            });
        }
        acc
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc, init: int32x4_t) -> int32x4_t {
        let Some((p01, p23)) = acc else {
            return init;
        };
        vaddq_s32(vpaddq_s32(vpaddlq_s16(p01), vpaddlq_s16(p23)), init)
    }
}

/// Per (row group, token): the f32 accumulators `acc` and `accm` (four rows each).
type Acc = (float32x4_t, float32x4_t);

/// One repacked K-quant layout: adds one block of every group `g[i]` against every
/// token block `y[t]` to `acc[i][t]`.
trait KPack {
    type G: Pod;
    unsafe fn block<D: Quad, const GG: usize, const TT: usize>(
        g: [&Self::G; GG],
        y: [&BlockQ8K; TT],
        acc: &mut [[Acc; TT]; GG],
    );
}

/// Four f16 as f32 from the upper half of `h` (`fcvtl2`).
#[inline(always)]
unsafe fn h2f4_high(h: uint16x8_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: `fcvtl2` is part of the ARMv8-A base SIMD&FP unit; it reads and writes only
    // the named registers.
    core::arch::asm!(
        "fcvtl2 {o:v}.4s, {i:v}.8h",
        i = in(vreg) h,
        o = lateout(vreg) out,
        options(pure, nomem, nostack, preserves_flags),
    );
    out
}

/// Sixteen bytes as eight u16: the low half (`HIGH == false`) or the high half.
#[inline(always)]
unsafe fn widen8<const HIGH: bool>(v: uint8x16_t) -> uint16x8_t {
    if HIGH {
        vmovl_high_u8(v)
    } else {
        vmovl_u8(vget_low_u8(v))
    }
}

/// Sixty-four bytes from `p` as four vectors (one `ld1`).
#[inline(always)]
unsafe fn load64(p: *const u8) -> [uint8x16_t; 4] {
    let v = vld1q_u8_x4(p);
    [v.0, v.1, v.2, v.3]
}

/// Q4Kx4: sub-block `j` of the four rows is two quads over chunks `8(j / 2)..+8` (low
/// nibbles for even `j`, high for odd) against activation vectors `2j`, `2j + 1`.
struct Q4;

/// The decoded scales and minimums of a Q4Kx4 group-block: byte `4j + r` of `sc[0]` /
/// `mn[0]` is sub-block `j` (0..4) of row `r`, of `sc[1]` / `mn[1]` sub-block `4 + j`.
struct Q4W {
    sc: [uint8x16_t; 2],
    mn: [uint8x16_t; 2],
    d: float32x4_t,
    dmin: float32x4_t,
}

/// [`q4_k::scales_mins_k4_packed`] for four rows at once (every step is byte-wise).
#[inline(always)]
unsafe fn q4_decode(b: &BlockQ4Kx4) -> Q4W {
    let w: [uint8x16_t; 3] = core::array::from_fn(|i| vld1q_u8(b.scales[i].as_ptr()));
    let low6 = vdupq_n_u8(0x3f);
    let dd = vld1q_u16(b.d.as_ptr() as *const u16);
    Q4W {
        sc: [
            vandq_u8(w[0], low6),
            // (w2 & 0x0f) | (w0 >> 6) << 4
            vsliq_n_u8::<4>(vandq_u8(w[2], vdupq_n_u8(0x0f)), vshrq_n_u8::<6>(w[0])),
        ],
        mn: [
            vandq_u8(w[1], low6),
            // (w2 >> 4) | (w1 >> 6) << 4
            vsliq_n_u8::<4>(vshrq_n_u8::<4>(w[2]), vshrq_n_u8::<6>(w[1])),
        ],
        d: h2f4(vget_low_u16(dd)),
        dmin: h2f4_high(dd),
    }
}

/// The four rows' scales of sub-blocks `2c` and `2c + 1` as int32 vectors.
#[inline(always)]
unsafe fn q4_scales(w: &Q4W, c: usize) -> [int32x4_t; 2] {
    let h = match c {
        0 => widen8::<false>(w.sc[0]),
        1 => widen8::<true>(w.sc[0]),
        2 => widen8::<false>(w.sc[1]),
        _ => widen8::<true>(w.sc[1]),
    };
    [
        vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))),
        vreinterpretq_s32_u32(vmovl_high_u16(h)),
    ]
}

/// The four rows' minimum integers `sum_j mn[j] * (bsum[2j] + bsum[2j + 1])`, the pair
/// sums `s` added in i16 (as [`crate::repack::kquant::q4_k_terms`]).
#[inline(always)]
unsafe fn q4_mins(w: &Q4W, s: int16x8_t) -> int32x4_t {
    let m = |v: uint8x16_t, high: bool| {
        vreinterpretq_s16_u16(if high {
            widen8::<true>(v)
        } else {
            widen8::<false>(v)
        })
    };
    let (m01, m23, m45, m67) = (
        m(w.mn[0], false),
        m(w.mn[0], true),
        m(w.mn[1], false),
        m(w.mn[1], true),
    );
    let p = vmull_laneq_s16::<0>(vget_low_s16(m01), s);
    let p = vmlal_high_laneq_s16::<1>(p, m01, s);
    let p = vmlal_laneq_s16::<2>(p, vget_low_s16(m23), s);
    let p = vmlal_high_laneq_s16::<3>(p, m23, s);
    let p = vmlal_laneq_s16::<4>(p, vget_low_s16(m45), s);
    let p = vmlal_high_laneq_s16::<5>(p, m45, s);
    let p = vmlal_laneq_s16::<6>(p, vget_low_s16(m67), s);
    vmlal_high_laneq_s16::<7>(p, m67, s)
}

/// The activation's sixteen group sums as two i16 vectors.
#[inline(always)]
unsafe fn bsums(y: &BlockQ8K) -> [int16x8_t; 2] {
    let p = y.bsums.as_ptr() as *const i16;
    [vld1q_s16(p), vld1q_s16(p.add(8))]
}

impl KPack for Q4 {
    type G = BlockQ4Kx4;
    #[inline(always)]
    unsafe fn block<D: Quad, const GG: usize, const TT: usize>(
        g: [&BlockQ4Kx4; GG],
        y: [&BlockQ8K; TT],
        acc: &mut [[Acc; TT]; GG],
    ) {
        let ws: [Q4W; GG] = core::array::from_fn(|i| q4_decode(g[i]));
        let zero = vdupq_n_s32(0);
        let mut isum = [[zero; TT]; GG];
        let m4 = vdupq_n_u8(0x0f);
        for c in 0..4 {
            // Weights 64c..64c + 64 of each token: sub-block 2c, then 2c + 1.
            let a: [[int8x16_t; 4]; TT] = core::array::from_fn(|t| {
                load64(y[t].qs.as_ptr().add(64 * c)).map(|v| vreinterpretq_s8_u8(v))
            });
            for i in 0..GG {
                let q0 = load64(g[i].qs[8 * c].as_ptr());
                let q1 = load64(g[i].qs[8 * c + 4].as_ptr());
                let lo = |q: [uint8x16_t; 4]| q.map(|v| vreinterpretq_s8_u8(vandq_u8(v, m4)));
                let hi = |q: [uint8x16_t; 4]| q.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)));
                let (l0, l1, h0, h1) = (lo(q0), lo(q1), hi(q0), hi(q1));
                let sc = q4_scales(&ws[i], c);
                for t in 0..TT {
                    let s_lo = D::finish(
                        D::quad(D::quad(D::start(zero), l0, a[t][0]), l1, a[t][1]),
                        zero,
                    );
                    let s_hi = D::finish(
                        D::quad(D::quad(D::start(zero), h0, a[t][2]), h1, a[t][3]),
                        zero,
                    );
                    isum[i][t] = vmlaq_s32(vmlaq_s32(isum[i][t], s_lo, sc[0]), s_hi, sc[1]);
                }
            }
        }
        for t in 0..TT {
            let b = bsums(y[t]);
            let s = vpaddq_s16(b[0], b[1]);
            let ys = y[t].scale();
            for i in 0..GG {
                let m = q4_mins(&ws[i], s);
                let (a0, a1) = acc[i][t];
                acc[i][t] = (
                    vfmaq_f32(a0, vcvtq_f32_s32(isum[i][t]), vmulq_n_f32(ws[i].d, ys)),
                    vfmaq_f32(a1, vcvtq_f32_s32(m), vmulq_n_f32(ws[i].dmin, ys)),
                );
            }
        }
    }
}

/// Q6Kx4: in half `h`, for `mh` in 0..2, the chunks `8h + 4mh..+4` of `qh` with those
/// of `ql` at `16h + 4mh` (A) and `16h + 8 + 4mh` (B) give the quads of groups
/// `8h + 2k + mh` (`k` 0..4: low nibbles of A, of B, high nibbles of A, of B, with bit
/// pairs 0, 1, 2, 3 of `qh`), each against activation vector `8h + 2k + mh`.
struct Q6;

/// The four rows' (signed) scales of group `g` as an int32 vector.
#[inline(always)]
unsafe fn q6_scale(sc: &[int8x16_t; 4], g: usize) -> int32x4_t {
    let v = sc[g / 4];
    let h = if g % 4 < 2 {
        vmovl_s8(vget_low_s8(v))
    } else {
        vmovl_high_s8(v)
    };
    if g % 2 == 0 {
        vmovl_s16(vget_low_s16(h))
    } else {
        vmovl_high_s16(h)
    }
}

/// `-32 * bsum[g]` in every lane, for the sixteen groups of a token block.
#[inline(always)]
unsafe fn q6_inits(y: &BlockQ8K) -> [int32x4_t; 16] {
    let b = bsums(y);
    let m = vdupq_n_s32(-32);
    let w = [
        vmulq_s32(vmovl_s16(vget_low_s16(b[0])), m),
        vmulq_s32(vmovl_high_s16(b[0]), m),
        vmulq_s32(vmovl_s16(vget_low_s16(b[1])), m),
        vmulq_s32(vmovl_high_s16(b[1]), m),
    ];
    core::array::from_fn(|g| match g % 4 {
        0 => vdupq_laneq_s32::<0>(w[g / 4]),
        1 => vdupq_laneq_s32::<1>(w[g / 4]),
        2 => vdupq_laneq_s32::<2>(w[g / 4]),
        _ => vdupq_laneq_s32::<3>(w[g / 4]),
    })
}

impl KPack for Q6 {
    type G = BlockQ6Kx4;
    #[inline(always)]
    unsafe fn block<D: Quad, const GG: usize, const TT: usize>(
        g: [&BlockQ6Kx4; GG],
        y: [&BlockQ8K; TT],
        acc: &mut [[Acc; TT]; GG],
    ) {
        let sc: [[int8x16_t; 4]; GG] = core::array::from_fn(|i| {
            core::array::from_fn(|v| vld1q_s8(g[i].scales[v].as_ptr() as *const i8))
        });
        let init: [[int32x4_t; 16]; TT] = core::array::from_fn(|t| q6_inits(y[t]));
        let mut isum = [[vdupq_n_s32(0); TT]; GG];
        let (m2, m30) = (vdupq_n_u8(0x03), vdupq_n_u8(0x30));
        for h in 0..2 {
            // Activation groups 8h..8h + 8 of each token.
            let a: [[int8x16_t; 8]; TT] = core::array::from_fn(|t| {
                let p = y[t].qs.as_ptr().add(128 * h);
                let (x, z) = (load64(p), load64(p.add(64)));
                core::array::from_fn(|k| vreinterpretq_s8_u8(if k < 4 { x[k] } else { z[k - 4] }))
            });
            for mh in 0..2 {
                for i in 0..GG {
                    let qh = load64(g[i].qh[8 * h + 4 * mh].as_ptr());
                    let qa = load64(g[i].ql[16 * h + 4 * mh].as_ptr());
                    let qb = load64(g[i].ql[16 * h + 8 + 4 * mh].as_ptr());
                    let s8 = |v: [uint8x16_t; 4]| v.map(|x| vreinterpretq_s8_u8(x));
                    let t2: [uint8x16_t; 4] = qh.map(|x| vshrq_n_u8::<2>(x));
                    // Low nibble | bit pair << 4 (`sli`), high nibble | bit pair (`sri`).
                    let u = [
                        s8(core::array::from_fn(|m| {
                            vsliq_n_u8::<4>(qa[m], vandq_u8(qh[m], m2))
                        })),
                        s8(core::array::from_fn(|m| {
                            vsliq_n_u8::<4>(qb[m], vandq_u8(t2[m], m2))
                        })),
                        s8(core::array::from_fn(|m| {
                            vsriq_n_u8::<4>(vandq_u8(qh[m], m30), qa[m])
                        })),
                        s8(core::array::from_fn(|m| {
                            vsriq_n_u8::<4>(vandq_u8(t2[m], m30), qb[m])
                        })),
                    ];
                    for (k, uk) in u.into_iter().enumerate() {
                        let gi = 8 * h + 2 * k + mh;
                        let s = q6_scale(&sc[i], gi);
                        for t in 0..TT {
                            let x = D::quad(D::start(init[t][gi]), uk, a[t][2 * k + mh]);
                            isum[i][t] = vmlaq_s32(isum[i][t], D::finish(x, init[t][gi]), s);
                        }
                    }
                }
            }
        }
        for i in 0..GG {
            let d = h2f4(vld1_u16(g[i].d.as_ptr() as *const u16));
            for t in 0..TT {
                let a0 = acc[i][t].0;
                acc[i][t].0 =
                    vfmaq_f32(a0, vcvtq_f32_s32(isum[i][t]), vmulq_n_f32(d, y[t].scale()));
            }
        }
    }
}

/// `GG` groups against `TT` tokens, all of `nb` blocks.
///
/// # Safety
/// NEON (and dotprod for [`SdotQ`]); `nb` group-blocks are readable at every `g[i]`
/// and `nb` blocks at every `a[t]`.
#[inline(always)]
unsafe fn tile<K: KPack, D: Quad, const GG: usize, const TT: usize>(
    g: [*const K::G; GG],
    a: [*const BlockQ8K; TT],
    nb: usize,
) -> [[[f32; TT]; 4]; GG] {
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[(zero, zero); TT]; GG];
    for b in 0..nb {
        // SAFETY: the caller's `nb` blocks start at each pointer.
        K::block::<D, GG, TT>(
            core::array::from_fn(|i| &*g[i].add(b)),
            core::array::from_fn(|t| &*a[t].add(b)),
            &mut acc,
        );
    }
    core::array::from_fn(|i| {
        let v: [float32x4_t; TT] = core::array::from_fn(|t| vsubq_f32(acc[i][t].0, acc[i][t].1));
        core::array::from_fn(|r| core::array::from_fn(|t| lane(v[t], r)))
    })
}

/// The shape of one call's work on whole groups.
struct Job {
    rb: usize,
    rows: Range<usize>,
    arb: usize,
    n_tok: usize,
}

/// Rows `job.rows` (inside whole groups present in `w`): pairs of groups x tiles of
/// tokens (an odd last group is computed twice, its second result not written).
#[inline(always)]
unsafe fn body<K: KPack, D: Quad>(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) {
    let (rb, n_tok) = (job.rb, job.n_tok);
    let nb = 4 * rb / core::mem::size_of::<K::G>();
    let act = |t: usize| acts.as_ptr().add(t * job.arb) as *const BlockQ8K;
    let rows = &job.rows;
    let mut put = |g: usize, r: usize, t: usize, v: f32| {
        let r = 4 * g + r;
        if rows.contains(&r) {
            out[(r - rows.start) * n_tok + t] = v;
        }
    };
    let group = |g: usize| -> Option<*const K::G> {
        let gw = cast::<K::G>(w.get(g * 4 * rb..(g + 1) * 4 * rb)?)?;
        (gw.len() == nb).then_some(gw.as_ptr())
    };
    let (mut g, end) = (rows.start / 4, rows.end.div_ceil(4));
    while g < end {
        let (Some(p0), Some(p1)) = (group(g), group((g + 1).min(end - 1))) else {
            return;
        };
        let groups = if g + 1 < end { 2 } else { 1 };
        let mut t = 0;
        while t + T <= n_tok {
            let res = tile::<K, D, 2, T>([p0, p1], core::array::from_fn(|j| act(t + j)), nb);
            for (i, gr) in res.iter().take(groups).enumerate() {
                for (r, rr) in gr.iter().enumerate() {
                    for (j, v) in rr.iter().enumerate() {
                        put(g + i, r, t + j, *v);
                    }
                }
            }
            t += T;
        }
        while t < n_tok {
            let res = tile::<K, D, 2, 1>([p0, p1], [act(t)], nb);
            for (i, gr) in res.iter().take(groups).enumerate() {
                for (r, rr) in gr.iter().enumerate() {
                    put(g + i, r, t, rr[0]);
                }
            }
            t += 1;
        }
        g += 2;
    }
}

/// Entry points, one per feature set (so that `sdot` is only compiled into the dotprod
/// one).
mod jobs {
    use super::*;

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn base<K: KPack>(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) {
        body::<K, MullQ>(job, w, acts, out)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub(super) unsafe fn dot<K: KPack>(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) {
        body::<K, SdotQ>(job, w, acts, out)
    }
}

/// Product over a repacked K-quant tensor (`w`: all of its rows) of plain type `ty`
/// with `block` bytes per plain block, or `false` (nothing written) when the shapes do
/// not fit. Rows past the last whole group are plain; they go to `table`'s plain kernel.
///
/// # Safety
/// The CPU has Advanced SIMD (and dotprod when `DOT`); `table` is a table for this CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn run<K: KPack, const DOT: bool>(
    table: &'static KernelTable,
    ty: GgmlType,
    block: usize,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let Some(PackedJob { n_tok, arb, split }) = PackedJob::new(
        w,
        row_bytes,
        &rows,
        acts,
        out.len(),
        (block, q8_k::BLOCK_BYTES, 4),
    ) else {
        return false;
    };
    let (head, tail) = out.split_at_mut((split - rows.start) * n_tok);
    if split > rows.start {
        let j = Job {
            rb: row_bytes,
            rows: rows.start..split,
            arb,
            n_tok,
        };
        // SAFETY: the checks above put every group-block of the groups of `j.rows` (all
        // in whole groups) inside `w`, every activation row inside `acts`, and `head` has
        // one value per (row, token); the caller guarantees the ISA.
        unsafe {
            if DOT {
                jobs::dot::<K>(&j, w, acts, head)
            } else {
                jobs::base::<K>(&j, w, acts, head)
            }
        }
    }
    if split < rows.end {
        return table.rows(ty, w, row_bytes, split..rows.end, acts, arb, tail);
    }
    true
}

/// A `PackedFn` for layout `$k` (`$dot`: compiled with dotprod).
macro_rules! packed_fn {
    ($name:ident, $k:ty, $dot:literal, $ty:ident, $block:expr) => {
        /// # Safety
        /// The CPU has the ISA of the table that lists this function.
        pub(super) unsafe fn $name(
            table: &'static KernelTable,
            w: &[u8],
            row_bytes: usize,
            rows: Range<usize>,
            acts: &[u8],
            out: &mut [f32],
        ) -> bool {
            // SAFETY: the caller's contract.
            unsafe { run::<$k, $dot>(table, GgmlType::$ty, $block, w, row_bytes, rows, acts, out) }
        }
    };
}
packed_fn!(q4_kx4_base, Q4, false, Q4_K, q4_k::BLOCK_BYTES);
packed_fn!(q4_kx4_dot, Q4, true, Q4_K, q4_k::BLOCK_BYTES);
packed_fn!(q6_kx4_base, Q6, false, Q6_K, q6_k::BLOCK_BYTES);
packed_fn!(q6_kx4_dot, Q6, true, Q6_K, q6_k::BLOCK_BYTES);
