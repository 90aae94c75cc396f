//! Token sampling in one pass over the logits.
//!
//! A bounded min-heap keeps the best `top_k + repeat_last_n` candidates while the
//! logits stream by (no sort of the 262,144-entry vocabulary). Repetition penalties only
//! ever lower a recent token's score, so any token in the penalised top-k was within the
//! unpenalised top `k + n_recent`: applying penalties to the kept candidates is exact.
//! With `top_k = 0` (no top-k) the candidate set is capped at [`MAX_CANDIDATES`]; the
//! probability mass beyond that is negligible at usual temperatures.

/// Most candidates kept by the heap.
pub const MAX_CANDIDATES: usize = 2048;
/// Longest repetition window.
pub const MAX_RECENT: usize = 1024;

/// Sampling settings (llama.cpp's flag names and defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerParams {
    /// <= 0: greedy.
    pub temp: f32,
    /// 0: off.
    pub top_k: usize,
    /// 1.0: off.
    pub top_p: f32,
    /// 0.0: off.
    pub min_p: f32,
    /// 1.0: off.
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x5eed,
        }
    }
}

/// A candidate token and its (penalised) logit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
}

/// The sampler state: settings, RNG, recent tokens and candidate storage.
pub struct Sampler {
    pub params: SamplerParams,
    rng: u64,
    recent: heapless::Deque<u32, MAX_RECENT>,
    heap: heapless::Vec<Candidate, MAX_CANDIDATES>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Sampler {
        Sampler {
            params,
            rng: params.seed ^ 0x9e37_79b9_7f4a_7c15,
            recent: heapless::Deque::new(),
            heap: heapless::Vec::new(),
        }
    }

    /// Record a token that is now part of the context (prompt or generated).
    pub fn accept(&mut self, id: u32) {
        let n = self.params.repeat_last_n.min(MAX_RECENT);
        if n == 0 {
            return;
        }
        while self.recent.len() >= n {
            self.recent.pop_front();
        }
        let _ = self.recent.push_back(id);
    }

    /// Forget recent tokens (new conversation).
    pub fn reset(&mut self) {
        self.recent.clear();
    }

    fn penalised(&self, id: u32, logit: f32) -> f32 {
        let p = self.params.repeat_penalty;
        if p == 1.0 || !self.recent.iter().any(|&r| r == id) {
            return logit;
        }
        if logit <= 0.0 {
            logit * p
        } else {
            logit / p
        }
    }

