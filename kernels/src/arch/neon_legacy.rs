//! NEON dot products for the legacy formats: Q8_0, Q4_0, Q5_0, Q1_0, Q2_0 (with Q8_0
//! activations), TQ2_0 (with Q8_K) and F32/F16 rows.
//!
//! Two instantiations of the same kernels (the `kernels!` macro below):
//! - `base`: plain NEON, the path of Cortex-A53 and Apple A7. Products of 8 signed bytes
//!   are formed with `smull` (exact in i16: |i8 * i8| <= 16384) and widened into i32 with
//!   `sadalp`.
//! - `dot`: NEON + dotprod (`sdot`, Cortex-A55 and later), four products per lane at once.
//!
//! Each kernel turns its weight block into exact signed bytes (nibble - 8, 5-bit - 16,
//! ±1 from sign bits, 2-bit code - 1) and computes its integer sums exactly. The float
//! arithmetic is the scalar reference's, step for step, so the results are bit-identical
//! to `crate::quant` (F32 excepted: its f64 accumulator is split over two lanes):
//! Q8_0/Q5_0 sum each block exactly and feed one accumulator with `fmadd`
//! ([`crate::quant::q8_0::Order::BlockSum`], the order of every NEON Q8_0/Q5_0 kernel:
//! half the conversions and fused steps of llama.cpp's x86 lanes, which the scalar path
//! and AVX2 keep), F16 keeps sixteen f32 lanes in four registers; the other formats do
//! their per-block float steps in scalar code as the reference does.
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use crate::quant::q1_0::BlockQ1_0;
use crate::quant::q2_0::BlockQ2_0;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::tq2_0::BlockTq2_0;

