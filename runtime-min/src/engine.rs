//! Loading a model under a budget: the memory plan, then weights, tokenizer and session.
//!
//! The plan is computed from the GGUF header alone, before a weight byte is read, and
//! printed; if it does not fit `--budget` the error says what is needed, what was given
//! and the largest context that would fit.
use core::fmt::Write;

use crate::arena::Arena;
use crate::commands::out::Mib;
use crate::gguf::Gguf;
use crate::model::{Config, KvType, Session, SessionOptions};
use crate::residency::{self, NoPlan, ResidencyPlan, STREAM_ZONES};

/// Memory the process needs outside the arena: code, stacks, libc, worker threads.
pub const PROCESS_OVERHEAD: u64 = 8 << 20;

/// Where the memory goes, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub header: u64,
    pub tokenizer: u64,
    /// Resident weights, stream zones and the embedding-row cache.
    pub weights: u64,
    pub kv_and_scratch: u64,
    /// Of `kv_and_scratch`: the per-layer state (KV cache, recurrent state).
    pub kv: u64,
    /// The K and V cache types.
    pub kv_types: (KvType, KvType),
    /// Of `kv`: the recurrent layers' delta-rule matrices, whether they are f16
    /// (`--state-f16`), and the bytes f16 saves (or would save) on them.
    pub state_f16: bool,
    pub f16_saving: u64,
    /// The command's own buffers (the server's connection and text buffers).
    pub buffers: u64,
    pub overhead: u64,
    pub budget: Option<u64>,
    /// What is resident and what is streamed.
    pub res: ResidencyPlan,
    /// Whether some plan fits the budget (when false, `weights` is the least any plan
    /// needs: everything streamed).
    pub possible: bool,
    /// Storage read bandwidth in bytes per second (`--read-bw`), for the ceiling.
    pub read_bw: Option<u64>,
    /// Arena bytes in use at the peak of the load-time head selection (`--head-rows`,
    /// `--head`): header, tokenizer, the kept ids and the selection's scratch, which is
    /// freed before the weights are loaded; 0 without one. It must fit the budget too.
    /// The plan keeps the whole LM head resident (MTP drafts, see [`plan`]).
    pub keep_head: bool,
    pub select_peak: u64,
}

impl Plan {
    pub fn total(&self) -> u64 {
        self.header
            + self.tokenizer
            + self.weights
            + self.kv_and_scratch
            + self.buffers
            + self.overhead
    }
    pub fn fits(&self) -> bool {
        self.possible
            && self
                .budget
                .is_none_or(|b| self.total() <= b && self.select_peak + self.overhead <= b)
    }
    /// Bytes the arena region must hold.
    pub fn arena_bytes(&self) -> u64 {
        self.total() - self.overhead
    }
    /// Weight bytes read from storage per generated token.
    pub fn streamed_per_token(&self) -> u64 {
        self.res.streamed_per_pass
    }