    fn next_f32(&mut self) -> f32 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Pick the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temp <= 0.0 {
            return self.greedy(logits);
        }
        let mut probs = [0.0f32; MAX_CANDIDATES];
        let n = self.distribution(logits, &mut probs);
        let mass: f32 = probs[..n].iter().sum();
        self.pick(&probs[..n], mass, None).unwrap_or(0)
    }

    /// Pick the next token where a draft proposed `draft` (speculative decoding with a
    /// deterministic draft): `draft` is kept with its probability p(draft), otherwise a
    /// token is drawn from the other candidates in proportion to their probabilities.
    /// The result is distributed exactly as [`Self::sample`]'s (and is [`Self::greedy`]
    /// at temperature 0).
    pub fn sample_with_draft(&mut self, logits: &[f32], draft: u32) -> u32 {
        if self.params.temp <= 0.0 {
            return self.greedy(logits);
        }
        let mut probs = [0.0f32; MAX_CANDIDATES];
        let n = self.distribution(logits, &mut probs);
        let mass: f32 = probs[..n].iter().sum();
        let at = self.heap[..n].iter().position(|c| c.id == draft);
        if let Some(i) = at {
            if self.next_f32() * mass < probs[i] {
                return draft;
            }
        }
        let rest = mass - at.map_or(0.0, |i| probs[i]);
        // Only the draft was left (top-k 1, or min-p/top-p kept one): it is the answer.
        self.pick(&probs[..n], rest, at).unwrap_or(draft)
    }

    /// The candidates (in `self.heap`, best first) and their unnormalised probabilities
    /// after penalties, top-k, temperature, min-p and top-p; returns how many remain.
    fn distribution(&mut self, logits: &[f32], probs: &mut [f32; MAX_CANDIDATES]) -> usize {
        let p = self.params;
        let k = if p.top_k == 0 {
            MAX_CANDIDATES
        } else {
            p.top_k.min(MAX_CANDIDATES)
        };
        let keep = (k + self.recent.len()).min(MAX_CANDIDATES);
        self.collect_top(logits, keep);
        // Penalise, then re-select the best k.
        let mut cands = core::mem::take(&mut self.heap);
        for c in cands.iter_mut() {
            c.logit = self.penalised(c.id, c.logit);
        }
        sort_desc(&mut cands);
        cands.truncate(k);
        // Softmax with temperature over the candidates.
        let max = cands.first().map(|c| c.logit).unwrap_or(0.0);
        for (i, c) in cands.iter().enumerate() {
            probs[i] = libm::expf((c.logit - max) / p.temp);
        }
        let mut n = cands.len();
        // min-p: drop tokens below min_p * p(best).
        if p.min_p > 0.0 && n > 0 {
            let floor = p.min_p * probs[0];
            n = probs[..n]
                .iter()
                .take_while(|&&q| q >= floor)
                .count()
                .max(1);
        }
        // top-p: smallest prefix with mass >= top_p.
        let total: f32 = probs[..n].iter().sum();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            if let Some(i) = probs[..n].iter().position(|q| {
                acc += q / total;
                acc >= p.top_p
            }) {
                n = i + 1;
            }
        }
        self.heap = cands;
        n
    }

    /// Draw a candidate with probability `probs[i] / mass`, leaving out candidate `skip`
    /// (whose probability `mass` does not include). When rounding leaves the draw past
    /// the last candidate, the first one is taken; `None` when nothing is left.
    fn pick(&mut self, probs: &[f32], mass: f32, skip: Option<usize>) -> Option<u32> {
        let mut r = self.next_f32() * mass;
        let mut first = None;
        for (i, &q) in probs.iter().enumerate() {
            if Some(i) == skip {
                continue;
            }
            first = first.or(Some(self.heap[i].id));
            r -= q;
            if r <= 0.0 {
                return Some(self.heap[i].id);
            }
        }
        first
    }

    /// The distribution [`Self::sample`] draws from (after penalties, top-k,
    /// temperature, min-p and top-p), as llama-server's `post_sampling_probs` reports
    /// it: the probability of `chosen` (0 when the cuts removed it) and the best
    /// `out.len()` candidates, best first, with their probability in `logit`; returns
    /// the chosen token's probability and how many candidates were written. Greedy
    /// sampling (`temp <= 0`) leaves one candidate, the argmax, with probability 1.
    /// Draws no random number: asking does not change what is sampled next.
    pub fn post_probs(
        &mut self,
        logits: &[f32],
        chosen: u32,
        out: &mut [Candidate],
    ) -> (f32, usize) {
        if self.params.temp <= 0.0 {
            let best = self.greedy(logits);
            let Some(first) = out.first_mut() else {
                return (if best == chosen { 1.0 } else { 0.0 }, 0);
            };
            *first = Candidate {
                id: best,
                logit: 1.0,
            };
            return (if best == chosen { 1.0 } else { 0.0 }, 1);
        }
        let mut probs = [0.0f32; MAX_CANDIDATES];
        let n = self.distribution(logits, &mut probs);
        let mass: f32 = probs[..n].iter().sum();
        if mass.is_nan() || mass <= 0.0 {
            return (0.0, 0);
        }
        let mut p_chosen = 0.0;
        for (c, &q) in self.heap[..n].iter().zip(&probs[..n]) {
            if c.id == chosen {
                p_chosen = q / mass;
            }
        }
        let k = out.len().min(n);
        for ((o, c), &q) in out.iter_mut().zip(&self.heap[..k]).zip(&probs[..k]) {
            *o = Candidate {
                id: c.id,
                logit: q / mass,
            };
        }
        (p_chosen, k)
    }

    /// Argmax of the penalised logits; the first maximum wins ties (as llama.cpp).
    pub fn greedy(&self, logits: &[f32]) -> u32 {
        let mut best = 0usize;
        let mut best_v = f32::NEG_INFINITY;
        for (i, &l) in logits.iter().enumerate() {
            let v = if self.recent.is_empty() {
                l
            } else {
                self.penalised(i as u32, l)
            };
            if v > best_v {
                best_v = v;
                best = i;
            }
        }
        best as u32
    }

    /// Keep the `keep` largest raw logits in `self.heap` (a min-heap by logit).
    fn collect_top(&mut self, logits: &[f32], keep: usize) {
        self.heap.clear();
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() {
                continue;
            }
            let c = Candidate {
                id: i as u32,
                logit: l,
            };
            if self.heap.len() < keep {
                let _ = self.heap.push(c);
                let last = self.heap.len() - 1;
                sift_up(&mut self.heap, last);
            } else if keep > 0 && l > self.heap[0].logit {
                self.heap[0] = c;
                sift_down(&mut self.heap, 0);
            }
        }
    }
}

