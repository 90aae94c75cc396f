//! Elementwise and normalisation ops of the forward pass (f32, scalar).
//!
//! Each follows the arithmetic of llama.cpp's CPU backend as built on the x86 (AVX-512)
//! host of our goldens, bit for bit where we can: once activations are re-quantized
//! (int8, or f16 for F16 weights) a one-ulp difference upstream can flip a rounding and
//! grow to the size of the quantization noise. So: RMSNorm squares in f32 and sums in
//! f64; rope angles are built by repeated multiplication and the rotation is fused as
//! GCC contracts it; exp is ggml's vector `ggml_v_expf` (not libm's); the attention
//! dot product and softmax use ggml's AVX-512 lanes and reduction trees; GELU goes
//! through f16 like ggml's lookup table. The same arithmetic runs on every ISA.
use crate::cpu::CpuFeatures;
use crate::f16::{f16_to_f32, f32_to_f16};

/// `out = x / sqrt(mean(x^2) + eps) * w` (w may be empty for no gain).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let mut sum = 0.0f64;
    for v in x {
        // ggml: `sum += (ggml_float)(x * x)`: the square is rounded to f32 first.
        sum += (*v * *v) as f64;
    }
    norm_row(x, w, rms_scale(sum, x.len(), eps), out);
}

/// In-place RMSNorm with gain.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let mut sum = 0.0f64;
    for v in x.iter() {
        sum += (*v * *v) as f64;
    }
    norm_row_inplace(x, w, rms_scale(sum, x.len(), eps));
}

/// [`rms_norm`] of every `row_len`-long row of `x` into `out`, bit for bit. Rows are
/// taken four at a time so that their f64 sums (each one sequential chain, as ggml's)
/// run side by side instead of waiting on one another's additions.
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], row_len: usize) {
    let n = row_len.max(1);
    let mut outs = out.chunks_exact_mut(n);
    for g in x.chunks_exact(4 * n) {
        let rows: [&[f32]; 4] = core::array::from_fn(|r| &g[r * n..(r + 1) * n]);
        let sums = sum_squares4(rows);
        for (row, sum) in rows.into_iter().zip(sums) {
            let Some(o) = outs.next() else {
                return;
            };
            norm_row(row, w, rms_scale(sum, n, eps), o);
        }
    }
    for (row, o) in x.chunks_exact(4 * n).remainder().chunks_exact(n).zip(outs) {
        rms_norm(row, w, eps, o);
    }
}

/// [`rms_norm_inplace`] of every `row_len`-long row of `x`, four rows side by side as
/// in [`rms_norm_rows`]; bit for bit.
pub fn rms_norm_rows_inplace(x: &mut [f32], w: &[f32], eps: f32, row_len: usize) {
    let n = row_len.max(1);
    let mut groups = x.chunks_exact_mut(4 * n);
    for g in &mut groups {
        let (a, rest) = g.split_at_mut(n);
        let (b, rest) = rest.split_at_mut(n);
        let (c, d) = rest.split_at_mut(n);
        let sums = sum_squares4([a, b, c, d]);
        for (r, row) in [a, b, c, d].into_iter().enumerate() {
            norm_row_inplace(row, w, rms_scale(sums[r], n, eps));
        }
    }
    for row in groups.into_remainder().chunks_exact_mut(n) {
        rms_norm_inplace(row, w, eps);
    }
}

/// Four rows' `sum((x * x) as f64)`, each in row order.
#[inline]
fn sum_squares4(rows: [&[f32]; 4]) -> [f64; 4] {
    let mut s = [0.0f64; 4];
    for (((a, b), c), d) in rows[0].iter().zip(rows[1]).zip(rows[2]).zip(rows[3]) {
        s[0] += (a * a) as f64;
        s[1] += (b * b) as f64;
        s[2] += (c * c) as f64;
        s[3] += (d * d) as f64;
    }
    s
}

#[inline]
fn rms_scale(sum: f64, n: usize, eps: f32) -> f32 {
    let mean = (sum / n as f64) as f32;
    1.0 / libm::sqrtf(mean + eps)
}

