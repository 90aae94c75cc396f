//! `pinch tune`'s choice: from what was measured on the device to a recommended command
//! line, its predicted tokens/s and the ceiling the storage sets.
//!
//! Everything here is a pure function of its inputs: the [`Measurements`] (storage,
//! memory, cores, the model's kernels timed at 1..N threads), the [`ModelFacts`] and a
//! [`Planner`] that says what a choice costs in memory and reads (the real one wraps
//! `engine::plan`; tests use a fake). The command that measures is
//! `commands::tune`; the file the choice is written to is [`profile`].
//!
//! # The model of a token's time
//! A generated token costs the matrix products of every layer and of the head (measured
//! per thread count: `layer_secs`, `head_secs`) plus the reads of what is streamed: the
//! plan's bytes per token at the direct sequential read speed, and for a MoE model with
//! an expert pool the missed experts at the random read speed. The two are added: the
//! stream engine reads on an I/O thread while the workers compute, but on the machine
//! this was checked on (2 busy cores) a streamed Gemma 3 270M ran at the sum of the two
//! times, not at the larger one (3.2 tok/s measured; the sum predicted 3.6, the overlap
//! 7.2), so no overlap is credited. The ceiling is what the storage alone allows (read
//! speed / bytes per token).
use crate::model::KvType;

pub mod profile;

/// Thread counts tune measures at most (1..=this).
pub const MAX_THREADS: usize = 16;
/// Prompt batch sizes tune chooses from, largest first.
pub const BATCHES: [usize; 4] = [64, 32, 16, 8];
/// A larger batch is kept while its scratch raises the bytes streamed per generated
/// token by at most this share over the smallest batch's.
const BATCH_STREAM_SLACK: f64 = 0.05;
/// Pruned head sizes tune may propose for a large vocabulary, largest first.
pub const HEAD_ROWS: [usize; 3] = [32768, 16384, 8192];
/// A pruned head is proposed only when it makes generation this much faster.
const HEAD_GAIN: f64 = 1.5;
/// Fewer threads are preferred while within this share of the best prediction.
const THREAD_TIE: f64 = 0.02;
/// Smallest context tune lowers `-c` to when nothing else fits.
const MIN_CTX: usize = 256;

/// What `pinch tune` measured on the device.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurements {
    /// Direct (uncached) sequential 1 MiB reads of the model file, bytes/s.
    pub seq_read_bps: f64,
    /// Direct random 1 MiB reads of the model file, bytes/s.
    pub rand_read_bps: f64,
    /// Memory the OS could still give (`None`: unknown).
    pub available: Option<u64>,
    /// The memory guard's floor (`--guard`; 0: off).
    pub guard_floor: u64,
    /// Cores (workers) the engine can run on.
    pub cores: usize,
    /// Seconds of one token's layer matrices (all layers; a MoE layer's routed experts
    /// counted for the experts a token uses) at `i + 1` threads.
    pub layer_secs: heapless::Vec<f64, MAX_THREADS>,
    /// Seconds of one token's full LM head at `i + 1` threads.
    pub head_secs: heapless::Vec<f64, MAX_THREADS>,
}

/// A MoE model's routed experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeFacts {
    pub moe_layers: usize,
    pub n_expert: usize,
    pub n_used: usize,
    /// Bytes of one expert (its gate, up and down rows).
    pub expert_bytes: u64,
}

/// What tune knows of the model without planning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelFacts {
    /// Rows of the LM head (the vocabulary).
    pub head_rows: usize,
    /// The context the command would use by default (and the largest tune considers).
    pub n_ctx: usize,
    pub moe: Option<MoeFacts>,
}

/// One set of settings tune may recommend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub threads: usize,
    /// `--budget` (`None`: no cap).
    pub budget: Option<u64>,
    pub batch: usize,
    /// `--head-rows` (0: the full head).
    pub head_rows: usize,
    pub kv: KvType,
    /// Expert slots per MoE layer (0: no pool; dense models).
    pub expert_pool: usize,
    pub ctx: usize,
}

/// What a [`Planner`] says a choice costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanCost {
    /// Whether a plan fits the choice's budget.
    pub fits: bool,
    /// The plan's total memory (when it does not fit: the least any plan needs).
    pub total: u64,
    /// Weight bytes read from storage per generated token.
    pub streamed_per_token: u64,
}

/// The memory plan of a choice (`engine::plan` for a real model).
pub trait Planner {
    fn cost(&self, c: &Choice) -> PlanCost;
}

/// What limits the predicted speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The matrix products (nothing streamed, or reads hidden behind them).
    Compute,
    /// Reads from storage.
    Storage,
}