/// The `n` best (id, logit) of `logits`, best first, into `out`; returns the count.
pub fn top_n(logits: &[f32], out: &mut [Candidate]) -> usize {
    let n = out.len();
    let mut len = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        let c = Candidate {
            id: i as u32,
            logit: l,
        };
        if len < n {
            out[len] = c;
            len += 1;
            let mut j = len - 1;
            while j > 0 && out[j - 1].logit < out[j].logit {
                out.swap(j - 1, j);
                j -= 1;
            }
        } else if n > 0 && l > out[n - 1].logit {
            out[n - 1] = c;
            let mut j = n - 1;
            while j > 0 && out[j - 1].logit < out[j].logit {
                out.swap(j - 1, j);
                j -= 1;
            }
        }
    }
    len
}

fn sift_up(h: &mut [Candidate], mut i: usize) {
    while i > 0 {
        let parent = (i - 1) / 2;
        if h[i].logit < h[parent].logit {
            h.swap(i, parent);
            i = parent;
        } else {
            break;
        }
    }
}

fn sift_down(h: &mut [Candidate], mut i: usize) {
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut m = i;
        if l < h.len() && h[l].logit < h[m].logit {
            m = l;
        }
        if r < h.len() && h[r].logit < h[m].logit {
            m = r;
        }
        if m == i {
            break;
        }
        h.swap(i, m);
        i = m;
    }
}

