//! The arithmetic of recurrent token mixers: causal short convolutions (LFM2's
//! `shortconv`, the conv1d in front of Qwen3.5's Gated DeltaNet) and the gated delta
//! rule, each over a fixed-size state carried from one call to the next.
//!
//! As llama.cpp 0c1e570 computes them on the CPU (`ggml_compute_forward_ssm_conv_f32`,
//! `ggml_compute_forward_gated_delta_net_f32`, `build_gdn_l2_norm`, `op_softplus`):
//!
//! - **causal conv**: `out[t][c] = sum_i in[t - (k-1) + i][c] * w[i][c]` for taps
//!   `i = 0..k`, where inputs before the first token of the call come from the carried
//!   tail (the last `k - 1` inputs of earlier calls, zeros at the start). The sum runs in
//!   tap order in f32 as ggml's loop does (GCC fuses its multiply-adds on the golden
//!   host; a software `fmaf` costs ~18 ns on a CPU without FMA, so here they are plain:
//!   a difference of an ulp per output).
//! - **L2 norm** (`x / sqrt(sum(x²) + eps)`): ggml computes it as an RMSNorm with
//!   `eps / n` followed by a scale of `1 / sqrt(n)`, so this does the same two steps.
//! - **gated delta rule**, one token, per value head `h` (key head `h % n_k_heads`),
//!   with the state `S` (`d × d`, key index `i`, value index `j`) stored transposed
//!   (`state[j * d + i] = S[i][j]`, ggml's layout: row `j` is column `j` of `S`):
//!
//!   ```text
//!   S      *= exp(g[h])
//!   δ[j]    = (v[j] - Σ_i S[i][j] k[i]) · β[h]
//!   S[i][j] += k[i] · δ[j]
//!   o[j]    = (Σ_i S[i][j] q[i]) / sqrt(d)
//!   ```
//!
//!   Every row `j` of the stored state depends only on itself, so the step does all four
//!   lines for one row before the next: one pass over the state per token, updated in
//!   place (llama.cpp makes four passes), two passes over the row (see
//!   [`delta_head_step`]; the decay multiplies the key's dot instead of the row first,
//!   an ulp's difference per value).
//!   A prompt is the same step token after token (llama.cpp's CPU op does the same; its
//!   chunked graph form differs from it by ~3e-5 on the tiny fixture's logits).
//!
//! Dot products here use 8 independent f32 lanes (`dot_lanes`), which the compiler
//! vectorises on every target; ggml's AVX-512 `ggml_vec_dot_f32` uses 64 lanes with
//! fused multiply-adds, a difference of a few ulp per dot, far inside the goldens'
//! tolerance for recurrent models.
use crate::matvec::KernelError;
use crate::CpuFeatures;

/// Shapes of one Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaDims {
    /// Key (and query) heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`), a multiple of `n_k_heads`.
    pub n_v_heads: usize,
    /// Head dimension of keys and values alike (`ssm.state_size`).
    pub head_dim: usize,
}

impl DeltaDims {
    /// Width of the query (and key) part of a token's `qkv` row.
    pub fn qk_dim(&self) -> usize {
        self.n_k_heads * self.head_dim
    }
    /// Width of the value part (and of the output) of a token.
    pub fn v_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }
    /// Channels of the conv in front of the rule: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        2 * self.qk_dim() + self.v_dim()
    }
    /// Floats of the recurrent state: one `d × d` matrix per value head.
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.head_dim * self.head_dim
    }
}

/// Most taps [`conv_causal_inplace`] takes (llama.cpp's models use 3 and 4).
pub const MAX_CONV_TAPS: usize = 16;

/// Channels [`conv_causal_inplace`] takes together (its inner loops run over them).
const CONV_BLOCK: usize = 64;

/// The taps of a depthwise conv as GGUF stores them (per channel its `k` taps, oldest
/// first: `w[c * k + i]`) → tap-major (`out[i * ch + c]`), the layout
/// [`conv_causal_inplace`] reads.
pub fn taps_tap_major(w: &[f32], ch: usize, k: usize, out: &mut [f32]) {
    for (c, wc) in w.chunks_exact(k.max(1)).take(ch).enumerate() {
        for (i, v) in wc.iter().enumerate() {
            if let Some(o) = out.get_mut(i * ch + c) {
                *o = *v;
            }
        }
    }
}

