//! NEON row-range products (`matvec_rows` / `matmul_rows`) for Q8_0, Q5_0 and the
//! K-quants, in two flavours picked once per call: baseline NEON (Cortex-A53, Apple A7)
//! and NEON + dotprod (`sdot`, Cortex-A55 and later).
//!
//! The arithmetic is the one-row kernels' ([`super::neon_legacy`], [`super::neon_kquant`]):
//! Q8_0/Q5_0 in [`crate::quant::q8_0::Order::BlockSum`] (per (row, token) one f32
//! accumulator fed once per block; four rows share one vector), the K-quants in
//! llama.cpp's x86 lanes. What changes is the loop: the ISA is
//! chosen once per call, and tiles of weight rows x tokens share their loads, so an
//! unpacked weight block is used for several tokens and an activation block for several
//! rows. On in-order cores (A53/A55), where instruction count is the cost, that removes
//! the per-row dispatch, re-unpacking and most scale conversions.
//!
//! Integer sums. `sdot` is exact for any bytes. The baseline path forms the products of
//! 8 byte pairs with `smull` and adds the next 8 with `smlal2` in i16 before widening
//! (`saddlp`/`sadalp`). The i16 pair sum is exact whenever the activation is not -128
//! (|w * a| <= 128 * 127),
//! which `quantize_row_x86` guarantees except for a degenerate block whose scale is 0 (its
//! lanes are then multiplied by 0). K-quant quants are below 64, so their pair sums are
//! exact for any activation.
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_kquant::{load16, sdot, KBlock};
use super::neon_legacy::{h2f, h2f4};
use super::Job;
use crate::blocks::{cast, Pod};
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::{q2_k, q3_k, q4_k, q5_k, q6_k};

/// Weight rows per tile of the block-32 formats.
const R: usize = 4;
/// Tokens per tile of the block-32 formats (4 x 2 tiles keep their 16 accumulators
/// in registers).
const T: usize = 2;
/// Tokens per K-quant tile (the unpacked block is reused this many times).
const TK: usize = 4;

/// A block's exact integer dot product, spread over four int32 lanes (any split: only
/// their total is used).
/// And for the K-quants, four int32 sums of 16 byte products, lane `l` over bytes
/// `4l..4l+4`.
pub(super) trait Dot {
    /// Whether `neon_repack`'s written-out Q8_0x4 group kernel computes this arithmetic
    /// (the baseline one: [`Mull`]).
    const FUSED: bool = false;
    unsafe fn block(w: [int8x16_t; 2], a: [int8x16_t; 2]) -> int32x4_t;
    unsafe fn groups(w: int8x16_t, a: int8x16_t) -> int32x4_t;
}

/// Baseline NEON: `smull` then `smlal2` adds products `j` and `j + 8` in i16 (exact:
/// |w * a| <= 128 * 127 when the activation is not -128, see the module doc), widened
/// with `saddlp`/`sadalp`: six instructions per 32 bytes.
pub(super) struct Mull;
impl Dot for Mull {
    const FUSED: bool = true;
    #[inline(always)]
    unsafe fn block(w: [int8x16_t; 2], a: [int8x16_t; 2]) -> int32x4_t {
        let p0 = vmlal_high_s8(vmull_s8(vget_low_s8(w[0]), vget_low_s8(a[0])), w[0], a[0]);
        let p1 = vmlal_high_s8(vmull_s8(vget_low_s8(w[1]), vget_low_s8(a[1])), w[1], a[1]);
        vpadalq_s16(vpaddlq_s16(p0), p1)
    }
    #[inline(always)]
    unsafe fn groups(w: int8x16_t, a: int8x16_t) -> int32x4_t {
        // Neighbouring products added in i16 (`addp`) before widening (`saddlp`).
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
        let hi = vmull_high_s8(w, a);
        vpaddlq_s16(vpaddq_s16(lo, hi))
    }
}

