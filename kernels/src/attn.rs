//! Attention inner loops over the KV cache: score dot products and the weighted sum
//! of values, for f32 and f16 caches.
//!
//! The arithmetic is llama.cpp's (see [`crate::ops::dot_f32`]): 64 fused lanes for the
//! dot product, fused multiply-adds into per-lane value accumulators. Fused
//! multiply-add is exactly rounded, so the SIMD paths in `arch::{x86,neon}_attn` give
//! the same bits as the scalar ones here; `libm::fmaf` is a software routine on targets
//! compiled without FMA, which is why the vector paths matter for speed.
use crate::f16::f16_to_f32;
use crate::quant::float::hsum16;
use crate::CpuFeatures;

/// Keys or values of one position: f32 or f16 bits.
#[derive(Clone, Copy, Debug)]
pub enum KvRow<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
}

impl KvRow<'_> {
    pub fn len(&self) -> usize {
        match self {
            KvRow::F32(s) => s.len(),
            KvRow::F16(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    #[inline]
    fn get(&self, i: usize) -> f32 {
        match self {
            KvRow::F32(s) => s[i],
            KvRow::F16(s) => f16_to_f32(s[i]),
        }
    }
}

/// `q · k` with llama.cpp's 4 x 16-lane order (scalar reference).
pub fn dot_scalar(k: KvRow, q: &[f32]) -> f32 {
    let n = k.len().min(q.len());
    let np = n / 64 * 64;
    let mut acc = [[0.0f32; 16]; 4];
    for base in (0..np).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, v) in lanes.iter_mut().enumerate() {
                let i = base + 16 * j + l;
                *v = libm::fmaf(k.get(i), q[i], *v);
            }
        }
    }
    let lanes: [f32; 16] =
        core::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let mut s = hsum16(lanes);
    for (i, qi) in q.iter().enumerate().take(n).skip(np) {
        s = libm::fmaf(k.get(i), *qi, s);
    }
    s
}

/// `acc[d] = fma(v[d], w, acc[d])` (scalar reference).
pub fn fma_row_scalar(v: KvRow, w: f32, acc: &mut [f32]) {
    for (d, a) in acc.iter_mut().enumerate() {
        *a = libm::fmaf(v.get(d), w, *a);
    }
}

/// [`dot_scalar`] on the fastest path `feat` allows (same bits).
#[inline]
pub fn dot(feat: &CpuFeatures, k: KvRow, q: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = feat.avx2_token() {
        if let Some(v) = crate::arch::x86_attn::dot(t, k, q) {
            return v;
        }
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(t) = feat.neon_token() {
        if let Some(v) = crate::arch::neon_attn::dot(t, k, q) {
            return v;
        }
    }
    let _ = feat;
    dot_scalar(k, q)
}

/// [`fma_row_scalar`] on the fastest path `feat` allows (same bits).
#[inline]
pub fn fma_row(feat: &CpuFeatures, v: KvRow, w: f32, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if feat
        .avx2_token()
        .is_some_and(|t| crate::arch::x86_attn::fma_row(t, v, w, acc))
    {
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if feat
        .neon_token()
        .is_some_and(|t| crate::arch::neon_attn::fma_row(t, v, w, acc))
    {
        return;
    }
    let _ = feat;
    fma_row_scalar(v, w, acc)
}

/// Most queries one call of the multi-query kernels takes at once (more are split).
pub const MAX_QUERIES: usize = 4;

/// `n` rows of `len` values, row `j` starting at value `j * stride` of `data`: the key
/// or value rows of one KV head over a span of positions.
#[derive(Clone, Copy, Debug)]
pub struct KvRows<'a> {
    data: KvRow<'a>,
    stride: usize,
    len: usize,
    n: usize,
}

impl<'a> KvRows<'a> {
    /// `n` rows, or as many as `data` holds.
    pub fn new(data: KvRow<'a>, stride: usize, len: usize, n: usize) -> KvRows<'a> {
        let fit = rows_that_fit(data.len(), stride, len);
        KvRows {
            data,
            stride,
            len,
            n: n.min(fit),
        }
    }
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.n
    }
    /// Values per row.
    pub fn row_len(&self) -> usize {
        self.len
    }
    /// Values between the starts of consecutive rows.
    pub fn stride(&self) -> usize {
        self.stride
    }
    /// The underlying values (row `j` at `j * stride`).
    pub fn data(&self) -> KvRow<'a> {
        self.data
    }
    /// Row `j` (`j < rows()`).
    #[inline]
    pub fn row(&self, j: usize) -> KvRow<'a> {
        let s = j * self.stride;
        match self.data {
            KvRow::F32(d) => KvRow::F32(&d[s..s + self.len]),
            KvRow::F16(d) => KvRow::F16(&d[s..s + self.len]),
        }
    }
}

