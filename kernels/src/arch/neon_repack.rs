//! NEON (and NEON + dotprod) row-range products over repacked Q8_0 weights
//! ([`crate::repack::Layout::Q8_0x4`]).
//!
//! The arithmetic is [`super::neon_rows`]'s for Q8_0 (exact integer lane sums by
//! `smull` + pairwise adds or by `sdot`, one fused multiply-add per block and lane, the
//! x86 `hsum8` tree), in tiles of one group (4 rows) x 2 tokens. What the layout saves:
//! the four rows come as one sequential stream, and their four f16 scales are adjacent,
//! so one `fcvtl` converts them (the plain kernel inserts them lane by lane). Rows of a
//! partial group at the ends of the range are computed with their group and dropped;
//! the plain tail rows (`rows % 4`) go to the plain kernel. Each (row, token) therefore
//! has the plain kernels' bits.
#![allow(unsafe_code)]

use core::arch::aarch64::*;
use core::ops::Range;

use super::neon_kquant::{load16, sdot};
use super::neon_legacy::{h2f, h2f4};
use crate::blocks::cast;
use crate::quant::q8_0::{BlockQ8_0, BLOCK_BYTES};
use crate::repack::{BlockQ8_0x4, Layout};
use crate::{CpuFeatures, GgmlType};

/// Tokens per tile (4 x 2 tiles keep their 16 accumulators in registers).
const T: usize = 2;

/// Product over a repacked tensor (`w`: all of its rows) for `rows`, or `false` (nothing
/// written) without NEON, for another layout, or when the shapes do not fit.
pub fn matmul(
    layout: Layout,
    feat: &CpuFeatures,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    if !feat.neon || layout != Layout::Q8_0x4 {
        return false;
    }
    if row_bytes == 0
        || !row_bytes.is_multiple_of(BLOCK_BYTES)
        || !w.len().is_multiple_of(row_bytes)
        || !acts.len().is_multiple_of(row_bytes)
        || rows.start > rows.end
        || rows.end > w.len() / row_bytes
    {
        return false;
    }
    let n_tok = acts.len() / row_bytes;
    if rows.len().checked_mul(n_tok) != Some(out.len()) {
        return false;
    }
    let n4 = w.len() / row_bytes / 4 * 4;
    let split = rows.end.min(n4).max(rows.start);
    let (head, tail) = out.split_at_mut((split - rows.start) * n_tok);
    if split > rows.start {
        let r = rows.start..split;
        if feat.dotprod {
            // SAFETY: `feat.dotprod` says the CPU executes `sdot`; the checks above put
            // every group-block of the groups of `r` (all below `n4`) inside `w`, every
            // activation row inside `acts`, and `head` has one value per (row, token).
            unsafe { jobs::dot(w, row_bytes, r, acts, n_tok, head) };
        } else {
            // SAFETY: Advanced SIMD is architectural on aarch64; bounds as above.
            unsafe { jobs::base(w, row_bytes, r, acts, n_tok, head) };
        }
    }
    if split < rows.end {
        return super::neon_rows::matmul(
            GgmlType::Q8_0,
            feat,
            w,
            row_bytes,
            split..rows.end,
            acts,
            row_bytes,
            tail,
        );
    }
    true
}

/// Four int32 sums of 16 byte products, lane `l` over bytes `4l..4l+4`.
trait Dot {
    unsafe fn groups(w: int8x16_t, a: int8x16_t) -> int32x4_t;
}

/// Baseline NEON: i16 pair sums are exact for activations in -127..=127 (see
/// [`super::neon_rows`]).
struct Mull;
impl Dot for Mull {
    #[inline(always)]
    unsafe fn groups(w: int8x16_t, a: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
        let hi = vmull_high_s8(w, a);
        vpaddlq_s16(vpaddq_s16(lo, hi))
    }
}

/// ARMv8.2 dotprod.
struct Sdot;
impl Dot for Sdot {
    #[inline(always)]
    unsafe fn groups(w: int8x16_t, a: int8x16_t) -> int32x4_t {
        sdot(vdupq_n_s32(0), w, a)
    }
}

/// `acc + g * v[lane]` (fused) for a lane known after unrolling.
#[inline(always)]
unsafe fn fma_lane(acc: float32x4_t, g: float32x4_t, v: float32x4_t, lane: usize) -> float32x4_t {
    match lane {
        0 => vfmaq_laneq_f32::<0>(acc, g, v),
        1 => vfmaq_laneq_f32::<1>(acc, g, v),
        2 => vfmaq_laneq_f32::<2>(acc, g, v),
        _ => vfmaq_laneq_f32::<3>(acc, g, v),
    }
}

