//! IQ4_XS against Q8_K on NEON (baseline and dotprod), one row at a time.
//!
//! Per 32-weight sub-block: one 16-byte load of indices, the low and high nibbles turned
//! into table values by one `tbl` each (IQ4_NL's 16 levels fit one register), then the
//! exact integer dot of the block formats ([`Dot`]: `smull`/`sadalp`, or `sdot`); the
//! four int32 lanes are scaled by the sub-block's signed scale (`mla`) into one
//! accumulator per super-block, reduced once. The levels lie in -127..=113, so the
//! baseline path's i16 pair sums (|w * a| <= 127 * 128) are exact even for -128
//! activations. The float step is llama.cpp's NEON one, `acc = fma(d_w * d_a, sum, acc)`
//! per block ([`crate::quant::iq4_xs::vec_dot_in`] in [`Order::BlockSum`]), so the result
//! is that reference's bits.
//!
//! [`Order::BlockSum`]: crate::quant::q8_0::Order::BlockSum
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_rows::{Dot, Mull, Sdot};
use crate::f16::read_f16;
use crate::quant::iq4_nl::KVALUES;
use crate::quant::iq4_xs::{BlockIq4Xs, SUB};
use crate::quant::q8_k::BlockQ8K;

#[inline(always)]
unsafe fn body<D: Dot>(x: &[BlockIq4Xs], y: &[BlockQ8K]) -> f32 {
    let levels = vld1q_s8(KVALUES.as_ptr());
    let m4 = vdupq_n_u8(0x0f);
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut acc = vdupq_n_s32(0);
        for (ib, ls) in bx.scales().into_iter().enumerate() {
            let q = vld1q_u8(bx.qs[16 * ib..16 * ib + 16].as_ptr());
            let w0 = vqtbl1q_s8(levels, vandq_u8(q, m4));
            let w1 = vqtbl1q_s8(levels, vshrq_n_u8::<4>(q));
            let a = &by.qs[SUB * ib..SUB * ib + SUB];
            let a0 = vld1q_s8(a.as_ptr() as *const i8);
            let a1 = vld1q_s8(a[16..].as_ptr() as *const i8);
            acc = vmlaq_n_s32(acc, D::block([w0, w1], [a0, a1]), ls);
        }
        sumf = libm::fmaf(read_f16(bx.d) * by.scale(), vaddvq_s32(acc) as f32, sumf);
    }
    sumf
}

/// Baseline NEON.
///
/// # Safety
/// The CPU has Advanced SIMD.
#[target_feature(enable = "neon")]
pub(super) unsafe fn base(x: &[BlockIq4Xs], y: &[BlockQ8K]) -> f32 {
    body::<Mull>(x, y)
}

/// NEON + dotprod.
///
/// # Safety
/// The CPU has Advanced SIMD and `sdot`.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn dot(x: &[BlockIq4Xs], y: &[BlockQ8K]) -> f32 {
    body::<Sdot>(x, y)
}