/// f16 scale to f32 with the baseline `fcvt` (exact, like the software conversion the
/// scalar reference uses, but one instruction instead of a dozen on the per-block path).
#[inline(always)]
pub(super) fn h2f(h: [u8; 2]) -> f32 {
    let x = u16::from_le_bytes(h) as i16;
    let out: f32;
    // SAFETY: `fcvt` (half to single) is part of the ARMv8-A base FP unit; it reads and
    // writes only the named registers.
    unsafe {
        core::arch::asm!(
            "fcvt {o:s}, {i:h}",
            i = in(vreg) x,
            o = lateout(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// `a * b + c` with one rounding (`fmadd`, base ARMv8-A FP; `f32::mul_add` needs std).
#[inline(always)]
pub(super) fn fmadd(a: f32, b: f32, c: f32) -> f32 {
    let out: f32;
    // SAFETY: `fmadd` is part of the ARMv8-A base FP unit; it reads and writes only the
    // named registers.
    unsafe {
        core::arch::asm!(
            "fmadd {o:s}, {a:s}, {b:s}, {c:s}",
            a = in(vreg) a,
            b = in(vreg) b,
            c = in(vreg) c,
            o = lateout(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// Plain NEON: `acc + sum(w * a)` over 32 bytes, via `smull` + `sadalp`.
mod base_dot {
    use core::arch::aarch64::*;

    #[inline]
    #[target_feature(enable = "neon")]
    pub unsafe fn dot32(
        acc: int32x4_t,
        w0: int8x16_t,
        w1: int8x16_t,
        a0: int8x16_t,
        a1: int8x16_t,
    ) -> int32x4_t {
        let p0 = vmull_s8(vget_low_s8(w0), vget_low_s8(a0));
        let p1 = vmull_high_s8(w0, a0);
        let p2 = vmull_s8(vget_low_s8(w1), vget_low_s8(a1));
        let p3 = vmull_high_s8(w1, a1);
        let acc = vpadalq_s16(acc, p0);
        let acc = vpadalq_s16(acc, p1);
        let acc = vpadalq_s16(acc, p2);
        vpadalq_s16(acc, p3)
    }
}

/// NEON + dotprod: `acc + sum(w * a)` over 32 bytes, via two `sdot`.
mod dot_dot {
    use core::arch::aarch64::*;

    #[inline]
    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn dot32(
        acc: int32x4_t,
        w0: int8x16_t,
        w1: int8x16_t,
        a0: int8x16_t,
        a1: int8x16_t,
    ) -> int32x4_t {
        // `vdotq_s32` is still unstable in Rust (stdarch_neon_dotprod), so `sdot` is
        // written out; `pure, nomem` lets the compiler schedule it like an intrinsic.
        let mut acc = acc;
        // SAFETY: `sdot` only touches the named vector registers; the caller guarantees
        // the CPU has dotprod (this function's target feature).
        unsafe {
            core::arch::asm!(
                "sdot {acc:v}.4s, {w0:v}.16b, {a0:v}.16b",
                "sdot {acc:v}.4s, {w1:v}.16b, {a1:v}.16b",
                acc = inout(vreg) acc,
                w0 = in(vreg) w0,
                a0 = in(vreg) a0,
                w1 = in(vreg) w1,
                a1 = in(vreg) a1,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }
}

/// The kernels, instantiated once per feature set so that every helper is inlined
/// under the same `target_feature` (a generic over the feature would leave `sdot`
/// behind a call).
macro_rules! kernels {
    ($name:ident, $feat:literal, $dot:path) => {
        pub(super) mod $name {
            use super::h2f as read_f16;
            use super::*;
            use $dot as dot32;

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn ld(p: &[u8]) -> int8x16_t {
                // SAFETY: callers pass slices of at least 16 bytes (block fields).
                vld1q_s8(p.as_ptr() as *const i8)
            }

            /// Bit i % 8 of byte `lo` (lanes 0..8) / `hi` (lanes 8..16) as 0xff / 0.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn bits16(lo: u8, hi: u8) -> uint8x16_t {
                const SEL: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
                let sel = vld1q_u8(SEL.as_ptr());
                vtstq_u8(vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi)), sel)
            }

            /// Q8_0 in [`crate::quant::q8_0::Order::BlockSum`]: one exact sum and one
            /// fused step per block.
            #[target_feature(enable = $feat)]
            pub unsafe fn q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
                let mut acc = 0.0f32;
                for (bx, by) in x.iter().zip(y) {
                    let (w, a) = (
                        (ld(&bx.qs[..16]), ld(&bx.qs[16..])),
                        (ld(&by.qs[..16]), ld(&by.qs[16..])),
                    );
                    let s = vaddvq_s32(dot32(vdupq_n_s32(0), w.0, w.1, a.0, a.1));
                    acc = fmadd(read_f16(bx.d) * read_f16(by.d), s as f32, acc);
                }
                acc
            }

            #[target_feature(enable = $feat)]
            pub unsafe fn q4_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
                let m4 = vdupq_n_u8(0x0f);
                let s8 = vdupq_n_s8(8);
                let mut sum = 0.0f32;
                for (bx, by) in x.iter().zip(y) {
                    let q = vld1q_u8(bx.qs.as_ptr());
                    let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, m4)), s8);
                    let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)), s8);
                    let v = dot32(vdupq_n_s32(0), lo, hi, ld(&by.qs[..16]), ld(&by.qs[16..]));
                    let sumi = vaddvq_s32(v);
                    sum += sumi as f32 * read_f16(bx.d) * read_f16(by.d);
                }
                sum
            }

            #[target_feature(enable = $feat)]
            pub unsafe fn q5_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
                let m4 = vdupq_n_u8(0x0f);
                let b4 = vdupq_n_u8(0x10);
                let s16 = vdupq_n_s8(16);
                let mut acc = 0.0f32;
                for (bx, by) in x.iter().zip(y) {
                    let q = vld1q_u8(bx.qs.as_ptr());
                    let h = bx.qh;
                    let hlo = vandq_u8(bits16(h[0], h[1]), b4);
                    let hhi = vandq_u8(bits16(h[2], h[3]), b4);
                    let lo = vorrq_u8(vandq_u8(q, m4), hlo);
                    let hi = vorrq_u8(vshrq_n_u8::<4>(q), hhi);
                    let lo = vsubq_s8(vreinterpretq_s8_u8(lo), s16);
                    let hi = vsubq_s8(vreinterpretq_s8_u8(hi), s16);
                    let v = dot32(vdupq_n_s32(0), lo, hi, ld(&by.qs[..16]), ld(&by.qs[16..]));
                    acc = fmadd(read_f16(bx.d) * read_f16(by.d), vaddvq_s32(v) as f32, acc);
                }
                acc
            }

            #[target_feature(enable = $feat)]
            pub unsafe fn q1_0(x: &[BlockQ1_0], y: &[BlockQ8_0]) -> f32 {
                let plus = vdupq_n_s8(1);
                let minus = vdupq_n_s8(-1);
                let mut sum = 0.0f32;
                for (bx, ys) in x.iter().zip(y.chunks_exact(4)) {
                    let mut sumi = 0.0f32;
                    for (k, by) in ys.iter().enumerate() {
                        let b = &bx.qs[4 * k..4 * k + 4];
                        let w0 = vbslq_s8(bits16(b[0], b[1]), plus, minus);
                        let w1 = vbslq_s8(bits16(b[2], b[3]), plus, minus);
                        let v = dot32(vdupq_n_s32(0), w0, w1, ld(&by.qs[..16]), ld(&by.qs[16..]));
                        let sumi_block = vaddvq_s32(v);
                        sumi += read_f16(by.d) * sumi_block as f32;
                    }
                    sum += read_f16(bx.d) * sumi;
                }
                sum
            }

            #[target_feature(enable = $feat)]
            pub unsafe fn q2_0(x: &[BlockQ2_0], y: &[BlockQ8_0]) -> f32 {
                // Codes are taken out plane by plane (plane t = weights 4b + t) and the
                // activations de-interleaved by `ld4` into the same order.
                let m2 = vdup_n_u8(3);
                let one = vdupq_n_s8(1);
                let mut sum = 0.0f32;
                for (bx, ys) in x.iter().zip(y.chunks_exact(2)) {
                    let mut sumi = 0.0f32;
                    for (k, by) in ys.iter().enumerate() {
                        // SAFETY: 8 bytes at qs[8k..8k+8] (k < 2, qs has 16).
                        let q = vld1_u8(bx.qs[8 * k..8 * k + 8].as_ptr());
                        let p0 = vand_u8(q, m2);
                        let p1 = vand_u8(vshr_n_u8::<2>(q), m2);
                        let p2 = vand_u8(vshr_n_u8::<4>(q), m2);
                        let p3 = vshr_n_u8::<6>(q);
                        let w0 = vsubq_s8(vreinterpretq_s8_u8(vcombine_u8(p0, p1)), one);
                        let w1 = vsubq_s8(vreinterpretq_s8_u8(vcombine_u8(p2, p3)), one);
                        // SAFETY: 32 bytes of activations.
                        let a = vld4_s8(by.qs.as_ptr() as *const i8);
                        let a0 = vcombine_s8(a.0, a.1);
                        let a1 = vcombine_s8(a.2, a.3);
                        let v = dot32(vdupq_n_s32(0), w0, w1, a0, a1);
                        let sumi_block = vaddvq_s32(v);
                        sumi += read_f16(by.d) * sumi_block as f32;
                    }
                    sum += read_f16(bx.d) * sumi;
                }
                sum
            }

            #[target_feature(enable = $feat)]
            pub unsafe fn tq2_0(x: &[BlockTq2_0], y: &[BlockQ8K]) -> f32 {
                let m2 = vdupq_n_u8(3);
                let one = vdupq_n_s8(1);
                let mut sum = 0.0f32;
                for (bx, by) in x.iter().zip(y) {
                    let mut acc = vdupq_n_s32(0);
                    for c in 0..2 {
                        let q0 = vld1q_u8(bx.qs[32 * c..].as_ptr());
                        let q1 = vld1q_u8(bx.qs[32 * c + 16..].as_ptr());
                        let a = &by.qs[128 * c..128 * c + 128];
                        let planes = [
                            (vandq_u8(q0, m2), vandq_u8(q1, m2)),
                            (
                                vandq_u8(vshrq_n_u8::<2>(q0), m2),
                                vandq_u8(vshrq_n_u8::<2>(q1), m2),
                            ),
                            (
                                vandq_u8(vshrq_n_u8::<4>(q0), m2),
                                vandq_u8(vshrq_n_u8::<4>(q1), m2),
                            ),
                            (vshrq_n_u8::<6>(q0), vshrq_n_u8::<6>(q1)),
                        ];
                        for (l, (p0, p1)) in planes.into_iter().enumerate() {
                            let w0 = vsubq_s8(vreinterpretq_s8_u8(p0), one);
                            let w1 = vsubq_s8(vreinterpretq_s8_u8(p1), one);
                            acc = dot32(acc, w0, w1, ld(&a[32 * l..]), ld(&a[32 * l + 16..]));
                        }
                    }
                    let sumi = vaddvq_s32(acc);
                    sum += sumi as f32 * (by.scale() * read_f16(bx.d));
                }
                sum
            }
        }
    };
}

