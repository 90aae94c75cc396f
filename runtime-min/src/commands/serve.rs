//! `pinch serve`: carve the server's buffers from the arena, listen, and run the server
//! loop ([`crate::server`]) until the process is stopped.
use core::fmt::Write;

use super::out::Out;
use super::{AppError, Ctx};
use crate::guard::MemoryGuard;
use crate::model::forward::MAX_SEQS;
use crate::platform::Platform;
use crate::server::gen::{self, Bufs, Lane, SeqCache, Setup};
use crate::server::json::{MAX_MESSAGES, MAX_TOP};
use crate::server::{http, Info, Io, MAX_BODY, MAX_SLOTS, SPARE_SLOTS};

/// The model id clients see: the file name without directories and `.gguf`.
pub fn model_id(path: &str) -> &str {
    let name = path.rsplit(['/', '\\']).next().unwrap_or(path);
    name.strip_suffix(".gguf").unwrap_or(name)
}

/// Bytes of arena `serve` takes for its buffers at context `n_ctx` (the plan counts
/// them so a `--budget` that fits the model also fits the server).
/// (`n_ctx` is a generation slot's context; `--parallel N` carves N lanes.)
pub fn buffer_bytes(o: &crate::cli::Opts, n_ctx: usize, tok: &crate::tokenizer::Tokenizer) -> u64 {
    let n_par = n_parallel(o);
    let (queue, n_slots) = connections(o, n_par);
    let _ = queue;
    let stride = MAX_TOP + 1;
    let limit = gen::prompt_limit(n_ctx);
    let shared = [
        n_slots * (http::MAX_HEAD + MAX_BODY),
        tok.scratch_bytes(limit),
        crate::server::constrain::bytes(tok.n_vocab() as usize),
    ];
    let per_lane = [
        2 * (MAX_BODY + 64 * MAX_MESSAGES),
        4 * n_ctx,
        (n_ctx * 16).clamp(64 << 10, 1 << 20),
        4 * n_ctx * stride,
        4 * n_ctx * stride,
        4 * n_ctx,
        4 * tok.n_vocab() as usize,
        crate::server::constrain::slot_bytes(tok.n_vocab() as usize),
    ];
    let sum = |v: &[usize]| v.iter().map(|&b| b as u64 + 64).sum::<u64>();
    sum(&shared) + n_par as u64 * sum(&per_lane)
}

/// Generation slots: `--parallel N` (at most the session's most sequences).
pub fn n_parallel(o: &crate::cli::Opts) -> usize {
    o.serve.parallel.clamp(1, crate::model::forward::MAX_SEQS)
}

/// Requests that may wait, and connection slots: the running, the waiting and
/// [`SPARE_SLOTS`] more.
fn connections(o: &crate::cli::Opts, n_par: usize) -> (usize, usize) {
    let queue = o.queue.min(MAX_SLOTS - n_par - SPARE_SLOTS);
    (queue, queue + n_par + SPARE_SLOTS)
}

/// One generation slot's buffers.
fn lane<'a, P: Platform>(ctx: &mut Ctx<'_, 'a, '_, P>, n_ctx: usize) -> Result<Lane<'a>, AppError> {
    let a = "server";
    let stride = MAX_TOP + 1;
    Ok(Lane {
        // Each half holds a whole body's strings, plus the template's text per message.
        text: ctx.arena.bytes(a, 2 * (MAX_BODY + 64 * MAX_MESSAGES))?,
        tokens: ctx.arena.slice::<u32>(a, n_ctx)?,
        out: ctx.arena.bytes(a, (n_ctx * 16).clamp(64 << 10, 1 << 20))?,
        rec_id: ctx.arena.slice::<u32>(a, n_ctx * stride)?,
        rec_lp: ctx.arena.slice::<f32>(a, n_ctx * stride)?,
        logits: ctx.arena.slice::<f32>(a, ctx.tok.n_vocab() as usize)?,
        grammar: crate::server::constrain::SlotGrammar::carve(
            ctx.arena,
            ctx.tok.n_vocab() as usize,
        )?,
    })
}

