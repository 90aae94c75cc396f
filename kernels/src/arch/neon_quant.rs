//! The NEON steps of the activation quantizers ([`super::act_quant`], which says why the
//! bytes are the scalar ones).
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::act_quant::Quantizer;
use crate::cpu::Neon;
use crate::quant::q8_0::QK;

impl Quantizer for Neon {
    fn amax_finite(self, xs: &[f32; QK]) -> Option<f32> {
        // SAFETY: the token proves Advanced SIMD; 32 floats are read.
        unsafe { amax_finite(xs) }
    }
    fn round_pack(self, xs: &[f32; QK], s: f32, qs: &mut [u8; QK]) {
        // SAFETY: the token proves Advanced SIMD; 32 floats are read and 32 bytes written.
        unsafe { round_pack(xs, s, qs) }
    }
    fn clamp_sum16(self, qs: &mut [u8; 16]) -> i16 {
        // SAFETY: the token proves Advanced SIMD; 16 bytes.
        unsafe {
            let q = vminq_s8(vld1q_s8(qs.as_ptr() as *const i8), vdupq_n_s8(127));
            vst1q_s8(qs.as_mut_ptr() as *mut i8, q);
            vaddlvq_s8(q)
        }
    }
}

#[inline(always)]
unsafe fn load(xs: &[f32; QK]) -> [float32x4_t; 8] {
    core::array::from_fn(|i| vld1q_f32(xs.as_ptr().add(4 * i)))
}

unsafe fn amax_finite(xs: &[f32; QK]) -> Option<f32> {
    let inf = vdupq_n_f32(f32::INFINITY);
    let (mut m, mut ok) = (vdupq_n_f32(0.0), vdupq_n_u32(u32::MAX));
    for x in load(xs) {
        let a = vabsq_f32(x);
        m = vmaxq_f32(m, a);
        // False for NaN and infinity.
        ok = vandq_u32(ok, vcltq_f32(a, inf));
    }
    (vminvq_u32(ok) != 0).then(|| vmaxvq_f32(m))
}

unsafe fn round_pack(xs: &[f32; QK], s: f32, qs: &mut [u8; QK]) {
    let (v, s) = (load(xs), vdupq_n_f32(s));
    for h in 0..2 {
        let q: [int32x4_t; 4] =
            core::array::from_fn(|i| vcvtnq_s32_f32(vmulq_f32(v[4 * h + i], s)));
        let lo = vqmovn_high_s32(vqmovn_s32(q[0]), q[1]);
        let hi = vqmovn_high_s32(vqmovn_s32(q[2]), q[3]);
        vst1q_s8(
            qs.as_mut_ptr().add(16 * h) as *mut i8,
            vqmovn_high_s16(vqmovn_s16(lo), hi),
        );
    }
}
