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

use super::neon_legacy::h2f4;
use super::neon_repack::{packed_fn, sdot_lane, walk, Job};
use super::neon_rows::lane;
use crate::blocks::Pod;
use crate::quant::q8_k::{self, BlockQ8K};
use crate::quant::{q4_k, q6_k};
use crate::repack::{BlockQ4Kx4, BlockQ6Kx4};

/// Tokens per tile of a prompt.
const T: usize = 2;

/// How four chunks (4 rows x 4 unsigned bytes < 64 each) meet the four words of one
/// activation vector; a chain of quads sums one scale group of the four rows.
pub(super) trait Quad {
    /// One activation vector prepared for quads (once per token, shared by the groups).
    type A: Copy;
    type Acc: Copy;
    unsafe fn prep(a: int8x16_t) -> Self::A;
    /// The first quad of a chain whose sum is offset by `init` (per row).
    unsafe fn first(w: [int8x16_t; 4], a: &Self::A, init: int32x4_t) -> Self::Acc;
    /// `acc` plus chunk `c` against word `c` of `a`, for `c` in 0..4.
    unsafe fn quad(acc: Self::Acc, w: [int8x16_t; 4], a: &Self::A) -> Self::Acc;
    /// The four rows' sums (row `r` in lane `r`), `init` included.
    unsafe fn finish(acc: Self::Acc, init: int32x4_t) -> int32x4_t;
    /// One quad of any int8 weights (|w| <= 128; activations not -128), summed.
    unsafe fn full(w: [int8x16_t; 4], a: &Self::A) -> int32x4_t;
}

/// `sdot` by element (dotprod).
pub(super) struct SdotQ;
impl Quad for SdotQ {
    type A = int8x16_t;
    type Acc = int32x4_t;
    #[inline(always)]
    unsafe fn prep(a: int8x16_t) -> int8x16_t {
        a
    }
    #[inline(always)]
    unsafe fn first(w: [int8x16_t; 4], a: &int8x16_t, init: int32x4_t) -> int32x4_t {
        Self::quad(init, w, a)
    }
    #[inline(always)]
    unsafe fn quad(acc: int32x4_t, w: [int8x16_t; 4], a: &int8x16_t) -> int32x4_t {
        let s = sdot_lane::<0>(acc, w[0], *a);
        let s = sdot_lane::<1>(s, w[1], *a);
        let s = sdot_lane::<2>(s, w[2], *a);
        sdot_lane::<3>(s, w[3], *a)
    }
    #[inline(always)]
    unsafe fn finish(acc: int32x4_t, _: int32x4_t) -> int32x4_t {
        acc
    }
    #[inline(always)]
    unsafe fn full(w: [int8x16_t; 4], a: &int8x16_t) -> int32x4_t {
        Self::quad(vdupq_n_s32(0), w, a)
    }
}

/// Broadcast words and i16 products (baseline NEON): rows 0, 1 in the first vector of
/// the chain, rows 2, 3 in the second.
pub(super) struct MullQ;
impl Quad for MullQ {
    type A = [int8x16_t; 4];
    type Acc = (int16x8_t, int16x8_t);
    #[inline(always)]
    unsafe fn prep(a: int8x16_t) -> [int8x16_t; 4] {
        let a = vreinterpretq_s32_s8(a);
        [
            vdupq_laneq_s32::<0>(a),
            vdupq_laneq_s32::<1>(a),
            vdupq_laneq_s32::<2>(a),
            vdupq_laneq_s32::<3>(a),
        ]
        .map(|v| vreinterpretq_s8_s32(v))
    }
    #[inline(always)]
    unsafe fn first(w: [int8x16_t; 4], b: &[int8x16_t; 4], _: int32x4_t) -> Self::Acc {
        let acc = (mull::<false>(w[0], b[0]), mull::<true>(w[0], b[0]));
        Self::more(acc, w, b, 1)
    }
    #[inline(always)]
    unsafe fn quad(acc: Self::Acc, w: [int8x16_t; 4], b: &[int8x16_t; 4]) -> Self::Acc {
        Self::more(acc, w, b, 0)
    }
    #[inline(always)]
    unsafe fn finish((p01, p23): Self::Acc, init: int32x4_t) -> int32x4_t {
        vaddq_s32(vpaddq_s32(vpaddlq_s16(p01), vpaddlq_s16(p23)), init)
    }
    /// Two products per i16 lane (|w * a| <= 128 * 127), widened after each pair.
    #[inline(always)]
    unsafe fn full(w: [int8x16_t; 4], b: &[int8x16_t; 4]) -> int32x4_t {
        let pair = |c: usize, high: bool| {
            if high {
                mlal::<true>(mull::<true>(w[c], b[c]), w[c + 1], b[c + 1])
            } else {
                mlal::<false>(mull::<false>(w[c], b[c]), w[c + 1], b[c + 1])
            }
        };
        let s01 = vpadalq_s16(vpaddlq_s16(pair(0, false)), pair(2, false));
        let s23 = vpadalq_s16(vpaddlq_s16(pair(0, true)), pair(2, true));
        vpaddq_s32(s01, s23)
    }
}

