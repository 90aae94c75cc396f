//! AVX2 elementwise activations, same bits as the scalar loops.
//!
//! - GELU through ggml's f16-indexed table: the scalar [`crate::ops::geglu_with_table`]
//!   converts each input to f16 in software (a dozen branches) and loads one table entry;
//!   here `vcvtps2ph` rounds eight inputs at once (to nearest even, as the software
//!   conversion, subnormals and NaN payloads included) and `vgatherdps` fetches their
//!   entries.
//! - SiLU (`x / (1 + e^-x)`, alone, times an up projection or as a gate): the scalar
//!   [`crate::ops::expf_ggml`] spends six software `fmaf`s per value on a build without
//!   FMA; here eight lanes take the same steps with hardware FMA (exactly rounded, so the
//!   same bits). A block of eight whose power of two leaves the normal range goes to the
//!   scalar function.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use crate::ops::SiluMode;
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

/// `e^v` per lane as [`crate::ops::expf_ggml`] computes it, or `None` when a lane's
/// power of two falls outside the normal range (`ldexpf` rounding there needs the scalar
/// path). Same operations in the same order as the scalar, with hardware FMA.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exp8_ggml(v: __m256) -> Option<__m256> {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(v, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    // Normal range of 2^n only: -126 <= n <= 127 (the scalar path handles the rest).
    let ok = _mm256_and_ps(
        _mm256_cmp_ps::<_CMP_GE_OQ>(n, _mm256_set1_ps(-126.0)),
        _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_set1_ps(127.0)),
    );
    if _mm256_movemask_ps(ok) != 0xff {
        return None;
    }
    let neg_n = _mm256_sub_ps(_mm256_setzero_ps(), n);
    let b = _mm256_fmadd_ps(
        neg_n,
        c(0x35bf_be8e),
        _mm256_fmadd_ps(neg_n, c(0x3f31_7200), v),
    );
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
    );
    // 2^n as a float built from its exponent bits; j * 2^n is exact for normal results
    // (j is within [0.7, 1.5]), and results below 2^-126 are excluded above.
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    Some(_mm256_mul_ps(j, _mm256_castsi256_ps(e)))
}

/// The first `x.len() / 8 * 8` values of `x` as `mode` says (`other`: the partner
/// values, at least as long as `x` unless `mode` is [`SiluMode::Alone`]); a block of
/// eight whose exponential leaves the normal range gets `scalar(x, y)` per value (the
/// reference's formula, `y = 0` when alone). Returns how many leading values were done:
/// 0 without AVX2 or with a short `other`.
pub fn silu_blocks(
    feat: &CpuFeatures,
    mode: SiluMode,
    x: &mut [f32],
    other: &[f32],
    scalar: &dyn Fn(f32, f32) -> f32,
) -> usize {
    if !feat.avx2() || (mode != SiluMode::Alone && other.len() < x.len()) {
        return 0;
    }
    // SAFETY: `feat.avx2()` says the CPU has AVX2, FMA and F16C (`CpuFeatures` promises
    // all three); the loop reads and writes whole blocks of eight inside `x` and reads
    // `other` only at indices of `x` (checked above to be inside it).
    unsafe { silu8(mode, x, other, scalar) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn silu8(
    mode: SiluMode,
    x: &mut [f32],
    other: &[f32],
    scalar: &dyn Fn(f32, f32) -> f32,
) -> usize {
    let n8 = x.len() / 8 * 8;
    let (xp, yp) = (x.as_mut_ptr(), other.as_ptr());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i < n8 {
        let xv = _mm256_loadu_ps(xp.add(i));
        let yv = if mode == SiluMode::Alone {
            xv
        } else {
            _mm256_loadu_ps(yp.add(i))
        };
        // The SiLU's input: the value itself, or the partner when it is the gate.
        let s_in = if mode == SiluMode::GatedBy { yv } else { xv };
        match exp8_ggml(_mm256_sub_ps(_mm256_setzero_ps(), s_in)) {
            Some(e) => {
                let s = _mm256_div_ps(s_in, _mm256_add_ps(one, e));
                let r = match mode {
                    SiluMode::Alone => s,
                    SiluMode::TimesOther => _mm256_mul_ps(s, yv),
                    SiluMode::GatedBy => _mm256_mul_ps(xv, s),
                };
                _mm256_storeu_ps(xp.add(i), r);
            }
            None => {
                for j in i..i + 8 {
                    let y = if mode == SiluMode::Alone {
                        0.0
                    } else {
                        *yp.add(j)
                    };
                    *xp.add(j) = scalar(*xp.add(j), y);
                }
            }
        }
        i += 8;
    }
    n8
}