/// The recommendation and its prediction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recommendation {
    pub choice: Choice,
    pub predicted_tps: f64,
    /// Tokens/s the storage alone allows (`None`: nothing is read per token).
    pub ceiling_tps: Option<f64>,
    pub bound: Bound,
    pub streamed_per_token: u64,
    /// The plan's total memory.
    pub total: u64,
    /// Memory tune planned within: the smaller of `--budget` and what the guard leaves.
    pub usable: Option<u64>,
    /// The best prediction with the full head, when a pruned head was chosen.
    pub full_head_tps: Option<f64>,
}

/// Why tune cannot recommend anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TuneError {
    /// No kernel timing was measured.
    NoTimings,
    /// Not even every weight streamed with the smallest batch and context fits.
    NoFit { needed: u64, usable: u64 },
}

impl core::fmt::Display for TuneError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TuneError::NoTimings => write!(f, "no kernel timings were measured"),
            TuneError::NoFit { needed, usable } => write!(
                f,
                "the model needs at least {} MiB (every weight streamed, batch 8, context {MIN_CTX}) but only {} MiB is usable (the budget, or available memory less the guard's floor)",
                needed.div_ceil(1 << 20),
                usable >> 20
            ),
        }
    }
}

/// Memory tune may plan within: `--budget` and what the guard leaves of available
/// memory, the smaller of the two (`None`: neither is known).
pub fn usable_memory(m: &Measurements, user_budget: Option<u64>) -> Option<u64> {
    let left = m.available.map(|a| a.saturating_sub(m.guard_floor));
    match (user_budget, left) {
        (Some(b), Some(l)) => Some(b.min(l)),
        (b, l) => b.or(l),
    }
}

/// The predicted seconds of one generated token: `compute` seconds of matrix products
/// and `read` seconds of storage reads, added (see the module doc); storage-bound when
/// the reads are the larger part.
fn token_secs(compute: f64, read: f64) -> (f64, Bound) {
    let bound = if read > compute {
        Bound::Storage
    } else {
        Bound::Compute
    };
    (compute + read, bound)
}

/// The prediction for `c` at its thread count.
struct Predicted {
    tps: f64,
    bound: Bound,
    ceiling: Option<f64>,
}

fn predict(m: &Measurements, f: &ModelFacts, c: &Choice, cost: &PlanCost) -> Option<Predicted> {
    let i = c.threads.checked_sub(1)?;
    let layers = *m.layer_secs.get(i)?;
    let head = *m.head_secs.get(i)?;
    let head_share = if c.head_rows == 0 || f.head_rows == 0 {
        1.0
    } else {
        c.head_rows.min(f.head_rows) as f64 / f.head_rows as f64
    };
    let compute = layers + head * head_share;
    let (read, bytes) = match (f.moe, c.expert_pool > 0) {
        // With a pool the experts are paged and the rest is resident: a token reads
        // the experts it uses that are not in the pool, each a random read. Routing is
        // taken as uniform: a used expert is in the pool pool / n_expert of the time.
        (Some(moe), true) => {
            let held = c.expert_pool.min(moe.n_expert) as f64 / moe.n_expert.max(1) as f64;
            let missed = (moe.moe_layers * moe.n_used) as f64 * (1.0 - held);
            let bytes = missed * moe.expert_bytes as f64;
            (bytes / m.rand_read_bps.max(1.0), bytes)
        }
        _ => {
            let bytes = cost.streamed_per_token as f64;
            (bytes / m.seq_read_bps.max(1.0), bytes)
        }
    };
    let (t, bound) = token_secs(compute, read);
    Some(Predicted {
        tps: 1.0 / t.max(1e-9),
        bound,
        ceiling: (bytes > 0.0).then(|| 1.0 / (read.max(1e-12))),
    })
}

/// The thread count with the best prediction for `c` (fewer threads on a near tie).
fn best_threads(
    m: &Measurements,
    f: &ModelFacts,
    c: &Choice,
    cost: &PlanCost,
) -> Option<(usize, Predicted)> {
    let n = m.cores.min(m.layer_secs.len()).min(m.head_secs.len());
    let mut all: heapless::Vec<(usize, Predicted), MAX_THREADS> = heapless::Vec::new();
    for t in 1..=n {
        if let Some(p) = predict(m, f, &Choice { threads: t, ..*c }, cost) {
            let _ = all.push((t, p));
        }
    }
    let best = all.iter().map(|(_, p)| p.tps).fold(0.0f64, f64::max);
    let i = all
        .iter()
        .position(|(_, p)| p.tps >= best * (1.0 - THREAD_TIE))?;
    let (t, p) = all.swap_remove(i);
    Some((t, p))
}