/// Eight f32 lanes reduced by the x86 tree of [`crate::quant::q8_0::hsum8`].
#[inline(always)]
unsafe fn hsum8(lo: float32x4_t, hi: float32x4_t) -> f32 {
    let v = vaddq_f32(lo, hi);
    (vgetq_lane_f32::<0>(v) + vgetq_lane_f32::<2>(v))
        + (vgetq_lane_f32::<1>(v) + vgetq_lane_f32::<3>(v))
}

/// The four rows of one group against `TT` tokens, all of `nb` blocks.
///
/// # Safety
/// NEON (and dotprod for [`Sdot`]); `nb` group-blocks are readable at `g` and `nb`
/// blocks at every `a[t]`.
#[inline(always)]
unsafe fn tile<D: Dot, const TT: usize>(
    g: *const BlockQ8_0x4,
    a: [*const BlockQ8_0; TT],
    nb: usize,
) -> [[f32; TT]; 4] {
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[(zero, zero); TT]; 4];
    let (mut g, mut a) = (g, a);
    for _ in 0..nb {
        // SAFETY: the caller's `nb` group-blocks start at `g`; one per step.
        let b = &*g;
        g = g.add(1);
        let p: [[int8x16_t; 2]; 4] = core::array::from_fn(|r| {
            [
                vreinterpretq_s8_u8(load16(&b.qs[r])),
                vreinterpretq_s8_u8(load16(&b.qs[r][16..])),
            ]
        });
        // The four rows' scales are adjacent: one load, one exact conversion.
        let dw = h2f4(vld1_u16(b.d.as_ptr() as *const u16));
        for t in 0..TT {
            // SAFETY: as for `g`.
            let y = &*a[t];
            a[t] = a[t].add(1);
            let a0 = vreinterpretq_s8_u8(load16(&y.qs));
            let a1 = vreinterpretq_s8_u8(load16(&y.qs[16..]));
            // d_w * d_a per row: exact in f32 (two f16 significands), as the reference.
            let d = vmulq_n_f32(dw, h2f(y.d));
            for r in 0..4 {
                let g0 = vcvtq_f32_s32(D::groups(p[r][0], a0));
                let g1 = vcvtq_f32_s32(D::groups(p[r][1], a1));
                acc[r][t].0 = fma_lane(acc[r][t].0, g0, d, r);
                acc[r][t].1 = fma_lane(acc[r][t].1, g1, d, r);
            }
        }
    }
    let mut out = [[0.0f32; TT]; 4];
    for r in 0..4 {
        for t in 0..TT {
            out[r][t] = hsum8(acc[r][t].0, acc[r][t].1);
        }
    }
    out
}

/// Rows `rows` (inside whole groups present in `w`) of a Q8_0x4 tensor.
#[inline(always)]
unsafe fn body<D: Dot>(
    w: &[u8],
    rb: usize,
    rows: Range<usize>,
    acts: &[u8],
    n_tok: usize,
    out: &mut [f32],
) {
    let nb = rb / BLOCK_BYTES;
    let act = |t: usize| acts.as_ptr().add(t * rb) as *const BlockQ8_0;
    let mut put = |r: usize, t: usize, v: f32| {
        if rows.contains(&r) {
            out[(r - rows.start) * n_tok + t] = v;
        }
    };
    for g in rows.start / 4..rows.end.div_ceil(4) {
        let gw = cast::<BlockQ8_0x4>(&w[g * 4 * rb..(g + 1) * 4 * rb]).unwrap_or(&[]);
        if gw.len() != nb {
            return;
        }
        let gp = gw.as_ptr();
        let mut t = 0;
        while t + T <= n_tok {
            let res = tile::<D, T>(gp, core::array::from_fn(|j| act(t + j)), nb);
            for (r, rr) in res.iter().enumerate() {
                for (j, v) in rr.iter().enumerate() {
                    put(4 * g + r, t + j, *v);
                }
            }
            t += T;
        }
        while t < n_tok {
            let res = tile::<D, 1>(gp, [act(t)], nb);
            for (r, rr) in res.iter().enumerate() {
                put(4 * g + r, t, rr[0]);
            }
            t += 1;
        }
    }
}

/// Entry points, one per feature set (so that `sdot` is only compiled into the dotprod
/// one).
mod jobs {
    use super::*;

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn base(
        w: &[u8],
        rb: usize,
        rows: Range<usize>,
        acts: &[u8],
        n_tok: usize,
        out: &mut [f32],
    ) {
        body::<Mull>(w, rb, rows, acts, n_tok, out)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub(super) unsafe fn dot(
        w: &[u8],
        rb: usize,
        rows: Range<usize>,
        acts: &[u8],
        n_tok: usize,
        out: &mut [f32],
    ) {
        body::<Sdot>(w, rb, rows, acts, n_tok, out)
    }
}
