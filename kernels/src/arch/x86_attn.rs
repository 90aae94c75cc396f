//! AVX2 + FMA + F16C attention loops (same bits as `crate::attn`'s scalar reference:
//! the lane structure is identical and FMA is exactly rounded).
#![allow(unsafe_code)]
use core::arch::x86_64::*;

use crate::attn::{KvRow, KvRows};
use crate::cpu::Avx2;
use crate::ops::RopeKind;
use crate::quant::float::hsum16;

/// Dot product; `None` if lengths differ.
pub fn dot(_: Avx2, k: KvRow, q: &[f32]) -> Option<f32> {
    if k.len() != q.len() {
        return None;
    }
    // SAFETY: the `Avx2` token proves AVX2 with FMA and F16C (only a detected
    // `CpuFeatures` hands it out); all loads stay inside the slices (lengths checked above).
    Some(unsafe { dot_avx2(k, q) })
}

/// `acc += v * w` fused; `false` if lengths differ.
pub fn fma_row(_: Avx2, v: KvRow, w: f32, acc: &mut [f32]) -> bool {
    if v.len() < acc.len() {
        return false;
    }
    // SAFETY: as in `dot`; `acc.len() <= v.len()` keeps every access in bounds.
    unsafe { fma_row_avx2(v, w, acc) };
    true
}

/// [`crate::ops::rope_apply`] with 8 pairs a step (same bits: the same two fused steps
/// per pair, each exactly rounded); `false` if `x` is shorter than `angles`.
pub fn rope_apply(_: Avx2, x: &mut [f32], angles: &[f32], kind: RopeKind) -> bool {
    if x.len() < angles.len() || !angles.len().is_multiple_of(2) {
        return false;
    }
    // SAFETY: the `Avx2` token proves AVX2 with FMA and F16C; every access is a slice
    // index or an 8-wide load/store of a range checked against the slices below.
    unsafe {
        match kind {
            RopeKind::Neox => rope_neox_avx2(x, angles),
            RopeKind::Norm => rope_norm_avx2(x, angles),
        }
    }
    true
}

/// Halves: pair i is (x[i], x[i + n_rot/2]), its (sin, cos) at angles[2i..2i+2].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rope_neox_avx2(x: &mut [f32], angles: &[f32]) {
    let half = angles.len() / 2;
    let (lo, hi) = x[..2 * half].split_at_mut(half);
    let mut i = 0;
    while i + 8 <= half {
        let a = &angles[2 * i..2 * i + 16];
        let a0 = _mm256_loadu_ps(a.as_ptr());
        let a1 = _mm256_loadu_ps(a[8..].as_ptr());
        // [s0 s1 s4 s5 | s2 s3 s6 s7] -> s0..s7 (and the cosines likewise).
        let s = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(
            _mm256_shuffle_ps::<0x88>(a0, a1),
        )));
        let c = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(
            _mm256_shuffle_ps::<0xDD>(a0, a1),
        )));
        let x0 = _mm256_loadu_ps(lo[i..i + 8].as_ptr());
        let x1 = _mm256_loadu_ps(hi[i..i + 8].as_ptr());
        let new0 = _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s));
        let new1 = _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c));
        _mm256_storeu_ps(lo[i..i + 8].as_mut_ptr(), new0);
        _mm256_storeu_ps(hi[i..i + 8].as_mut_ptr(), new1);
        i += 8;
    }
    for i in i..half {
        let (s, c) = (angles[2 * i], angles[2 * i + 1]);
        let (x0, x1) = (lo[i], hi[i]);
        lo[i] = fmaf(x0, c, -(x1 * s));
        hi[i] = fmaf(x0, s, x1 * c);
    }
}