/// ARMv8.2 dotprod: two `sdot`.
pub(super) struct Sdot;
impl Dot for Sdot {
    #[inline(always)]
    unsafe fn block(w: [int8x16_t; 2], a: [int8x16_t; 2]) -> int32x4_t {
        sdot(sdot(vdupq_n_s32(0), w[0], a[0]), w[1], a[1])
    }
    #[inline(always)]
    unsafe fn groups(w: int8x16_t, a: int8x16_t) -> int32x4_t {
        sdot(vdupq_n_s32(0), w, a)
    }
}

/// The totals of four rows' block sums, row `r` in lane `r` (three `addp`).
#[inline(always)]
pub(super) unsafe fn rows4(s: [int32x4_t; 4]) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]))
}

/// `acc + p * v[lane]` (wrapping int32) for a lane known after unrolling.
#[inline(always)]
unsafe fn mla_lane(acc: int32x4_t, p: int32x4_t, v: int32x4_t, lane: usize) -> int32x4_t {
    match lane {
        0 => vmlaq_laneq_s32::<0>(acc, p, v),
        1 => vmlaq_laneq_s32::<1>(acc, p, v),
        2 => vmlaq_laneq_s32::<2>(acc, p, v),
        _ => vmlaq_laneq_s32::<3>(acc, p, v),
    }
}

/// `v` with lane `lane` set to `x`, for a lane known after unrolling.
#[inline(always)]
unsafe fn set_u16(v: uint16x4_t, x: u16, lane: usize) -> uint16x4_t {
    match lane {
        0 => vset_lane_u16::<0>(x, v),
        1 => vset_lane_u16::<1>(x, v),
        2 => vset_lane_u16::<2>(x, v),
        _ => vset_lane_u16::<3>(x, v),
    }
}

/// A block-32 weight format dotted with Q8_0 in [`crate::quant::q8_0::Order::BlockSum`].
pub(super) trait Lanes8: Pod {
    fn d(&self) -> [u8; 2];
    /// The 32 quants as exact signed bytes, weights 0..16 and 16..32.
    unsafe fn prep(&self) -> [int8x16_t; 2];
}

impl Lanes8 for BlockQ8_0 {
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn prep(&self) -> [int8x16_t; 2] {
        [
            vreinterpretq_s8_u8(load16(&self.qs)),
            vreinterpretq_s8_u8(load16(&self.qs[16..])),
        ]
    }
}

impl Lanes8 for BlockQ5_0 {
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn prep(&self) -> [int8x16_t; 2] {
        const SEL: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
        const IDX0: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
        const IDX1: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
        let sel = load16(&SEL);
        // Byte i / 8 of qh to lane i (`tbl`), then 0xff where bit i % 8 is set.
        let h = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(self.qh)));
        let m0 = vtstq_u8(vqtbl1q_u8(h, load16(&IDX0)), sel);
        let m1 = vtstq_u8(vqtbl1q_u8(h, load16(&IDX1)), sel);
        let q = load16(&self.qs);
        let sixteen = vdupq_n_u8(16);
        // (nibble | bit << 4) - 16 = nibble - (16 where the bit is clear).
        let lo = vsubq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), vbicq_u8(sixteen, m0));
        let hi = vsubq_u8(vshrq_n_u8::<4>(q), vbicq_u8(sixteen, m1));
        [vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)]
    }
}