/// How many rows of `len` items, one every `stride` items, `total` items hold.
pub(crate) fn rows_that_fit(total: usize, stride: usize, len: usize) -> usize {
    match total.checked_sub(len) {
        None => 0,
        Some(rest) => match rest.checked_div(stride) {
            Some(r) => r.saturating_add(1),
            None => usize::MAX,
        },
    }
}

/// `outs[g][j] = dot_scalar(k.row(j), qs[g])` for every query `g` and row `j` (scalar
/// reference of [`dots`]).
pub fn dots_scalar(k: &KvRows, qs: &[&[f32]], outs: &mut [&mut [f32]]) {
    for (q, out) in qs.iter().zip(outs.iter_mut()) {
        for (j, o) in out.iter_mut().enumerate().take(k.rows()) {
            *o = dot_scalar(k.row(j), q);
        }
    }
}

/// [`dots_scalar`] on the fastest path `feat` allows (same bits): each key row is
/// loaded (and widened from f16) once for up to [`MAX_QUERIES`] queries.
pub fn dots(feat: &CpuFeatures, k: &KvRows, qs: &[&[f32]], outs: &mut [&mut [f32]]) {
    for (qc, oc) in qs.chunks(MAX_QUERIES).zip(outs.chunks_mut(MAX_QUERIES)) {
        #[cfg(target_arch = "x86_64")]
        if feat
            .avx2_token()
            .is_some_and(|t| crate::arch::x86_attn::dots(t, k, qc, oc))
        {
            continue;
        }
        #[cfg(target_arch = "aarch64")]
        if feat
            .neon_token()
            .is_some_and(|t| crate::arch::neon_attn::dots(t, k, qc, oc))
        {
            continue;
        }
        let _ = feat;
        dots_scalar(k, qc, oc);
    }
}

/// Attention-weighted sum of value rows for several queries (scalar reference of
/// [`weighted_sum`]): `outs[g][d]` is [`hsum16`] of 16 lanes, lane `l` summing
/// `fma(v.row(j)[d], ws[g][j], lane)` over the rows `j = l, l + 16, ...` in order,
/// starting from 0 and skipping zero weights (llama.cpp's tinyBLAS order for `V^T w`;
/// a skipped row is never read).
pub fn weighted_sum_scalar(v: &KvRows, ws: &[&[f32]], outs: &mut [&mut [f32]]) {
    weighted_sum_cols(v, ws, outs, 0);
}

/// [`weighted_sum_scalar`] for columns `from..` only.
pub(crate) fn weighted_sum_cols(v: &KvRows, ws: &[&[f32]], outs: &mut [&mut [f32]], from: usize) {
    const B: usize = 16;
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        let len = out.len().min(v.row_len());
        let n = v.rows().min(w.len());
        let mut d0 = from;
        while d0 < len {
            let nb = (len - d0).min(B);
            let mut lanes = [[0.0f32; B]; 16];
            for (j, wj) in w.iter().enumerate().take(n) {
                if *wj != 0.0 {
                    let row = v.row(j);
                    for (c, a) in lanes[j % 16][..nb].iter_mut().enumerate() {
                        *a = libm::fmaf(row.get(d0 + c), *wj, *a);
                    }
                }
            }
            for (c, o) in out[d0..d0 + nb].iter_mut().enumerate() {
                *o = hsum16(core::array::from_fn(|l| lanes[l][c]));
            }
            d0 += nb;
        }
    }
}