/// The expert pool for a MoE model whose plan streams: as many slots per MoE layer as
/// the memory left over the least plan (`least`: every weight streamed, which keeps
/// the dense parts' zones) holds, at least the experts a token uses, at most all.
fn expert_pool(f: &ModelFacts, usable: Option<u64>, cost: &PlanCost, least: u64) -> usize {
    let Some(moe) = f.moe else { return 0 };
    if cost.streamed_per_token == 0 {
        return 0;
    }
    let left = usable.map_or(0, |u| u.saturating_sub(least));
    let per_slot = (moe.moe_layers as u64 * moe.expert_bytes).max(1);
    ((left / per_slot) as usize).clamp(moe.n_used.max(1), moe.n_expert.max(1))
}

/// The budget to recommend for a plan: its total rounded up to whole MiB, never above
/// what is usable.
fn budget_for(total: u64, usable: Option<u64>) -> u64 {
    let mib = 1u64 << 20;
    let b = total.div_ceil(mib) * mib;
    usable.map_or(b, |u| b.min(u / mib * mib).max(total))
}

/// Recommend settings from the measurements. `user_budget` is tune's `--budget` (the
/// most the recommendation may use); `ctx` starts at `facts.n_ctx` and is lowered only
/// when no plan fits otherwise.
///
/// # Errors
/// [`TuneError::NoTimings`] without kernel timings; [`TuneError::NoFit`] when not even
/// the smallest batch and context with every weight streamed fits.
pub fn recommend(
    m: &Measurements,
    facts: &ModelFacts,
    planner: &dyn Planner,
    user_budget: Option<u64>,
) -> Result<Recommendation, TuneError> {
    if m.layer_secs.is_empty() || m.head_secs.is_empty() {
        return Err(TuneError::NoTimings);
    }
    let usable = usable_memory(m, user_budget);
    let base = Choice {
        threads: 1,
        budget: usable,
        batch: BATCHES[BATCHES.len() - 1],
        head_rows: 0,
        kv: KvType::F16,
        expert_pool: 0,
        ctx: facts.n_ctx.max(1),
    };
    // The context: the default one, halved while even the smallest batch does not fit.
    let mut c = base;
    loop {
        let cost = planner.cost(&c);
        if cost.fits {
            break;
        }
        if c.ctx <= MIN_CTX {
            return Err(TuneError::NoFit {
                needed: cost.total,
                usable: usable.unwrap_or(0),
            });
        }
        c.ctx = (c.ctx / 2).max(MIN_CTX);
    }
    let full = best_for_head(m, facts, planner, usable, c, 0).ok_or(TuneError::NoTimings)?;
    // A pruned head, when the full one is streamed and pruning is much faster.
    let mut best = full;
    let mut pruned = false;
    if full.streamed_per_token > 0 {
        for &rows in HEAD_ROWS.iter().filter(|&&r| r < facts.head_rows / 2) {
            if let Some(r) = best_for_head(m, facts, planner, usable, c, rows) {
                if r.predicted_tps >= HEAD_GAIN * full.predicted_tps
                    && r.predicted_tps > best.predicted_tps
                {
                    best = r;
                    pruned = true;
                }
                break;
            }
        }
    }
    if pruned {
        best.full_head_tps = Some(full.predicted_tps);
    }
    Ok(best)
}

/// The best batch, threads and expert pool for context `c.ctx` and head `head_rows`, if
/// a plan fits.
fn best_for_head(
    m: &Measurements,
    facts: &ModelFacts,
    planner: &dyn Planner,
    usable: Option<u64>,
    c: Choice,
    head_rows: usize,
) -> Option<Recommendation> {
    let c = Choice { head_rows, ..c };
    let smallest = planner.cost(&c);
    if !smallest.fits {
        return None;
    }
    let limit = smallest.streamed_per_token as f64 * (1.0 + BATCH_STREAM_SLACK);
    let (batch, cost) = BATCHES
        .iter()
        .map(|&b| (b, planner.cost(&Choice { batch: b, ..c })))
        .find(|(_, k)| k.fits && k.streamed_per_token as f64 <= limit)
        .unwrap_or((c.batch, smallest));
    let mut c = Choice { batch, ..c };
    let least = planner
        .cost(&Choice {
            budget: Some(0),
            ..c
        })
        .total;
    c.expert_pool = expert_pool(facts, usable, &cost, least);
    let (threads, p) = best_threads(m, facts, &c, &cost)?;
    c.threads = threads;
    c.budget = Some(budget_for(cost.total, usable));
    Some(Recommendation {
        choice: c,
        predicted_tps: p.tps,
        ceiling_tps: p.ceiling,
        bound: p.bound,
        streamed_per_token: cost.streamed_per_token,
        total: cost.total,
        usable,
        full_head_tps: None,
    })
}

#[cfg(test)]
mod tests;