#[inline]
fn norm_row(x: &[f32], w: &[f32], scale: f32, out: &mut [f32]) {
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

#[inline]
fn norm_row_inplace(x: &mut [f32], w: &[f32], scale: f32) {
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
    let mut angles = [0.0f32; 512];
    let angles = &mut angles[..n_rot.min(512)];
    rope_angles(pos, n_rot, base, freq_scale, angles);
    rope_apply(x, angles, kind);
}

/// The (sin, cos) pairs [`rope`] rotates by at position `pos`, interleaved into `out`
/// (length `n_rot`): every head of a token at one rope base shares them, so they are
/// computed once per token rather than once per head.
pub fn rope_angles(pos: usize, n_rot: usize, base: f32, freq_scale: f32, out: &mut [f32]) {
    let theta_scale = libm::powf(base, -2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for sc in out.chunks_exact_mut(2).take(n_rot / 2) {
        let t = theta * freq_scale;
        sc[0] = libm::sinf(t);
        sc[1] = libm::cosf(t);
        theta *= theta_scale;
    }
}

/// [`rope_apply`] on the fastest path `feat` allows (same bits). On x86 the scalar
/// reference's `libm::fmaf` is a call through a pointer chosen at run time, about 3 ns
/// each: 9 % of a Gemma 3 270M prompt at `-t 2` before.
#[inline]
pub fn rope_apply_with(feat: &CpuFeatures, x: &mut [f32], angles: &[f32], kind: RopeKind) {
    #[cfg(target_arch = "x86_64")]
    if feat
        .avx2_token()
        .is_some_and(|t| crate::arch::x86_attn::rope_apply(t, x, angles, kind))
    {
        return;
    }
    let _ = feat;
    rope_apply(x, angles, kind)
}

/// Rotate `x` by the pairs [`rope_angles`] computed (`angles.len()` = n_rot).
pub fn rope_apply(x: &mut [f32], angles: &[f32], kind: RopeKind) {
    let n_rot = angles.len();
    for (i, sc) in angles.chunks_exact(2).enumerate() {
        let (s, c) = (sc[0], sc[1]);
        let (a, b) = match kind {
            RopeKind::Norm => (2 * i, 2 * i + 1),
            RopeKind::Neox => (i, i + n_rot / 2),
        };
        let (x0, x1) = (x[a], x[b]);
        // ggml's `x0*cos - x1*sin` / `x0*sin + x1*cos`, contracted by GCC
        // (-ffp-contract=fast) into one fused multiply-add each.
        x[a] = libm::fmaf(x0, c, -(x1 * s));
        x[b] = libm::fmaf(x0, s, x1 * c);
    }
}

/// `e^x` as ggml's AVX-512 `ggml_v_expf` computes it (the path of `ggml_vec_soft_max_f32`
/// and `ggml_v_silu` on the golden host): `x = n ln2 + b` with `n` rounded by the
/// 1.5 * 2^23 trick, a degree-5 polynomial in `b` in fused steps, then `j * 2^n`
/// (`vscalefps`). Within 1.5 ulp of `expf` but not equal to it, hence emulated.
#[inline]
pub fn expf_ggml(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = libm::fmaf(x, c(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = libm::fmaf(
        -n,
        c(0x35bf_be8e),
        libm::fmaf(-n, c(0x3f31_7200), x), // ln2 in two parts
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = libm::fmaf(
        libm::fmaf(
            libm::fmaf(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            libm::fmaf(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        libm::fmaf(c(0x3f7f_fff6), b, 1.0),
    );
    libm::ldexpf(j, n as i32)
}

/// In-place softmax over `x` as ggml's `ggml_vec_soft_max_f32` on AVX-512: `e = exp(x -
/// max)` by [`expf_ggml`], summed per group of 16 in f32 (`_mm512_reduce_add_ps` tree)
/// and across groups in f64, then scaled by `(1 / sum) as f32`. Masked entries
/// (`-inf`) become 0.
pub fn softmax(x: &mut [f32]) {
    softmax_skip(x, f32::NEG_INFINITY)
}

/// [`softmax`] where entries below `max + log_ratio` get weight exactly 0 without
/// computing their exp (attention skips them; `log_ratio = -inf` skips nothing).
pub fn softmax_skip(x: &mut [f32], log_ratio: f32) {
    softmax_skip_on(&crate::CpuFeatures::SCALAR, x, log_ratio)
}

/// [`softmax_skip`] with the exponentials vectorized where `feat` allows (same bits).
pub fn softmax_skip_on(feat: &crate::CpuFeatures, x: &mut [f32], log_ratio: f32) {
    let mut max = f32::NEG_INFINITY;
    for v in x.iter() {
        if *v > max {
            max = *v;
        }
    }
    let floor = max + log_ratio;
    let mut sum = 0.0f64;
    for chunk in x.chunks_mut(16) {
        let mut e = [0.0f32; 16];
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = feat.avx2_token() {
            // Entries below the floor are exponentiated at the floor (in range) and
            // lanes past the end at the max, then both get 0 as in the scalar loop.
            let xs: [f32; 16] = core::array::from_fn(|i| match chunk.get(i) {
                Some(v) if *v < floor => floor,
                Some(v) => *v,
                None => max,
            });
            if crate::arch::x86_attn::exp16_minus(t, &xs, max, &mut e) {
                for (i, ei) in e.iter_mut().enumerate() {
                    if chunk.get(i).is_none_or(|v| *v < floor) {
                        *ei = 0.0;
                    }
                }
                chunk.copy_from_slice(&e[..chunk.len()]);
                sum += crate::quant::float::hsum16(e) as f64;
                continue;
            }
        }
        let _ = feat;
        for (ei, v) in e.iter_mut().zip(chunk.iter_mut()) {
            *ei = if *v < floor { 0.0 } else { expf_ggml(*v - max) };
            *v = *ei;
        }
        sum += crate::quant::float::hsum16(e) as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `(max, ln sum_i e^(x_i - max))` over `x`: the normalizer of a log-softmax, so
/// `-log p(t) = lse - (x_t - max)`. Each exponential as [`expf_ggml`] (within 1.5 ulp of
/// `expf`), eight or sixteen at a time where `feat` allows (same bits), summed per group
/// of 16 in f32 and across groups in f64, as [`softmax`] does. Perplexity runs it on
/// every scored position over the whole vocabulary.
pub fn log_sum_exp_on(feat: &crate::CpuFeatures, x: &[f32]) -> (f32, f64) {
    let max = x
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let mut sum = 0.0f64;
    for chunk in x.chunks(16) {
        let mut e = [0.0f32; 16];
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = feat.avx2_token() {
            if crate::arch::x86_attn::exp16_minus(t, chunk, max, &mut e) {
                sum += crate::quant::float::hsum16(e) as f64;
                continue;
            }
        }
        let _ = feat;
        for (ei, v) in e.iter_mut().zip(chunk) {
            *ei = expf_ggml(*v - max);
        }
        sum += crate::quant::float::hsum16(e) as f64;
    }
    (max, libm::log(sum))
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

/// Entries of the table [`gelu_table_fill`] makes: one per half-precision bit pattern.
pub const GELU_TABLE_LEN: usize = 1 << 16;

/// Fill `table[h] = f16(gelu(f16_to_f32(h)))` (kept as f32, so a SIMD gather reads it
/// directly) for every half-precision bit pattern: ggml's `ggml_table_gelu_f16`, so
/// [`geglu_with_table`] costs a load per element.
pub fn gelu_table_fill(table: &mut [f32]) {
    for (h, t) in table.iter_mut().enumerate().take(GELU_TABLE_LEN) {
        *t = f16_to_f32(f32_to_f16(gelu_exact(f16_to_f32(h as u16))));
    }
}

/// [`geglu`] through a table made by [`gelu_table_fill`] ([`GELU_TABLE_LEN`] entries);
/// same bits. AVX2 converts and gathers eight at a time.
pub fn geglu_with_table(feat: &crate::CpuFeatures, gate: &mut [f32], up: &[f32], table: &[f32]) {
    if table.len() < GELU_TABLE_LEN {
        return geglu(gate, up);
    }
    #[cfg(target_arch = "x86_64")]
    let done = crate::arch::x86_act::geglu_table(feat, gate, up, table);
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = feat;
        0
    };
    for (g, u) in gate[done..].iter_mut().zip(&up[done..]) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[f32_to_f16(x) as usize] * u
        };
    }
}

/// SiLU: `x / (1 + e^-x)` with ggml's vector exp (`ggml_v_silu`).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf_ggml(0.0 - x))
}

/// `gate[i] = silu(gate[i]) * up[i]`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    swiglu_on(&crate::CpuFeatures::SCALAR, gate, up)
}

/// What a SiLU pass does with each value `x` and its partner `y` (when there is one).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SiluMode {
    /// `x = silu(x)`.
    Alone,
    /// `x = silu(x) * y` (SwiGLU: `x` the gate, `y` the up projection).
    TimesOther,
    /// `x = x * silu(y)` (`y` the gate).
    GatedBy,
}

impl SiluMode {
    /// The scalar reference of one value.
    #[inline]
    fn apply(self, x: f32, y: f32) -> f32 {
        match self {
            SiluMode::Alone => silu(x),
            SiluMode::TimesOther => silu(x) * y,
            SiluMode::GatedBy => x * silu(y),
        }
    }
}

/// `x` through [`SiluMode`] `mode` with partner values `other` (ignored when alone; the
/// pass stops at the shorter slice otherwise), eight lanes at a time where `feat`
/// allows (same bits as the scalar loop).
pub fn silu_on(feat: &crate::CpuFeatures, mode: SiluMode, x: &mut [f32], other: &[f32]) {
    let len = if mode == SiluMode::Alone {
        x.len()
    } else {
        x.len().min(other.len())
    };
    let x = &mut x[..len];
    #[cfg(target_arch = "x86_64")]
    let done = crate::arch::x86_act::silu_blocks(feat, mode, x, other, &|a, b| mode.apply(a, b));
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = feat;
        0
    };
    for (i, v) in x.iter_mut().enumerate().skip(done) {
        let y = if mode == SiluMode::Alone {
            0.0
        } else {
            other[i]
        };
        *v = mode.apply(*v, y);
    }
}

/// [`swiglu`] on the best path `feat` allows (same bits).
pub fn swiglu_on(feat: &crate::CpuFeatures, gate: &mut [f32], up: &[f32]) {
    silu_on(feat, SiluMode::TimesOther, gate, up)
}

/// `gate[i] = gelu(gate[i]) * up[i]` with ggml's f16-table GELU.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = if *g >= 10.0 {
            *g * u
        } else {
            gelu_f16_table(*g) * u
        };
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

/// f32 dot product as ggml's AVX-512 `ggml_vec_dot_f32` (attention scores over an f32
/// cache): four accumulators of 16 lanes over steps of 64 with fused multiply-adds,
/// folded `0 += 2, 1 += 3, 0 += 1`, reduced by the `_mm512_reduce_add_ps` tree; the
/// last `n % 64` products are added one by one (fused, as GCC contracts them).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let np = n / 64 * 64;
    let mut acc = [[0.0f32; 16]; 4];
    for (ca, cb) in a[..np].chunks_exact(64).zip(b[..np].chunks_exact(64)) {
        for (k, lanes) in acc.iter_mut().enumerate() {
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = libm::fmaf(ca[16 * k + l], cb[16 * k + l], *v);
            }
        }
    }
    let mut lanes = [0.0f32; 16];
    for (l, v) in lanes.iter_mut().enumerate() {
        *v = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut s = crate::quant::float::hsum16(lanes);
    for i in np..n {
        s = libm::fmaf(a[i], b[i], s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rope path gives the scalar reference's bits: both pair layouts, rotary
    /// widths with and without a tail past the last 8 pairs, head vectors longer than the
    /// rotary width (their rest untouched), positions far from 0.
    #[test]
    fn rope_on_every_path_gives_the_scalar_bits() {
        extern crate std;
        use std::vec::Vec;
        let mut rng = crate::testutil::Rng(0x0be5);
        for n_rot in [2usize, 6, 16, 18, 32, 64, 80, 128, 256] {
            for extra in [0usize, 8] {
                for kind in [RopeKind::Neox, RopeKind::Norm] {
                    for pos in [0usize, 7, 4093, 131_000] {
                        let mut angles = [0.0f32; 256];
                        rope_angles(pos, n_rot, 10_000.0, 1.0, &mut angles[..n_rot]);
                        let x: Vec<f32> = (0..n_rot + extra).map(|_| rng.f32() * 8.0).collect();
                        let mut want = x.clone();
                        rope_apply(&mut want, &angles[..n_rot], kind);
                        for f in CpuFeatures::detect().levels() {
                            let mut got = x.clone();
                            rope_apply_with(&f, &mut got, &angles[..n_rot], kind);
                            let same = got
                                .iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{} n_rot {n_rot} {kind:?} pos {pos}", f.describe());
                            assert_eq!(got[n_rot..], x[n_rot..]);
                        }
                    }
                }
            }
        }
    }

    /// Every SiLU mode on the detected CPU gives the scalar loop's bits: random values,
    /// values whose exponential leaves the normal range (a block of them goes to the
    /// scalar path), zeros of both signs, odd lengths (a scalar tail).
    #[test]
    fn simd_silu_gives_the_scalar_bits() {
        extern crate std;
        use std::vec::Vec;
        let feat = crate::CpuFeatures::detect();
        let mut rng = crate::testutil::Rng(9);
        for n in [1usize, 7, 8, 17, 64, 255, 1023] {
            let mut x = std::vec![0f32; n];
            rng.fill_f32(&mut x, 12.0);
            let mut y = std::vec![0f32; n];
            rng.fill_f32(&mut y, 12.0);
            for (i, v) in [0.0f32, -0.0, -95.0, 100.0, -200.0, 1e-30]
                .iter()
                .enumerate()
            {
                if i * 5 < n {
                    x[i * 5] = *v;
                    y[(i * 3) % n] = *v;
                }
            }
            for mode in [SiluMode::Alone, SiluMode::TimesOther, SiluMode::GatedBy] {
                let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| mode.apply(*a, *b)).collect();
                let mut got = x.clone();
                silu_on(&feat, mode, &mut got, &y);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{mode:?} n {n} at {i}: {a} vs {b}"
                    );
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if feat.avx2() {
            // Guard: the vector path runs (it reports the values it took).
            let mut x = [0.5f32; 16];
            let done =
                crate::arch::x86_act::silu_blocks(&feat, SiluMode::Alone, &mut x, &[], &|a, _| a);
            assert_eq!(done, 16);
        }
    }

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
    fn table_geglu_equals_computed_geglu() {
        extern crate std;
        let mut table = std::vec![0f32; GELU_TABLE_LEN];
        gelu_table_fill(&mut table);
        let x: std::vec::Vec<f32> = (-1200..1200).map(|i| i as f32 * 0.01).collect();
        let up: std::vec::Vec<f32> = x.iter().map(|v| 1.0 - v * 0.3).collect();
        let (mut a, mut b) = (x.clone(), x.clone());
        geglu(&mut a, &up);
        geglu_with_table(&crate::CpuFeatures::SCALAR, &mut b, &up, &table);
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
    }

    #[test]
    fn norm_rows_equal_row_by_row_bits() {
        extern crate std;
        use std::vec::Vec;
        let mut rng = crate::testutil::Rng(11);
        for rows in [1usize, 3, 4, 5, 9] {
            for n in [1usize, 7, 64] {
                let mut x = std::vec![0f32; rows * n];
                rng.fill_f32(&mut x, 4.0);
                // Magnitudes far apart inside a row, where the f64 sum rounds.
                x[0] *= 1e12;
                let mut w = std::vec![0f32; n];
                rng.fill_f32(&mut w, 1.0);
                for w in [&w[..], &[][..]] {
                    let want: Vec<f32> = x
                        .chunks(n)
                        .flat_map(|r| {
                            let mut o = std::vec![0f32; n];
                            rms_norm(r, w, 1e-6, &mut o);
                            o
                        })
                        .collect();
                    let mut got = std::vec![f32::NAN; rows * n];
                    rms_norm_rows(&x, w, 1e-6, &mut got, n);
                    let mut inplace = x.clone();
                    rms_norm_rows_inplace(&mut inplace, w, 1e-6, n);
                    for ((a, b), c) in want.iter().zip(&got).zip(&inplace) {
                        assert_eq!(a.to_bits(), b.to_bits(), "rows {rows} n {n}");
                        assert_eq!(a.to_bits(), c.to_bits(), "rows {rows} n {n}");
                    }
                }
            }
        }
    }

    #[test]
    fn gelu_table_close_to_exact() {
        for i in -100..100 {
            let x = i as f32 * 0.07;
            assert!((gelu_f16_table(x) - gelu_exact(x)).abs() < 4e-3 * (1.0 + x.abs()));
        }
    }
}