    /// Print the plan as a small table.
    pub fn print(&self, w: &mut dyn Write, cfg: &Config, s: &SessionOptions) -> core::fmt::Result {
        let r = &self.res;
        writeln!(
            w,
            "plan: {} x {} layers, n_embd {}, vocab {}, ctx {}, batch {}, {} threads",
            cfg.arch.name(),
            cfg.n_layer,
            cfg.n_embd,
            cfg.n_vocab,
            s.n_ctx,
            s.n_batch,
            s.threads
        )?;
        let streamed = r.streamed_layers();
        if streamed == 0 {
            writeln!(
                w,
                "  layers: all {} resident           {:>12}",
                r.n_layer,
                Mib(r.layer_bytes)
            )?;
        } else {
            writeln!(
                w,
                "  layers: {} resident, {} streamed  {:>12} resident",
                r.resident_layers,
                streamed,
                Mib(r.layer_bytes)
            )?;
        }
        let head_streamed = r.head_rows - r.head_resident_rows;
        if head_streamed == 0 {
            writeln!(
                w,
                "  LM head: {} rows resident       {:>12}",
                r.head_rows,
                Mib(r.head_bytes)
            )?;
        } else {
            writeln!(
                w,
                "  LM head: {} of {} rows resident {:>12}, the rest streamed in {} chunks of {} rows",
                r.head_resident_rows,
                r.head_rows,
                Mib(r.head_bytes),
                r.head_chunks(),
                r.head_chunk_rows
            )?;
        }
        if r.embd_cache_bytes > 0 {
            writeln!(
                w,
                "  input embeddings: rows read on demand, cache {:.1} KiB",
                r.embd_cache_bytes as f64 / 1024.0
            )?;
        } else {
            writeln!(w, "  input embeddings: rows of the resident tied head")?;
        }
        writeln!(w, "  norms and biases        {:>12}", Mib(r.vector_bytes))?;
        if r.streams() {
            writeln!(
                w,
                "  stream zones            {:>12}  ({} x {})",
                Mib(r.zone_total()),
                STREAM_ZONES,
                Mib(r.zone_bytes)
            )?;
        }
        writeln!(
            w,
            "  kv cache + scratch      {:>12}",
            Mib(self.kv_and_scratch)
        )?;
        writeln!(
            w,
            "    of which layer state  {:>12}  (KV cache K {}, V {})",
            Mib(self.kv),
            self.kv_types.0.name(),
            self.kv_types.1.name()
        )?;
        if self.f16_saving > 0 {
            if self.state_f16 {
                writeln!(
                    w,
                    "      recurrent state in f16 (--state-f16): {} less than f32",
                    Mib(self.f16_saving)
                )?;
            } else {
                writeln!(
                    w,
                    "      recurrent state in f32 (--state-f16 would save {})",
                    Mib(self.f16_saving)
                )?;
            }
        }
        if self.buffers > 0 {
            writeln!(w, "  server buffers          {:>12}", Mib(self.buffers))?;
        }
        writeln!(
            w,
            "  tokenizer + header      {:>12}",
            Mib(self.tokenizer + self.header)
        )?;
        writeln!(w, "  process overhead        {:>12}", Mib(self.overhead))?;
        if self.select_peak > 0 {
            writeln!(
                w,
                "  head selection peak     {:>12}  (scratch freed before loading)",
                Mib(self.select_peak + self.overhead)
            )?;
        }
        write!(w, "  total                   {:>12}", Mib(self.total()))?;
        match self.budget {
            Some(b) => writeln!(
                w,
                "  of budget {} ({})",
                Mib(b),
                if self.fits() { "fits" } else { "DOES NOT FIT" }
            )?,
            None => writeln!(w, "  (no --budget)")?,
        }
        let per = self.streamed_per_token();
        if per == 0 && r.experts.pages() {
            return writeln!(
                w,
                "  read from storage per token: only paged experts (below)"
            );
        }
        if per == 0 {
            return writeln!(w, "  read from storage per token: 0 (all weights resident)");
        }
        write!(w, "  read from storage per token: {}", Mib(per))?;
        match self.read_bw {
            Some(bw) => writeln!(
                w,
                "; at {:.0} MB/s (--read-bw) the ceiling is {:.2} tok/s",
                bw as f64 / 1e6,
                bw as f64 / per as f64
            ),
            None => writeln!(
                w,
                "; ceiling = read bandwidth / this (measure it: pinch bench --storage FILE, then --read-bw)"
            ),
        }
    }
}