/// Adjacent pairs: pair i is (x[2i], x[2i+1]), its (sin, cos) at angles[2i..2i+2].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rope_norm_avx2(x: &mut [f32], angles: &[f32]) {
    let n = angles.len();
    let mut i = 0;
    while i + 8 <= n {
        let a = _mm256_loadu_ps(angles[i..i + 8].as_ptr());
        let s = _mm256_moveldup_ps(a); // s0 s0 s1 s1 ...
        let c = _mm256_movehdup_ps(a); // c0 c0 c1 c1 ...
        let v = _mm256_loadu_ps(x[i..i + 8].as_ptr()); // e0 o0 e1 o1 ...
        let swapped = _mm256_permute_ps::<0xB1>(v); // o0 e0 o1 e1 ...
                                                    // Even lanes: e*c - o*s; odd lanes: e*s + o*c (e from `swapped` there).
        let even = _mm256_fmsub_ps(v, c, _mm256_mul_ps(swapped, s));
        let odd = _mm256_fmadd_ps(swapped, s, _mm256_mul_ps(v, c));
        _mm256_storeu_ps(x[i..i + 8].as_mut_ptr(), _mm256_blend_ps::<0xAA>(even, odd));
        i += 8;
    }
    while i < n {
        let (s, c) = (angles[i], angles[i + 1]);
        let (x0, x1) = (x[i], x[i + 1]);
        x[i] = fmaf(x0, c, -(x1 * s));
        x[i + 1] = fmaf(x0, s, x1 * c);
        i += 2;
    }
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
pub fn exp16_minus(_: Avx2, x: &[f32], max: f32, out: &mut [f32; 16]) -> bool {
    if x.len() != 16 {
        return false;
    }
    let (lo, hi) = out.split_at_mut(8);
    // SAFETY: the `Avx2` token proves AVX2 with FMA; each call reads 8
    // floats of `x` (16 long, checked) and writes 8 into a half of `out`.
    unsafe { exp8_avx2(&x[..8], max, lo) && exp8_avx2(&x[8..], max, hi) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8_avx2(x: &[f32], max: f32, out: &mut [f32]) -> bool {
    let v = _mm256_sub_ps(_mm256_loadu_ps(x[..8].as_ptr()), _mm256_set1_ps(max));
    let Some(res) = super::x86_act::exp8_ggml(v) else {
        return false;
    };
    _mm256_storeu_ps(out[..8].as_mut_ptr(), res);
    true
}

/// A stored key/value element: f32 or f16 bits.
trait Elem: Copy {
    /// Eight values from `p` widened to f32.
    unsafe fn load8(p: *const Self) -> __m256;
    /// One value widened to f32.
    unsafe fn load1(p: *const Self) -> f32;
}

impl Elem for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load1(p: *const f32) -> f32 {
        *p
    }
}

impl Elem for u16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load1(p: *const u16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(*p as i32)))
    }
}

/// Raw views of up to four query (or weight) slices and their outputs.
type Ptrs<const N: usize> = ([*const f32; N], [*mut f32; N]);

fn ptrs(ins: &[&[f32]], outs: &mut [&mut [f32]]) -> Ptrs<4> {
    let i = core::array::from_fn(|g| ins.get(g).map_or(core::ptr::null(), |s| s.as_ptr()));
    let mut o = [core::ptr::null_mut(); 4];
    for (p, s) in o.iter_mut().zip(outs.iter_mut()) {
        *p = s.as_mut_ptr();
    }
    (i, o)
}