/// `RR` (at most 4) weight rows against `TT` activation rows, all of `nb` blocks: per
/// token one f32 accumulator per row (row `r` in lane `r`), fed once per block with the
/// block's exact sum: `acc = fma(d_w * d_a, sum, acc)`.
///
/// # Safety
/// NEON (and dotprod for [`Sdot`]); `nb` blocks are readable from every pointer in `w`
/// and `a`. (Pointers rather than slices: walking them costs one add per row and
/// block, where indexing cost a multiply-add.)
#[inline(always)]
unsafe fn lanes_tile<B: Lanes8, D: Dot, const RR: usize, const TT: usize>(
    w: [*const B; RR],
    a: [*const BlockQ8_0; TT],
    nb: usize,
) -> [[f32; TT]; RR] {
    let mut acc = [vdupq_n_f32(0.0); TT];
    let (mut w, mut a) = (w, a);
    for _ in 0..nb {
        let mut p = [[vdupq_n_s8(0); 2]; RR];
        let mut dh = vdup_n_u16(0);
        for r in 0..RR {
            // SAFETY: the caller's `nb` blocks start at w[r]; one block per step.
            let b = &*w[r];
            w[r] = w[r].add(1);
            p[r] = b.prep();
            dh = set_u16(dh, u16::from_le_bytes(b.d()), r);
        }
        // The rows' scales, converted exactly, four at a time.
        let dw = h2f4(dh);
        for t in 0..TT {
            // SAFETY: as for `w`.
            let y = &*a[t];
            a[t] = a[t].add(1);
            let ay = [
                vreinterpretq_s8_u8(load16(&y.qs)),
                vreinterpretq_s8_u8(load16(&y.qs[16..])),
            ];
            // d_w * d_a per row: exact in f32 (two f16 significands), as the reference.
            let d = vmulq_n_f32(dw, h2f(y.d));
            let mut s = [vdupq_n_s32(0); 4];
            for r in 0..RR {
                s[r] = D::block(p[r], ay);
            }
            acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(rows4(s)), d);
        }
    }
    let mut out = [[0.0f32; TT]; RR];
    for (r, o) in out.iter_mut().enumerate() {
        for (t, v) in o.iter_mut().enumerate() {
            *v = lane(acc[t], r);
        }
    }
    out
}

/// Lane `r` of `v` for a lane known after unrolling.
#[inline(always)]
pub(super) unsafe fn lane(v: float32x4_t, r: usize) -> f32 {
    match r {
        0 => vgetq_lane_f32::<0>(v),
        1 => vgetq_lane_f32::<1>(v),
        2 => vgetq_lane_f32::<2>(v),
        _ => vgetq_lane_f32::<3>(v),
    }
}

/// The tiled loop over a [`Job`] for one [`Lanes8`] format.
#[inline(always)]
unsafe fn lanes_body<B: Lanes8, D: Dot>(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
    let nb = job.row_bytes / core::mem::size_of::<B>();
    if nb * core::mem::size_of::<B>() != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8_0>() != job.act_row_bytes
    {
        return false;
    }
    let n_tok = job.n_tok;
    let rb = job.row_bytes;
    let arb = job.act_row_bytes;
    // `Job::new` checked that rows `job.rows` of `rb` bytes lie inside `w` and `n_tok`
    // rows of `arb` bytes are `acts`; `nb` blocks fill each exactly. Blocks are arrays
    // of bytes (alignment 1), so any byte address is a valid block pointer.
    let row = |r: usize| w.as_ptr().add(r * rb) as *const B;
    let act = |t: usize| acts.as_ptr().add(t * arb) as *const BlockQ8_0;
    let start = job.rows.start;
    let nr = job.rows.len();
    let mut i = 0;
    while i < nr {
        if i + R <= nr {
            let ws: [*const B; R] = core::array::from_fn(|j| row(start + i + j));
            let mut t = 0;
            while t + T <= n_tok {
                let res = lanes_tile::<B, D, R, T>(ws, core::array::from_fn(|j| act(t + j)), nb);
                for (r, rr) in res.iter().enumerate() {
                    out[(i + r) * n_tok + t..(i + r) * n_tok + t + T].copy_from_slice(rr);
                }
                t += T;
            }
            while t < n_tok {
                let res = lanes_tile::<B, D, R, 1>(ws, [act(t)], nb);
                for (r, rr) in res.iter().enumerate() {
                    out[(i + r) * n_tok + t] = rr[0];
                }
                t += 1;
            }
            i += R;
        } else {
            let ws = [row(start + i)];
            let mut t = 0;
            while t + T <= n_tok {
                let res = lanes_tile::<B, D, 1, T>(ws, core::array::from_fn(|j| act(t + j)), nb);
                out[i * n_tok + t..i * n_tok + t + T].copy_from_slice(&res[0]);
                t += T;
            }
            while t < n_tok {
                out[i * n_tok + t] = lanes_tile::<B, D, 1, 1>(ws, [act(t)], nb)[0][0];
                t += 1;
            }
            i += 1;
        }
    }
    true
}

