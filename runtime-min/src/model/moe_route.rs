//! Mixture-of-experts routing: which experts run a token's feed-forward, and with what
//! weight each one's output is added (llama.cpp 0c1e570, `build_moe_ffn`).
//!
//! ```text
//! probs  = softmax(logits) | sigmoid(logits)        logits = router · xn (one per expert)
//! sel    = probs [+ exp_probs_b]                    the bias only steers the choice
//! groups (n_group > 1): score(g) = sum of g's two best sel; keep the n_group_used best
//!        groups, every other expert's sel = -inf
//! ids    = the n_used largest sel, best first
//! w      = probs[ids] [/ sum(w), at least 2^-14] [* weights_scale]
//! ```
//!
//! Ties are broken towards the lower expert (or group) index: llama.cpp sorts with
//! `std::sort`, which for the 16 or fewer entries of a group or of a small model is an
//! insertion sort, i.e. stable. Beyond 16 entries its order of exact ties is unspecified;
//! exact ties of router scores do not occur in practice.
use crate::gguf::Gguf;
use crate::model::ModelError;

/// Most experts a MoE layer may have (per-token scratch is on the stack).
pub const MAX_EXPERTS: usize = 512;
/// Most experts one token may use.
pub const MAX_EXPERTS_USED: usize = 32;

/// How router logits become expert probabilities (`{arch}.expert_gating_func`:
/// 1 = softmax, 2 = sigmoid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

/// The MoE hyper-parameters of a model (the same for every MoE layer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    /// Experts each token runs (top-k).
    pub n_used: usize,
    /// Hidden width of one routed expert.
    pub n_ff_exp: usize,
    /// Hidden width of the shared expert(s) together; 0 = no shared expert.
    pub n_ff_shexp: usize,
    pub gating: Gating,
    /// Divide the chosen experts' weights by their sum.
    pub norm_weights: bool,
    /// Multiply the weights by this (1 = not at all).
    pub weights_scale: f32,
    /// Expert groups for group-limited routing (0 or 1 = none).
    pub n_group: usize,
    /// Groups each token may choose its experts from.
    pub n_group_used: usize,
    /// Layers `0..n_dense_lead` have a dense FFN instead of experts.
    pub n_dense_lead: usize,
}

