//! IQ2_XXS against Q8_K on NEON (baseline and dotprod), one row at a time.
//!
//! Per 32 weights: the group's eight bytes are one load; the four grid points are 8-byte
//! loads, the four 7-bit sign codes index a table of +1 / -1 bytes (8-byte loads too),
//! and one `mul` per 16 weights applies them; the 32 products go through the same exact
//! integer dot as the other
//! block formats (`smull`/`sadalp`, or `sdot`: |grid * q| <= 43 * 128, no i16 pair sum
//! can overflow). The per-group scale and the float steps are the scalar reference's
//! ([`crate::quant::iq2_xxs::vec_dot`]), so the result is its bits.
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_legacy::h2f as read_f16;
use super::neon_rows::{Dot, Mull, Sdot};
use crate::quant::iq2_xxs::{signs, BlockIq2Xxs, GRID};
use crate::quant::q8_k::BlockQ8K;

/// The eight weight signs of every 7-bit sign code as bytes of +1 / -1 ([`signs`]'s bit
/// `j` set: byte `j` is -1): one 8-byte load and one multiply per eight weights, instead
/// of the parity count (`count_ones` goes through a vector `cnt` on AArch64) and a
/// mask-and-negate.
static SIGN_UNITS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut c = 0;
    while c < 128 {
        let s = signs(c as u32);
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let unit: u8 = if s & (1 << j) != 0 { 0xff } else { 1 };
            v |= (unit as u64) << (8 * j);
            j += 1;
        }
        t[c] = v;
        c += 1;
    }
    t
};

/// Sixteen signed weights: grid points `i0`, `i1` (grid values are 8, 25 or 43, so the
/// products by +1 / -1 are exact) with the sign codes in bits `k0..k0 + 7`, `k1..k1 + 7`
/// of `a`.
#[inline(always)]
unsafe fn signed16(i0: u8, i1: u8, a: u32, k0: u32, k1: u32) -> int8x16_t {
    let g = vcombine_u8(vcreate_u8(GRID[i0 as usize]), vcreate_u8(GRID[i1 as usize]));
    let s = vcombine_u8(
        vcreate_u8(SIGN_UNITS[((a >> k0) & 127) as usize]),
        vcreate_u8(SIGN_UNITS[((a >> k1) & 127) as usize]),
    );
    vreinterpretq_s8_u8(vmulq_u8(g, s))
}

/// The eight bytes of `q` as one little-endian `ldr` (LLVM narrows
/// `u64::from_le_bytes` into a byte load per field it extracts: eight loads and the
/// shifts to join them).
#[inline(always)]
fn load_u64(q: &[u8]) -> u64 {
    assert!(q.len() >= 8);
    let v: u64;
    // SAFETY: `q` has at least 8 readable bytes (checked above); AArch64 `ldr` allows
    // any alignment for normal memory; only the named registers are written.
    unsafe {
        core::arch::asm!(
            "ldr {v}, [{p}]",
            p = in(reg) q.as_ptr(),
            v = lateout(reg) v,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    v
}

#[inline(always)]
unsafe fn body<D: Dot>(x: &[BlockIq2Xxs], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let d = read_f16(bx.d) * by.scale();
        let mut bsum = 0i32;
        for (g, q) in bx.qs.chunks_exact(8).enumerate() {
            // One load of the group: four grid indices, then the sign and scale word.
            let v = load_u64(q);
            let [i0, i1, i2, i3, ..] = v.to_le_bytes();
            let a1 = (v >> 32) as u32;
            let w0 = signed16(i0, i1, a1, 0, 7);
            let w1 = signed16(i2, i3, a1, 14, 21);
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