/// Entry points of the block-32 formats, one per feature set (so that `sdot` is only
/// ever compiled into the dotprod one).
pub(super) mod lanes {
    use super::*;

    #[target_feature(enable = "neon")]
    pub(in crate::arch) unsafe fn base<B: Lanes8>(
        job: &Job,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) -> bool {
        lanes_body::<B, Mull>(job, w, acts, out)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub(in crate::arch) unsafe fn dot<B: Lanes8>(
        job: &Job,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) -> bool {
        lanes_body::<B, Sdot>(job, w, acts, out)
    }
}

/// The per-block factors of a K-quant dot product ([`crate::quant::q8_k::KTerms`]) split
/// into the part that depends on the weights only (computed once per weight block and
/// tile) and the part that depends on the token. Q4_K and Q6_K, the formats of Q4_K_M
/// files, compute it with NEON; the others take `terms` as it is. Either way the
/// numbers are the ones `terms` gives: the same f32 products, and integer sums that are
/// exact (or wrap alike) in any order.
pub(super) trait KRow: KBlock {
    /// Group scales as int32 lanes (group `g` in vector `g / 4`, lane `g % 4`), the
    /// weight's `d` and `dmin` as f32 (before the activation scale), and for the generic
    /// path the first token's terms.
    unsafe fn weight_part(&self, y0: &BlockQ8K) -> WPart;
    /// `(d, offset, dmin, mins)` for one token.
    unsafe fn token_part(&self, w: &WPart, y: &BlockQ8K) -> (f32, i32, f32, i32);
}

pub(super) struct WPart {
    sv: [int32x4_t; 4],
    d: f32,
    dmin: f32,
    /// Q4_K: the eight minimums (u8); Q6_K: the sixteen scales (i8) as two i16 vectors.
    extra: [int16x8_t; 2],
    first: crate::quant::q8_k::KTerms,
}

/// Sixteen i16 group values as four int32 vectors.
#[inline(always)]
unsafe fn widen16(v: [int16x8_t; 2]) -> [int32x4_t; 4] {
    [
        vmovl_s16(vget_low_s16(v[0])),
        vmovl_high_s16(v[0]),
        vmovl_s16(vget_low_s16(v[1])),
        vmovl_high_s16(v[1]),
    ]
}

/// The activation's sixteen group sums (`bsums`) as two i16 vectors.
#[inline(always)]
unsafe fn bsums(y: &BlockQ8K) -> [int16x8_t; 2] {
    [
        vreinterpretq_s16_u8(load16(&y.bsums)),
        vreinterpretq_s16_u8(load16(&y.bsums[16..])),
    ]
}

macro_rules! generic_krow {
    ($t:ty) => {
        impl KRow for $t {
            #[inline(always)]
            unsafe fn weight_part(&self, y0: &BlockQ8K) -> WPart {
                let first = self.terms(y0);
                let s16 = [
                    vld1q_s16(first.scales.as_ptr()),
                    vld1q_s16(first.scales[8..].as_ptr()),
                ];
                WPart {
                    sv: widen16(s16),
                    d: 0.0,
                    dmin: 0.0,
                    extra: s16,
                    first,
                }
            }
            #[inline(always)]
            unsafe fn token_part(&self, _: &WPart, y: &BlockQ8K) -> (f32, i32, f32, i32) {
                let t = self.terms(y);
                (t.d, t.offset, t.dmin, t.mins)
            }
        }
    };
}
generic_krow!(q2_k::BlockQ2K);
generic_krow!(q3_k::BlockQ3K);
generic_krow!(q5_k::BlockQ5K);

impl KRow for q4_k::BlockQ4K {
    #[inline(always)]
    unsafe fn weight_part(&self, y0: &BlockQ8K) -> WPart {
        let (sc, mn) = q4_k::scales_mins_k4_packed(&self.scales);
        // Group g has the scale of sub-block g / 2: each scale twice.
        let sc = vmovl_u8(vcreate_u8(sc));
        let sc2 = [
            vreinterpretq_s16_u16(vzip1q_u16(sc, sc)),
            vreinterpretq_s16_u16(vzip2q_u16(sc, sc)),
        ];
        let mn = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(mn)));
        let d = h2f(self.d);
        let dmin = h2f(self.dmin);
        let mut w = WPart {
            sv: widen16(sc2),
            d,
            dmin,
            extra: [mn, mn],
            first: crate::quant::q8_k::KTerms {
                d: 0.0,
                scales: [0; 16],
                offset: 0,
                dmin: 0.0,
                mins: 0,
            },
        };
        let (d0, o0, m0, s0) = self.token_part(&w, y0);
        w.first.d = d0;
        w.first.offset = o0;
        w.first.dmin = m0;
        w.first.mins = s0;
        w
    }
    #[inline(always)]
    unsafe fn token_part(&self, w: &WPart, y: &BlockQ8K) -> (f32, i32, f32, i32) {
        // sum_g bsums[g] * mn[g / 2] = sum_j mn[j] * (bsums[2j] + bsums[2j + 1]), pairs
        // widened to i32 first so that any bytes give the scalar code's integer.
        let b = bsums(y);
        let m = w.extra[0];
        let p = vmulq_s32(vpaddlq_s16(b[0]), vmovl_s16(vget_low_s16(m)));
        let p = vmlaq_s32(p, vpaddlq_s16(b[1]), vmovl_high_s16(m));
        let ys = y.scale();
        (w.d * ys, 0, w.dmin * ys, vaddvq_s32(p))
    }
}

