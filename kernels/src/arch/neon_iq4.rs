//! IQ4_XS against Q8_K on NEON (baseline and dotprod), one row at a time.
//!
//! Per 32-weight sub-block: one 16-byte load of indices, the low and high nibbles turned
//! into table values by one `tbl` each (IQ4_NL's 16 levels fit one register), then the
//! exact integer dot of the block formats ([`Dot`]: `smull`/`sadalp`, or `sdot`). Four
//! sub-blocks' lanes are reduced together by `addp` into one vector of their totals,
//! multiplied by their signed scales (unpacked with vector instructions), and the
//! super-block's total is reduced once. The levels lie in -127..=113, so the
//! baseline path's i16 pair sums (|w * a| <= 127 * 128) are exact even for -128
//! activations. The float step is llama.cpp's NEON one, `acc = fma(d_w * d_a, sum, acc)`
//! per block ([`crate::quant::iq4_xs::vec_dot_in`] in [`Order::BlockSum`]), so the result
//! is that reference's bits.
//!
//! [`Order::BlockSum`]: crate::quant::q8_0::Order::BlockSum
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_rows::{rows4, Dot, Mull, Sdot};
use crate::f16::read_f16;
use crate::quant::iq4_nl::KVALUES;
use crate::quant::iq4_xs::{BlockIq4Xs, SUB};
use crate::quant::q8_k::BlockQ8K;

/// Per-lane shifts that bring bits `2ib..2ib + 2` of `scales_h` down (lane `ib`).
const H_SHIFTS: [i16; 8] = [0, -2, -4, -6, -8, -10, -12, -14];

/// The signed scales `ls - 32` of the eight sub-blocks, as two int32x4 (sub-blocks 0..4,
/// 4..8): the `scales_l` nibbles interleaved by `zip1`, the `scales_h` bit pairs shifted
/// per lane, about a dozen instructions per block.
#[inline(always)]
unsafe fn scales(b: &BlockIq4Xs) -> [int32x4_t; 2] {
    let l = vcreate_u8(u32::from_le_bytes(b.scales_l) as u64);
    let lo = vzip1_u8(vand_u8(l, vdup_n_u8(0x0f)), vshr_n_u8::<4>(l));
    let h = vdupq_n_u16(u16::from_le_bytes(b.scales_h));
    let hi = vandq_u16(vshlq_u16(h, vld1q_s16(H_SHIFTS.as_ptr())), vdupq_n_u16(3));
    let ls = vorr_u8(lo, vshl_n_u8::<4>(vmovn_u16(hi)));
    let ls = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(ls)), vdupq_n_s16(32));
    [vmovl_s16(vget_low_s16(ls)), vmovl_high_s16(ls)]
}

#[inline(always)]
unsafe fn body<D: Dot>(x: &[BlockIq4Xs], y: &[BlockQ8K]) -> f32 {
    let levels = vld1q_s8(KVALUES.as_ptr());
    let m4 = vdupq_n_u8(0x0f);
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let ls = scales(bx);
        let mut p = [vdupq_n_s32(0); 8];
        for (ib, pb) in p.iter_mut().enumerate() {
            let q = vld1q_u8(bx.qs[16 * ib..16 * ib + 16].as_ptr());
            let w0 = vqtbl1q_s8(levels, vandq_u8(q, m4));
            let w1 = vqtbl1q_s8(levels, vshrq_n_u8::<4>(q));
            let a = &by.qs[SUB * ib..SUB * ib + SUB];
            let a0 = vld1q_s8(a.as_ptr() as *const i8);
            let a1 = vld1q_s8(a[16..].as_ptr() as *const i8);
            *pb = D::block([w0, w1], [a0, a1]);
        }
        // Lane r of `rows4` is sub-block r's total: one multiply by the scales per four.
        let s0 = rows4([p[0], p[1], p[2], p[3]]);
        let s1 = rows4([p[4], p[5], p[6], p[7]]);
        let isum = vaddvq_s32(vmlaq_s32(vmulq_s32(s0, ls[0]), s1, ls[1]));
        sumf = libm::fmaf(read_f16(bx.d) * by.scale(), isum as f32, sumf);
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
