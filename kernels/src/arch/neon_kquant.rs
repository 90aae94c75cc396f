//! NEON dot products of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) with Q8_K, in two
//! flavours: baseline NEON (`smull`/`saddlp`, for the Cortex-A53 and Apple A7) and
//! NEON + dotprod (`sdot`, Cortex-A55 and later).
//!
//! One shape for every format: each 256-weight block is unpacked into sixteen 16-byte
//! vectors of *unsigned* quants (0..64, so they are also valid non-negative i8), one per
//! 16-weight scale group. Each vector is dotted with its 16 activations into four int32
//! lanes of four consecutive weights and multiplied by the group's integer scale. Even
//! groups feed lanes 0..4 and odd groups lanes 4..8, which is exactly the eight-lane
//! split of the AVX2 kernel (`x86_kquant`: lane `l` of each 32-weight chunk); the block's
//! float factor is applied with one fused multiply-add per lane, and the lanes are reduced
//! in the AVX2 kernel's tree. So ARM computes the same bits as x86 (where our goldens
//! come from), not merely the same value within rounding. Offsets (Q3_K/Q6_K) and
//! minimums (Q2_K/Q4_K/Q5_K) come from the activation `bsums` through [`KTerms`].
//!
//! # Safety (for every `unsafe fn` here)
//! Callers of the `Sdot` paths must run on a CPU with dotprod; memory is only read
//! through `load16`, which stays inside the slice it is given.
//!
//! `sdot` is emitted with inline assembly: the `vdotq_s32` intrinsic is still unstable
//! (`stdarch_neon_dotprod`) in the pinned toolchain.
#![allow(unsafe_code)]
use core::arch::aarch64::*;

use crate::quant::q8_k::{BlockQ8K, KTerms};
use crate::quant::{q2_k, q3_k, q4_k, q5_k, q6_k};

/// How 16 unsigned quants (< 128) meet 16 int8 activations: four int32 sums, lane `k`
/// over bytes `4k..4k+4`.
trait Dot16 {
    unsafe fn dot16(u: uint8x16_t, q: int8x16_t) -> int32x4_t;
}

/// Baseline NEON: widening multiplies (exact in i16: |u * q| <= 63 * 128), pairwise
/// widening adds, then neighbouring pairs joined.
struct Mull;
impl Dot16 for Mull {
    #[inline(always)]
    unsafe fn dot16(u: uint8x16_t, q: int8x16_t) -> int32x4_t {
        let u = vreinterpretq_s8_u8(u);
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(u), vget_low_s8(q)));
        let hi = vpaddlq_s16(vmull_high_s8(u, q));
        vpaddq_s32(lo, hi)
    }
}

/// ARMv8.2 dotprod.
struct Sdot;
impl Dot16 for Sdot {
    #[inline(always)]
    unsafe fn dot16(u: uint8x16_t, q: int8x16_t) -> int32x4_t {
        sdot(vdupq_n_s32(0), vreinterpretq_s8_u8(u), q)
    }
}

#[target_feature(enable = "dotprod")]
#[inline]
pub(super) unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: callers run only when the CPU has dotprod; the instruction touches only
    // the three vector registers named here.
    core::arch::asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// A K-quant block as the NEON kernels see it; `inline(always)` so the unpacking is
/// compiled inside each kernel.
pub(super) trait KBlock {
    fn terms(&self, y: &BlockQ8K) -> KTerms;
    /// The 256 quants as unsigned bytes in weight order, one vector per 16-weight group.
    unsafe fn unpack(&self) -> [uint8x16_t; 16];
}

macro_rules! kblock {
    ($t:ty, $m:ident, $unpack:ident) => {
        impl KBlock for $t {
            #[inline(always)]
            fn terms(&self, y: &BlockQ8K) -> KTerms {
                $m::terms(self, y)
            }
            #[inline(always)]
            unsafe fn unpack(&self) -> [uint8x16_t; 16] {
                $unpack(self)
            }
        }
    };
}
kblock!(q2_k::BlockQ2K, q2_k, unpack_q2k);
kblock!(q3_k::BlockQ3K, q3_k, unpack_q3k);
kblock!(q4_k::BlockQ4K, q4_k, unpack_q4k);
kblock!(q5_k::BlockQ5K, q5_k, unpack_q5k);
kblock!(q6_k::BlockQ6K, q6_k, unpack_q6k);

/// Load of the first 16 bytes of `p`. The bounds check keeps the read inside `p`
/// whatever the caller passes (call sites use fixed in-bounds offsets of a block, so the
/// check folds away).
#[inline(always)]
pub(super) unsafe fn load16(p: &[u8]) -> uint8x16_t {
    let Some(p) = p.get(..16) else {
        return vdupq_n_u8(0);
    };
    vld1q_u8(p.as_ptr())
}

/// `v >> s` per byte for a run-time `s` (a negative left shift).
#[inline(always)]
unsafe fn shr(v: uint8x16_t, s: usize) -> uint8x16_t {
    vshlq_u8(v, vdupq_n_s8(-(s as i8)))
}

