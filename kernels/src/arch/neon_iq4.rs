//! IQ4_XS against Q8_K and IQ4_NL against Q8_0 on NEON (baseline and dotprod), one row
//! at a time.
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
//! IQ4_NL is the same 32-weight sub-block without a sub-block scale: one `tbl` pair and
//! one [`Dot`] per block, its lanes summed by `addv`, blocks taken in pairs with
//! llama.cpp's NEON float step `sum += fma(d0, sumi0, d1 * sumi1)` and an odd last block
//! as `sum = fma(d, sumi, sum)` ([`crate::quant::iq4_nl::vec_dot_in`] in
//! [`Order::BlockSum`]).
//!
//! [`Order::BlockSum`]: crate::quant::q8_0::Order::BlockSum
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_legacy::fmadd;
use super::neon_legacy::h2f as read_f16;
use super::neon_rows::{rows4, Dot, Mull, Sdot};
use crate::quant::iq4_nl::{BlockIq4Nl, KVALUES};
use crate::quant::iq4_xs::{BlockIq4Xs, SUB};
use crate::quant::q8_0::BlockQ8_0;
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

/// The table values of 16 index bytes: low nibbles (weights 0..16), high (16..32).
#[inline(always)]
unsafe fn levels_of(levels: int8x16_t, q: &[u8]) -> [int8x16_t; 2] {
    let q = vld1q_u8(q[..16].as_ptr());
    [
        vqtbl1q_s8(levels, vandq_u8(q, vdupq_n_u8(0x0f))),
        vqtbl1q_s8(levels, vshrq_n_u8::<4>(q)),
    ]
}

/// The 32 activation quants of `a` as two registers.
#[inline(always)]
unsafe fn acts(a: &[u8]) -> [int8x16_t; 2] {
    let (lo, hi) = (&a[..16], &a[16..32]);
    [
        vld1q_s8(lo.as_ptr() as *const i8),
        vld1q_s8(hi.as_ptr() as *const i8),
    ]
}

/// One IQ4_NL block's scale product and exact integer dot with its Q8_0 block.
#[inline(always)]
unsafe fn nl_block<D: Dot>(levels: int8x16_t, x: &BlockIq4Nl, y: &BlockQ8_0) -> (f32, f32) {
    let s = vaddvq_s32(D::block(levels_of(levels, &x.qs), acts(&y.qs)));
    (read_f16(x.d) * read_f16(y.d), s as f32)
}

#[inline(always)]
unsafe fn nl_body<D: Dot>(x: &[BlockIq4Nl], y: &[BlockQ8_0]) -> f32 {
    let levels = vld1q_s8(KVALUES.as_ptr());
    let mut sumf = 0.0f32;
    let (xp, xt) = x.as_chunks::<2>();
    let (yp, yt) = y.as_chunks::<2>();
    for (bx, by) in xp.iter().zip(yp) {
        let (d0, s0) = nl_block::<D>(levels, &bx[0], &by[0]);
        let (d1, s1) = nl_block::<D>(levels, &bx[1], &by[1]);
        sumf += fmadd(d0, s0, d1 * s1);
    }
    if let (Some(bx), Some(by)) = (xt.first(), yt.first()) {
        let (d, s) = nl_block::<D>(levels, bx, by);
        sumf = fmadd(d, s, sumf);
    }
    sumf
}

#[inline(always)]
unsafe fn body<D: Dot>(x: &[BlockIq4Xs], y: &[BlockQ8K]) -> f32 {
    let levels = vld1q_s8(KVALUES.as_ptr());
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let ls = scales(bx);
        let mut p = [vdupq_n_s32(0); 8];
        for (ib, pb) in p.iter_mut().enumerate() {
            let w = levels_of(levels, &bx.qs[16 * ib..16 * ib + 16]);
            *pb = D::block(w, acts(&by.qs[SUB * ib..SUB * ib + SUB]));
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

/// IQ4_NL, baseline NEON.
///
/// # Safety
/// The CPU has Advanced SIMD.
#[target_feature(enable = "neon")]
pub(super) unsafe fn nl_base(x: &[BlockIq4Nl], y: &[BlockQ8_0]) -> f32 {
    nl_body::<Mull>(x, y)
}

/// IQ4_NL, NEON + dotprod.
///
/// # Safety
/// The CPU has Advanced SIMD and `sdot`.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn nl_dot(x: &[BlockIq4Nl], y: &[BlockQ8_0]) -> f32 {
    nl_body::<Sdot>(x, y)
}
