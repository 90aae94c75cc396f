//! Token sampling as llama.cpp's default chain does it (commit 0c1e570,
//! `common_sampler` with its default sampler order, which llama-server, llama-cli and
//! llama-cpp-python's `Llama.sample` all follow when DRY, top-n-sigma, typical-p and XTC
//! are off, as pinch has them):
//!
//! 1. penalties: over the last `repeat_last_n` tokens of the context (prompt included),
//!    a token seen `c` times gets `l <= 0 ? l * repeat : l / repeat`, then
//!    `- (c * frequency + presence)`;
//! 2. top-k (`top_k = 0`: off), which leaves the candidates sorted best first;
//! 3. top-p on the softmax of the *untempered* logits (f32 sums in candidate order): the
//!    shortest best-first prefix whose cumulative probability reaches `top_p`;
//! 4. min-p on the untempered logits: keep `l >= l_max + ln(min_p)`;
//! 5. temperature: every logit divided by `temp`;
//! 6. `dist`: `e_i = expf(l_i - l_max)` summed in f64, one `uniform_real_distribution
//!    <double>` draw `u` from a `std::mt19937` seeded with the seed ([`Mt19937`]), and
//!    the first candidate whose running f64 sum reaches `u * sum` (one draw per token,
//!    also when one candidate is left).
//!
//! The order of the candidates matters for that running sum: top-k, top-p and a sorted
//! min-p keep them best first; with neither top-k nor top-p they stay in token-id order,
//! as in llama.cpp. `temp <= 0` is greedy: the argmax of the penalised logits (the
//! first maximum), no random number drawn.
//!
//! A bounded min-heap keeps the best `top_k + d` candidates while the logits stream by
//! (`d` distinct recent tokens; no sort of the 262,144-entry vocabulary). Penalties
//! only change the recent tokens' scores, so the penalised top-k is within the raw top
//! `k + d` when they only lower scores, and within that plus the recent tokens when a
//! negative penalty raises some: the top-k is exact either way. Without top-k the
//! candidate set is the whole vocabulary when it fits in [`MAX_CANDIDATES`], else its
//! [`MAX_CANDIDATES`] best tokens (in id order), and what needs the rest streams over
//! the logits again: top-p's normaliser, and the draw when neither top-p nor min-p cut
//! inside the candidates. pinch approximates llama.cpp only where a set larger than
//! [`MAX_CANDIDATES`] must be kept sorted: a top-p nucleus beyond them (cut at them),
//! or a top-k above them.
use crate::mt19937::Mt19937;
use core::cmp::Ordering;

/// Most candidates kept by the heap.
pub const MAX_CANDIDATES: usize = 2048;
/// Longest repetition window.
pub const MAX_RECENT: usize = 1024;

/// llama.cpp's `LLAMA_DEFAULT_SEED` (`-s -1`): draw a random seed
/// ([`SamplerParams::resolve_seed`]).
pub const RANDOM_SEED: u64 = 0xFFFF_FFFF;

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
    /// The window all three penalties count tokens in (llama.cpp's `penalty_last_n`);
    /// 0: penalties off.
    pub repeat_last_n: usize,
    /// Subtracted once from every token seen in the window (0: off).
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window (0: off).
    pub frequency_penalty: f32,
    /// The RNG's seed; its low 32 bits seed the `mt19937` (llama.cpp's seeds are
    /// 32-bit).
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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0x5eed,
        }
    }
}

impl SamplerParams {
    /// [`RANDOM_SEED`] replaced by a seed made from `entropy` (e.g. the clock in ns, as
    /// llama.cpp falls back to when `std::random_device` is not a true RNG); any other
    /// seed is kept.
    pub fn resolve_seed(self, entropy: u64) -> SamplerParams {
        if self.seed as u32 != RANDOM_SEED as u32 {
            return self;
        }
        // Fold the clock's 64 bits into 32, never giving RANDOM_SEED back.
        let s = (entropy ^ (entropy >> 32)) as u32;
        SamplerParams {
            seed: u64::from(if s == u32::MAX { 0 } else { s }),
            ..self
        }
    }

