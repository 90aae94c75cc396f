//! The AVX2 steps of the activation quantizers ([`super::act_quant`], which says why the
//! bytes are the scalar ones).
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::act_quant::Quantizer;
use crate::cpu::Avx2;
use crate::quant::q8_0::QK;

impl Quantizer for Avx2 {
    fn amax_finite(self, xs: &[f32; QK]) -> Option<f32> {
        // SAFETY: the token proves AVX2; 32 floats are read.
        unsafe { amax_finite(xs) }
    }
    fn round_pack(self, xs: &[f32; QK], s: f32, qs: &mut [u8; QK]) {
        // SAFETY: the token proves AVX2; 32 floats are read and 32 bytes written.
        unsafe { round_pack(xs, s, qs) }
    }
    fn clamp_sum16(self, qs: &mut [u8; 16]) -> i16 {
        // SAFETY: the token proves AVX2 (SSE4.1 and SSSE3 with it); 16 bytes.
        unsafe { clamp_sum16(qs) }
    }
}

#[target_feature(enable = "avx2")]
unsafe fn load(xs: &[f32; QK]) -> [__m256; 4] {
    core::array::from_fn(|i| _mm256_loadu_ps(xs.as_ptr().add(8 * i)))
}

#[target_feature(enable = "avx2")]
unsafe fn amax_finite(xs: &[f32; QK]) -> Option<f32> {
    let (sign, inf) = (_mm256_set1_ps(-0.0), _mm256_set1_ps(f32::INFINITY));
    let (mut m, mut bad) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for x in load(xs) {
        let a = _mm256_andnot_ps(sign, x);
        m = _mm256_max_ps(a, m);
        // Not (a < inf): NaN or infinite.
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_max_ss(h, _mm_shuffle_ps::<1>(h, h));
    (_mm256_movemask_ps(bad) == 0).then(|| _mm_cvtss_f32(h))
}

#[target_feature(enable = "avx2")]
unsafe fn round_pack(xs: &[f32; QK], s: f32, qs: &mut [u8; QK]) {
    let (v, s) = (load(xs), _mm256_set1_ps(s));
    let q: [__m256i; 4] = core::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], s)));
    // The packs work within 128-bit halves: bytes come out as four-value groups
    // 0, 2, 4, 6 | 1, 3, 5, 7 of the eight; the permute restores their order.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, p);
}

#[target_feature(enable = "avx2")]
unsafe fn clamp_sum16(qs: &mut [u8; 16]) -> i16 {
    let q = _mm_min_epi8(
        _mm_loadu_si128(qs.as_ptr() as *const __m128i),
        _mm_set1_epi8(127),
    );
    _mm_storeu_si128(qs.as_mut_ptr() as *mut __m128i, q);
    // Byte pairs (1 x q), then pairs of those, then the four i32 lanes.
    let pairs = _mm_maddubs_epi16(_mm_set1_epi8(1), q);
    let quads = _mm_madd_epi16(pairs, _mm_set1_epi16(1));
    let s = _mm_add_epi32(quads, _mm_shuffle_epi32::<0b01_00_11_10>(quads));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s) as i16
}