/// `crate::attn::dots` for 1 to 4 queries; `false` if the shapes do not fit.
pub fn dots(_: Avx2, k: &KvRows, qs: &[&[f32]], outs: &mut [&mut [f32]]) -> bool {
    let g = qs.len();
    if !(1..=4).contains(&g)
        || outs.len() != g
        || qs.iter().any(|q| q.len() != k.row_len())
        || outs.iter().any(|o| o.len() < k.rows())
    {
        return false;
    }
    let (qp, op) = ptrs(qs, outs);
    let (s, len, n) = (k.stride(), k.row_len(), k.rows());
    // SAFETY: the `Avx2` token proves AVX2 with FMA and F16C. `KvRows::new`
    // checked that `n` rows of `len` values at stride `s` lie inside the data; each of
    // the first `g` query pointers has `len` values and each output at least `n`
    // (checked above); the kernels touch only the first `g` pointers.
    unsafe {
        match k.data() {
            KvRow::F32(d) => dots_g(d.as_ptr(), s, len, n, g, qp, op),
            KvRow::F16(d) => dots_g(d.as_ptr(), s, len, n, g, qp, op),
        }
    }
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_g<E: Elem>(
    k: *const E,
    s: usize,
    len: usize,
    n: usize,
    g: usize,
    qp: [*const f32; 4],
    op: [*mut f32; 4],
) {
    match g {
        1 => dots_avx2::<E, 1, 8>(k, s, len, n, qp, op),
        2 => dots_avx2::<E, 2, 4>(k, s, len, n, qp, op),
        3 => dots_avx2::<E, 3, 2>(k, s, len, n, qp, op),
        _ => dots_avx2::<E, 4, 2>(k, s, len, n, qp, op),
    }
}

/// `dot_avx2` of every row with `G` queries: each 8-value slice of a row is loaded
/// once for all queries. The reference's eight accumulators (`acc[r]`: values
/// `64 b + 8 r ..` of every block `b`) are independent chains, so they are run `R` at a
/// time (`G * R` chains in flight) and combined exactly as `dot_avx2` does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_avx2<E: Elem, const G: usize, const R: usize>(
    k: *const E,
    s: usize,
    len: usize,
    n: usize,
    qp: [*const f32; 4],
    op: [*mut f32; 4],
) {
    const ORD: [usize; 8] = [0, 4, 2, 6, 1, 5, 3, 7];
    let np = len / 64 * 64;
    for j in 0..n {
        let kp = k.add(j * s);
        let mut part = [[_mm256_setzero_ps(); 8]; G];
        let mut r0 = 0;
        while r0 < 8 {
            let mut acc = [[_mm256_setzero_ps(); R]; G];
            let mut base = 0;
            while base < np {
                for (rr, r) in ORD[r0..r0 + R].iter().enumerate() {
                    let i = base + 8 * r;
                    let kv = E::load8(kp.add(i));
                    for (a, q) in acc.iter_mut().zip(qp) {
                        a[rr] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q.add(i)), a[rr]);
                    }
                }
                base += 64;
            }
            for (p, a) in part.iter_mut().zip(&acc) {
                for (rr, r) in ORD[r0..r0 + R].iter().enumerate() {
                    p[*r] = a[rr];
                }
            }
            r0 += R;
        }
        for ((p, q), o) in part.iter().zip(qp).zip(op) {
            let lo = _mm256_add_ps(_mm256_add_ps(p[0], p[4]), _mm256_add_ps(p[2], p[6]));
            let hi = _mm256_add_ps(_mm256_add_ps(p[1], p[5]), _mm256_add_ps(p[3], p[7]));
            let mut v = hsum16_vec(lo, hi);
            for i in np..len {
                v = fmaf(E::load1(kp.add(i)), *q.add(i), v);
            }
            *o.add(j) = v;
        }
    }
}

/// `hsum16` of lanes `lo` (0-7) and `hi` (8-15) with the same additions in registers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum16_vec(lo: __m256, hi: __m256) -> f32 {
    let t8 = _mm256_add_ps(lo, hi);
    let t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps::<1>(t8));
    // x0 = t4[0] + t4[2], x1 = t4[1] + t4[3]; then x0 + x1.
    let x = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps::<1>(x, x)))
}

/// `crate::attn::weighted_sum` for 1 to 4 queries; `false` if the shapes do not fit or
/// an output is not finite (the caller then takes the scalar path).
///
/// Rows are read for every query once any query weighs them, so a row that weighs
/// zero for one query still meets it, where the reference skips it. That adds exactly
/// nothing (`fma(v, 0, acc) == acc`: the lane sums start at +0 and never become -0)
/// unless `v` is an infinity or NaN, and then the query's output is NaN: finite outputs
/// are exactly the reference's.
pub fn weighted_sum(_: Avx2, v: &KvRows, ws: &[&[f32]], outs: &mut [&mut [f32]]) -> bool {
    let g = ws.len();
    let (len, n) = (v.row_len(), v.rows());
    if !(1..=4).contains(&g)
        || outs.len() != g
        || ws.iter().any(|w| w.len() < n)
        || outs.iter().any(|o| o.len() != len)
    {
        return false;
    }
    let (wp, op) = ptrs(ws, outs);
    let s = v.stride();
    // SAFETY: as in `dots`: the rows lie inside the data (`KvRows::new`), the first `g`
    // weight pointers have at least `n` values and the outputs `len` (checked above).
    let done = unsafe {
        match v.data() {
            KvRow::F32(d) => wsum_g(d.as_ptr(), s, len, n, g, wp, op),
            KvRow::F16(d) => wsum_g(d.as_ptr(), s, len, n, g, wp, op),
        }
    };
    crate::attn::weighted_sum_cols(v, ws, outs, done);
    outs.iter().all(|o| o.iter().all(|x| x.is_finite()))
}