impl KRow for q6_k::BlockQ6K {
    #[inline(always)]
    unsafe fn weight_part(&self, y0: &BlockQ8K) -> WPart {
        let s = vreinterpretq_s8_u8(load16(&self.scales));
        let s16 = [vmovl_s8(vget_low_s8(s)), vmovl_high_s8(s)];
        let mut w = WPart {
            sv: widen16(s16),
            d: h2f(self.d),
            dmin: 0.0,
            extra: s16,
            first: crate::quant::q8_k::KTerms {
                d: 0.0,
                scales: [0; 16],
                offset: 0,
                dmin: 0.0,
                mins: 0,
            },
        };
        let (d0, o0, m0, s0) = self.token_part(&w, y0);
        w.first.d = d0;
        w.first.offset = o0;
        w.first.dmin = m0;
        w.first.mins = s0;
        w
    }
    #[inline(always)]
    unsafe fn token_part(&self, w: &WPart, y: &BlockQ8K) -> (f32, i32, f32, i32) {
        // 32 * sum_g scale[g] * bsums[g], wrapping like `q6_k::terms`.
        let b = bsums(y);
        let p = vmull_s16(vget_low_s16(b[0]), vget_low_s16(w.extra[0]));
        let p = vmlal_high_s16(p, b[0], w.extra[0]);
        let p = vmlal_s16(p, vget_low_s16(b[1]), vget_low_s16(w.extra[1]));
        let p = vmlal_high_s16(p, b[1], w.extra[1]);
        (w.d * y.scale(), vaddvq_s32(p).wrapping_mul(32), 0.0, 0)
    }
}