/// Heap-sort descending by logit (candidates are few; no allocation).
fn sort_desc(v: &mut [Candidate]) {
    // The slice is a min-heap already only when untouched; rebuild to be safe.
    let n = v.len();
    for i in (0..n / 2).rev() {
        sift_down(v, i);
    }
    for end in (1..n).rev() {
        v.swap(0, end);
        sift_down(&mut v[..end], 0);
    }
    // A min-heap sort yields descending order.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_maximum() {
        let s = Sampler::new(SamplerParams {
            temp: 0.0,
            ..Default::default()
        });
        assert_eq!(s.greedy(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_penalty_changes_choice() {
        let mut s = Sampler::new(SamplerParams {
            temp: 1.0,
            top_k: 1,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 10.0,
            repeat_last_n: 4,
            seed: 1,
        });
        let logits = [0.5f32, 2.0, 1.9, -3.0];
        assert_eq!(s.sample(&logits), 1);
        s.accept(1);
        // 2.0 / 10 = 0.2 < 1.9: token 2 wins now.
        assert_eq!(s.sample(&logits), 2);
    }

    #[test]
    fn sampling_stays_within_top_k_and_follows_probabilities() {
        let mut logits = [0.0f32; 1000];
        for (i, l) in logits.iter_mut().enumerate() {
            *l = -(i as f32) * 0.01;
        }
        logits[500] = 5.0;
        logits[700] = 5.0;
        let mut s = Sampler::new(SamplerParams {
            temp: 1.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 0,
            seed: 7,
        });
        let mut counts = [0u32; 2];
        for _ in 0..2000 {
            match s.sample(&logits) {
                500 => counts[0] += 1,
                700 => counts[1] += 1,
                other => panic!("sampled {other} outside top-2"),
            }
        }
        assert!(counts[0] > 850 && counts[1] > 850, "{counts:?}");
    }

    /// Speculative sampling with a deterministic draft keeps the sampler's distribution:
    /// over many draws, each token's share with a draft (likely, unlikely, or outside
    /// the candidates) matches its share without one.
    #[test]
    fn sampling_with_a_draft_keeps_the_distribution() {
        let logits: [f32; 8] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -9.0];
        let params = SamplerParams {
            temp: 0.9,
            top_k: 6,
            top_p: 0.97,
            min_p: 0.0,
            repeat_penalty: 1.1,
            repeat_last_n: 8,
            seed: 11,
        };
        let draws = 40_000;
        let hist = |draft: Option<u32>| {
            let mut s = Sampler::new(params);
            s.accept(1);
            let mut h = [0u32; 8];
            for _ in 0..draws {
                let t = match draft {
                    Some(d) => s.sample_with_draft(&logits, d),
                    None => s.sample(&logits),
                };
                h[t as usize] += 1;
            }
            h
        };
        let plain = hist(None);
        for d in [0u32, 3, 7] {
            let with = hist(Some(d));
            for t in 0..8 {
                let (a, b) = (
                    plain[t] as f64 / draws as f64,
                    with[t] as f64 / draws as f64,
                );
                // 4 standard deviations of a share estimated from 40,000 draws.
                let sd = (a.max(1e-4) * (1.0 - a) / draws as f64).sqrt();
                assert!(
                    (a - b).abs() <= 4.0 * sd + 1e-4,
                    "draft {d}: token {t}: {a} vs {b}"
                );
            }
        }
        // Tokens top-k and top-p cut never appear, with or without a draft.
        assert_eq!(plain[7], 0);
        assert_eq!(hist(Some(7))[7], 0);
    }

    /// The reported distribution is the one sampled from: the cuts leave the
    /// candidates they keep, their probabilities sum to 1, and a token drawn is always
    /// among them with the probability it is drawn with.
    #[test]
    fn post_probs_are_the_distribution_sampled_from() {
        let logits: [f32; 6] = [3.0, 2.5, 1.0, 0.0, -4.0, -9.0];
        let params = SamplerParams {
            temp: 1.0,
            top_k: 4,
            top_p: 1.0,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 0,
            seed: 3,
        };
        let mut s = Sampler::new(params);
        let mut out = [Candidate { id: 0, logit: 0.0 }; 8];
        let (p0, n) = s.post_probs(&logits, 0, &mut out);
        // top-k keeps 4; min-p cuts token 3 (e^-3 = 0.0498 of the best < 0.05).
        let e = |x: f32| libm::expf(x);
        let z = e(3.0) + e(2.5) + e(1.0);
        assert_eq!(n, 3);
        assert_eq!([out[0].id, out[1].id, out[2].id], [0, 1, 2]);
        assert!((p0 - e(3.0) / z).abs() < 1e-6);
        let sum: f32 = out[..n].iter().map(|c| c.logit).sum();
        assert!((sum - 1.0).abs() < 1e-6);
        // A token the cuts removed has probability 0; asking draws nothing.
        assert_eq!(s.post_probs(&logits, 4, &mut out).0, 0.0);
        let mut fresh = Sampler::new(params);
        for _ in 0..50 {
            assert_eq!(s.sample(&logits), fresh.sample(&logits));
        }
        // Fewer slots than candidates: the best ones. Greedy: the argmax alone, p = 1.
        assert_eq!(s.post_probs(&logits, 1, &mut out[..2]).1, 2);
        let mut g = Sampler::new(SamplerParams {
            temp: 0.0,
            ..params
        });
        assert_eq!(g.post_probs(&logits, 0, &mut out), (1.0, 1));
        assert_eq!(out[0].id, 0);
        assert_eq!(g.post_probs(&logits, 1, &mut out).0, 0.0);
    }

    #[test]
    fn top_n_returns_best_first() {
        let mut out = [Candidate { id: 0, logit: 0.0 }; 3];
        let n = top_n(&[0.1, 0.9, 0.5, 0.7, -1.0], &mut out);
        assert_eq!(n, 3);
        assert_eq!([out[0].id, out[1].id, out[2].id], [1, 3, 2]);
    }
}