#[inline(always)]
unsafe fn dot_body<B: KBlock, D: Dot16>(w: &[B], a: &[BlockQ8K]) -> f32 {
    // The block sums' accumulator and the minimums' (lane 0 of each).
    let mut acc = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    for (x, y) in w.iter().zip(a) {
        let t = x.terms(y);
        let u = x.unpack();
        let mut isum = (vdupq_n_s32(0), vdupq_n_s32(0));
        for (g, &ug) in u.iter().enumerate() {
            let q = vreinterpretq_s8_u8(load16(&y.qs[16 * g..]));
            let p = D::dot16(ug, q);
            if g % 2 == 0 {
                isum.0 = vmlaq_n_s32(isum.0, p, t.scales[g] as i32);
            } else {
                isum.1 = vmlaq_n_s32(isum.1, p, t.scales[g] as i32);
            }
        }
        // The block's exact integer (wrapping), then one fma per block
        // (`q8_k::kquant_dot_blocksum`, the order of the repacked kernels too).
        let i = vaddvq_s32(vaddq_s32(isum.0, isum.1)).wrapping_sub(t.offset);
        acc.0 = vfmaq_n_f32(acc.0, vdupq_n_f32(i as f32), t.d);
        acc.1 = vfmaq_n_f32(acc.1, vdupq_n_f32(t.mins as f32), t.dmin);
    }
    vgetq_lane_f32::<0>(acc.0) - vgetq_lane_f32::<0>(acc.1)
}

pub(super) unsafe fn dot_neon<B: KBlock>(w: &[B], a: &[BlockQ8K]) -> f32 {
    dot_body::<B, Mull>(w, a)
}

#[target_feature(enable = "dotprod")]
pub(super) unsafe fn dot_sdot<B: KBlock>(w: &[B], a: &[BlockQ8K]) -> f32 {
    dot_body::<B, Sdot>(w, a)
}

#[inline(always)]
unsafe fn unpack_q4k(x: &q4_k::BlockQ4K) -> [uint8x16_t; 16] {
    let m4 = vdupq_n_u8(0x0F);
    let mut u = [vdupq_n_u8(0); 16];
    for c in 0..4 {
        for half in 0..2 {
            let q = load16(&x.qs[32 * c + 16 * half..]);
            u[4 * c + half] = vandq_u8(q, m4);
            u[4 * c + 2 + half] = vshrq_n_u8::<4>(q);
        }
    }
    u
}

#[inline(always)]
unsafe fn unpack_q5k(x: &q5_k::BlockQ5K) -> [uint8x16_t; 16] {
    let m4 = vdupq_n_u8(0x0F);
    let one = vdupq_n_u8(1);
    let mut qh = [load16(&x.qh), load16(&x.qh[16..])];
    let mut u = [vdupq_n_u8(0); 16];
    for c in 0..4 {
        for half in 0..2 {
            let q = load16(&x.qs[32 * c + 16 * half..]);
            // Bits 2c and 2c+1 of qh, already shifted down to bits 0 and 1.
            let h0 = vshlq_n_u8::<4>(vandq_u8(qh[half], one));
            let h1 = vshlq_n_u8::<3>(vandq_u8(qh[half], vdupq_n_u8(2)));
            u[4 * c + half] = vorrq_u8(vandq_u8(q, m4), h0);
            u[4 * c + 2 + half] = vorrq_u8(vshrq_n_u8::<4>(q), h1);
            qh[half] = vshrq_n_u8::<2>(qh[half]);
        }
    }
    u
}

#[inline(always)]
unsafe fn unpack_q6k(x: &q6_k::BlockQ6K) -> [uint8x16_t; 16] {
    let m4 = vdupq_n_u8(0x0F);
    let m2 = vdupq_n_u8(0x03);
    let mut u = [vdupq_n_u8(0); 16];
    for h in 0..2 {
        for half in 0..2 {
            let ql0 = load16(&x.ql[64 * h + 16 * half..]);
            let ql1 = load16(&x.ql[64 * h + 32 + 16 * half..]);
            let qh = load16(&x.qh[32 * h + 16 * half..]);
            let g = 8 * h + half;
            u[g] = vorrq_u8(vandq_u8(ql0, m4), vshlq_n_u8::<4>(vandq_u8(qh, m2)));
            u[g + 2] = vorrq_u8(
                vandq_u8(ql1, m4),
                vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m2)),
            );
            u[g + 4] = vorrq_u8(
                vshrq_n_u8::<4>(ql0),
                vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m2)),
            );
            u[g + 6] = vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh)));
        }
    }
    u
}

#[inline(always)]
unsafe fn unpack_q2k(x: &q2_k::BlockQ2K) -> [uint8x16_t; 16] {
    let m2 = vdupq_n_u8(0x03);
    let mut u = [vdupq_n_u8(0); 16];
    for h in 0..2 {
        for half in 0..2 {
            let q = load16(&x.qs[32 * h + 16 * half..]);
            for k in 0..4 {
                u[8 * h + 2 * k + half] = vandq_u8(shr(q, 2 * k), m2);
            }
        }
    }
    u
}

#[inline(always)]
unsafe fn unpack_q3k(x: &q3_k::BlockQ3K) -> [uint8x16_t; 16] {
    let m2 = vdupq_n_u8(0x03);
    let one = vdupq_n_u8(1);
    let hm = [load16(&x.hmask), load16(&x.hmask[16..])];
    let mut u = [vdupq_n_u8(0); 16];
    for h in 0..2 {
        for half in 0..2 {
            let q = load16(&x.qs[32 * h + 16 * half..]);
            for k in 0..4 {
                let hb = vshlq_n_u8::<2>(vandq_u8(shr(hm[half], 4 * h + k), one));
                u[8 * h + 2 * k + half] = vorrq_u8(vandq_u8(shr(q, 2 * k), m2), hb);
            }
        }
    }
    u
}
