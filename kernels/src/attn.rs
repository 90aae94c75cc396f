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
    if feat.avx2 {
        if let Some(v) = crate::arch::x86_attn::dot(k, q) {
            return v;
        }
    }
    #[cfg(target_arch = "aarch64")]
    if feat.neon {
        if let Some(v) = crate::arch::neon_attn::dot(k, q) {
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
    if feat.avx2 && crate::arch::x86_attn::fma_row(v, w, acc) {
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if feat.neon && crate::arch::neon_attn::fma_row(v, w, acc) {
        return;
    }
    let _ = feat;
    fma_row_scalar(v, w, acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    fn feats() -> [CpuFeatures; 2] {
        let mut f = CpuFeatures::SCALAR;
        #[cfg(target_arch = "x86_64")]
        {
            f.avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c");
        }
        #[cfg(target_arch = "aarch64")]
        {
            f.neon = true;
        }
        [CpuFeatures::SCALAR, f]
    }

    extern crate std;
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
}