/// Compute the plan for a model and session options: everything resident if it fits
/// `budget`, else the residency plan that streams the least (`keep_head`: the least
/// that keeps the whole LM head resident, see [`residency::plan_with`]).
#[allow(clippy::too_many_arguments)]
pub fn plan(
    g: &Gguf,
    cfg: &Config,
    s: &SessionOptions,
    header: u64,
    tokenizer: u64,
    budget: Option<u64>,
    pruned_rows: Option<usize>,
    read_bw: Option<u64>,
    buffers: u64,
    select_peak: u64,
    keep_head: bool,
) -> Plan {
    // A pruned head (at load, or a recut file's) adds its id list, logits scratch and
    // the tokenizer's mask of kept ids.
    let head_k = pruned_rows.or_else(|| g.get_array(crate::head::KEY_IDS).map(|a| a.len()));
    let mask = cfg.n_vocab.div_ceil(64) * 8 + 64;
    let kv_and_scratch = Session::bytes_needed(cfg, s) as u64
        + head_k.map_or(0, |k| {
            (k * s.head_group.max(1) * 4 + k * 4 + 128 + mask) as u64
        });
    let fixed = header + tokenizer + kv_and_scratch + buffers + PROCESS_OVERHEAD;
    let weight_budget = budget.map(|b| b.saturating_sub(fixed));
    let (res, possible, weights) =
        match residency::plan_with(g, cfg, weight_budget, pruned_rows, keep_head) {
            Ok(r) => (r, true, r.bytes()),
            Err(NoPlan { min_bytes }) => (ResidencyPlan::default(), false, min_bytes),
        };
    Plan {
        header,
        tokenizer,
        weights,
        kv_and_scratch,
        kv: Session::state_bytes_needed(cfg, s) as u64,
        kv_types: (s.kv, s.kv_v),
        state_f16: s.state_f16,
        f16_saving: crate::model::hybrid::state_f16_saving(cfg) as u64,
        buffers,
        overhead: PROCESS_OVERHEAD,
        budget,
        res,
        possible,
        read_bw,
        select_peak,
        keep_head,
    }
}

/// The largest context (multiple of 256, at least 256) that fits `budget` with the rest
/// of the plan unchanged, if any.
pub fn max_ctx_that_fits(
    g: &Gguf,
    cfg: &Config,
    s: &SessionOptions,
    p: &Plan,
    pruned_rows: Option<usize>,
) -> Option<usize> {
    let mut best = None;
    let mut n = 256;
    while n <= s.n_ctx {
        let mut t = *s;
        t.n_ctx = n;
        // The server's buffers grow with the context (approximately linearly).
        let buffers = p.buffers * n as u64 / s.n_ctx.max(1) as u64;
        let q = plan(
            g,
            cfg,
            &t,
            p.header,
            p.tokenizer,
            p.budget,
            pruned_rows,
            None,
            buffers,
            p.select_peak,
            p.keep_head,
        );
        if q.fits() {
            best = Some(n);
        } else {
            break;
        }
        n += 256;
    }
    best
}

/// A budget that no plan fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverBudget {
    pub needed: u64,
    pub given: u64,
    pub max_ctx: Option<usize>,
}

impl core::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "the model needs at least {} (every weight streamed) but --budget is {}",
            Mib(self.needed),
            Mib(self.given)
        )?;
        match self.max_ctx {
            Some(c) => write!(f, "; it would fit with -c {c}"),
            None => write!(f, "; a smaller context does not help"),
        }
    }
}

/// Check the plan against the budget.
pub fn check_budget(
    p: &Plan,
    g: &Gguf,
    cfg: &Config,
    s: &SessionOptions,
    pruned_rows: Option<usize>,
) -> Result<(), OverBudget> {
    match p.budget {
        Some(b) if !p.fits() => Err(OverBudget {
            needed: p.total(),
            given: b,
            max_ctx: max_ctx_that_fits(g, cfg, s, p, pruned_rows),
        }),
        _ => Ok(()),
    }
}

/// Copy `header` into the arena so everything the engine keeps is accounted for.
pub fn keep_header<'a>(
    arena: &mut Arena<'a>,
    header: &[u8],
) -> Result<&'a [u8], crate::arena::ArenaError> {
    let b = arena.bytes("gguf header", header.len())?;
    b.copy_from_slice(header);
    Ok(b)
}