impl MoeConfig {
    /// The MoE hyper-parameters of a `qwen3moe` or `bailingmoe2` file (`None` for other
    /// architectures); `n_ff` is `{arch}.feed_forward_length`. Checks what llama.cpp
    /// asserts at load, as errors naming the key.
    pub fn from_gguf(g: &Gguf, arch: &str, n_ff: usize) -> Result<Option<MoeConfig>, ModelError> {
        let u = |k: &str| g.arch_get(k).and_then(|v| v.as_u64()).map(|v| v as usize);
        let f = |k: &str| g.arch_get(k).and_then(|v| v.as_f32());
        let bailing = match arch {
            "qwen3moe" => false,
            "bailingmoe2" => true,
            _ => return Ok(None),
        };
        let n_expert = u("expert_count").ok_or(ModelError::MissingKey("expert_count"))?;
        let n_used = u("expert_used_count").ok_or(ModelError::MissingKey("expert_used_count"))?;
        if n_expert == 0 || n_expert > MAX_EXPERTS {
            return Err(ModelError::BadShape("expert_count is 0 or above 512"));
        }
        if n_used == 0 || n_used > n_expert || n_used > MAX_EXPERTS_USED {
            return Err(ModelError::BadShape(
                "expert_used_count is 0, above expert_count or above 32",
            ));
        }
        let n_ff_exp = match u("expert_feed_forward_length") {
            Some(v) => v,
            // qwen3moe's fallback; bailingmoe2 requires the key.
            None if !bailing => n_ff / n_used,
            None => return Err(ModelError::MissingKey("expert_feed_forward_length")),
        };
        if n_ff_exp == 0 {
            return Err(ModelError::BadShape("expert_feed_forward_length is 0"));
        }
        let n_group = u("expert_group_count").unwrap_or(0);
        let n_group_used = u("expert_group_used_count").unwrap_or(0);
        if n_group > 1 {
            if n_group >= n_expert
                || !n_expert.is_multiple_of(n_group)
                || n_group_used == 0
                || n_group_used >= n_group
            {
                return Err(ModelError::BadShape(
                    "expert_group_count / expert_group_used_count do not divide the experts",
                ));
            }
            if n_expert / n_group < 2 {
                return Err(ModelError::BadShape(
                    "expert groups of fewer than 2 experts (a group scores its best two)",
                ));
            }
        }
        // llama.cpp ignores a scale of 0 (the default) or 1.
        let scale = f("expert_weights_scale").unwrap_or(0.0);
        let weights_scale = if scale == 0.0 { 1.0 } else { scale };
        if !bailing {
            return Ok(Some(MoeConfig {
                n_expert,
                n_used,
                n_ff_exp,
                n_ff_shexp: 0,
                gating: Gating::Softmax,
                norm_weights: true,
                weights_scale,
                n_group,
                n_group_used,
                n_dense_lead: 0,
            }));
        }
        let n_shared =
            u("expert_shared_count").ok_or(ModelError::MissingKey("expert_shared_count"))?;
        let n_ff_shexp = u("expert_shared_feed_forward_length")
            .unwrap_or(n_ff_exp)
            .checked_mul(n_shared)
            .ok_or(ModelError::BadShape(
                "expert_shared_count x its length overflows",
            ))?;
        let gating = match u("expert_gating_func") {
            Some(1) => Gating::Softmax,
            Some(2) => Gating::Sigmoid,
            Some(_) => {
                return Err(ModelError::BadShape(
                    "expert_gating_func is neither 1 (softmax) nor 2 (sigmoid)",
                ))
            }
            None => return Err(ModelError::MissingKey("expert_gating_func")),
        };
        let norm_weights = g
            .arch_get("expert_weights_norm")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        Ok(Some(MoeConfig {
            n_expert,
            n_used,
            n_ff_exp,
            n_ff_shexp,
            gating,
            norm_weights,
            weights_scale,
            n_group,
            n_group_used,
            n_dense_lead: u("leading_dense_block_count").unwrap_or(0),
        }))
    }

    /// Whether layer `il` has experts (else a dense FFN).
    pub fn is_moe_layer(&self, il: usize) -> bool {
        il >= self.n_dense_lead
    }
}

/// Route one token. `logits` are its `n_expert` router outputs, `bias` the selection bias
/// (`exp_probs_b`); writes the chosen experts, best first, to `ids[..n_used]` and their
/// weights to `weights[..n_used]`.
///
/// # Panics
/// If `logits` or `bias` are shorter than `n_expert` or the outputs shorter than
/// `n_used` (the block sizes them from the same config).
pub fn route(
    m: &MoeConfig,
    logits: &[f32],
    bias: Option<&[f32]>,
    ids: &mut [u32],
    weights: &mut [f32],
) {
    let ne = m.n_expert;
    let mut probs = [0.0f32; MAX_EXPERTS];
    let probs = &mut probs[..ne];
    probs.copy_from_slice(&logits[..ne]);
    match m.gating {
        Gating::Softmax => softmax(probs),
        Gating::Sigmoid => {
            for p in probs.iter_mut() {
                *p = 1.0 / (1.0 + libm::expf(-*p));
            }
        }
    }
    let mut sel = [0.0f32; MAX_EXPERTS];
    let sel = &mut sel[..ne];
    sel.copy_from_slice(probs);
    if let Some(b) = bias {
        for (s, b) in sel.iter_mut().zip(b) {
            *s += b;
        }
    }
    if m.n_group > 1 {
        mask_groups(m, sel);
    }
    let k = m.n_used;
    top_k(sel, &mut ids[..k]);
    for (w, &id) in weights[..k].iter_mut().zip(&ids[..k]) {
        *w = probs[id as usize];
    }
    if m.norm_weights {
        // ggml_sum_rows (accumulated in f64), clamped to the smallest normal f16.
        let sum: f64 = weights[..k].iter().map(|&w| w as f64).sum();
        let sum = (sum as f32).max(6.103_515_6e-5);
        for w in weights[..k].iter_mut() {
            *w /= sum;
        }
    }
    if m.weights_scale != 1.0 {
        for w in weights[..k].iter_mut() {
            *w *= m.weights_scale;
        }
    }
}