    /// Whether the penalties change anything (llama.cpp's `is_disabled`, negated).
    fn penalties_on(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }

    /// Whether a penalty can raise a score (a repeat penalty below 1, a negative
    /// presence or frequency penalty).
    fn penalties_can_raise(&self) -> bool {
        self.repeat_penalty < 1.0 || self.presence_penalty < 0.0 || self.frequency_penalty < 0.0
    }
}

/// A candidate token and its (penalised) logit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
}

/// A candidate inside the chain: its logit at the current stage and a probability
/// figure (top-p's normalised softmax, then the draw's unnormalised `e_i`).
#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    logit: f32,
    p: f32,
}

/// The sampler state: settings, RNG, recent tokens and candidate storage.
pub struct Sampler {
    pub params: SamplerParams,
    rng: Mt19937,
    recent: heapless::Deque<u32, MAX_RECENT>,
    /// How often each token occurs in `recent`, sorted by id.
    counts: heapless::Vec<(u32, u32), MAX_RECENT>,
    /// The candidates the chain left (after [`Self::chain`]).
    cands: heapless::Vec<Cand, MAX_CANDIDATES>,
    /// `Some(floor)` when the chain left more tokens than `cands` holds (no top-k or
    /// top-p on a vocabulary above [`MAX_CANDIDATES`]): all tokens whose penalised
    /// logit is at least `floor`, which the draw walks over the logits for.
    rest: Option<f32>,
}