/// [`weighted_sum_scalar`] on the fastest path `feat` allows (same bits): each value
/// row is loaded (and widened) once for up to [`MAX_QUERIES`] queries, and the lane
/// sums stay in registers across rows.
pub fn weighted_sum(feat: &CpuFeatures, v: &KvRows, ws: &[&[f32]], outs: &mut [&mut [f32]]) {
    for (wc, oc) in ws.chunks(MAX_QUERIES).zip(outs.chunks_mut(MAX_QUERIES)) {
        #[cfg(target_arch = "x86_64")]
        if feat
            .avx2_token()
            .is_some_and(|t| crate::arch::x86_attn::weighted_sum(t, v, wc, oc))
        {
            continue;
        }
        #[cfg(target_arch = "aarch64")]
        if feat
            .neon_token()
            .is_some_and(|t| crate::arch::neon_attn::weighted_sum(t, v, wc, oc))
        {
            continue;
        }
        let _ = feat;
        weighted_sum_scalar(v, wc, oc);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// The scalar path and the best one this machine has.
    pub(crate) fn feats() -> [CpuFeatures; 2] {
        use crate::cpu::Feature;
        let f = CpuFeatures::detect().only(&[Feature::Neon, Feature::Avx2]);
        [CpuFeatures::SCALAR, f]
    }

    extern crate std;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn vectorized_softmax_equals_the_scalar_one_bit_for_bit() {
        let mut rng = Rng(0xfeed);
        for n in [1usize, 5, 16, 17, 40, 64, 100, 1000] {
            for spread in [0.5f32, 4.0, 30.0, 120.0] {
                let x: Vec<f32> = (0..n).map(|_| rng.f32() * spread).collect();
                for skip in [f32::NEG_INFINITY, -9.21034] {
                    let mut a = x.clone();
                    let mut b = x.clone();
                    crate::ops::softmax_skip(&mut a, skip);
                    for f in feats() {
                        b.copy_from_slice(&x);
                        crate::ops::softmax_skip_on(&f, &mut b, skip);
                        assert!(
                            a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                            "n={n} spread={spread} {f:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn simd_attention_loops_equal_the_scalar_reference_bit_for_bit() {
        let mut rng = Rng(0x1234_5678);
        for n in [1usize, 3, 17, 63, 64, 65, 128, 255, 256, 1023] {
            let q: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
            let kf: Vec<f32> = (0..n).map(|_| rng.f32() * 2.0).collect();
            let kh: Vec<u16> = kf.iter().map(|v| crate::f16::f32_to_f16(*v)).collect();
            for f in feats() {
                for row in [KvRow::F32(&kf), KvRow::F16(&kh)] {
                    assert_eq!(
                        dot(&f, row, &q).to_bits(),
                        dot_scalar(row, &q).to_bits(),
                        "dot n={n} {f:?}"
                    );
                    let mut a: Vec<f32> = q.clone();
                    let mut b: Vec<f32> = q.clone();
                    fma_row(&f, row, 0.37, &mut a);
                    fma_row_scalar(row, 0.37, &mut b);
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "fma_row n={n} {f:?}"
                    );
                }
            }
        }
    }

    /// Rows of `len` values at stride `len + pad`, as f32 and f16.
    fn planes(rng: &mut Rng, n: usize, len: usize, pad: usize) -> (Vec<f32>, Vec<u16>) {
        let f: Vec<f32> = (0..n * (len + pad)).map(|_| rng.f32() * 2.0).collect();
        let h = f.iter().map(|v| crate::f16::f32_to_f16(*v)).collect();
        (f, h)
    }

    fn same(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    #[test]
    fn multi_query_dots_equal_single_dots_bit_for_bit() {
        let mut rng = Rng(0x0dd5_eed5);
        for len in [1usize, 17, 64, 100, 256] {
            for n in [0usize, 1, 7, 33] {
                for g in 1..=6 {
                    let (kf, kh) = planes(&mut rng, n, len, 3);
                    let q: Vec<f32> = (0..g * len).map(|_| rng.f32() * 3.0).collect();
                    let qs: Vec<&[f32]> = q.chunks(len).collect();
                    for data in [KvRow::F32(&kf), KvRow::F16(&kh)] {
                        let k = KvRows::new(data, len + 3, len, n);
                        let want: Vec<f32> = (0..g)
                            .flat_map(|gi| (0..n).map(move |j| (gi, j)))
                            .map(|(gi, j)| dot_scalar(k.row(j), qs[gi]))
                            .collect();
                        for f in feats() {
                            let mut got = vec![f32::NAN; g * n];
                            let mut outs: Vec<&mut [f32]> = got.chunks_mut(n.max(1)).collect();
                            outs.truncate(g);
                            dots(&f, &k, &qs, &mut outs);
                            assert!(same(&got[..g * n], &want), "len={len} n={n} g={g} {f:?}");
                        }
                    }
                }
            }
        }
    }

    /// The per-query loop `weighted_sum` replaces: one 16-lane buffer per query.
    fn weighted_sum_one_by_one(f: &CpuFeatures, v: &KvRows, w: &[f32]) -> Vec<f32> {
        let len = v.row_len();
        let mut lanes = vec![0.0f32; 16 * len];
        for (j, wj) in w.iter().enumerate() {
            if *wj != 0.0 {
                let l = (j % 16) * len;
                fma_row(f, v.row(j), *wj, &mut lanes[l..l + len]);
            }
        }
        (0..len)
            .map(|d| hsum16(core::array::from_fn(|l| lanes[l * len + d])))
            .collect()
    }

    #[test]
    fn multi_query_weighted_sums_equal_the_per_query_loop_bit_for_bit() {
        let mut rng = Rng(0xbeef_cafe);
        for len in [1usize, 8, 17, 64, 100, 256] {
            for n in [0usize, 1, 15, 16, 17, 50, 300] {
                for g in 1..=6 {
                    let (vf, vh) = planes(&mut rng, n, len, 5);
                    // Weights: zero for every query on some rows, for some queries on
                    // others, or nowhere.
                    let w: Vec<f32> = (0..g * n)
                        .map(|i| {
                            let r = rng.f32();
                            let row_zero = (i % n.max(1)) % 5 == 3;
                            if row_zero || r < -0.4 {
                                0.0
                            } else {
                                r.abs()
                            }
                        })
                        .collect();
                    let ws: Vec<&[f32]> = (0..g).map(|q| &w[q * n..(q + 1) * n]).collect();
                    for data in [KvRow::F32(&vf), KvRow::F16(&vh)] {
                        let v = KvRows::new(data, len + 5, len, n);
                        let want: Vec<f32> = ws
                            .iter()
                            .flat_map(|wq| {
                                weighted_sum_one_by_one(&CpuFeatures::SCALAR, &v, &wq[..n])
                            })
                            .collect();
                        for f in feats() {
                            let mut got = vec![f32::NAN; g * len];
                            let mut outs: Vec<&mut [f32]> = got.chunks_mut(len).collect();
                            weighted_sum(&f, &v, &ws, &mut outs);
                            assert!(same(&got, &want), "len={len} n={n} g={g} {f:?}");
                            let mut ref_out = vec![f32::NAN; g * len];
                            let mut outs: Vec<&mut [f32]> = ref_out.chunks_mut(len).collect();
                            weighted_sum_scalar(&v, &ws, &mut outs);
                            assert!(same(&ref_out, &want), "scalar len={len} n={n} g={g}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn non_finite_values_under_a_zero_weight_are_still_skipped() {
        let (len, n) = (64usize, 40usize);
        let mut rng = Rng(7);
        let (mut vf, _) = planes(&mut rng, n, len, 0);
        vf[9 * len + 5] = f32::INFINITY;
        vf[21 * len + 60] = f32::NAN;
        let mut w: Vec<f32> = (0..4 * n).map(|_| rng.f32().abs() + 0.01).collect();
        // Rows 9 and 21 weigh nothing for queries 0 and 2 but count for 1 and 3.
        for q in [0, 2] {
            w[q * n + 9] = 0.0;
            w[q * n + 21] = 0.0;
        }
        let ws: Vec<&[f32]> = w.chunks(n).collect();
        let vh: Vec<u16> = vf.iter().map(|x| crate::f16::f32_to_f16(*x)).collect();
        for data in [KvRow::F32(&vf), KvRow::F16(&vh)] {
            let v = KvRows::new(data, len, len, n);
            for f in feats() {
                let mut got = vec![0.0f32; 4 * len];
                let mut outs: Vec<&mut [f32]> = got.chunks_mut(len).collect();
                weighted_sum(&f, &v, &ws, &mut outs);
                for (q, o) in got.chunks(len).enumerate() {
                    let want = weighted_sum_one_by_one(&CpuFeatures::SCALAR, &v, ws[q]);
                    assert!(same(o, &want), "query {q} {f:?}");
                    assert_eq!(o.iter().all(|x| x.is_finite()), q % 2 == 0);
                }
            }
        }
    }

    #[test]
    fn every_finite_f16_key_and_value_gives_the_scalar_bits() {
        // All finite half-precision patterns (subnormals included), 64 per row.
        let h: Vec<u16> = (0..=u16::MAX).filter(|b| b & 0x7c00 != 0x7c00).collect();
        let n = h.len() / 64;
        let rows = KvRows::new(KvRow::F16(&h), 64, 64, n);
        let mut rng = Rng(99);
        let q: Vec<f32> = (0..4 * 64).map(|_| rng.f32()).collect();
        let qs: Vec<&[f32]> = q.chunks(64).collect();
        let w: Vec<f32> = (0..4 * n).map(|_| rng.f32().abs() * 1e-3).collect();
        let ws: Vec<&[f32]> = w.chunks(n).collect();
        for f in feats() {
            let mut a = vec![0.0f32; 4 * n];
            let mut b = vec![0.0f32; 4 * n];
            dots(&f, &rows, &qs, &mut a.chunks_mut(n).collect::<Vec<_>>());
            dots_scalar(&rows, &qs, &mut b.chunks_mut(n).collect::<Vec<_>>());
            assert!(same(&a, &b), "dots {f:?}");
            let mut a = vec![0.0f32; 4 * 64];
            let mut b = vec![0.0f32; 4 * 64];
            weighted_sum(&f, &rows, &ws, &mut a.chunks_mut(64).collect::<Vec<_>>());
            weighted_sum_scalar(&rows, &ws, &mut b.chunks_mut(64).collect::<Vec<_>>());
            assert!(same(&a, &b), "weighted_sum {f:?}");
        }
    }

    #[test]
    fn kv_rows_keep_only_the_rows_the_data_holds() {
        let d = [0.0f32; 10];
        let rows = |stride, len, n| KvRows::new(KvRow::F32(&d), stride, len, n).rows();
        assert_eq!(rows(4, 2, 3), 3);
        assert_eq!(rows(4, 3, 3), 2);
        assert_eq!(rows(4, 2, 9), 3);
        assert_eq!(rows(usize::MAX, 3, 3), 1);
        assert_eq!(rows(4, 11, 3), 0);
        assert_eq!(rows(0, 10, 5), 5);
    }
}
