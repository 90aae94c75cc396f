//! The expert pager's part of a command: the plan's per-layer pools, the run options
//! (`--policy`, `--moe-prefetch`, `--moe-warm`, `--moe-trace`, `--moe-bias`,
//! `--experts`) before the command, and its counts and files after it.
//!
//! `--moe-bias` and `--experts` change which experts run, so their output is not the
//! model's: before the command, a short text is evaluated exactly and with them, and the
//! KL divergence of the logits is printed beside the hit rates of both runs. Both start
//! from the pools a first exact pass over the text left (full, as a run's are after its
//! first tokens): `--moe-bias` favours what is in memory, so from empty pools it would
//! favour the first token's experts, whatever the pool size.
use core::fmt::Write;

use super::out::{Mib, Out};
use super::{AppError, Ctx};
use crate::gguf::Gguf;
use crate::model::Logits;
use crate::pager::{PagerStats, Routing};
use crate::platform::Platform;
use crate::residency::ResidencyPlan;

/// The text `--moe-bias` / `--experts` are measured on.
const COST_TEXT: &str = "The history of computing is longer than the history of computing hardware and modern computing technology, and includes methods intended for pen and paper.";
/// Most positions of the cost text (the exact run's log-probabilities are kept).
const COST_TOKENS: usize = 24;

/// Per MoE layer: pool size in experts and MiB; bytes read per token and the ceiling.
pub fn print_plan(
    w: &mut dyn Write,
    g: &Gguf,
    n_layer: usize,
    r: &ResidencyPlan,
    read_bw: Option<u64>,
) {
    let e = r.experts;
    if !e.pages() {
        return;
    }
    let _ = writeln!(
        w,
        "  experts paged: a pool of {} of {} experts in each of {} MoE layers, {} staging slots and one transient slot ({})",
        e.slots,
        e.n_expert,
        e.layers,
        crate::pager::paged::staging_slots(e.n_expert, e.n_used),
        Mib(e.bytes)
    );
    for (il, slot, read) in crate::residency::expert_layers(g, n_layer) {
        let _ = writeln!(
            w,
            "    layer {il:>3}: {:>4} experts {:>12}, one expert read {}",
            e.slots,
            Mib(e.slots as u64 * slot),
            Mib(read)
        );
    }
    let (uni, worst) = (e.uniform_read_per_token(), e.worst_read_per_token());
    let _ = write!(
        w,
        "  experts read per token: {} if routing were uniform, {} if every pick missed",
        Mib(uni),
        Mib(worst)
    );
    match read_bw {
        Some(bw) => {
            let _ = writeln!(
                w,
                "; at {:.0} MB/s the ceiling is {:.2} tok/s ({:.2} at worst)",
                bw as f64 / 1e6,
                bw as f64 / uni.max(1) as f64,
                bw as f64 / worst.max(1) as f64
            );
        }
        None => {
            let _ = writeln!(w, " (measure a trace: --moe-trace, then pinch moe-sim)");
        }
    }
}

/// Apply the run options before the command.
pub fn setup<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let moe = o.moe;
    let Some(x) = ctx.sess.experts_mut() else {
        if moe != crate::cli::MoeOpts::default() {
            return Err(AppError::Usage(
                "--moe-* and --experts need a mixture-of-experts model",
            ));
        }
        return Ok(());
    };
    x.set_policy(o.moe_policy);
    x.prefetch = moe.prefetch;
    if let Some(n) = moe.readers {
        x.readers = n.max(1);
    }
    let routing = Routing {
        n_used: moe.experts,
        resident_bias: moe.bias,
    };
    if routing != Routing::default() {
        measure_cost(ctx, routing)?;
    }
    if let Some(path) = moe.warm {
        warm_start(ctx, path)?;
    }
    if let Some(x) = ctx.sess.experts_mut() {
        x.routing = routing;
    }
    if moe.trace.is_some() {
        let picks = moe
            .experts
            .or(ctx.cfg.moe.map(|m| m.n_used))
            .unwrap_or(1)
            .min(ctx.cfg.moe.map_or(1, |m| m.n_used));
        let n_moe = ctx.sess.experts().map_or(1, |x| x.n_moe());
        let len = crate::pager::trace::HEADER + ctx.sess.opts.n_ctx * 2 * n_moe * picks;
        let buf = ctx.arena.bytes("moe trace", len)?;
        if let Some(x) = ctx.sess.experts_mut() {
            x.record_trace(buf, picks)?;
        }
    }
    Ok(())
}