/// Causal depthwise convolution of `n` tokens of `ch` channels, in place.
///
/// `x` holds the inputs token-major (`x[t * ch + c]`) and receives the outputs. `w`
/// holds the taps tap-major (`w[i * ch + c]`, tap 0 the oldest; see
/// [`taps_tap_major`]). `tail` is the carried state: the previous `k - 1` inputs,
/// token-major (`tail[j * ch + c]`, oldest first); it holds the last `k - 1` inputs
/// when the call returns. The loops run over blocks of channels, so every step is a
/// pass over contiguous rows (vectorised), the sum of each output in tap order.
///
/// # Errors
/// `k` is 0 or above [`MAX_CONV_TAPS`], or a slice is shorter than the shapes say
/// (`x`: `n * ch`, `w`: `k * ch`, `tail`: `(k - 1) * ch`): [`KernelError::BadLength`],
/// and nothing is computed.
pub fn conv_causal_inplace(
    x: &mut [f32],
    n: usize,
    ch: usize,
    w: &[f32],
    k: usize,
    tail: &mut [f32],
) -> Result<(), KernelError> {
    let bad = |what, expected, found| {
        Err(KernelError::BadLength {
            what,
            expected,
            found,
        })
    };
    if k == 0 || k > MAX_CONV_TAPS {
        return bad("conv taps (1..=16)", MAX_CONV_TAPS, k);
    }
    let m = k - 1;
    if x.len() < n * ch {
        return bad("conv input", n * ch, x.len());
    }
    if w.len() < ch * k {
        return bad("conv taps", ch * k, w.len());
    }
    if tail.len() < ch * m {
        return bad("conv state", ch * m, tail.len());
    }
    let mut sum = [0.0f32; CONV_BLOCK];
    for t in 0..n {
        let row = &mut x[t * ch..(t + 1) * ch];
        let mut c0 = 0;
        while c0 < ch {
            let b = CONV_BLOCK.min(ch - c0);
            let cs = c0..c0 + b;
            let s = &mut sum[..b];
            s.fill(0.0);
            for i in 0..m {
                let (ti, wi) = (&tail[i * ch..][cs.clone()], &w[i * ch..][cs.clone()]);
                for ((s, a), b) in s.iter_mut().zip(ti).zip(wi) {
                    *s += a * b;
                }
            }
            let input = &mut row[cs.clone()];
            for ((s, a), b) in s.iter_mut().zip(input.iter()).zip(&w[m * ch..][cs.clone()]) {
                *s += a * b;
            }
            // Slide the window: drop the oldest input, append this token's.
            for i in 0..m {
                let (older, newer) = tail.split_at_mut((i + 1) * ch);
                let src = if i + 1 < m {
                    &newer[cs.clone()]
                } else {
                    &*input
                };
                older[i * ch..][cs.clone()].copy_from_slice(src);
            }
            input.copy_from_slice(s);
            c0 += b;
        }
    }
    Ok(())
}

/// `x / sqrt(sum(x²) + eps)` in place, as ggml's `rms_norm(x, eps / n) / sqrt(n)`:
/// squares rounded to f32 and summed in f64, then two f32 scalings.
pub fn l2_norm_inplace(x: &mut [f32], eps: f32) {
    let n = x.len();
    if n == 0 {
        return;
    }
    let nf = n as f32;
    let mut sum = 0.0f64;
    for v in x.iter() {
        sum += (*v * *v) as f64;
    }
    let mean = (sum / n as f64) as f32;
    let scale = 1.0 / libm::sqrtf(mean + eps / nf);
    let post = 1.0 / libm::sqrtf(nf);
    for v in x.iter_mut() {
        *v = (*v * scale) * post;
    }
}

/// ggml's softplus: `x` above 20, else `ln(1 + e^x)`.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::logf(1.0 + libm::expf(x))
    }
}

/// ggml's sigmoid: `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + libm::expf(-x))
}

/// The per-head log-decay and write strength of one token: `g[h] = softplus(alpha[h] +
/// dt_bias[h]) * a[h]` (`a` stored as `-exp(A_log)`) and `beta[h] = sigmoid(beta[h])`,
/// both in place.
pub fn delta_gates(alpha: &mut [f32], dt_bias: &[f32], a: &[f32], beta: &mut [f32]) {
    for ((g, b), a) in alpha.iter_mut().zip(dt_bias).zip(a) {
        *g = softplus(*g + *b) * *a;
    }
    for b in beta.iter_mut() {
        *b = sigmoid(*b);
    }
}

/// `x[i] *= silu(gate[i])` (the output gate of a DeltaNet layer), SiLU as ggml's vector
/// form ([`crate::ops::silu`]).
pub fn mul_silu(x: &mut [f32], gate: &[f32]) {
    mul_silu_on(&CpuFeatures::SCALAR, x, gate)
}

/// [`mul_silu`] eight lanes at a time where `feat` allows (same bits).
pub fn mul_silu_on(feat: &CpuFeatures, x: &mut [f32], gate: &[f32]) {
    crate::ops::silu_on(feat, crate::ops::SiluMode::GatedBy, x, gate)
}

/// `x[i] *= sigmoid(gate[i])` (the output gate of a gated attention layer).
pub fn mul_sigmoid(x: &mut [f32], gate: &[f32]) {
    for (v, g) in x.iter_mut().zip(gate) {
        *v *= sigmoid(*g);
    }
}

const LANES: usize = 8;

/// `sum(a[i] * b[i])` over 8 f32 lanes (two SSE or one AVX register), lanes added in
/// order at the end.
#[inline]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let np = n / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for (ca, cb) in a[..np].chunks_exact(LANES).zip(b[..np].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut s = acc.iter().fold(0.0f32, |s, v| s + v);
    for i in np..n {
        s += a[i] * b[i];
    }
    s
}