kernels!(base, "neon", super::base_dot::dot32);
kernels!(dot, "neon,dotprod", super::dot_dot::dot32);

/// F32 weights: the same f32 products as the reference, f64 sums in two lanes.
#[target_feature(enable = "neon")]
pub(super) unsafe fn f32_row(w: &[u8], act: &[u8]) -> f32 {
    let n = w.len() / 4;
    let mut acc0 = vdupq_n_f64(0.0);
    let mut acc1 = vdupq_n_f64(0.0);
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: bytes 4i..4i+16 are inside both slices (i + 4 <= n).
        let x = vld1q_f32(w.as_ptr().add(4 * i) as *const f32);
        let a = vld1q_f32(act.as_ptr().add(4 * i) as *const f32);
        let p = vmulq_f32(x, a);
        acc0 = vaddq_f64(acc0, vcvt_f64_f32(vget_low_f32(p)));
        acc1 = vaddq_f64(acc1, vcvt_high_f64_f32(p));
        i += 4;
    }
    let mut s = vaddvq_f64(vaddq_f64(acc0, acc1));
    for j in i..n {
        let x = f32::from_le_bytes([w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]]);
        let a = f32::from_le_bytes([act[4 * j], act[4 * j + 1], act[4 * j + 2], act[4 * j + 3]]);
        s += (x * a) as f64;
    }
    s as f32
}

