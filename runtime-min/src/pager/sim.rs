//! Replaying a routing trace through a pool per layer: hit rates per layer and bytes
//! read per token for a pool size and policy, beside the best fixed pool of that size
//! (each layer's most used experts over the whole trace, which no online policy beats
//! by much on a stationary trace and which tells what a policy leaves on the table).
use super::pool::{Access, Policy, Pool, PoolArrays, PoolError};
use super::trace::Trace;
use super::MAX_EXPERTS;
use crate::model::config::MAX_LAYERS;

/// One MoE layer's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    pub hits: u64,
    pub misses: u64,
    /// Hits the best fixed pool of the same size would have had.
    pub best_fixed_hits: u64,
}

impl LayerStats {
    pub fn accesses(&self) -> u64 {
        self.hits + self.misses
    }
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.accesses().max(1) as f64
    }
    pub fn best_fixed_rate(&self) -> f64 {
        self.best_fixed_hits as f64 / self.accesses().max(1) as f64
    }
}

/// What a replay counted.
#[derive(Clone, Debug)]
pub struct SimReport {
    pub tokens: usize,
    pub layers: heapless::Vec<LayerStats, MAX_LAYERS>,
}

impl SimReport {
    pub fn total(&self) -> LayerStats {
        let mut t = LayerStats::default();
        for l in &self.layers {
            t.hits += l.hits;
            t.misses += l.misses;
            t.best_fixed_hits += l.best_fixed_hits;
        }
        t
    }
    /// Expert reads per token (misses), times `expert_bytes`.
    pub fn bytes_per_token(&self, expert_bytes: u64) -> f64 {
        self.total().misses as f64 * expert_bytes as f64 / self.tokens.max(1) as f64
    }
}

/// Replay `trace` with `slots` per layer under `policy`, one token at a time.
pub fn simulate(trace: &Trace, slots: usize, policy: Policy) -> Result<SimReport, PoolError> {
    simulate_from(trace, slots, policy, 0)
}

/// [`simulate`] counting from token `from` on: the tokens before it go through the
/// pools (a run's prompt) but count neither for the policy nor for the best fixed pool.
pub fn simulate_from(
    trace: &Trace,
    slots: usize,
    policy: Policy,
    from: usize,
) -> Result<SimReport, PoolError> {
    let mut report = SimReport {
        tokens: trace.tokens().saturating_sub(from),
        layers: heapless::Vec::new(),
    };
    let mut picks = [0u16; MAX_EXPERTS];
    let mut out = [Access::Hit(0); MAX_EXPERTS];
    let k = trace.picks;
    let mut mem = PoolArrays::default();
    for l in 0..trace.layers {
        let mut pool = Pool::new(trace.experts, slots, policy, mem.mem())?;
        let mut stats = LayerStats::default();
        let mut freq = [0u64; MAX_EXPERTS];
        for t in 0..trace.tokens() {
            trace.picks_of(t, l, &mut picks[..k]);
            let want = distinct(&mut picks[..k]);
            pool.access(&picks[..want], &mut out)?;
            pool.tick();
            if t < from {
                continue;
            }
            for (a, &e) in out[..want].iter().zip(&picks[..want]) {
                freq[e as usize] += 1;
                match a {
                    Access::Hit(_) => stats.hits += 1,
                    Access::Miss { .. } => stats.misses += 1,
                }
            }
        }
        stats.best_fixed_hits = top_sum(&mut freq[..trace.experts], pool.slots());
        let _ = report.layers.push(stats);
    }
    Ok(report)
}

/// Sort `ids` and drop repeats; returns how many distinct ids lead it.
fn distinct(ids: &mut [u16]) -> usize {
    ids.sort_unstable();
    let mut n = 0;
    for i in 0..ids.len() {
        if n == 0 || ids[i] != ids[n - 1] {
            ids[n] = ids[i];
            n += 1;
        }
    }
    n
}

/// The sum of the `k` largest counts.
fn top_sum(counts: &mut [u64], k: usize) -> u64 {
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts.iter().take(k).sum()
}