/// Evaluate the cost text exactly and with `routing`; print the KL divergence.
fn measure_cost<P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    routing: Routing,
) -> Result<(), AppError> {
    let nv = ctx.cfg.n_vocab;
    let mut ids = [0u32; 512];
    let scratch = ctx.arena.bytes("moe cost", 64 << 10)?;
    let n = ctx
        .tok
        .encode(COST_TEXT, false, false, scratch, &mut ids)
        .map_err(AppError::Tokenizer)?;
    let room = ctx.arena.remaining().saturating_sub(256) / (4 * nv.max(1));
    let t = n.min(COST_TOKENS).min(room).min(ctx.sess.opts.n_ctx);
    let mut err = Out::stderr(ctx.p);
    if t < 2 {
        let _ = writeln!(
            err,
            "moe cost: not measured (no memory left for the exact logits)"
        );
        return Ok(());
    }
    let exact: &mut [f32] = ctx.arena.slice("moe cost", t * nv)?;
    let p = ctx.p;
    let stats_of = |ctx: &Ctx<'_, '_, '_, P>| {
        ctx.sess
            .experts()
            .map_or(PagerStats::default(), |x| x.total())
    };
    // One token at a time, as generation goes: the pools' contents matter. A first
    // exact pass fills the pools; the measured exact pass and the changed one then
    // start from full pools (the session is reset between passes, the pools are not).
    ctx.sess.reset();
    for id in &ids[..t] {
        ctx.sess.eval(p, &[*id], Logits::Last, &mut |_, _| {})?;
    }
    let s0 = stats_of(ctx);
    ctx.sess.reset();
    for (i, id) in ids[..t].iter().enumerate() {
        ctx.sess.eval(p, &[*id], Logits::Last, &mut |_, l| {
            log_softmax(l, &mut exact[i * nv..(i + 1) * nv]);
        })?;
    }
    let s1 = stats_of(ctx);
    let policy = ctx.o.moe_policy;
    if let Some(x) = ctx.sess.experts_mut() {
        x.routing = routing;
    }
    ctx.sess.reset();
    let mut kl = 0.0f64;
    let mut same_top = 0usize;
    for (i, id) in ids[..t].iter().enumerate() {
        ctx.sess.eval(p, &[*id], Logits::Last, &mut |_, l| {
            let lp = &exact[i * nv..(i + 1) * nv];
            kl += kl_from(lp, l);
            same_top += (argmax(lp) == argmax(l)) as usize;
        })?;
    }
    let s2 = stats_of(ctx);
    let (mut a, mut b) = (s1, s2);
    sub(&mut a, &s0);
    sub(&mut b, &s1);
    let _ = writeln!(
        err,
        "moe cost of --moe-bias {} --experts {}: KL(exact || this) = {:.5} nats per token over {t} tokens, top-1 agreement {:.1} %; hit rate {:.1} % -> {:.1} %, expert reads {} -> {}",
        routing.resident_bias,
        routing
            .n_used
            .map_or(ctx.cfg.moe.map_or(0, |m| m.n_used), |k| k),
        (kl / t as f64).max(0.0),
        100.0 * same_top as f64 / t as f64,
        100.0 * a.hit_rate(),
        100.0 * b.hit_rate(),
        a.reads,
        b.reads
    );
    if let Some(x) = ctx.sess.experts_mut() {
        x.set_policy(policy);
    }
    ctx.sess.reset();
    Ok(())
}

fn sub(a: &mut PagerStats, b: &PagerStats) {
    a.hits -= b.hits;
    a.misses -= b.misses;
    a.reads -= b.reads;
    a.bytes -= b.bytes;
}

/// `out = log softmax(l)`.
/// The index of the largest value (the first of equals).
fn argmax(l: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best
}

fn log_softmax(l: &[f32], out: &mut [f32]) {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = l.iter().map(|&v| libm::exp((v - m) as f64)).sum();
    let lse = m as f64 + libm::log(s);
    for (o, &v) in out.iter_mut().zip(l) {
        *o = (v as f64 - lse) as f32;
    }
}

/// KL(p || q) with `lp` = log p and `l` the logits of q.
fn kl_from(lp: &[f32], l: &[f32]) -> f64 {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = l.iter().map(|&v| libm::exp((v - m) as f64)).sum();
    let lse = m as f64 + libm::log(s);
    lp.iter()
        .zip(l)
        .filter(|(a, _)| a.is_finite())
        .map(|(&a, &v)| libm::exp(a as f64) * (a as f64 - (v as f64 - lse)))
        .sum()
}