/// Four f16 (as u16 lanes) to f32 with the baseline `fcvtl` (exact). Written as asm
/// because Rust's `float16x4_t` and `vcvt_f32_f16` are not stable.
#[inline(always)]
pub(super) fn h2f4(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: `fcvtl` is part of the ARMv8-A base SIMD&FP unit; it reads and writes only
    // the named registers.
    unsafe {
        core::arch::asm!(
            "fcvtl {o:v}.4s, {i:v}.4h",
            i = in(vreg) h,
            o = lateout(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// F16 weights (converted exactly) against f16-rounded activations: sixteen f32 lanes
/// in four registers (products are exact, so `fmla` equals multiply-then-add), reduced
/// by [`crate::quant::float::hsum16`]; a tail of fewer than 16 goes through f64 like the
/// reference.
#[target_feature(enable = "neon")]
pub(super) unsafe fn f16_row(w: &[u8], act: &[u8]) -> f32 {
    let n = w.len() / 2;
    let body = n / 16 * 16;
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i < body {
        for (k, a) in acc.iter_mut().enumerate() {
            let j = i + 4 * k;
            // SAFETY: bytes 2j..2j+8 of w and 4j..4j+16 of act are in bounds (j + 4 <= n).
            let x = h2f4(vld1_u16(w.as_ptr().add(2 * j) as *const u16));
            let y = vld1q_f32(act.as_ptr().add(4 * j) as *const f32);
            *a = vfmaq_f32(*a, x, y);
        }
        i += 16;
    }
    let mut lanes = [0.0f32; 16];
    for (k, a) in acc.iter().enumerate() {
        // SAFETY: 4 writable f32 at lanes[4k..4k+4].
        vst1q_f32(lanes.as_mut_ptr().add(4 * k), *a);
    }
    let mut s = crate::quant::float::hsum16(lanes) as f64;
    for j in body..n {
        let x = h2f([w[2 * j], w[2 * j + 1]]);
        let a = f32::from_le_bytes([act[4 * j], act[4 * j + 1], act[4 * j + 2], act[4 * j + 3]]);
        s += (x * a) as f64;
    }
    s as f32
}