/// Keep the `n_group_used` groups whose two best scores sum highest; set every other
/// group's scores to -inf.
fn mask_groups(m: &MoeConfig, sel: &mut [f32]) {
    let per = m.n_expert / m.n_group;
    let mut score = [0.0f32; MAX_EXPERTS];
    let score = &mut score[..m.n_group];
    for (g, s) in score.iter_mut().enumerate() {
        let mut best = [0u32; 2];
        top_k(&sel[g * per..(g + 1) * per], &mut best);
        *s = sel[g * per + best[0] as usize] + sel[g * per + best[1] as usize];
    }
    let mut keep = [0u32; MAX_EXPERTS];
    let keep = &mut keep[..m.n_group_used];
    top_k(score, keep);
    for g in 0..m.n_group {
        if !keep.contains(&(g as u32)) {
            sel[g * per..(g + 1) * per].fill(f32::NEG_INFINITY);
        }
    }
}

/// The indices of the `out.len()` largest values of `v`, largest first; equal values in
/// index order (a stable descending sort, cut).
fn top_k(v: &[f32], out: &mut [u32]) {
    let mut n = 0;
    for (i, &x) in v.iter().enumerate() {
        // Insert i after every kept index whose value is >= x (stable for ties).
        let mut at = n;
        while at > 0 && v[out[at - 1] as usize] < x {
            at -= 1;
        }
        if at >= out.len() {
            continue;
        }
        let end = (n + 1).min(out.len());
        for j in (at + 1..end).rev() {
            out[j] = out[j - 1];
        }
        out[at] = i as u32;
        n = end;
    }
}