/// One K-quant weight row against `TT` activation rows, all of `nb` blocks, in the
/// arithmetic of [`super::neon_kquant`] per token.
///
/// # Safety
/// NEON (and dotprod for [`Sdot`]); `w` and every slice in `a` have at least `nb` blocks.
#[inline(always)]
unsafe fn kquant_tile<B: KRow, D: Dot, const TT: usize>(
    w: &[B],
    a: [&[BlockQ8K]; TT],
    nb: usize,
) -> [f32; TT] {
    let zero = vdupq_n_f32(0.0);
    let mut acc = [(zero, zero); TT];
    for k in 0..nb {
        // SAFETY: k < nb <= w.len() and <= a[t].len().
        let x = w.get_unchecked(k);
        let u = x.unpack();
        let wp = x.weight_part(a[0].get_unchecked(k));
        for t in 0..TT {
            let y = a[t].get_unchecked(k);
            let (d, offset, dmin, mins_i) = if t == 0 {
                (wp.first.d, wp.first.offset, wp.first.dmin, wp.first.mins)
            } else {
                x.token_part(&wp, y)
            };
            let mut isum = (vdupq_n_s32(0), vdupq_n_s32(0));
            // Written out group by group: as a loop LLVM keeps `u` in memory and turns
            // the lane selection into a jump table.
            macro_rules! group {
                ($($g:literal)*) => {$(
                    let q = vreinterpretq_s8_u8(load16(&y.qs[16 * $g..]));
                    let p = D::groups(vreinterpretq_s8_u8(u[$g]), q);
                    if $g % 2 == 0 {
                        isum.0 = mla_lane(isum.0, p, wp.sv[$g / 4], $g % 4);
                    } else {
                        isum.1 = mla_lane(isum.1, p, wp.sv[$g / 4], $g % 4);
                    }
                )*};
            }
            group!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
            // Block sum order (`q8_k::kquant_dot_blocksum`), as the repacked kernels.
            let i = vaddvq_s32(vaddq_s32(isum.0, isum.1)).wrapping_sub(offset);
            acc[t].0 = vfmaq_n_f32(acc[t].0, vdupq_n_f32(i as f32), d);
            acc[t].1 = vfmaq_n_f32(acc[t].1, vdupq_n_f32(mins_i as f32), dmin);
        }
    }
    core::array::from_fn(|t| vgetq_lane_f32::<0>(acc[t].0) - vgetq_lane_f32::<0>(acc[t].1))
}

/// The tiled loop over a [`Job`] for one K-quant format.
#[inline(always)]
unsafe fn kquant_body<B: KRow + Pod, D: Dot>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let nb = job.row_bytes / core::mem::size_of::<B>();
    if nb * core::mem::size_of::<B>() != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8K>() != job.act_row_bytes
    {
        return false;
    }
    let n_tok = job.n_tok;
    let rb = job.row_bytes;
    let arb = job.act_row_bytes;
    let act = |t: usize| cast::<BlockQ8K>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    for (i, r) in job.rows.clone().enumerate() {
        let wr = cast::<B>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
        let o = &mut out[i * n_tok..(i + 1) * n_tok];
        let mut t = 0;
        while t + TK <= n_tok {
            let res = kquant_tile::<B, D, TK>(wr, core::array::from_fn(|j| act(t + j)), nb);
            o[t..t + TK].copy_from_slice(&res);
            t += TK;
        }
        while t < n_tok {
            o[t] = kquant_tile::<B, D, 1>(wr, [act(t)], nb)[0];
            t += 1;
        }
    }
    true
}

/// Entry points of the K-quants, one per feature set.
pub(super) mod kquant {
    use super::*;

    #[target_feature(enable = "neon")]
    pub(in crate::arch) unsafe fn base<B: KRow + Pod>(
        job: &Job,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) -> bool {
        kquant_body::<B, Mull>(job, w, acts, out)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub(in crate::arch) unsafe fn dot<B: KRow + Pod>(
        job: &Job,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) -> bool {
        kquant_body::<B, Sdot>(job, w, acts, out)
    }
}