/// One token's inputs to one value head's step of the delta rule.
#[derive(Clone, Copy, Debug)]
pub struct HeadToken<'a> {
    /// The key head's L2-normalised query.
    pub q: &'a [f32],
    /// The key head's L2-normalised key.
    pub k: &'a [f32],
    /// The value (its length is the head dimension `d`).
    pub v: &'a [f32],
    /// `exp(g)`.
    pub decay: f32,
    /// The write strength.
    pub beta: f32,
}

/// One token of the gated delta rule for one value head, state updated in place.
///
/// `state` is the head's `d × d` matrix (transposed, see the module doc), `x` the
/// token's inputs; `out` (len `d`) receives `Sᵀq / sqrt(d)`. A `q` or `k` shorter than
/// `v` computes nothing.
///
/// Two passes over each row instead of the formula's four: the decay is taken out of
/// the key's dot (`(e·S)ᵀk = e·(Sᵀk)`), and the decay, the write and the query's dot
/// run in one pass (`row = row·e + k·δ; o += row·q`). Each row is 8-lane blocks the
/// compiler vectorises; a tail of `d % 8` runs scalar.
#[inline]
pub fn delta_head_step(state: &mut [f32], x: HeadToken<'_>, out: &mut [f32]) {
    let HeadToken {
        q,
        k,
        v,
        decay,
        beta,
    } = x;
    let d = v.len();
    let scale = 1.0 / libm::sqrtf(d as f32);
    let (Some(k), Some(q)) = (k.get(..d), q.get(..d)) else {
        return;
    };
    let np = d / LANES * LANES;
    for ((row, vj), oj) in state.chunks_exact_mut(d).zip(v).zip(out.iter_mut()) {
        let delta = (vj - dot_lanes(row, k) * decay) * beta;
        let mut acc = [0.0f32; LANES];
        let blocks = row[..np]
            .chunks_exact_mut(LANES)
            .zip(k[..np].chunks_exact(LANES))
            .zip(q[..np].chunks_exact(LANES));
        for ((r, kb), qb) in blocks {
            for l in 0..LANES {
                r[l] = r[l] * decay + kb[l] * delta;
                acc[l] += r[l] * qb[l];
            }
        }
        let mut sq = acc.iter().fold(0.0f32, |s, v| s + v);
        for i in np..d {
            row[i] = row[i] * decay + k[i] * delta;
            sq += row[i] * q[i];
        }
        *oj = sq * scale;
    }
}

/// [`delta_head_step`] on the best path `feat` allows (same bits).
#[inline]
fn head_step(feat: &CpuFeatures, state: &mut [f32], x: HeadToken<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = feat.avx2_token() {
        let scale = 1.0 / libm::sqrtf(x.v.len() as f32);
        if crate::arch::x86_delta::head_step(t, state, x, scale, out) {
            return;
        }
    }
    let _ = feat;
    delta_head_step(state, x, out)
}

/// The gated delta rule over `n` tokens for value heads `heads`, state updated in place.
///
/// Token `t`'s `qkv[t * stride..]` row holds `[q | k | v]` (`dims.qk_dim()`,
/// `dims.qk_dim()`, `dims.v_dim()` values; q and k L2-normalised); `g[t * n_v + h]` its
/// log-decays and `beta[t * n_v + h]` its write strengths (see [`delta_gates`]).
/// `state` holds the `d × d` matrices of heads `heads` only, back to back; head `h` of
/// token `t` goes to `out[t * out_stride + (h - heads.start) * head_stride..][..d]`
/// (token-major: `out_stride = n_v * d`, `head_stride = d`; head-major: `out_stride =
/// d`, `head_stride = n * d`). Each head runs all its tokens before the next (its state
/// stays in cache), so callers may split heads across workers.
///
/// # Preconditions
/// Slices hold what the shapes say (checked by the caller once per layer); a shorter
/// one computes fewer heads or tokens.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    dims: DeltaDims,
    heads: core::ops::Range<usize>,
    n: usize,
    qkv: &[f32],
    stride: usize,
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    out_stride: usize,
    head_stride: usize,
) {
    let feat = CpuFeatures::SCALAR;
    delta_rule_on(
        &feat,
        dims,
        heads,
        n,
        qkv,
        stride,
        g,
        beta,
        state,
        out,
        out_stride,
        head_stride,
    )
}

