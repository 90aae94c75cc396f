//! AVX2 elementwise activations: GELU through ggml's f16-indexed table.
//!
//! The scalar [`crate::ops::geglu_with_table`] converts each input to f16 in software
//! (a dozen branches) and loads one table entry; here `vcvtps2ph` rounds eight inputs at
//! once (to nearest even, as the software conversion, subnormals and NaN payloads
//! included) and `vgatherdps` fetches their entries. Same bits as the scalar loop.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use crate::CpuFeatures;

/// `gate[i] = gelu(gate[i]) * up[i]` with `table` from [`crate::ops::gelu_table_fill`],
/// for the first `gate.len() / 8 * 8` elements; returns how many were done (0 without
/// AVX2/F16C or with a short table or `up`).
pub fn geglu_table(feat: &CpuFeatures, gate: &mut [f32], up: &[f32], table: &[f32]) -> usize {
    if !feat.avx2() || table.len() < 1 << 16 || up.len() < gate.len() {
        return 0;
    }
    // SAFETY: `feat.avx2()` says the CPU has AVX2 and F16C (`CpuFeatures` promises both);
    // the loop stays inside `gate` and `up`, and every gathered index is a u16, below
    // `table.len()`.
    unsafe { geglu8(gate, up, table) }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn geglu8(gate: &mut [f32], up: &[f32], table: &[f32]) -> usize {
    let n8 = gate.len() / 8 * 8;
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let (g, u, t) = (gate.as_mut_ptr(), up.as_ptr(), table.as_ptr());
    let mut i = 0;
    while i < n8 {
        let x = _mm256_loadu_ps(g.add(i));
        let up = _mm256_loadu_ps(u.add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        let y = _mm256_mul_ps(_mm256_i32gather_ps::<4>(t, _mm256_cvtepu16_epi32(h)), up);
        // As the scalar loop: x >= 10 gives x * up, x <= -10 gives 0.
        let y = _mm256_blendv_ps(y, _mm256_mul_ps(x, up), _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
        let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), y);
        _mm256_storeu_ps(g.add(i), y);
        i += 8;
    }
    n8
}
