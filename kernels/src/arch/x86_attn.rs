//! AVX2 + FMA + F16C attention loops (same bits as `crate::attn`'s scalar reference:
//! the lane structure is identical and FMA is exactly rounded).
#![allow(unsafe_code)]
use core::arch::x86_64::*;

use crate::attn::KvRow;
use crate::quant::float::hsum16;

/// Dot product; `None` if lengths differ.
pub fn dot(k: KvRow, q: &[f32]) -> Option<f32> {
    if k.len() != q.len() {
        return None;
    }
    // SAFETY: callers check `CpuFeatures::avx2`, which the platform sets only with FMA
    // and F16C; all loads stay inside the slices (lengths checked above).
    Some(unsafe { dot_avx2(k, q) })
}

/// `acc += v * w` fused; `false` if lengths differ.
pub fn fma_row(v: KvRow, w: f32, acc: &mut [f32]) -> bool {
    if v.len() < acc.len() {
        return false;
    }
    // SAFETY: as in `dot`; `acc.len() <= v.len()` keeps every access in bounds.
    unsafe { fma_row_avx2(v, w, acc) };
    true
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(k: &KvRow, i: usize) -> __m256 {
    match k {
        KvRow::F32(s) => _mm256_loadu_ps(s[i..i + 8].as_ptr()),
        KvRow::F16(s) => _mm256_cvtph_ps(_mm_loadu_si128(s[i..i + 8].as_ptr() as *const __m128i)),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scalar_at(k: &KvRow, i: usize) -> f32 {
    match k {
        KvRow::F32(s) => s[i],
        KvRow::F16(s) => _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(s[i] as i32))),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fmaf(a: f32, b: f32, c: f32) -> f32 {
    _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(k: KvRow, q: &[f32]) -> f32 {
    let n = q.len();
    let np = n / 64 * 64;
    // acc[2j], acc[2j+1]: lanes 0-7 and 8-15 of the reference's accumulator j.
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut base = 0;
    while base < np {
        for (r, a) in acc.iter_mut().enumerate() {
            let i = base + 8 * r;
            *a = _mm256_fmadd_ps(load8(&k, i), _mm256_loadu_ps(q[i..i + 8].as_ptr()), *a);
        }
        base += 64;
    }
    let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    let mut lanes = [0.0f32; 16];
    _mm256_storeu_ps(lanes[..8].as_mut_ptr(), lo);
    _mm256_storeu_ps(lanes[8..].as_mut_ptr(), hi);
    let mut s = hsum16(lanes);
    for (i, qi) in q.iter().enumerate().skip(np) {
        s = fmaf(scalar_at(&k, i), *qi, s);
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fma_row_avx2(v: KvRow, w: f32, acc: &mut [f32]) {
    let n = acc.len();
    let n8 = n / 8 * 8;
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i < n8 {
        let a = _mm256_loadu_ps(acc[i..i + 8].as_ptr());
        let r = _mm256_fmadd_ps(load8(&v, i), wv, a);
        _mm256_storeu_ps(acc[i..i + 8].as_mut_ptr(), r);
        i += 8;
    }
    for (j, a) in acc.iter_mut().enumerate().skip(n8) {
        *a = fmaf(scalar_at(&v, j), w, *a);
    }
}

/// `out[i] = ops::expf_ggml(x[i] - max)` for a chunk of exactly 16 values, or `false`
/// (with `out` unspecified) when the chunk is shorter or a lane's power of two falls
/// outside the normal range, where `ldexpf` rounding needs the scalar path. Same
/// operations in the same order as the scalar, with hardware FMA.
pub fn exp16_minus(x: &[f32], max: f32, out: &mut [f32; 16]) -> bool {
    if x.len() != 16 {
        return false;
    }
    let (lo, hi) = out.split_at_mut(8);
    // SAFETY: callers check `CpuFeatures::avx2` (which includes FMA); each call reads 8
    // floats of `x` (16 long, checked) and writes 8 into a half of `out`.
    unsafe { exp8_avx2(&x[..8], max, lo) && exp8_avx2(&x[8..], max, hi) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8_avx2(x: &[f32], max: f32, out: &mut [f32]) -> bool {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let v = _mm256_sub_ps(_mm256_loadu_ps(x[..8].as_ptr()), _mm256_set1_ps(max));
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(v, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    // Normal range of 2^n only: -126 <= n <= 127 (the scalar path handles the rest).
    let ok = _mm256_and_ps(
        _mm256_cmp_ps::<_CMP_GE_OQ>(n, _mm256_set1_ps(-126.0)),
        _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_set1_ps(127.0)),
    );
    if _mm256_movemask_ps(ok) != 0xff {
        return false;
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
    let res = _mm256_mul_ps(j, _mm256_castsi256_ps(e));
    _mm256_storeu_ps(out[..8].as_mut_ptr(), res);
    true
}