/// `--moe-warm FILE`: lines `LAYER: E E E` (most used first), if the file exists.
fn warm_start<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>, path: &str) -> Result<(), AppError> {
    if ctx.p.open(path).is_err() {
        return Ok(()); // the first run writes it
    }
    let text = super::head_select::read_file(ctx.p, ctx.arena, path)?;
    let text = core::str::from_utf8(text)
        .map_err(|_| AppError::Usage("--moe-warm: the hot list is not text"))?;
    let p = ctx.p;
    let mut placed = 0;
    for line in text.lines() {
        let Some((layer, rest)) = line.split_once(':') else {
            continue;
        };
        let il: usize = layer.trim().parse().map_err(|_| {
            AppError::Usage("--moe-warm: a line does not start with a layer number")
        })?;
        let mut hot = heapless::Vec::<u16, { crate::pager::MAX_EXPERTS }>::new();
        for w in rest.split_whitespace() {
            let e = w
                .parse()
                .map_err(|_| AppError::Usage("--moe-warm: an expert id is not a number"))?;
            let _ = hot.push(e);
        }
        if let Some(r) = ctx.sess.with_expert_io(p, |x, io| x.warm(io, il, &hot)) {
            placed += r?;
        }
    }
    let _ = writeln!(
        Out::stderr(p),
        "moe warm start: {placed} experts from {path}"
    );
    Ok(())
}

/// After the command: the pager's counts, the trace and the hot list.
pub fn finish<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let Some(x) = ctx.sess.experts() else {
        return Ok(());
    };
    let p = ctx.p;
    let mut err = Out::stderr(p);
    let tokens = ctx.sess.n_past().max(1) as f64;
    if x.pages() {
        let t = x.total();
        let per_token = t.bytes as f64 / tokens;
        let _ = write!(
            err,
            "experts: hit rate {:.1} % ({} hits, {} misses), {} reads, {} per evaluated token, reading {:.0} ms, compute waiting for experts {:.0} ms",
            100.0 * t.hit_rate(),
            t.hits,
            t.misses,
            t.reads,
            Mib(per_token as u64),
            t.read_ns as f64 / 1e6,
            t.wait_ns as f64 / 1e6,
        );
        match ctx.o.read_bw {
            Some(bw) if per_token > 0.0 => {
                let _ = writeln!(
                    err,
                    "; ceiling at {:.0} MB/s for these reads {:.2} tok/s",
                    bw as f64 / 1e6,
                    bw as f64 / per_token
                );
            }
            _ => {
                let _ = writeln!(err);
            }
        }
        if t.verified > 0 {
            let _ = writeln!(
                err,
                "experts: every one of {} expert reads verified against the file",
                t.verified
            );
        }
        if t.prefetched > 0 {
            let _ = writeln!(
                err,
                "experts prefetched: {}, of which used {} ({:.1} % of the would-be misses read ahead), evicted unused {}",
                t.prefetched,
                t.read_ahead,
                100.0 * t.read_ahead as f64 / (t.misses + t.read_ahead).max(1) as f64,
                t.prefetch_wasted
            );
        }
        if ctx.o.verbose {
            for (il, slots, _, s) in x.layers() {
                let _ = writeln!(
                    err,
                    "  layer {il:>3}: {slots} slots, hit rate {:.1} %, {} reads",
                    100.0 * s.hit_rate(),
                    s.reads
                );
            }
        }
    }
    if let (Some(path), Some(bytes)) = (ctx.o.moe.trace, x.trace_bytes()) {
        p.write_file(path, &[bytes])
            .map_err(|e| AppError::Output(name(path), e))?;
        let _ = writeln!(err, "moe trace: {} bytes to {path}", bytes.len());
    }
    if let Some(path) = ctx.o.moe.warm {
        let room = ctx.arena.remaining().min(1 << 20);
        let buf = ctx.arena.bytes("moe warm", room)?;
        let mut n = 0;
        x.hot_lists(&mut |il, ids| {
            let mut line: heapless::String<4096> = heapless::String::new();
            let _ = write!(line, "{il}:");
            for e in ids {
                let _ = write!(line, " {e}");
            }
            let _ = line.push('\n');
            if let Some(d) = buf.get_mut(n..n + line.len()) {
                d.copy_from_slice(line.as_bytes());
                n += line.len();
            }
        });
        p.write_file(path, &[&buf[..n]])
            .map_err(|e| AppError::Output(name(path), e))?;
    }
    Ok(())
}

fn name(path: &str) -> heapless::String<80> {
    let mut s = heapless::String::new();
    let _ = s.push_str(&path[..path.len().min(80)]);
    s
}
