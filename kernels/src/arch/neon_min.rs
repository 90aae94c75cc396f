//! NEON kernels for the block-32 formats with a minimum, Q4_1 and Q5_1, dotted with Q8_1
//! activations: one row (`dot_row`) and row ranges (`job`), instantiated twice like
//! `neon_legacy`: `base` (plain NEON, Cortex-A53 / Apple A7) and `dot` (`sdot`).
//!
//! The arithmetic is the scalar reference's, [`crate::quant::q8_1::min_lanes8_dot`]
//! (llama.cpp's x86 one, so NEON gives the x86 goldens' bits): eight exact i32 lanes of
//! four consecutive products per block, each fused into its f32 lane with `d_w * d_a`
//! (`fmla`), the lanes reduced in `hsum8`'s tree, and `m_w * s_a` summed in block order
//! in a separate f32, added last. NEON's four-lane registers give the lanes in natural
//! order: weights 0..16 (low nibbles) and 16..32 (high nibbles) against activation
//! bytes 0..16 and 16..32 give lanes 0..4 and 4..8.
//!
//! Integer lanes of 16 unsigned quants (0..32) and 16 activation bytes: `sdot`, or
//! `smull`/`smull2`, `addp` (pair sums fit i16: `2 * 31 * 128 < 32767`) and `saddlp`.
//!
//! Row ranges ([`super::min_rows`]): token tiles of up to 4 tokens share a table of the
//! activation scales and sums as f32; one token runs 4 rows at once, two or more run
//! 2 rows x 4 tokens (16 accumulators of the 32 vector registers).
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::min_rows::{body, MinBlock, MinTile, TokTable};
use super::Job;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_1::BlockQ8_1;

/// Q4_1 / Q5_1 quants as NEON sees them.
pub(super) trait Quants: MinBlock {
    /// The unsigned quants of weights 0..16 and 16..32.
    unsafe fn quants(&self) -> (int8x16_t, int8x16_t);
}

#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let q = vld1q_u8(qs.as_ptr());
    (vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(q))
}

impl Quants for BlockQ4_1 {
    #[inline(always)]
    unsafe fn quants(&self) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&self.qs);
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

impl Quants for BlockQ5_1 {
    #[inline(always)]
    unsafe fn quants(&self) -> (int8x16_t, int8x16_t) {
        // Bit j of `qh` is bit 4 of weight j: `cmtst` against one bit per lane.
        const SEL: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
        let sel = vld1q_u8(SEL.as_ptr());
        let h = self.qh;
        let b4 = vdupq_n_u8(0x10);
        let m0 = vandq_u8(
            vtstq_u8(vcombine_u8(vdup_n_u8(h[0]), vdup_n_u8(h[1])), sel),
            b4,
        );
        let m1 = vandq_u8(
            vtstq_u8(vcombine_u8(vdup_n_u8(h[2]), vdup_n_u8(h[3])), sel),
            b4,
        );
        let (lo, hi) = nibbles(&self.qs);
        (
            vreinterpretq_s8_u8(vorrq_u8(lo, m0)),
            vreinterpretq_s8_u8(vorrq_u8(hi, m1)),
        )
    }
}

/// Plain NEON: the four lane sums of `w * a` (w unsigned 0..32).
mod base_lanes {
    use core::arch::aarch64::*;

    #[inline]
    #[target_feature(enable = "neon")]
    pub unsafe fn lanes16(w: int8x16_t, a: int8x16_t) -> int32x4_t {
        let p0 = vmull_s8(vget_low_s8(w), vget_low_s8(a));
        let p1 = vmull_high_s8(w, a);
        vpaddlq_s16(vpaddq_s16(p0, p1))
    }
}

/// NEON + dotprod: the four lane sums of `w * a` with one `sdot`.
mod dot_lanes {
    use core::arch::aarch64::*;

    #[inline]
    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn lanes16(w: int8x16_t, a: int8x16_t) -> int32x4_t {
        super::super::neon_kquant::sdot(vdupq_n_s32(0), w, a)
    }
}

/// Eight lanes (`lo`: 0..4, `hi`: 4..8) reduced in [`crate::quant::q8_0::hsum8`]'s
/// tree: `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
#[inline(always)]
unsafe fn hsum8(lo: float32x4_t, hi: float32x4_t) -> f32 {
    let v = vaddq_f32(lo, hi);
    vpadds_f32(vadd_f32(vget_low_f32(v), vget_high_f32(v)))
}

