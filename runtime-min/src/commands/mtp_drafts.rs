//! Setting up drafts from the model's MTP block (`crate::model::mtp`) for `run`, `chat`
//! and `serve`: whether the file has a block pinch runs, the plan that keeps the whole
//! LM head beside it, and loading it into the session. Where any step says no, prompt
//! lookup drafts instead, with a note saying why.
use core::fmt::Write;

use crate::arena::Arena;
use crate::cli::{Opts, SpecType};
use crate::engine::Plan;
use crate::gguf::Gguf;
use crate::model::mtp::{self, Mtp, MtpWeights, NoMtp};
use crate::model::{Config, Loader, Session, SessionOptions, Weights};
use crate::platform::Platform;

use super::out::Out;

/// The index of the block that drafts for `n_draft` drafted tokens, unless
/// `--spec-type lookup` or the file says otherwise (then a note, see [`note`]).
pub fn choose<P: Platform>(
    p: &P,
    o: &Opts,
    g: &Gguf,
    cfg: &Config,
    n_draft: usize,
    n_seq: usize,
) -> Option<usize> {
    if n_draft == 0 || o.spec_type == Some(SpecType::Lookup) {
        return None;
    }
    match mtp::block_index(g, cfg) {
        Ok(il) if n_seq <= 1 => Some(il),
        Ok(_) => {
            note(p, o, NoMtp::Parallel);
            None
        }
        Err(why) => {
            note(p, o, why);
            None
        }
    }
}

/// The plan with block `il`'s weights, KV cache and buffers and the whole LM head
/// resident (each drafted token reads it; layers stream first): `plan_keeping(extra
/// bytes, keep_head)` makes it. `None` (and a note) when that does not fit the budget:
/// the block is then not loaded and takes nothing from it.
pub fn plan<P: Platform>(
    p: &P,
    o: &Opts,
    g: &Gguf,
    cfg: &Config,
    s: &SessionOptions,
    il: usize,
    plan_keeping: &dyn Fn(u64, bool) -> Plan,
) -> Option<Plan> {
    let bytes = mtp::weight_bytes(g, il) + Mtp::bytes_needed(cfg, il, s) as u64;
    let with = plan_keeping(bytes, true);
    if with.possible && with.fits() && !with.res.head_streams() {
        return Some(with);
    }
    note(p, o, NoMtp::HeadStreamed);
    None
}

/// Load block `il` and let `sess` draft up to `n_draft` tokens from it; false (and a note naming what is
/// wrong) when it cannot: a block that does not load costs its drafts, not the run.
#[allow(clippy::too_many_arguments)]
pub fn attach<'a, P: Platform>(
    p: &P,
    o: &Opts,
    file: &P::File,
    g: &Gguf,
    cfg: &Config,
    il: usize,
    n_draft: usize,
    weights: &Weights<'a>,
    sess: &mut Session<'_, 'a>,
    arena: &mut Arena<'a>,
) -> bool {
    // The plan keeps the head; a head pruned at load is resident too.
    if weights.head_stream.is_some() {
        note(p, o, NoMtp::HeadStreamed);
        return false;
    }
    let mut loader = Loader {
        platform: p,
        file,
        gguf: g,
        arena,
    };
    let m = MtpWeights::load(&mut loader, cfg, il)
        .and_then(|w| Mtp::new(arena, w, cfg, il, &sess.opts));
    let attached = match m {
        Ok(m) => sess.attach_mtp(m).map_err(|why| note(p, o, why)).is_ok(),
        Err(e) => {
            let _ = writeln!(
                Out::stderr(p),
                "note: no MTP drafts: its block (blk.{il}) does not load: {e}; prompt lookup drafts instead"
            );
            false
        }
    };
    if attached && (o.verbose || o.budget.is_some()) {
        let _ = writeln!(
            Out::stderr(p),
            "  drafts: the model's MTP block (blk.{il}), up to {n_draft} tokens per pass"
        );
    }
    attached
}

/// Say why the model's MTP block does not draft (prompt lookup does instead): always
/// when `--spec-type mtp` asked for it; with `-v` or a printed plan (`--budget`) when
/// the file has a block.
fn note<P: Platform>(p: &P, o: &Opts, why: NoMtp) {
    let asked = o.spec_type == Some(SpecType::Mtp);
    if asked || ((o.verbose || o.budget.is_some()) && why != NoMtp::Absent) {
        let _ = writeln!(
            Out::stderr(p),
            "note: no MTP drafts: {}; prompt lookup drafts instead",
            why.says()
        );
    }
}
