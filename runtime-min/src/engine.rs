//! Loading a model under a budget: the memory plan, then weights, tokenizer and session.
//!
//! The plan is computed from the GGUF header alone, before a weight byte is read, and
//! printed; if it does not fit `--budget` the error says what is needed, what was given
//! and the largest context that would fit.
use core::fmt::Write;

use crate::arena::Arena;
use crate::commands::out::Mib;
use crate::gguf::Gguf;
use crate::model::{Config, Session, SessionOptions};

/// Memory the process needs outside the arena: code, stacks, libc, worker threads.
pub const PROCESS_OVERHEAD: u64 = 8 << 20;

/// Where the memory goes, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub header: u64,
    pub tokenizer: u64,
    pub weights: u64,
    pub kv_and_scratch: u64,
    pub overhead: u64,
    pub budget: Option<u64>,
    /// Weight bytes read from storage per generated token (0 when all resident).
    pub streamed_per_token: u64,
}

impl Plan {
    pub fn total(&self) -> u64 {
        self.header + self.tokenizer + self.weights + self.kv_and_scratch + self.overhead
    }
    pub fn fits(&self) -> bool {
        self.budget.is_none_or(|b| self.total() <= b)
    }
    /// Bytes the arena region must hold.
    pub fn arena_bytes(&self) -> u64 {
        self.total() - self.overhead
    }

    /// Print the plan as a small table.
    pub fn print(&self, w: &mut dyn Write, cfg: &Config, s: &SessionOptions) -> core::fmt::Result {
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
        writeln!(w, "  weights (resident)      {:>12}", Mib(self.weights))?;
        writeln!(
            w,
            "  kv cache + scratch      {:>12}",
            Mib(self.kv_and_scratch)
        )?;
        writeln!(
            w,
            "  tokenizer + header      {:>12}",
            Mib(self.tokenizer + self.header)
        )?;
        writeln!(w, "  process overhead        {:>12}", Mib(self.overhead))?;
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
        writeln!(
            w,
            "  read from storage per token: {} (all weights resident)",
            Mib(self.streamed_per_token)
        )
    }
}

/// Bytes of the tensors a dense model loads (tied output counted once), with the
/// arena's 64-byte alignment per tensor.
pub fn weight_bytes(g: &Gguf) -> u64 {
    g.tensors().map(|t| t.bytes + 64).sum()
}

/// Compute the plan for a model and session options.
pub fn plan(
    g: &Gguf,
    cfg: &Config,
    s: &SessionOptions,
    header: u64,
    tokenizer: u64,
    budget: Option<u64>,
) -> Plan {
    Plan {
        header,
        tokenizer,
        weights: weight_bytes(g),
        kv_and_scratch: Session::bytes_needed(cfg, s) as u64,
        overhead: PROCESS_OVERHEAD,
        budget,
        streamed_per_token: 0,
    }
}

/// The largest context (multiple of 256, at least 256) that fits `budget` with the rest
/// of the plan unchanged, if any.
pub fn max_ctx_that_fits(
    g: &Gguf,
    cfg: &Config,
    s: &SessionOptions,
    header: u64,
    tokenizer: u64,
    budget: u64,
) -> Option<usize> {
    let mut best = None;
    let mut n = 256;
    while n <= s.n_ctx {
        let mut t = *s;
        t.n_ctx = n;
        if plan(g, cfg, &t, header, tokenizer, Some(budget)).fits() {
            best = Some(n);
        } else {
            break;
        }
        n += 256;
    }
    best
}

/// A budget that the plan exceeds.
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
            "the model needs {} but --budget is {}",
            Mib(self.needed),
            Mib(self.given)
        )?;
        match self.max_ctx {
            Some(c) => write!(f, "; it would fit with -c {c}"),
            None => write!(
                f,
                "; a smaller context does not help (weight streaming is not available yet)"
            ),
        }
    }
}

/// Check the plan against the budget.
pub fn check_budget(
    p: &Plan,
    g: &Gguf,
    cfg: &Config,
    s: &SessionOptions,
) -> Result<(), OverBudget> {
    match p.budget {
        Some(b) if !p.fits() => Err(OverBudget {
            needed: p.total(),
            given: b,
            max_ctx: max_ctx_that_fits(g, cfg, s, p.header, p.tokenizer, b),
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