macro_rules! kernels {
    ($name:ident, $feat:literal, $lanes:path) => {
        pub(super) mod $name {
            use super::super::neon_legacy::h2f;
            use super::*;
            use $lanes as lanes16;

            /// One row with one activation row.
            ///
            /// # Safety
            /// The CPU has this module's features.
            #[target_feature(enable = $feat)]
            pub unsafe fn dot_row<B: Quants>(x: &[B], y: &[BlockQ8_1]) -> f32 {
                let mut acc = [vdupq_n_f32(0.0); 2];
                let mut summs = 0.0f32;
                for (bx, by) in x.iter().zip(y) {
                    // m_w * s_a is exact (two f16): one rounding, as the reference.
                    summs += h2f(bx.m()) * h2f(by.s);
                    let dd = h2f(bx.d()) * h2f(by.d);
                    let (w0, w1) = bx.quants();
                    let a0 = vld1q_s8(by.qs.as_ptr() as *const i8);
                    let a1 = vld1q_s8(by.qs[16..].as_ptr() as *const i8);
                    acc[0] = vfmaq_n_f32(acc[0], vcvtq_f32_s32(lanes16(w0, a0)), dd);
                    acc[1] = vfmaq_n_f32(acc[1], vcvtq_f32_s32(lanes16(w1, a1)), dd);
                }
                hsum8(acc[0], acc[1]) + summs
            }

            /// This level's tile.
            pub struct Tile;

            impl<B: Quants> MinTile<B> for Tile {
                const TOKENS: usize = 4;
                const ROWS: usize = 2;

                #[inline(always)]
                unsafe fn tile<const RR: usize, const TT: usize>(
                    w: [&[B]; RR],
                    a: [&[BlockQ8_1]; TT],
                    tab: &TokTable,
                    nb: usize,
                    _prefetch: *const u8,
                ) -> [[f32; TT]; RR] {
                    let mut acc = [[[vdupq_n_f32(0.0); 2]; TT]; RR];
                    let mut summs = [vdupq_n_f32(0.0); RR];
                    for k in 0..nb {
                        // SAFETY (here and below): k < nb <= MAX_NB, w[r].len(), a[t].len().
                        let da = vld1q_f32(tab.da.get_unchecked(k).as_ptr());
                        let sa = vld1q_f32(tab.sa.get_unchecked(k).as_ptr());
                        for r in 0..RR {
                            let b = w[r].get_unchecked(k);
                            let (w0, w1) = b.quants();
                            summs[r] = vaddq_f32(summs[r], vmulq_n_f32(sa, h2f(b.m())));
                            let mut dd = [0.0f32; 4];
                            vst1q_f32(dd.as_mut_ptr(), vmulq_n_f32(da, h2f(b.d())));
                            for t in 0..TT {
                                let q = &a[t].get_unchecked(k).qs;
                                let a0 = vld1q_s8(q.as_ptr() as *const i8);
                                let a1 = vld1q_s8(q[16..].as_ptr() as *const i8);
                                let g0 = vcvtq_f32_s32(lanes16(w0, a0));
                                let g1 = vcvtq_f32_s32(lanes16(w1, a1));
                                acc[r][t][0] = vfmaq_n_f32(acc[r][t][0], g0, dd[t]);
                                acc[r][t][1] = vfmaq_n_f32(acc[r][t][1], g1, dd[t]);
                            }
                        }
                    }
                    let mut out = [[0.0f32; TT]; RR];
                    for r in 0..RR {
                        let mut s = [0.0f32; 4];
                        vst1q_f32(s.as_mut_ptr(), summs[r]);
                        for t in 0..TT {
                            out[r][t] = hsum8(acc[r][t][0], acc[r][t][1]) + s[t];
                        }
                    }
                    out
                }
            }

            /// Row ranges: 4 rows x 1 token, or 2 rows x up to 4 tokens, then single
            /// rows; `false` (nothing written) for shapes that do not fit.
            ///
            /// # Safety
            /// This module's features; `job` checked by `Job::new`.
            #[target_feature(enable = $feat)]
            pub unsafe fn job<B: Quants>(
                job: &Job,
                w: &[u8],
                acts: &[u8],
                out: &mut [f32],
            ) -> bool {
                body::<B, Tile>(job, w, acts, out, h2f)
            }
        }
    };
}

kernels!(base, "neon", super::base_lanes::lanes16);
kernels!(dot, "neon,dotprod", super::dot_lanes::lanes16);