/// Best first; equal logits by id (llama.cpp leaves their order to `std::partial_sort`).
fn best_first(a: &Cand, b: &Cand) -> Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Sampler {
        Sampler {
            params,
            rng: Mt19937::new(params.seed as u32),
            recent: heapless::Deque::new(),
            counts: heapless::Vec::new(),
            cands: heapless::Vec::new(),
            rest: None,
        }
    }

    /// Record a token that is now part of the context (prompt or generated).
    pub fn accept(&mut self, id: u32) {
        let n = self.params.repeat_last_n.min(MAX_RECENT);
        if n == 0 {
            return;
        }
        while self.recent.len() >= n {
            if let Some(old) = self.recent.pop_front() {
                self.count_down(old);
            }
        }
        let _ = self.recent.push_back(id);
        match self.counts.binary_search_by_key(&id, |&(t, _)| t) {
            Ok(i) => self.counts[i].1 += 1,
            Err(i) => {
                let _ = self.counts.insert(i, (id, 1));
            }
        }
    }

    fn count_down(&mut self, id: u32) {
        if let Ok(i) = self.counts.binary_search_by_key(&id, |&(t, _)| t) {
            self.counts[i].1 -= 1;
            if self.counts[i].1 == 0 {
                self.counts.remove(i);
            }
        }
    }

    /// Forget recent tokens (new conversation).
    pub fn reset(&mut self) {
        self.recent.clear();
        self.counts.clear();
    }

    /// Occurrences of `id` in the window.
    fn count(&self, id: u32) -> u32 {
        self.counts
            .binary_search_by_key(&id, |&(t, _)| t)
            .map_or(0, |i| self.counts[i].1)
    }

    /// `logit` after the penalties for a token seen `count` times.
    fn penalise(&self, count: u32, logit: f32) -> f32 {
        if count == 0 {
            return logit;
        }
        let p = &self.params;
        let l = if logit <= 0.0 {
            logit * p.repeat_penalty
        } else {
            logit / p.repeat_penalty
        };
        l - (count as f32 * p.frequency_penalty + p.presence_penalty)
    }

    /// Pick the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temp <= 0.0 {
            return self.greedy(logits);
        }
        let (n, sum) = self.chain(logits);
        self.draw(logits, n, sum)
    }

    /// Pick the next token where a draft proposed `draft` (speculative decoding with a
    /// deterministic draft). As in llama.cpp's speculative decoding, the position is
    /// sampled as usual, and the draft is kept when it is the token drawn: one draw a
    /// position, so the tokens are those of plain decoding with the same seed (and
    /// [`Self::greedy`]'s at temperature 0).
    pub fn sample_with_draft(&mut self, logits: &[f32], _draft: u32) -> u32 {
        self.sample(logits)
    }

    /// The `dist` step: one uniform double, then the first candidate whose running f64
    /// sum of `e_i` reaches `u * sum`. A single candidate still takes a draw (as
    /// llama.cpp, which keeps its RNG in step with its backend sampler that way).
    fn draw(&mut self, logits: &[f32], n: usize, sum: f64) -> u32 {
        if n == 0 {
            return 0;
        }
        let u = self.rng.next_f64();
        if let Some(floor) = self.rest {
            return self.draw_over_logits(logits, floor, sum * u);
        }
        if n == 1 {
            return self.cands[0].id;
        }
        let target = sum * u;
        let mut run = 0.0f64;
        for c in &self.cands[..n] {
            run += c.p as f64;
            if run >= target {
                return c.id;
            }
        }
        self.cands[n - 1].id
    }

    /// The draw over every token with a penalised logit of at least `floor`, in id
    /// order: the first whose running f64 sum of `e_i` reaches `target`.
    fn draw_over_logits(&self, logits: &[f32], floor: f32, target: f64) -> u32 {
        let (temp, max) = (self.params.temp, self.max_logit(false));
        let mut run = 0.0f64;
        let mut last = None;
        let mut found = None;
        self.for_each_penalised(logits, |id, l| {
            if found.is_some() || l < floor {
                return;
            }
            run += libm::expf(l / temp - max) as f64;
            last = Some(id);
            if run >= target {
                found = Some(id);
            }
        });
        found.or(last).unwrap_or(0)
    }

    /// `f(id, penalised logit)` for every token, in id order.
    fn for_each_penalised(&self, logits: &[f32], mut f: impl FnMut(u32, f32)) {
        let penalties = self.params.penalties_on() && !self.counts.is_empty();
        let mut j = 0;
        for (i, &l) in logits.iter().enumerate() {
            let id = i as u32;
            let mut v = l;
            if penalties {
                while j < self.counts.len() && self.counts[j].0 < id {
                    j += 1;
                }
                if j < self.counts.len() && self.counts[j].0 == id {
                    v = self.penalise(self.counts[j].1, l);
                }
            }
            f(id, v);
        }
    }

    /// Run the chain up to the draw: the candidates left are `self.cands[..n]`, their
    /// logits divided by the temperature and their `e_i` in `p`; returns `n` and the
    /// f64 sum of the `e_i`.
    fn chain(&mut self, logits: &[f32]) -> (usize, f64) {
        let p = self.params;
        let mut sorted = self.candidates(logits);
        if p.top_p < 1.0 && !self.cands.is_empty() {
            self.top_p(logits, sorted);
            sorted = true;
        }
        if p.min_p > 0.0 && !self.cands.is_empty() {
            self.min_p(sorted);
        }
        for c in self.cands.iter_mut() {
            c.logit /= p.temp;
        }
        let max = self.max_logit(sorted);
        let mut sum = 0.0f64;
        for c in self.cands.iter_mut() {
            c.p = libm::expf(c.logit - max);
            sum += c.p as f64;
        }
        if let Some(floor) = self.rest {
            // The sum over every token left, in id order (the candidates are in id
            // order too, and hold the largest logit).
            sum = 0.0;
            self.for_each_penalised(logits, |_, l| {
                if l >= floor {
                    sum += libm::expf(l / p.temp - max) as f64;
                }
            });
        }
        (self.cands.len(), sum)
    }

    /// The first logit when sorted, else the largest.
    fn max_logit(&self, sorted: bool) -> f32 {
        match (sorted, self.cands.first()) {
            (_, None) => 0.0,
            (true, Some(c)) => c.logit,
            (false, Some(c)) => self.cands.iter().fold(c.logit, |m, c| m.max(c.logit)),
        }
    }

    /// Penalties and top-k into `self.cands`; returns whether they are sorted best
    /// first (top-k on) or in id order (off).
    fn candidates(&mut self, logits: &[f32]) -> bool {
        let p = self.params;
        let penalties = p.penalties_on() && !self.counts.is_empty();
        let d = if penalties { self.counts.len() } else { 0 };
        let all = logits.len();
        self.rest = None;
        if p.top_k == 0 && all <= MAX_CANDIDATES {
            // The whole vocabulary, in id order.
            let mut cands = core::mem::take(&mut self.cands);
            cands.clear();
            self.for_each_penalised(logits, |id, logit| {
                let _ = cands.push(Cand { id, logit, p: 0.0 });
            });
            self.cands = cands;
            return false;
        }
        let k = if p.top_k == 0 {
            MAX_CANDIDATES.saturating_sub(2 * d).max(1)
        } else {
            p.top_k.min(all).min(MAX_CANDIDATES)
        };
        self.collect_top(logits, (k + d).min(MAX_CANDIDATES));
        if penalties && p.penalties_can_raise() {
            // A recent token below the raw top k + d may rise into the top k.
            self.cands.sort_unstable_by_key(|c| c.id);
            let have = self.cands.len();
            for ci in 0..self.counts.len() {
                let id = self.counts[ci].0;
                let Some(&l) = logits.get(id as usize) else {
                    continue;
                };
                if self.cands[..have]
                    .binary_search_by_key(&id, |c| c.id)
                    .is_err()
                {
                    let _ = self.cands.push(Cand {
                        id,
                        logit: l,
                        p: 0.0,
                    });
                }
            }
        }
        if penalties {
            for i in 0..self.cands.len() {
                let c = self.cands[i];
                self.cands[i].logit = self.penalise(self.count(c.id), c.logit);
            }
        }
        self.cands.sort_unstable_by(best_first);
        self.cands.truncate(k);
        if p.top_k == 0 {
            // Without top-k llama.cpp keeps the vocabulary's order; the rest of it
            // stays reachable through `rest`.
            self.cands.sort_unstable_by_key(|c| c.id);
            self.rest = Some(f32::NEG_INFINITY);
            return false;
        }
        true
    }

    /// Top-p: softmax of the current logits (f32, summed in candidate order: over the
    /// whole vocabulary in id order when `rest` says the candidates are its best),
    /// then the best-first prefix whose f32 running sum of probabilities reaches
    /// `top_p`. A prefix longer than the candidates is cut at them (approximate).
    fn top_p(&mut self, logits: &[f32], sorted: bool) {
        let max = self.max_logit(sorted);
        let mut sum = 0.0f32;
        for c in self.cands.iter_mut() {
            c.p = libm::expf(c.logit - max);
            sum += c.p;
        }
        if self.rest.take().is_some() {
            sum = 0.0;
            self.for_each_penalised(logits, |_, l| sum += libm::expf(l - max));
        }
        for c in self.cands.iter_mut() {
            c.p /= sum;
        }
        if !sorted {
            self.cands.sort_unstable_by(best_first);
        }
        let mut cum = 0.0f32;
        for i in 0..self.cands.len() {
            cum += self.cands[i].p;
            if cum >= self.params.top_p {
                self.cands.truncate(i + 1);
                break;
            }
        }
    }

    /// Min-p: keep the candidates with `logit >= max + ln(min_p)` (in their order).
    fn min_p(&mut self, sorted: bool) {
        let floor = self.max_logit(sorted) + libm::logf(self.params.min_p);
        if sorted {
            // The first always stays.
            let keep = 1 + self.cands[1..]
                .iter()
                .take_while(|c| c.logit >= floor)
                .count();
            self.cands.truncate(keep);
        } else {
            let before = self.cands.len();
            self.cands.retain(|c| c.logit >= floor);
            if self.rest.is_some() {
                // Complete when it cut some candidates, else the rest is filtered in
                // the draw.
                self.rest = (self.cands.len() == before).then_some(floor);
            }
        }
    }

    /// The distribution [`Self::sample`] draws from (after the whole chain), as
    /// llama-server's `post_sampling_probs` reports it: the probability of `chosen` (0
    /// when the cuts removed it) and the best `out.len()` candidates, best first, with
    /// their probability in `logit`; returns the chosen token's probability and how
    /// many candidates were written. Greedy sampling (`temp <= 0`) leaves one
    /// candidate, the argmax, with probability 1.
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
        let (n, sum) = self.chain(logits);
        if n == 0 || sum.is_nan() || sum <= 0.0 {
            return (0.0, 0);
        }
        // As llama.cpp normalises them: e_i / sum in f64, stored as f32 (1 alone).
        let alone = n == 1 && self.rest.is_none();
        for c in self.cands.iter_mut() {
            c.p = if alone {
                1.0
            } else {
                (c.p as f64 / sum) as f32
            };
        }
        let mut p_chosen = self
            .cands
            .iter()
            .find(|c| c.id == chosen)
            .map_or(0.0, |c| c.p);
        if let (0.0, Some(floor), Some(&l)) = (p_chosen, self.rest, logits.get(chosen as usize)) {
            // A token beyond the candidates, still in the draw.
            let l = self.penalise(self.count(chosen), l);
            if l >= floor {
                let max = self.max_logit(false);
                p_chosen = (libm::expf(l / self.params.temp - max) as f64 / sum) as f32;
            }
        }
        self.cands.sort_unstable_by(|a, b| {
            b.p.partial_cmp(&a.p)
                .unwrap_or(Ordering::Equal)
                .then(a.id.cmp(&b.id))
        });
        let k = out.len().min(n);
        for (o, c) in out.iter_mut().zip(&self.cands[..k]) {
            *o = Candidate {
                id: c.id,
                logit: c.p,
            };
        }
        (p_chosen, k)
    }

    /// Argmax of the penalised logits; the first maximum wins ties (as llama.cpp).
    pub fn greedy(&self, logits: &[f32]) -> u32 {
        let mut best = 0u32;
        let mut best_v = f32::NEG_INFINITY;
        self.for_each_penalised(logits, |id, v| {
            if v > best_v {
                best_v = v;
                best = id;
            }
        });
        best
    }

    /// Keep the `keep` largest raw logits in `self.cands` (a min-heap by logit).
    fn collect_top(&mut self, logits: &[f32], keep: usize) {
        let heap = &mut self.cands;
        heap.clear();
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() {
                continue;
            }
            let c = Cand {
                id: i as u32,
                logit: l,
                p: 0.0,
            };
            if heap.len() < keep {
                let _ = heap.push(c);
                let last = heap.len() - 1;
                sift_up(heap, last);
            } else if keep > 0 && l > heap[0].logit {
                heap[0] = c;
                sift_down(heap, 0);
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

fn sift_up(h: &mut [Cand], mut i: usize) {
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

fn sift_down(h: &mut [Cand], mut i: usize) {
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
            ..Default::default()
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
            ..Default::default()
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

    /// Speculative sampling with a deterministic draft draws what plain sampling draws
    /// with the same seed, token for token, whatever the draft (likely, unlikely, or
    /// outside the candidates): one draw a position, as llama.cpp's speculative decoding.
    #[test]
    fn sampling_with_a_draft_draws_the_plain_tokens() {
        let logits: [f32; 8] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -9.0];
        let params = SamplerParams {
            temp: 0.9,
            top_k: 6,
            top_p: 0.97,
            min_p: 0.0,
            repeat_penalty: 1.1,
            repeat_last_n: 8,
            seed: 11,
            ..Default::default()
        };
        let run = |draft: Option<u32>| {
            let mut s = Sampler::new(params);
            s.accept(1);
            (0..500)
                .map(|_| {
                    let t = match draft {
                        Some(d) => s.sample_with_draft(&logits, d),
                        None => s.sample(&logits),
                    };
                    s.accept(t);
                    t
                })
                .collect::<heapless::Vec<u32, 500>>()
        };
        let plain = run(None);
        for d in [0u32, 3, 7] {
            assert_eq!(run(Some(d)), plain, "draft {d}");
        }
        // Tokens top-k cuts never appear; the draws are not all one token.
        assert!(!plain.contains(&7) && !plain.contains(&6));
        assert!(plain.iter().any(|&t| t != plain[0]));
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
            ..Default::default()
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
