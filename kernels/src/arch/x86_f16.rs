//! F16C slice conversions between f16 and f32 (`vcvtph2ps` / `vcvtps2ph`), eight
//! values per instruction, for state kept in f16 (`--state-f16`). Same bits as the
//! software conversions of [`crate::f16`] (round to nearest even, subnormals and NaN
//! kept: `vcvtps2ph` quiets a signalling NaN as the software path does).
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use crate::CpuFeatures;

/// A block's f16 scale (little-endian bytes) to f32 with F16C: exact, the value of the
/// software [`crate::f16::read_f16`] the scalar references use (one instruction against
/// its shifts and branches, which cost the Q4_K one-token kernel half its speed).
///
/// # Safety
/// The CPU has F16C (every caller runs under `avx2,fma,f16c` or wider).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn read_f16(h: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(
        _mm_cvtsi32_si128(u16::from_le_bytes(h) as i32),
    ))
}

/// `dst[i] = f16_to_f32(src[i])` for the first `n / 8 * 8` of `n = min(len)` values;
/// how many were done (0 without AVX2/F16C).
pub fn widen(feat: &CpuFeatures, src: &[u16], dst: &mut [f32]) -> usize {
    if !feat.avx2() {
        return 0;
    }
    let n8 = src.len().min(dst.len()) / 8 * 8;
    // SAFETY: `feat.avx2()` says the CPU has AVX2 and F16C (`CpuFeatures` promises
    // both); every load reads `src[i..i + 8]` and every store writes `dst[i..i + 8]`
    // with `i + 8 <= n8`, inside both slices.
    unsafe { widen8(src, dst, n8) };
    n8
}

/// `dst[i] = f32_to_f16(src[i])` for the first `n / 8 * 8` of `n = min(len)` values;
/// how many were done (0 without AVX2/F16C).
pub fn narrow(feat: &CpuFeatures, src: &[f32], dst: &mut [u16]) -> usize {
    if !feat.avx2() {
        return 0;
    }
    let n8 = src.len().min(dst.len()) / 8 * 8;
    // SAFETY: as in `widen`: F16C is present and every access stays below `n8`.
    unsafe { narrow8(src, dst, n8) };
    n8
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn widen8(src: &[u16], dst: &mut [f32], n8: usize) {
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i < n8 {
        let h = _mm_loadu_si128(s.add(i) as *const __m128i);
        _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn narrow8(src: &[f32], dst: &mut [u16], n8: usize) {
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i < n8 {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.add(i)));
        _mm_storeu_si128(d.add(i) as *mut __m128i, h);
        i += 8;
    }
}