impl MullQ {
    /// `acc` plus chunks `from..4`.
    #[inline(always)]
    unsafe fn more(
        mut acc: (int16x8_t, int16x8_t),
        w: [int8x16_t; 4],
        b: &[int8x16_t; 4],
        from: usize,
    ) -> (int16x8_t, int16x8_t) {
        for c in from..4 {
            acc = (
                mlal::<false>(acc.0, w[c], b[c]),
                mlal::<true>(acc.1, w[c], b[c]),
            );
        }
        acc
    }
}

/// `smull` (`HIGH`: `smull2`) of the low (high) eight bytes, written out because LLVM
/// otherwise splits a product against a broadcast word into `sshll` + `mul`.
#[inline(always)]
unsafe fn mull<const HIGH: bool>(a: int8x16_t, b: int8x16_t) -> int16x8_t {
    let out: int16x8_t;
    // SAFETY: baseline Advanced SIMD; reads and writes only the named registers.
    if HIGH {
        core::arch::asm!("smull2 {o:v}.8h, {a:v}.16b, {b:v}.16b", a = in(vreg) a, b = in(vreg) b,
            o = lateout(vreg) out, options(pure, nomem, nostack, preserves_flags));
    } else {
        core::arch::asm!("smull {o:v}.8h, {a:v}.8b, {b:v}.8b", a = in(vreg) a, b = in(vreg) b,
            o = lateout(vreg) out, options(pure, nomem, nostack, preserves_flags));
    }
    out
}

/// `acc +` [`mull`] (`smlal` / `smlal2`).
#[inline(always)]
unsafe fn mlal<const HIGH: bool>(mut acc: int16x8_t, a: int8x16_t, b: int8x16_t) -> int16x8_t {
    // SAFETY: baseline Advanced SIMD; reads and writes only the named registers.
    if HIGH {
        core::arch::asm!("smlal2 {o:v}.8h, {a:v}.16b, {b:v}.16b", a = in(vreg) a, b = in(vreg) b,
            o = inout(vreg) acc, options(pure, nomem, nostack, preserves_flags));
    } else {
        core::arch::asm!("smlal {o:v}.8h, {a:v}.8b, {b:v}.8b", a = in(vreg) a, b = in(vreg) b,
            o = inout(vreg) acc, options(pure, nomem, nostack, preserves_flags));
    }
    acc
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

/// Sixty-four bytes from `p` as four vectors.
#[inline(always)]
unsafe fn load64(p: *const u8) -> [uint8x16_t; 4] {
    let v = vld1q_u8_x4(p);
    [v.0, v.1, v.2, v.3]
}

/// Sixty-four activation bytes from `p`, prepared for `D`'s quads.
#[inline(always)]
unsafe fn act64<D: Quad>(p: *const u8) -> [D::A; 4] {
    load64(p).map(|v| D::prep(vreinterpretq_s8_u8(v)))
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
            sli_n::<4>(vandq_u8(w[2], vdupq_n_u8(0x0f)), vshrq_n_u8::<6>(w[0])),
        ],
        mn: [
            vandq_u8(w[1], low6),
            // (w2 >> 4) | (w1 >> 6) << 4
            sli_n::<4>(vshrq_n_u8::<4>(w[2]), vshrq_n_u8::<6>(w[1])),
        ],
        d: h2f4(vget_low_u16(dd)),
        dmin: h2f4_high(dd),
    }
}