/// ggml's softmax of one row on the golden host (AVX-512): 16 at a time with ggml's
/// polynomial `expf`, the rest with libm's, summed in f64, then scaled by 1/sum.
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    let whole = x.len() / 16 * 16;
    let (head, tail) = x.split_at_mut(whole);
    for c in head.chunks_exact_mut(16) {
        let mut e = [0.0f32; 16];
        for (ei, v) in e.iter_mut().zip(c.iter_mut()) {
            *ei = pinch_kernels::ops::expf_ggml(*v - max);
            *v = *ei;
        }
        sum += pinch_kernels::quant::float::hsum16(e) as f64;
    }
    for v in tail.iter_mut() {
        *v = libm::expf(*v - max);
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    fn cfg(n_expert: usize, n_used: usize, gating: Gating) -> MoeConfig {
        MoeConfig {
            n_expert,
            n_used,
            n_ff_exp: 8,
            n_ff_shexp: 0,
            gating,
            norm_weights: true,
            weights_scale: 1.0,
            n_group: 0,
            n_group_used: 0,
            n_dense_lead: 0,
        }
    }

    fn run(m: &MoeConfig, logits: &[f32], bias: Option<&[f32]>) -> (Vec<u32>, Vec<f32>) {
        let mut ids = vec![0u32; m.n_used];
        let mut w = vec![0.0f32; m.n_used];
        route(m, logits, bias, &mut ids, &mut w);
        (ids, w)
    }

    #[test]
    fn top_k_is_a_stable_descending_sort_cut() {
        let v = [1.0, 3.0, 2.0, 3.0, -1.0, 2.0];
        let mut out = [0u32; 4];
        top_k(&v, &mut out);
        assert_eq!(out, [1, 3, 2, 5]);
        let mut all = [0u32; 6];
        top_k(&v, &mut all);
        assert_eq!(all, [1, 3, 2, 5, 0, 4]);
        let mut one = [9u32; 1];
        top_k(&[f32::NEG_INFINITY, f32::NEG_INFINITY], &mut one);
        assert_eq!(one, [0]);
    }

    #[test]
    fn softmax_router_renormalises_the_chosen_two() {
        let m = cfg(4, 2, Gating::Softmax);
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let (ids, w) = run(&m, &logits, None);
        assert_eq!(ids, [1, 3]);
        // softmax then renormalised over the two = softmax of the two logits.
        let (a, b) = (2.0f64.exp(), 1.0f64.exp());
        assert!((w[0] as f64 - a / (a + b)).abs() < 1e-6, "{w:?}");
        assert!((w[1] as f64 - b / (a + b)).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn softmax_of_many_experts_sums_to_one() {
        // 37 experts: two AVX-512-sized chunks and a tail.
        let mut x: Vec<f32> = (0..37).map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.0).collect();
        let want: Vec<f64> = {
            let mx = x.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let e: Vec<f64> = x.iter().map(|&v| (v as f64 - mx).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        };
        softmax(&mut x);
        for (g, w) in x.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-6);
        }
    }

    #[test]
    fn sigmoid_router_selects_by_biased_score_but_weights_by_unbiased() {
        let mut m = cfg(4, 2, Gating::Sigmoid);
        m.weights_scale = 2.5;
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        // The bias makes experts 3 and 2 the choice although 0 and 1 score higher.
        let bias = [0.0f32, 0.0, 1.0, 2.0];
        let (ids, w) = run(&m, &logits, Some(&bias));
        assert_eq!(ids, [3, 2]);
        let s = |x: f64| 1.0 / (1.0 + (-x).exp());
        let (a, b) = (s(-1.0), s(0.0));
        assert!((w[0] as f64 - 2.5 * a / (a + b)).abs() < 1e-6, "{w:?}");
        assert!((w[1] as f64 - 2.5 * b / (a + b)).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn unnormalised_weights_are_the_probabilities_times_the_scale() {
        let mut m = cfg(3, 1, Gating::Sigmoid);
        m.norm_weights = false;
        m.weights_scale = 0.5;
        let (ids, w) = run(&m, &[0.0, 3.0, 1.0], None);
        assert_eq!(ids, [1]);
        let p = 1.0 / (1.0 + (-3.0f64).exp());
        assert!((w[0] as f64 - 0.5 * p).abs() < 1e-6);
    }

    #[test]
    fn group_limited_routing_scores_a_group_by_its_best_two() {
        // Two groups of three: group 0 = [0.9, 0.1, 0.1] (best two sum 1.0), group 1 =
        // [0.6, 0.6, 0.0] (1.2). The single best expert (0) is in the losing group.
        let mut m = cfg(6, 2, Gating::Sigmoid);
        m.n_group = 2;
        m.n_group_used = 1;
        m.norm_weights = false;
        let p = [0.9f32, 0.1, 0.1, 0.6, 0.6, 0.0];
        let logit = |p: f32| libm::logf(p / (1.0 - p));
        let logits: Vec<f32> = p
            .iter()
            .map(|&v| if v == 0.0 { -30.0 } else { logit(v) })
            .collect();
        let (ids, _) = run(&m, &logits, None);
        assert_eq!(ids, [3, 4]);
        // Without groups expert 0 wins.
        m.n_group = 0;
        let (ids, _) = run(&m, &logits, None);
        assert_eq!(ids, [0, 3]);
    }

    #[test]
    fn more_experts_than_the_kept_groups_hold_takes_masked_ones_in_index_order() {
        // llama.cpp's top-k then picks -inf entries; their weights are still their
        // (unbiased) probabilities.
        let mut m = cfg(4, 3, Gating::Sigmoid);
        m.n_group = 2;
        m.n_group_used = 1;
        m.norm_weights = false;
        let (ids, w) = run(&m, &[0.0, 0.0, 3.0, 2.0], None);
        assert_eq!(ids, [2, 3, 0]);
        assert!((w[2] - 0.5).abs() < 1e-7);
    }

    #[test]
    fn tied_scores_go_to_the_lower_expert() {
        let m = cfg(4, 2, Gating::Softmax);
        let (ids, w) = run(&m, &[1.0, 2.0, 2.0, 2.0], None);
        assert_eq!(ids, [1, 2]);
        assert_eq!(w[0], w[1]);
    }

    #[test]
    fn zero_weights_are_clamped_before_division() {
        let mut m = cfg(2, 1, Gating::Sigmoid);
        m.weights_scale = 1.0;
        let (_, w) = run(&m, &[-200.0, -200.0], None);
        assert_eq!(w[0], 0.0);
    }
}