#[cfg(test)]
mod tests {
    use super::super::trace::TraceWriter;
    use super::*;

    /// A trace of `tokens` tokens over `experts`, two picks per token per layer, from a
    /// skewed (Zipf-like) popularity drawn by a fixed xorshift.
    fn zipf_trace(buf: &mut [u8], layers: usize, experts: usize, tokens: usize) -> usize {
        let mut w = TraceWriter::new(buf, layers, experts, 2).unwrap();
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let weights: heapless::Vec<f64, 64> =
            (0..experts).map(|i| 1.0 / (i as f64 + 1.0)).collect();
        let total: f64 = weights.iter().sum();
        for _ in 0..tokens {
            for _ in 0..layers {
                let mut pick = [0u16; 2];
                for p in pick.iter_mut() {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    let mut u = (s >> 11) as f64 / (1u64 << 53) as f64 * total;
                    let mut e = 0;
                    while e + 1 < experts && u > weights[e] {
                        u -= weights[e];
                        e += 1;
                    }
                    *p = e as u16;
                }
                w.push(&pick).unwrap();
            }
        }
        w.bytes().len()
    }

    #[test]
    fn counts_add_up_and_a_full_pool_misses_only_once_per_expert() {
        let mut buf = vec_buf();
        let n = zipf_trace(&mut buf, 2, 16, 400);
        let t = Trace::parse(&buf[..n]).unwrap();
        let full = simulate(&t, 16, Policy::LFU).unwrap();
        for l in &full.layers {
            assert!(l.misses <= 16, "{l:?}");
            assert_eq!(l.best_fixed_hits, l.accesses());
        }
        let none = simulate(&t, 0, Policy::Lru).unwrap();
        assert_eq!(none.total().hits, 0);
        assert_eq!(none.total().accesses(), full.total().accesses());
    }

    #[test]
    fn on_a_skewed_trace_lfu_beats_lru_and_nears_the_best_fixed_pool() {
        let mut buf = vec_buf();
        let n = zipf_trace(&mut buf, 1, 32, 3000);
        let t = Trace::parse(&buf[..n]).unwrap();
        let lfu = simulate(&t, 8, Policy::LFU).unwrap().total();
        let lru = simulate(&t, 8, Policy::Lru).unwrap().total();
        assert!(lfu.hit_rate() > lru.hit_rate(), "lfu {lfu:?} lru {lru:?}");
        assert!(
            lfu.best_fixed_rate() - lfu.hit_rate() < 0.05,
            "lfu {:.3} best fixed {:.3}",
            lfu.hit_rate(),
            lfu.best_fixed_rate()
        );
    }

    /// Counting from token 100 on: the first 100 tokens fill the pool (a full pool
    /// then never misses), and the counts cover only the rest.
    #[test]
    fn counting_from_a_token_skips_the_tokens_before_it() {
        let mut buf = vec_buf();
        let n = zipf_trace(&mut buf, 1, 16, 400);
        let t = Trace::parse(&buf[..n]).unwrap();
        let all = simulate(&t, 16, Policy::LFU).unwrap();
        let late = simulate_from(&t, 16, Policy::LFU, 100).unwrap();
        assert_eq!(late.tokens, 300);
        let (a, b) = (all.total(), late.total());
        assert!(
            b.accesses() < a.accesses() && b.accesses() > 0,
            "{a:?} {b:?}"
        );
        assert!(a.misses > 0);
        assert_eq!(b.best_fixed_hits, b.accesses());
        // Every expert the first 100 tokens used stays resident: few or no misses.
        assert!(b.misses <= a.misses, "{a:?} {b:?}");
        let small = simulate_from(&t, 4, Policy::LFU, 100).unwrap().total();
        assert!(small.best_fixed_hits < small.accesses());
    }

    fn vec_buf() -> [u8; 20 + 3000 * 4 * 2] {
        [0u8; 20 + 3000 * 4 * 2]
    }
}
