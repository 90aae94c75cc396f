//! Elementwise and normalisation ops of the forward pass (f32, scalar).
//!
//! Each follows the arithmetic of llama.cpp's CPU backend where that changes the
//! result beyond float noise: RMSNorm sums squares in f64; rope angles are built by
//! repeated multiplication; GELU goes through f16 like ggml's lookup table; softmax
//! sums in f64.
use crate::f16::{f16_to_f32, f32_to_f16};

/// `out = x / sqrt(mean(x^2) + eps) * w` (w may be empty for no gain).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let mut sum = 0.0f64;
    for v in x {
        sum += (*v as f64) * (*v as f64);
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / libm::sqrtf(mean + eps);
    if w.is_empty() {
        for (o, v) in out.iter_mut().zip(x) {
            *o = v * scale;
        }
    } else {
        for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

/// In-place RMSNorm with gain.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let mut sum = 0.0f64;
    for v in x.iter() {
        sum += (*v as f64) * (*v as f64);
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / libm::sqrtf(mean + eps);
    if w.is_empty() {
        for v in x.iter_mut() {
            *v *= scale;
        }
    } else {
        for (v, g) in x.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
}

/// Which dimensions rope rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// Adjacent pairs (2i, 2i+1): llama.
    Norm,
    /// Halves (i, i + n_rot/2): qwen, gemma (GPT-NeoX style).
    Neox,
}

/// Rotate one head vector `x` (len >= n_rot) for position `pos`. `freq_scale` is 1
/// unless linear rope scaling is configured.
pub fn rope(x: &mut [f32], pos: usize, n_rot: usize, base: f32, freq_scale: f32, kind: RopeKind) {
    let theta_scale = libm::powf(base, -2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for i in 0..n_rot / 2 {
        let t = theta * freq_scale;
        let (s, c) = (libm::sinf(t), libm::cosf(t));
        let (a, b) = match kind {
            RopeKind::Norm => (2 * i, 2 * i + 1),
            RopeKind::Neox => (i, i + n_rot / 2),
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
        theta *= theta_scale;
    }
}

/// In-place softmax over `x`; returns nothing, sums in f64 like ggml.
pub fn softmax(x: &mut [f32]) {
    let mut max = f32::NEG_INFINITY;
    for v in x.iter() {
        if *v > max {
            max = *v;
        }
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        let e = if *v == f32::NEG_INFINITY { 0.0 } else { libm::expf(*v - max) };
        *v = e;
        sum += e as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044715;

/// GELU with the tanh approximation, in f32.
#[inline]
pub fn gelu_exact(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::tanhf(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))
}

/// GELU as ggml's CPU backend computes it: the input rounded to f16 indexes a table of
/// f16 results; outside (-10, 10) it is 0 or x.
#[inline]
pub fn gelu_f16_table(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let h = f16_to_f32(f32_to_f16(x));
        f16_to_f32(f32_to_f16(gelu_exact(h)))
    }
}

/// SiLU: x * sigmoid(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + libm::expf(-x))
}

/// `gate[i] = silu(gate[i]) * up[i]`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// `gate[i] = gelu(gate[i]) * up[i]` with ggml's f16-table GELU.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = if *g >= 10.0 { *g * u } else { gelu_f16_table(*g) * u };
    }
}

/// `y += x`.
pub fn add_inplace(y: &mut [f32], x: &[f32]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += b;
    }
}

/// `y *= s`.
pub fn scale_inplace(y: &mut [f32], s: f32) {
    for a in y.iter_mut() {
        *a *= s;
    }
}

/// f32 dot product (reference; used by attention over f32 caches).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let n8 = a.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        for j in 0..8 {
            acc[j] += a[i + j] * b[i + j];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]);
    for i in n8..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_is_one() {
        let x = [2.0f32; 8];
        let mut o = [0.0; 8];
        rms_norm(&x, &[], 0.0, &mut o);
        assert!(o.iter().all(|v| (v - 1.0).abs() < 1e-6));
    }

    #[test]
    fn softmax_sums_to_one_and_handles_masked() {
        let mut x = [1.0, 2.0, f32::NEG_INFINITY, 3.0];
        softmax(&mut x);
        let s: f32 = x.iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(x[2], 0.0);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        rope(&mut x, 0, 4, 10000.0, 1.0, RopeKind::Neox);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        rope(&mut x, 7, 4, 10000.0, 1.0, RopeKind::Norm);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
    }

    #[test]
    fn gelu_table_close_to_exact() {
        for i in -100..100 {
            let x = i as f32 * 0.07;
            assert!((gelu_f16_table(x) - gelu_exact(x)).abs() < 4e-3 * (1.0 + x.abs()));
        }
    }
}