/// `pinch serve`.
pub fn serve<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let (p, o, g) = (ctx.p, ctx.o, ctx.g);
    // A generation slot's context (`-c` split across `--parallel` slots).
    let n_ctx = ctx.sess.opts.n_ctx;
    // The session holds one sequence per slot (`session_options`).
    let n_par = ctx.sess.n_seq();
    let (queue, n_slots) = connections(o, n_par);
    let slot_bytes = http::MAX_HEAD + MAX_BODY;
    let a = "server";
    let before = ctx.arena.used();
    let conns = ctx.arena.bytes(a, n_slots * slot_bytes)?;
    let limit = gen::prompt_limit(n_ctx);
    let mut bufs = Bufs {
        scratch: ctx.arena.bytes(a, ctx.tok.scratch_bytes(limit))?,
        prompt_limit: limit,
        grammar: crate::server::constrain::GrammarBufs::carve(ctx.arena, ctx.tok)?,
    };
    let mut lanes: heapless::Vec<Lane<'_>, MAX_SEQS> = heapless::Vec::new();
    let mut seqs: heapless::Vec<SeqCache<'_>, MAX_SEQS> = heapless::Vec::new();
    for seq in (0..n_par).rev() {
        let _ = lanes.push(lane(ctx, n_ctx)?);
        let cache = ctx.arena.slice::<u32>(a, n_ctx)?;
        let _ = seqs.push(SeqCache {
            seq,
            cache,
            n_cached: 0,
        });
    }
    let server_bytes = ctx.arena.used() - before;
    let sf = o.serve;
    // `--chat-template NAME|FILE|JINJA`, `--chat-template-file FILE`, else the model's
    // own Jinja template, else the format llama.cpp detects, else (no template at all)
    // the architecture's format or ChatML, as llama-server.
    let setup = Setup {
        template: super::run::select_template(ctx)?,
        no_bos: o.no_bos,
        verbose: o.verbose,
    };
    let path = o.model.unwrap_or("");
    // `--alias a,b,c`: the first name in sort order is the id (as llama-server).
    let id = match sf.alias {
        Some(a) => a
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .min()
            .unwrap_or(model_id(path)),
        None => model_id(path),
    };
    let file_name = path.rsplit(['/', '\\']).next().unwrap_or(path);
    let info = Info {
        model_id: id,
        aliases: [path, file_name, g.get_str("general.name").unwrap_or("")],
        budget: o.budget,
        n_ctx,
        path,
        alias: sf.alias,
        api_key: sf.api_key,
        n_parallel: n_par,
        webui: !sf.no_webui,
        slots: !sf.no_slots,
        metrics: !sf.no_metrics,
        cors_local_only: sf.cors_origins == Some("localhost"),
        tags: sf.tags,
        start_unix: p.unix_time_s(),
        verbose: o.verbose,
        n_predict: o.n_predict,
        seed: o.sampler.seed,
    };
    // `--host a,b`: every address on the same port (the first one's when `--port 0`).
    let mut listeners: heapless::Vec<crate::platform::Socket, { crate::server::MAX_LISTEN }> =
        heapless::Vec::new();
    let mut port = o.port;
    for host in o.host.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match p.tcp_listen(host, port) {
            Ok((l, bound)) if listeners.push(l).is_ok() => port = bound,
            Ok(_) => return Err(AppError::Usage("at most 4 addresses in --host")),
            Err(e) => {
                let _ = writeln!(Out::stderr(p), "pinch: cannot listen on {host}:{port}: {e}");
                return Err(AppError::Usage("could not listen on --host/--port"));
            }
        }
    }
    if listeners.is_empty() {
        return Err(AppError::Usage("--host names no address"));
    }
    let _ = writeln!(
        Out::stderr(p),
        "pinch: serving {id} on http://{}:{port}/ (context {n_ctx}{}, queue {queue}, {} KiB of server buffers)",
        o.host,
        match n_par {
            1 => heapless::String::<32>::new(),
            n => {
                let mut s = heapless::String::new();
                let _ = write!(s, " in each of {n} slots");
                s
            }
        },
        server_bytes >> 10
    );
    let mut io = Io::new(p, &listeners, conns.chunks_mut(slot_bytes), queue, info);
    // Idle: sleep 1 ms after activity, backing off to 10 ms, so an idle server costs
    // next to nothing and a new request waits at most 10 ms.
    let mut idle = 0u32;
    if n_par > 1 {
        crate::server::batch::serve(ctx, setup, &mut io, &mut bufs, lanes, seqs);
    }
    let (Some(mut lane), Some(mut seq)) = (lanes.pop(), seqs.pop()) else {
        return Err(AppError::Usage("no generation slot"));
    };
    let mut guard = MemoryGuard::from_opt(o.guard);
    loop {
        let busy = io.poll();
        if let Some(i) = io.start_next() {
            let g = &mut guard;
            crate::server::answer::serve_one(
                ctx, setup, &mut io, &mut bufs, &mut lane, &mut seq, g, i,
            );
            idle = 0;
            continue;
        }
        if busy {
            idle = 0;
        } else {
            idle = (idle + 1).min(10);
            p.sleep_ms(idle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_id_is_the_file_stem() {
        assert_eq!(model_id("/a/b/tiny-qwen3-Q8_0.gguf"), "tiny-qwen3-Q8_0");
        assert_eq!(model_id("m.bin"), "m.bin");
        assert_eq!(model_id(""), "");
    }
}
