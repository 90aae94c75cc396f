//! NEON attention loops (same bits as `crate::attn`'s scalar reference: identical lane
//! structure, and `vfmaq_f32` is exactly rounded). f16 caches are widened in software.
#![allow(unsafe_code)]
use core::arch::aarch64::*;

use crate::attn::KvRow;
use crate::f16::f16_to_f32;
use crate::quant::float::hsum16;

/// Dot product; `None` if lengths differ.
pub fn dot(k: KvRow, q: &[f32]) -> Option<f32> {
    if k.len() != q.len() {
        return None;
    }
    // SAFETY: NEON is part of AArch64; loads stay inside the slices (lengths checked).
    Some(unsafe { dot_neon(k, q) })
}

/// `acc += v * w` fused; `false` if lengths differ.
pub fn fma_row(v: KvRow, w: f32, acc: &mut [f32]) -> bool {
    if v.len() < acc.len() {
        return false;
    }
    // SAFETY: as in `dot`; `acc.len() <= v.len()` keeps every access in bounds.
    unsafe { fma_row_neon(v, w, acc) };
    true
}

#[inline]
unsafe fn load4(k: &KvRow, i: usize) -> float32x4_t {
    match k {
        KvRow::F32(s) => vld1q_f32(s[i..i + 4].as_ptr()),
        KvRow::F16(s) => {
            let t = [
                f16_to_f32(s[i]),
                f16_to_f32(s[i + 1]),
                f16_to_f32(s[i + 2]),
                f16_to_f32(s[i + 3]),
            ];
            vld1q_f32(t.as_ptr())
        }
    }
}

#[inline]
fn at(k: &KvRow, i: usize) -> f32 {
    match k {
        KvRow::F32(s) => s[i],
        KvRow::F16(s) => f16_to_f32(s[i]),
    }
}

#[inline]
unsafe fn fmaf(a: f32, b: f32, c: f32) -> f32 {
    vgetq_lane_f32::<0>(vfmaq_f32(vdupq_n_f32(c), vdupq_n_f32(a), vdupq_n_f32(b)))
}

unsafe fn dot_neon(k: KvRow, q: &[f32]) -> f32 {
    let n = q.len();
    let np = n / 64 * 64;
    // acc[4j + m]: lanes 4m..4m+4 of the reference's accumulator j.
    let mut acc = [vdupq_n_f32(0.0); 16];
    let mut base = 0;
    while base < np {
        for (r, a) in acc.iter_mut().enumerate() {
            let i = base + 4 * r;
            *a = vfmaq_f32(*a, load4(&k, i), vld1q_f32(q[i..i + 4].as_ptr()));
        }
        base += 64;
    }
    let mut lanes = [0.0f32; 16];
    for m in 0..4 {
        let v = vaddq_f32(
            vaddq_f32(acc[m], acc[8 + m]),
            vaddq_f32(acc[4 + m], acc[12 + m]),
        );
        vst1q_f32(lanes[4 * m..4 * m + 4].as_mut_ptr(), v);
    }
    let mut s = hsum16(lanes);
    for (i, qi) in q.iter().enumerate().skip(np) {
        s = fmaf(at(&k, i), *qi, s);
    }
    s
}

unsafe fn fma_row_neon(v: KvRow, w: f32, acc: &mut [f32]) {
    let n = acc.len();
    let n4 = n / 4 * 4;
    let wv = vdupq_n_f32(w);
    let mut i = 0;
    while i < n4 {
        let a = vld1q_f32(acc[i..i + 4].as_ptr());
        vst1q_f32(acc[i..i + 4].as_mut_ptr(), vfmaq_f32(a, load4(&v, i), wv));
        i += 4;
    }
    for (j, a) in acc.iter_mut().enumerate().skip(n4) {
        *a = fmaf(at(&v, j), w, *a);
    }
}
