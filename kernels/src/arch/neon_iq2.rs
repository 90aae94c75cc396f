//! IQ2_XXS against Q8_K on NEON (baseline and dotprod), one row at a time.
//!
//! Per 32 weights: the four grid points are two 8-byte loads per 16 weights, the signs
//! two bytes broadcast and tested against the bit of each lane (`cmtst`), applied as
//! `(g ^ m) - m`; the 32 products go through the same exact integer dot as the other
//! block formats (`smull`/`sadalp`, or `sdot`: |grid * q| <= 43 * 128, no i16 pair sum
//! can overflow). The per-group scale and the float steps are the scalar reference's
//! ([`crate::quant::iq2_xxs::vec_dot`]), so the result is its bits.
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_rows::{Dot, Mull, Sdot};
use crate::f16::read_f16;
use crate::quant::iq2_xxs::{signs, BlockIq2Xxs, GRID};
use crate::quant::q8_k::BlockQ8K;

/// Lane `j`'s sign bit within its byte (two groups of eight lanes).
const LANE_BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// Sixteen signed weights: grid points `i0`, `i1` with sign bytes `s0`, `s1`.
#[inline(always)]
unsafe fn signed16(i0: u8, i1: u8, s0: u8, s1: u8, bits: uint8x16_t) -> int8x16_t {
    let g = vcombine_u8(vcreate_u8(GRID[i0 as usize]), vcreate_u8(GRID[i1 as usize]));
    let m = vtstq_u8(vcombine_u8(vdup_n_u8(s0), vdup_n_u8(s1)), bits);
    vreinterpretq_s8_u8(vsubq_u8(veorq_u8(g, m), m))
}

#[inline(always)]
unsafe fn body<D: Dot>(x: &[BlockIq2Xxs], y: &[BlockQ8K]) -> f32 {
    let bits = vld1q_u8(LANE_BITS.as_ptr());
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let d = read_f16(bx.d) * by.scale();
        let mut bsum = 0i32;
        for g in 0..8 {
            let q = &bx.qs[8 * g..8 * g + 8];
            let a1 = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
            let w0 = signed16(q[0], q[1], signs(a1), signs(a1 >> 7), bits);
            let w1 = signed16(q[2], q[3], signs(a1 >> 14), signs(a1 >> 21), bits);
            let a = &by.qs[32 * g..32 * g + 32];
            let a0 = vld1q_s8(a.as_ptr() as *const i8);
            let a1v = vld1q_s8(a[16..].as_ptr() as *const i8);
            let sumi = vaddvq_s32(D::block([w0, w1], [a0, a1v]));
            bsum += sumi * (2 * (a1 >> 28) as i32 + 1);
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

/// Baseline NEON.
///
/// # Safety
/// The CPU has Advanced SIMD.
#[target_feature(enable = "neon")]
pub(super) unsafe fn base(x: &[BlockIq2Xxs], y: &[BlockQ8K]) -> f32 {
    body::<Mull>(x, y)
}

/// NEON + dotprod.
///
/// # Safety
/// The CPU has Advanced SIMD and `sdot`.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn dot(x: &[BlockIq2Xxs], y: &[BlockQ8K]) -> f32 {
    body::<Sdot>(x, y)
}