/// [`delta_rule`] with the step on the best path `feat` allows (AVX2: eight state rows
/// at a time, same bits).
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_on(
    feat: &CpuFeatures,
    dims: DeltaDims,
    heads: core::ops::Range<usize>,
    n: usize,
    qkv: &[f32],
    stride: usize,
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    out_stride: usize,
    head_stride: usize,
) {
    let d = dims.head_dim;
    let (nk, nv) = (dims.n_k_heads.max(1), dims.n_v_heads);
    let qk = dims.qk_dim();
    for (i, h) in heads.enumerate() {
        let Some(s) = state.get_mut(i * d * d..(i + 1) * d * d) else {
            return;
        };
        let kh = h % nk;
        for t in 0..n {
            let row = t * stride;
            let (Some(q), Some(k), Some(v)) = (
                qkv.get(row + kh * d..row + (kh + 1) * d),
                qkv.get(row + qk + kh * d..row + qk + (kh + 1) * d),
                qkv.get(row + 2 * qk + h * d..row + 2 * qk + (h + 1) * d),
            ) else {
                return;
            };
            let (Some(&gt), Some(&bt)) = (g.get(t * nv + h), beta.get(t * nv + h)) else {
                return;
            };
            let o0 = t * out_stride + i * head_stride;
            let Some(o) = out.get_mut(o0..o0 + d) else {
                return;
            };
            let decay = libm::expf(gt);
            let x = HeadToken {
                q,
                k,
                v,
                decay,
                beta: bt,
            };
            head_step(feat, s, x, o);
        }
    }
}

/// Tokens per chunk of [`delta_rule_chunked`].
pub const DELTA_CHUNK: usize = 32;

/// Floats of the work buffer [`delta_rule_chunked`] needs for head dimension `d`.
pub fn delta_chunk_work(d: usize) -> usize {
    DELTA_CHUNK + 2 * DELTA_CHUNK * d
}

/// `y += a * x` (the compiler vectorises it).
#[inline]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * *x;
    }
}