/// Eight bytes of `v` (`HIGH`: the upper eight) as two int32 vectors of four.
#[inline(always)]
unsafe fn widen_u8x8<const HIGH: bool>(v: uint8x16_t) -> [int32x4_t; 2] {
    let h = widen8::<HIGH>(v);
    [
        vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))),
        vreinterpretq_s32_u32(vmovl_high_u16(h)),
    ]
}

/// The four rows' minimum integers `sum_g mn[g / 2] * bsum[g]` (`b`: the sixteen group
/// sums), exact in i32 for any bytes (as `q4_k::terms`).
#[inline(always)]
unsafe fn q4_mins(w: &Q4W, b: [int16x8_t; 2]) -> int32x4_t {
    let m01 = vreinterpretq_s16_u16(widen8::<false>(w.mn[0]));
    let m23 = vreinterpretq_s16_u16(widen8::<true>(w.mn[0]));
    let m45 = vreinterpretq_s16_u16(widen8::<false>(w.mn[1]));
    let m67 = vreinterpretq_s16_u16(widen8::<true>(w.mn[1]));
    let p = vmull_laneq_s16::<0>(vget_low_s16(m01), b[0]);
    let p = vmlal_laneq_s16::<1>(p, vget_low_s16(m01), b[0]);
    let p = vmlal_high_laneq_s16::<2>(p, m01, b[0]);
    let p = vmlal_high_laneq_s16::<3>(p, m01, b[0]);
    let p = vmlal_laneq_s16::<4>(p, vget_low_s16(m23), b[0]);
    let p = vmlal_laneq_s16::<5>(p, vget_low_s16(m23), b[0]);
    let p = vmlal_high_laneq_s16::<6>(p, m23, b[0]);
    let p = vmlal_high_laneq_s16::<7>(p, m23, b[0]);
    let p = vmlal_laneq_s16::<0>(p, vget_low_s16(m45), b[1]);
    let p = vmlal_laneq_s16::<1>(p, vget_low_s16(m45), b[1]);
    let p = vmlal_high_laneq_s16::<2>(p, m45, b[1]);
    let p = vmlal_high_laneq_s16::<3>(p, m45, b[1]);
    let p = vmlal_laneq_s16::<4>(p, vget_low_s16(m67), b[1]);
    let p = vmlal_laneq_s16::<5>(p, vget_low_s16(m67), b[1]);
    let p = vmlal_high_laneq_s16::<6>(p, m67, b[1]);
    vmlal_high_laneq_s16::<7>(p, m67, b[1])
}

/// The activation's sixteen group sums as two i16 vectors.
#[inline(always)]
unsafe fn bsums(y: &BlockQ8K) -> [int16x8_t; 2] {
    let p = y.bsums.as_ptr() as *const i16;
    [vld1q_s16(p), vld1q_s16(p.add(8))]
}

/// Sub-blocks `2C` and `2C + 1` (weights `64C..64C + 64`) of a Q4Kx4 block added to
/// `isum` (written per `C` so that every index is a constant).
#[inline(always)]
unsafe fn q4_part<D: Quad, const GG: usize, const TT: usize, const C: usize>(
    g: &[&BlockQ4Kx4; GG],
    y: &[&BlockQ8K; TT],
    ws: &[Q4W; GG],
    isum: &mut [[int32x4_t; TT]; GG],
) {
    let zero = vdupq_n_s32(0);
    let m4 = vdupq_n_u8(0x0f);
    let a: [[D::A; 4]; TT] = core::array::from_fn(|t| act64::<D>(y[t].qs.as_ptr().add(64 * C)));
    for i in 0..GG {
        let q0 = load64(g[i].qs[8 * C].as_ptr());
        let q1 = load64(g[i].qs[8 * C + 4].as_ptr());
        let lo = |q: [uint8x16_t; 4]| q.map(|v| vreinterpretq_s8_u8(vandq_u8(v, m4)));
        let hi = |q: [uint8x16_t; 4]| q.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)));
        let (l0, l1, h0, h1) = (lo(q0), lo(q1), hi(q0), hi(q1));
        let sc = match C {
            0 => widen_u8x8::<false>(ws[i].sc[0]),
            1 => widen_u8x8::<true>(ws[i].sc[0]),
            2 => widen_u8x8::<false>(ws[i].sc[1]),
            _ => widen_u8x8::<true>(ws[i].sc[1]),
        };
        for t in 0..TT {
            let s_lo = D::finish(D::quad(D::first(l0, &a[t][0], zero), l1, &a[t][1]), zero);
            let s_hi = D::finish(D::quad(D::first(h0, &a[t][2], zero), h1, &a[t][3]), zero);
            isum[i][t] = vmlaq_s32(vmlaq_s32(isum[i][t], s_lo, sc[0]), s_hi, sc[1]);
        }
    }
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
        let mut isum = [[vdupq_n_s32(0); TT]; GG];
        q4_part::<D, GG, TT, 0>(&g, &y, &ws, &mut isum);
        q4_part::<D, GG, TT, 1>(&g, &y, &ws, &mut isum);
        q4_part::<D, GG, TT, 2>(&g, &y, &ws, &mut isum);
        q4_part::<D, GG, TT, 3>(&g, &y, &ws, &mut isum);
        for t in 0..TT {
            let b = bsums(y[t]);
            let ys = y[t].scale();
            for i in 0..GG {
                let m = q4_mins(&ws[i], b);
                let (a0, a1) = acc[i][t];
                acc[i][t] = (
                    vfmaq_f32(a0, vcvtq_f32_s32(isum[i][t]), vmulq_n_f32(ws[i].d, ys)),
                    vfmaq_f32(a1, vcvtq_f32_s32(m), vmulq_n_f32(ws[i].dmin, ys)),
                );
            }
        }
    }
}