/// How far ahead (in rows) `wsum_avx2` prefetches value rows: two rows of a lane
/// (further ahead, the prefetched lines evict each other: a lane's rows often share
/// L1 sets).
const PREFETCH_ROWS: usize = 32;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn wsum_g<E: Elem>(
    v: *const E,
    s: usize,
    len: usize,
    n: usize,
    g: usize,
    wp: [*const f32; 4],
    op: [*mut f32; 4],
) -> usize {
    match g {
        1 => wsum_avx2::<E, 1, 4>(v, s, len, n, wp, op),
        2 => wsum_avx2::<E, 2, 4>(v, s, len, n, wp, op),
        3 => wsum_avx2::<E, 3, 2>(v, s, len, n, wp, op),
        _ => wsum_avx2::<E, 4, 2>(v, s, len, n, wp, op),
    }
}

/// Columns in blocks of `8 NB`: for each lane `l`, the rows `l, l + 16, ...` are
/// accumulated in registers for all `G` queries (one load and widening per row), then
/// the 16 lanes are reduced with `hsum16`'s tree, column-wise. Returns the number of
/// columns done.
#[allow(clippy::needless_range_loop)] // `b` picks the column block of `r[i][b]`
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn wsum_avx2<E: Elem, const G: usize, const NB: usize>(
    v: *const E,
    s: usize,
    len: usize,
    n: usize,
    wp: [*const f32; 4],
    op: [*mut f32; 4],
) -> usize {
    let bw = 8 * NB;
    let nb = len / bw * bw;
    let mut d0 = 0;
    while d0 < nb {
        let mut red = [[[_mm256_setzero_ps(); NB]; 16]; G];
        for l in 0..16 {
            let mut acc = [[_mm256_setzero_ps(); NB]; G];
            let mut j = l;
            while j < n {
                // Skip the row when every weight is +-0 (sign bit shifted out).
                let any = wp[..G].iter().fold(0u32, |a, w| {
                    // Volatile keeps this integer read apart from the broadcast
                    // below, which then loads straight into a vector register.
                    a | (core::ptr::read_volatile(w.add(j) as *const u32) << 1)
                });
                if any != 0 {
                    let p = v.add(j * s + d0);
                    // The rows of a lane lie 16 strides apart: fetch a few ahead.
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_ROWS * s) as *const i8);
                    let x: [__m256; NB] = core::array::from_fn(|b| E::load8(p.add(8 * b)));
                    for (a, w) in acc.iter_mut().zip(wp) {
                        let wb = _mm256_broadcast_ss(&*w.add(j));
                        for (ab, xb) in a.iter_mut().zip(&x) {
                            *ab = _mm256_fmadd_ps(*xb, wb, *ab);
                        }
                    }
                }
                j += 16;
            }
            for (r, a) in red.iter_mut().zip(&acc) {
                r[l] = *a;
            }
        }
        for (r, o) in red.iter().zip(op) {
            for b in 0..NB {
                let t8: [__m256; 8] = core::array::from_fn(|i| _mm256_add_ps(r[i][b], r[i + 8][b]));
                let t4: [__m256; 4] = core::array::from_fn(|i| _mm256_add_ps(t8[i], t8[i + 4]));
                let sum = _mm256_add_ps(_mm256_add_ps(t4[0], t4[2]), _mm256_add_ps(t4[1], t4[3]));
                _mm256_storeu_ps(o.add(d0 + 8 * b), sum);
            }
        }
        d0 += bw;
    }
    nb
}