/// The gated delta rule over `n` tokens in chunks of [`DELTA_CHUNK`] (the chunked form
/// for prompts), arguments and results as [`delta_rule`] plus `work`
/// ([`delta_chunk_work`] floats).
///
/// Within a chunk starting from state `S₀`, with `G_t` the sum of the log-decays of the
/// chunk's tokens up to `t` and `Γ_t = exp(G_t)`, the rule unrolls to (derived from the
/// token form, `S` as `d × d` key-by-value):
///
/// ```text
/// δ_t = β_t (v_t − Γ_t S₀ᵀk_t − Σ_{s<t} e^{G_t−G_s} (k_t·k_s) δ_s)   (forward substitution)
/// o_t = (Γ_t S₀ᵀq_t + Σ_{s≤t} e^{G_t−G_s} (q_t·k_s) δ_s) / sqrt(d)
/// S   = Γ_last S₀ + Σ_s e^{G_last−G_s} k_s δ_sᵀ
/// ```
///
/// So each state row is read once per chunk for the chunk's `S₀ᵀk`, `S₀ᵀq` and written
/// once for the update, instead of once per token; the `c²` terms are dots and
/// `axpy`s of length `d`. The sums run in another order than the token form's, a
/// difference of float rounding only (outputs and state within `2e-5` relative of the
/// token form's, tested). Every `G_t − G_s` with `s <= t` is `<= 0`, so no exponential
/// overflows.
///
/// Not used by the model yet: it does the token form's `3·d²` multiply-adds per token
/// plus `~c·d` more, and on x86 (SSE2 auto-vectorised, 16 heads x 128, 64-512
/// tokens) it measured 1.3-1.7x slower than the fused token step ([`delta_head_step`],
/// whose row stays in L1 for its two passes). It is the form to give blocked SIMD
/// kernels (the `S₀ᵀK`, `S₀ᵀQ` and update steps are `c × d × d` matrix products).
///
/// # Preconditions
/// As [`delta_rule`]; a `work` shorter than [`delta_chunk_work`] computes nothing.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_chunked(
    dims: DeltaDims,
    heads: core::ops::Range<usize>,
    n: usize,
    qkv: &[f32],
    stride: usize,
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    out_stride: usize,
    head_stride: usize,
    work: &mut [f32],
) {
    let d = dims.head_dim;
    let (nk, nv) = (dims.n_k_heads.max(1), dims.n_v_heads);
    let qk = dims.qk_dim();
    if work.len() < delta_chunk_work(d) || d == 0 {
        return;
    }
    // The chunk's rows must all be there (then the slicing below stays inside).
    let need_qkv = n.saturating_sub(1) * stride + 2 * qk + nv * d;
    if n == 0 || qkv.len() < need_qkv || g.len() < n * nv || beta.len() < n * nv {
        return;
    }
    let (gc, rest) = work.split_at_mut(DELTA_CHUNK);
    let (dl, rest) = rest.split_at_mut(DELTA_CHUNK * d);
    let qs = &mut rest[..DELTA_CHUNK * d];
    let scale = 1.0 / libm::sqrtf(d as f32);
    for (i, h) in heads.enumerate() {
        let Some(st) = state.get_mut(i * d * d..(i + 1) * d * d) else {
            return;
        };
        let kh = h % nk;
        let key = |t: usize| &qkv[t * stride + qk + kh * d..][..d];
        let query = |t: usize| &qkv[t * stride + kh * d..][..d];
        let value = |t: usize| &qkv[t * stride + 2 * qk + h * d..][..d];
        let mut t0 = 0;
        while t0 < n {
            let c = DELTA_CHUNK.min(n - t0);
            let mut acc = 0.0f32;
            for (s, gs) in gc[..c].iter_mut().enumerate() {
                acc += g[(t0 + s) * nv + h];
                *gs = acc;
            }
            // S₀ᵀk_t and S₀ᵀq_t, row by row of the stored state (row j = column j of S).
            for (j, row) in st.chunks_exact(d).enumerate() {
                for s in 0..c {
                    let t = t0 + s;
                    let e = libm::expf(gc[s]);
                    let bt = beta[t * nv + h];
                    dl[s * d + j] = bt * (value(t)[j] - e * dot_lanes(row, key(t)));
                    qs[s * d + j] = e * dot_lanes(row, query(t));
                }
            }
            // Forward substitution: δ_t -= β_t e^{G_t−G_s} (k_t·k_s) δ_s, s < t.
            for s1 in 1..c {
                let (done, cur) = dl.split_at_mut(s1 * d);
                let bt = beta[(t0 + s1) * nv + h];
                for s0 in 0..s1 {
                    let a =
                        bt * libm::expf(gc[s1] - gc[s0]) * dot_lanes(key(t0 + s1), key(t0 + s0));
                    axpy(&mut cur[..d], -a, &done[s0 * d..(s0 + 1) * d]);
                }
            }
            // Outputs.
            for s1 in 0..c {
                let t = t0 + s1;
                let o0 = t * out_stride + i * head_stride;
                let Some(o) = out.get_mut(o0..o0 + d) else {
                    return;
                };
                o.copy_from_slice(&qs[s1 * d..(s1 + 1) * d]);
                for s0 in 0..=s1 {
                    let a = libm::expf(gc[s1] - gc[s0]) * dot_lanes(query(t), key(t0 + s0));
                    axpy(o, a, &dl[s0 * d..(s0 + 1) * d]);
                }
                for v in o.iter_mut() {
                    *v *= scale;
                }
            }
            // The state at the chunk's end: row j = Γ row j + Σ_s e^{G_last−G_s} δ_s[j] k_s.
            let last = gc[c - 1];
            let decay = libm::expf(last);
            for gs in gc[..c].iter_mut() {
                *gs = libm::expf(last - *gs);
            }
            for (j, row) in st.chunks_exact_mut(d).enumerate() {
                for v in row.iter_mut() {
                    *v *= decay;
                }
                for s in 0..c {
                    axpy(row, gc[s] * dl[s * d + j], key(t0 + s));
                }
            }
            t0 += c;
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::testutil::Rng;
    use std::vec;
    use std::vec::Vec;

    /// The convolution straight from its formula: a zero-padded history of every input.
    fn conv_naive(hist: &[Vec<f32>], w: &[f32], k: usize, ch: usize) -> Vec<Vec<f32>> {
        // hist: all inputs from the very start, one row per token.
        (0..hist.len())
            .map(|t| {
                (0..ch)
                    .map(|c| {
                        let mut s = 0.0f64;
                        for i in 0..k {
                            let src = t as isize - (k - 1) as isize + i as isize;
                            if src >= 0 {
                                s += hist[src as usize][c] as f64 * w[c * k + i] as f64;
                            }
                        }
                        s as f32
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn conv_in_calls_of_any_size_equals_the_formula() {
        let mut rng = Rng(3);
        for (k, ch) in [
            (1usize, 5usize),
            (2, 1),
            (3, 7),
            (4, 33),
            (5, 2),
            (4, 150),
            (3, 64),
        ] {
            let total = 11;
            let hist: Vec<Vec<f32>> = (0..total)
                .map(|_| {
                    let mut r = vec![0f32; ch];
                    rng.fill_f32(&mut r, 2.0);
                    r
                })
                .collect();
            let mut w = vec![0f32; ch * k];
            rng.fill_f32(&mut w, 1.0);
            let want = conv_naive(&hist, &w, k, ch);
            let mut wt = vec![0f32; ch * k];
            taps_tap_major(&w, ch, k, &mut wt);
            // Calls of 1, 3, 2, 5 tokens: the tail carries across each boundary.
            let mut tail = vec![0f32; ch * (k - 1)];
            let mut t0 = 0;
            for n in [1usize, 3, 2, 5] {
                let mut x: Vec<f32> = hist[t0..t0 + n].concat();
                conv_causal_inplace(&mut x, n, ch, &wt, k, &mut tail).unwrap();
                for t in 0..n {
                    for c in 0..ch {
                        let (a, b) = (x[t * ch + c], want[t0 + t][c]);
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                            "k {k} ch {ch} t {}",
                            t0 + t
                        );
                    }
                }
                t0 += n;
            }
            // The tail is the last k-1 inputs, token-major.
            for c in 0..ch {
                for j in 0..k - 1 {
                    assert_eq!(tail[j * ch + c], hist[total - (k - 1) + j][c]);
                }
            }
        }
    }

    #[test]
    fn conv_refuses_bad_taps_and_short_slices() {
        let (mut x, mut tail) = ([1.0f32; 8], [0.0f32; 8]);
        let w = [0.5f32; 8];
        for k in [0usize, MAX_CONV_TAPS + 1] {
            let r = conv_causal_inplace(&mut x, 2, 4, &w, k, &mut tail);
            assert!(matches!(r, Err(KernelError::BadLength { .. })), "k {k}");
        }
        // 4 channels of 3 taps need 12 weights and 8 tail values.
        let r = conv_causal_inplace(&mut x, 2, 4, &w, 3, &mut tail);
        assert!(matches!(
            r,
            Err(KernelError::BadLength {
                what: "conv taps",
                ..
            })
        ));
        let r = conv_causal_inplace(&mut x, 3, 4, &[0.5; 12], 3, &mut tail);
        assert!(matches!(
            r,
            Err(KernelError::BadLength {
                what: "conv input",
                ..
            })
        ));
        assert_eq!(x, [1.0; 8], "nothing computed on error");
    }

    #[test]
    fn conv_of_one_token_per_call_is_bit_identical_to_one_batch() {
        let mut rng = Rng(5);
        let (k, ch, n) = (4usize, 19usize, 9usize);
        let mut x = vec![0f32; n * ch];
        rng.fill_f32(&mut x, 3.0);
        let mut w = vec![0f32; ch * k];
        rng.fill_f32(&mut w, 1.0);
        let mut batch = x.clone();
        let mut tail_b = vec![0f32; ch * (k - 1)];
        conv_causal_inplace(&mut batch, n, ch, &w, k, &mut tail_b).unwrap();
        let mut tail_s = vec![0f32; ch * (k - 1)];
        for t in 0..n {
            let row = &mut x[t * ch..(t + 1) * ch];
            conv_causal_inplace(row, 1, ch, &w, k, &mut tail_s).unwrap();
        }
        assert!(batch
            .iter()
            .zip(&x)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_eq!(tail_b, tail_s);
    }

    #[test]
    fn l2_norm_gives_unit_length_and_keeps_eps_inside_the_root() {
        let mut rng = Rng(7);
        for n in [1usize, 3, 17, 64, 255] {
            let mut x = vec![0f32; n];
            rng.fill_f32(&mut x, 5.0);
            let want: Vec<f32> = {
                let s: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
                x.iter()
                    .map(|v| (*v as f64 / (s + 1e-6).sqrt()) as f32)
                    .collect()
            };
            l2_norm_inplace(&mut x, 1e-6);
            for (a, b) in x.iter().zip(&want) {
                assert!((a - b).abs() <= 2e-6 * (1.0 + b.abs()), "n {n}");
            }
        }
        // All zeros: eps keeps it finite (zero), never NaN.
        let mut z = [0f32; 5];
        l2_norm_inplace(&mut z, 1e-6);
        assert_eq!(z, [0.0; 5]);
        // Tiny vector: eps dominates, as llama.cpp's eps-inside-the-root form says.
        let mut t = [1e-4f32, 0.0];
        l2_norm_inplace(&mut t, 1e-6);
        let want = 1e-4 / (1e-8f64 + 1e-6).sqrt();
        assert!((t[0] as f64 - want).abs() < 1e-6, "{}", t[0]);
    }

    #[test]
    fn softplus_and_sigmoid_follow_their_formulas() {
        for i in -300..300 {
            let x = i as f32 * 0.1;
            let sp = (1.0 + (x as f64).exp()).ln();
            let want = if x > 20.0 { x as f64 } else { sp };
            assert!(
                (softplus(x) as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{x}"
            );
            let sg = 1.0 / (1.0 + (-(x as f64)).exp());
            assert!((sigmoid(x) as f64 - sg).abs() <= 1e-6, "{x}");
        }
        // The cut-over: above 20, x itself.
        assert_eq!(softplus(25.0), 25.0);
    }

    /// The delta rule straight from its formula, in f64, state as S[i][j].
    struct Naive {
        s: Vec<Vec<Vec<f64>>>, // [head][i][j]
    }

    impl Naive {
        fn step(&mut self, dims: DeltaDims, qkv: &[f32], g: &[f32], beta: &[f32]) -> Vec<f64> {
            let d = dims.head_dim;
            let qk = dims.qk_dim();
            let mut out = vec![0f64; dims.v_dim()];
            for h in 0..dims.n_v_heads {
                let kh = h % dims.n_k_heads;
                let q = &qkv[kh * d..(kh + 1) * d];
                let k = &qkv[qk + kh * d..qk + (kh + 1) * d];
                let v = &qkv[2 * qk + h * d..2 * qk + (h + 1) * d];
                let s = &mut self.s[h];
                let e = (g[h] as f64).exp();
                for row in s.iter_mut() {
                    for x in row.iter_mut() {
                        *x *= e;
                    }
                }
                for j in 0..d {
                    let sk: f64 = (0..d).map(|i| s[i][j] * k[i] as f64).sum();
                    let delta = (v[j] as f64 - sk) * beta[h] as f64;
                    for i in 0..d {
                        s[i][j] += k[i] as f64 * delta;
                    }
                }
                for j in 0..d {
                    let sq: f64 = (0..d).map(|i| s[i][j] * q[i] as f64).sum();
                    out[h * d + j] = sq / (d as f64).sqrt();
                }
            }
            out
        }
    }

    fn random_tokens(rng: &mut Rng, dims: DeltaDims, n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (d, qk, nv) = (dims.head_dim, dims.qk_dim(), dims.n_v_heads);
        let cd = dims.conv_dim();
        let mut qkv = vec![0f32; n * cd];
        rng.fill_f32(&mut qkv, 1.0);
        for t in 0..n {
            for part in [0, qk] {
                for h in 0..dims.n_k_heads {
                    let o = t * cd + part + h * d;
                    l2_norm_inplace(&mut qkv[o..o + d], 1e-6);
                }
            }
        }
        let mut g = vec![0f32; n * nv];
        let mut beta = vec![0f32; n * nv];
        rng.fill_f32(&mut g, 1.0);
        rng.fill_f32(&mut beta, 3.0);
        let a: Vec<f32> = (0..nv).map(|h| -(0.5 + h as f32 * 0.3)).collect();
        let bias: Vec<f32> = (0..nv).map(|h| 0.1 * h as f32 - 0.2).collect();
        for t in 0..n {
            delta_gates(
                &mut g[t * nv..(t + 1) * nv],
                &bias,
                &a,
                &mut beta[t * nv..(t + 1) * nv],
            );
        }
        (qkv, g, beta)
    }

    #[test]
    fn delta_rule_equals_the_formula_on_odd_shapes_and_batchings() {
        let mut rng = Rng(13);
        for (nk, nv, d) in [
            (1usize, 1usize, 1usize),
            (2, 4, 3),
            (1, 3, 17),
            (2, 2, 32),
            (3, 6, 20),
        ] {
            let dims = DeltaDims {
                n_k_heads: nk,
                n_v_heads: nv,
                head_dim: d,
            };
            let n = 7;
            let (qkv, g, beta) = random_tokens(&mut rng, dims, n);
            let cd = dims.conv_dim();
            let mut naive = Naive {
                s: vec![vec![vec![0f64; d]; d]; nv],
            };
            let want: Vec<Vec<f64>> = (0..n)
                .map(|t| {
                    naive.step(
                        dims,
                        &qkv[t * cd..(t + 1) * cd],
                        &g[t * nv..],
                        &beta[t * nv..],
                    )
                })
                .collect();
            // Batched: all heads, all tokens in one call, token-major and head-major.
            let vd = dims.v_dim();
            let batched = |out_stride: usize, head_stride: usize| {
                let mut state = vec![0f32; dims.state_len()];
                let mut out = vec![f32::NAN; n * vd];
                let (q, gg, bb) = (&qkv[..], &g[..], &beta[..]);
                delta_rule(
                    dims,
                    0..nv,
                    n,
                    q,
                    cd,
                    gg,
                    bb,
                    &mut state,
                    &mut out,
                    out_stride,
                    head_stride,
                );
                (state, out)
            };
            let (state, out) = batched(vd, d);
            let (_, out_h) = batched(d, n * d);
            for t in 0..n {
                for h in 0..nv {
                    let a = &out[t * vd + h * d..][..d];
                    let b = &out_h[h * n * d + t * d..][..d];
                    assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
                }
            }
            // One token at a time, heads split in two calls.
            let mut state_s = vec![0f32; dims.state_len()];
            let mut out_s = vec![f32::NAN; n * vd];
            let split = nv / 2;
            for t in 0..n {
                let (s0, s1) = state_s.split_at_mut(split * d * d);
                let o = &mut out_s[t * vd..(t + 1) * vd];
                let (o0, o1) = o.split_at_mut(split * d);
                let (q, gg, bb) = (&qkv[t * cd..], &g[t * nv..], &beta[t * nv..]);
                delta_rule(dims, 0..split, 1, q, cd, gg, bb, s0, o0, vd, d);
                delta_rule(dims, split..nv, 1, q, cd, gg, bb, s1, o1, vd, d);
            }
            for t in 0..n {
                for j in 0..vd {
                    let w = want[t][j];
                    let (a, b) = (out[t * vd + j] as f64, out_s[t * vd + j] as f64);
                    assert!(
                        (a - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{dims:?} t {t} j {j}: {a} vs {w}"
                    );
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{dims:?} t {t}: batched vs one by one"
                    );
                }
            }
            // The stored state is Sᵀ.
            for h in 0..nv {
                for i in 0..d {
                    for j in 0..d {
                        let w = naive.s[h][i][j];
                        let a = state[h * d * d + j * d + i] as f64;
                        assert!((a - w).abs() <= 1e-5 * (1.0 + w.abs()));
                    }
                }
            }
        }
    }

    #[test]
    fn chunked_delta_rule_equals_the_token_form_on_odd_shapes_and_lengths() {
        let mut rng = Rng(29);
        for (nk, nv, d, n) in [
            (1usize, 1usize, 1usize, 1usize),
            (2, 4, 3, 5),
            (1, 3, 17, 33),
            (2, 2, 32, 64),
            (3, 6, 20, 70),
            (1, 2, 128, 40),
        ] {
            let dims = DeltaDims {
                n_k_heads: nk,
                n_v_heads: nv,
                head_dim: d,
            };
            let (qkv, g, beta) = random_tokens(&mut rng, dims, n);
            let (cd, vd) = (dims.conv_dim(), dims.v_dim());
            // From a state that is not zero: first a few tokens by the token form.
            let mut s_tok = vec![0f32; dims.state_len()];
            rng.fill_f32(&mut s_tok, 0.5);
            let mut s_chk = s_tok.clone();
            let mut o_tok = vec![0f32; n * vd];
            let mut o_chk = vec![f32::NAN; n * vd];
            delta_rule(
                dims,
                0..nv,
                n,
                &qkv,
                cd,
                &g,
                &beta,
                &mut s_tok,
                &mut o_tok,
                vd,
                d,
            );
            let mut work = vec![0f32; delta_chunk_work(d)];
            let (q, gg, bb) = (&qkv[..], &g[..], &beta[..]);
            delta_rule_chunked(
                dims,
                0..nv,
                n,
                q,
                cd,
                gg,
                bb,
                &mut s_chk,
                &mut o_chk,
                vd,
                d,
                &mut work,
            );
            let close = |a: f32, b: f32| (a - b).abs() <= 2e-5 * (1.0 + b.abs());
            for (j, (a, b)) in o_chk.iter().zip(&o_tok).enumerate() {
                assert!(close(*a, *b), "{dims:?} n {n} out {j}: {a} vs {b}");
            }
            for (j, (a, b)) in s_chk.iter().zip(&s_tok).enumerate() {
                assert!(close(*a, *b), "{dims:?} n {n} state {j}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn zero_beta_and_zero_decay_leave_and_clear_the_state() {
        let mut s: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let q = [1.0, 0.0, 0.0, 0.0];
        let mut o = [0f32; 4];
        // decay 1, beta 0: state unchanged, out = row j · q / 2 = S[0][j] / 2.
        let x = |v, decay, beta| HeadToken {
            q: &q,
            k: &q,
            v,
            decay,
            beta,
        };
        delta_head_step(&mut s, x(&[9.0; 4], 1.0, 0.0), &mut o);
        assert_eq!(s, (0..16).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(o, [0.0, 2.0, 4.0, 6.0]);
        // decay 0, beta 1: the old state is gone; S = k vᵀ.
        let v = [1.0, 2.0, 3.0, 4.0];
        delta_head_step(&mut s, x(&v, 0.0, 1.0), &mut o);
        assert_eq!(o, [0.5, 1.0, 1.5, 2.0]);
    }

    /// The AVX2 step (eight rows at a time) gives the scalar reference's bits, state and
    /// outputs, over several tokens; head dimensions that are not a multiple of 8 take
    /// the scalar step (and so agree trivially). Skipped only without AVX2.
    #[test]
    fn simd_delta_rule_gives_the_scalar_bits() {
        let feat = CpuFeatures::detect();
        #[cfg(target_arch = "x86_64")]
        {
            let Some(t) = feat.avx2_token() else {
                std::eprintln!("no AVX2: nothing to compare");
                return;
            };
            // Guard: the fast path really runs for d = 8k and refuses other d.
            let (mut st, mut o) = (vec![0f32; 64], vec![0f32; 8]);
            let q = [0.5f32; 8];
            let step = crate::arch::x86_delta::head_step;
            let x = |n: usize| HeadToken {
                q: &q[..n],
                k: &q[..n],
                v: &q[..n],
                decay: 1.0,
                beta: 1.0,
            };
            assert!(step(t, &mut st, x(8), 0.25, &mut o));
            assert!(!step(t, &mut st[..49], x(7), 0.3, &mut o));
        }
        let mut rng = Rng(21);
        for (nk, nv, d) in [
            (1usize, 1usize, 8usize),
            (2, 4, 32),
            (1, 3, 24),
            (2, 2, 128),
            (1, 2, 20),
        ] {
            let dims = DeltaDims {
                n_k_heads: nk,
                n_v_heads: nv,
                head_dim: d,
            };
            let (cd, vd, n) = (dims.conv_dim(), dims.v_dim(), 5usize);
            let (qkv, g, beta) = random_tokens(&mut rng, dims, n);
            let mut s0 = vec![0f32; dims.state_len()];
            rng.fill_f32(&mut s0, 0.5);
            let (mut s_ref, mut s_simd) = (s0.clone(), s0);
            let (mut o_ref, mut o_simd) = (vec![0f32; n * vd], vec![0f32; n * vd]);
            let all = 0..nv;
            delta_rule(
                dims,
                all.clone(),
                n,
                &qkv,
                cd,
                &g,
                &beta,
                &mut s_ref,
                &mut o_ref,
                vd,
                d,
            );
            delta_rule_on(
                &feat,
                dims,
                all,
                n,
                &qkv,
                cd,
                &g,
                &beta,
                &mut s_simd,
                &mut o_simd,
                vd,
                d,
            );
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same(&o_ref, &o_simd), "{dims:?}: outputs");
            assert!(same(&s_ref, &s_simd), "{dims:?}: state");
        }
    }
}