/// Q6Kx4: part `P` (groups `4P..4P + 4`) is twelve chunks giving four quads of `4 s`
/// (see [`crate::repack::kquant`]), one per group, against the part's four activation
/// vectors; the block's integer is `isum >> 2`.
struct Q6;

/// `sli #N`: `src << N | dest & (2^N - 1)` per byte.
#[inline(always)]
unsafe fn sli_n<const N: i32>(mut dest: uint8x16_t, src: uint8x16_t) -> uint8x16_t {
    // SAFETY: baseline Advanced SIMD; reads and writes only the named registers.
    core::arch::asm!("sli {d:v}.16b, {s:v}.16b, #{n}", d = inout(vreg) dest, s = in(vreg) src,
        n = const N, options(pure, nomem, nostack, preserves_flags));
    dest
}

/// A one-operand instruction on the low half of a vector (`HIGH == false`: `$lo`) or
/// its high half (`$hi`), written out.
macro_rules! widen_asm {
    ($(#[$m:meta])* $name:ident, $in:ty, $out:ty, $lo:literal, $hi:literal) => {
        $(#[$m])*
        #[inline(always)]
        unsafe fn $name<const HIGH: bool>(v: $in) -> $out {
            let out: $out;
            // SAFETY: baseline Advanced SIMD; reads and writes only the named registers.
            if HIGH {
                core::arch::asm!($hi, i = in(vreg) v, o = lateout(vreg) out,
                    options(pure, nomem, nostack, preserves_flags));
            } else {
                core::arch::asm!($lo, i = in(vreg) v, o = lateout(vreg) out,
                    options(pure, nomem, nostack, preserves_flags));
            }
            out
        }
    };
}
widen_asm!(
    /// Sign-extending widening (`sxtl`, `sxtl2`), written out: LLVM merges two of them
    /// into a zip and two shifts.
    sxtl8, int8x16_t, int16x8_t, "sxtl {o:v}.8h, {i:v}.8b", "sxtl2 {o:v}.8h, {i:v}.16b"
);
widen_asm!(
    /// See [`sxtl8`].
    sxtl16, int16x8_t, int32x4_t, "sxtl {o:v}.4s, {i:v}.4h", "sxtl2 {o:v}.4s, {i:v}.8h"
);

/// Part `P` of a Q6Kx4 block added to `isum` (four times the integer).
#[inline(always)]
unsafe fn q6_part<D: Quad, const GG: usize, const TT: usize, const P: usize>(
    g: &[&BlockQ6Kx4; GG],
    y: &[&BlockQ8K; TT],
    isum: &mut [[int32x4_t; TT]; GG],
) {
    let fc = vdupq_n_u8(0xfc);
    let a: [[D::A; 4]; TT] = core::array::from_fn(|t| act64::<D>(y[t].qs.as_ptr().add(64 * P)));
    for i in 0..GG {
        let x = load64(g[i].q[12 * P].as_ptr());
        let yv = load64(g[i].q[12 * P + 4].as_ptr());
        let z = load64(g[i].q[12 * P + 8].as_ptr());
        let s8 = |v: [uint8x16_t; 4]| v.map(|x| vreinterpretq_s8_u8(x));
        let v = [
            s8(x.map(|c| vandq_u8(c, fc))),
            s8(yv.map(|c| vandq_u8(c, fc))),
            s8(z.map(|c| vandq_u8(c, fc))),
            s8(core::array::from_fn(|m| {
                sli_n::<6>(sli_n::<4>(vshlq_n_u8::<2>(x[m]), yv[m]), z[m])
            })),
        ];
        let sc = vld1q_s8(g[i].scales[P].as_ptr() as *const i8);
        let (s01, s23) = (sxtl8::<false>(sc), sxtl8::<true>(sc));
        let s = [
            sxtl16::<false>(s01),
            sxtl16::<true>(s01),
            sxtl16::<false>(s23),
            sxtl16::<true>(s23),
        ];
        for t in 0..TT {
            for k in 0..4 {
                isum[i][t] = vmlaq_s32(isum[i][t], D::full(v[k], &a[t][k]), s[k]);
            }
        }
    }
}

impl KPack for Q6 {
    type G = BlockQ6Kx4;
    #[inline(always)]
    unsafe fn block<D: Quad, const GG: usize, const TT: usize>(
        g: [&BlockQ6Kx4; GG],
        y: [&BlockQ8K; TT],
        acc: &mut [[Acc; TT]; GG],
    ) {
        let mut isum = [[vdupq_n_s32(0); TT]; GG];
        q6_part::<D, GG, TT, 0>(&g, &y, &mut isum);
        q6_part::<D, GG, TT, 1>(&g, &y, &mut isum);
        q6_part::<D, GG, TT, 2>(&g, &y, &mut isum);
        q6_part::<D, GG, TT, 3>(&g, &y, &mut isum);
        for i in 0..GG {
            let d = h2f4(vld1_u16(g[i].d.as_ptr() as *const u16));
            for t in 0..TT {
                // Exact: every product was 4 s a, and |4 * integer| < 2^29 for any bytes.
                let n = vshrq_n_s32::<2>(isum[i][t]);
                let a0 = acc[i][t].0;
                acc[i][t].0 = vfmaq_f32(a0, vcvtq_f32_s32(n), vmulq_n_f32(d, y[t].scale()));
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

/// Rows `job.rows` of a repacked K-quant tensor, `GG` groups at a time.
#[inline(always)]
unsafe fn body<K: KPack, D: Quad, const GG: usize>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) {
    let nb = 4 * job.rb / core::mem::size_of::<K::G>();
    let act = |t: usize| acts.as_ptr().add(t * job.arb) as *const BlockQ8K;
    walk::<K::G, GG, T>(
        job,
        w,
        out,
        |g, t| tile::<K, D, GG, T>(g, core::array::from_fn(|j| act(t + j)), nb),
        |g, t| tile::<K, D, GG, 1>(g, [act(t)], nb),
    )
}

/// Entry points, one per feature set (so that `sdot` is only compiled into the dotprod
/// one).
mod jobs {
    use super::*;

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn base<K: KPack, const GG: usize>(
        job: &Job,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) {
        body::<K, MullQ, GG>(job, w, acts, out)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub(super) unsafe fn dot<K: KPack, const GG: usize>(
        job: &Job,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) {
        body::<K, SdotQ, GG>(job, w, acts, out)
    }
}

const ACT: usize = q8_k::BLOCK_BYTES;
packed_fn!(
    q4_kx4_base,
    jobs::base::<Q4, 2>,
    Q4_K,
    q4_k::BLOCK_BYTES,
    ACT
);
packed_fn!(q4_kx4_dot, jobs::dot::<Q4, 2>, Q4_K, q4_k::BLOCK_BYTES, ACT);
packed_fn!(
    q6_kx4_base,
    jobs::base::<Q6, 2>,
    Q6_K,
    q6_k::BLOCK_BYTES,
    ACT
);
packed_fn!(q6_kx4_dot, jobs::dot::<Q6, 1>, Q6_K, q6_k::BLOCK_BYTES, ACT);
