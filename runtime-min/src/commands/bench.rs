//! `pinch bench`: prompt-processing and generation tokens/s, llama-bench style; and
//! `pinch bench --storage FILE`: the storage's sequential read speed, for `--read-bw`.
use core::fmt::Write;

use super::out::{json_str, print_peak_rss, Mib, Out};
use super::{secs, AppError, Ctx};
use crate::arena::Arena;
use crate::cli::Opts;
use crate::model::{Logits, ModelError};
use crate::platform::Platform;

/// Mean and sample standard deviation.
fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (m, libm::sqrt(var))
}

pub fn bench<P: Platform>(ctx: &mut Ctx<'_, '_, '_, P>) -> Result<(), AppError> {
    let o = ctx.o;
    let p = ctx.p;
    let n_ctx = ctx.sess.opts.n_ctx;
    let toks = ctx.arena.slice::<u32>("tokens", n_ctx)?;
    // Deterministic, ordinary token ids (skip the first few hundred: specials/bytes).
    let nv = ctx.cfg.n_vocab as u32;
    for (i, t) in toks.iter_mut().enumerate() {
        *t = (1000 + (i as u32).wrapping_mul(7919)) % nv;
    }
    let threads: heapless::Vec<usize, 8> = if o.bench_t.is_empty() {
        heapless::Vec::from_slice(&[ctx.sess.opts.threads]).unwrap_or_default()
    } else {
        o.bench_t.clone()
    };
    let reps = o.bench_reps.max(1);
    let mut out = Out::stdout(p);
    // Streaming: each generated token reads this much; the storage speed sets a ceiling.
    let per_token = ctx.plan.streamed_per_token();
    let ceiling = ctx
        .plan
        .read_bw
        .map(|bw| bw as f64 / per_token.max(1) as f64);
    if per_token > 0 {
        let _ = writeln!(
            out,
            "| model | size | threads | test | t/s | read/token | plan ceiling t/s |"
        );
        let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    } else {
        let _ = writeln!(out, "| model | size | threads | test | t/s |");
        let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: |");
    }
    let size = ctx.plan.weights;
    let mut json = heapless::String::<2048>::new();
    let _ = json.push_str("{\"command\":\"bench\",\"results\":[");
    let mut first = true;
    for &t in &threads {
        ctx.sess.opts.threads = t.max(1);
        let mut tests: heapless::Vec<(usize, bool), 10> = heapless::Vec::new();
        for &pp in &o.bench_p {
            if pp > 0 {
                let _ = tests.push((pp, true));
            }
        }
        if o.n_predict > 0 {
            let _ = tests.push((o.n_predict, false));
        }
        for (n, is_pp) in tests {
            if n + o.bench_depth > n_ctx {
                let _ = writeln!(
                    Out::stderr(p),
                    "pinch bench: skipping {n} tokens: larger than -c {n_ctx}"
                );
                continue;
            }
            let mut tps = [0.0f64; 32];
            let r = reps.min(32);
            // Warm-up: one short pass so caches and pages are hot.
            ctx.sess.reset();
            ctx.sess.eval(p, &toks[..1], Logits::Last, &mut |_, _| {})?;
            for rep in tps.iter_mut().take(r) {
                ctx.sess.reset();
                // `-d N`: the test starts after N tokens already in the cache (speed
                // deep into a long answer), as llama-bench's depth.
                let d = o.bench_depth;
                if d > 0 {
                    ctx.sess.eval(p, &toks[..d], Logits::None, &mut |_, _| {})?;
                }
                let t0 = p.now_ns();
                if is_pp {
                    ctx.sess
                        .eval(p, &toks[d..d + n], Logits::Last, &mut |_, _| {})?;
                } else {
                    for i in d..d + n {
                        ctx.sess
                            .eval(p, &toks[i..i + 1], Logits::Last, &mut |_, _| {})?;
                    }
                }
                *rep = n as f64 / secs(t0, p.now_ns()).max(1e-9);
            }
            let (m, sd) = mean_sd(&tps[..r]);
            let test = if is_pp { "pp" } else { "tg" };
            let mut label = heapless::String::<24>::new();
            let _ = write!(label, "{test}{n}");
            if o.bench_depth > 0 {
                let _ = write!(label, " @ d{}", o.bench_depth);
            }
            let _ = write!(
                out,
                "| {} | {} | {t} | {label} | {m:.2} ± {sd:.2} |",
                ctx.cfg.arch.name(),
                Mib(size)
            );
            if per_token > 0 {
                let _ = write!(out, " {} |", Mib(per_token));
                match ceiling {
                    Some(c) => {
                        let _ = write!(out, " {c:.2} |");
                    }
                    None => {
                        let _ = write!(out, " (give --read-bw) |");
                    }
                }
            }
            let _ = writeln!(out);
            out.flush();
            let _ = write!(
                json,
                "{}{{\"test\":\"{test}{n}\",\"threads\":{t},\"tps\":{m:.3},\"sd\":{sd:.3},\"depth\":{}}}",
                if first { "" } else { "," },
                o.bench_depth
            );
            first = false;
        }
    }
    if ctx.sess.n_seq() > 1 && o.n_predict > 0 {
        parallel(ctx, toks, &mut out, &mut json)?;
    }
    if o.json {
        let _ = writeln!(
            out,
            "{json}],\"weight_bytes\":{size},\"stream_plan_per_token\":{per_token},\"ceiling_tps\":{:.3},\"stream_bytes\":{},\"stream_passes\":{},\"peak_rss\":{}}}",
            ceiling.unwrap_or(0.0),
            ctx.sess.stream.bytes,
            ctx.sess.stream.passes,
            p.peak_rss().unwrap_or(0)
        );
    }
    drop(out);
    print_peak_rss(p);
    Ok(())
}

/// `pinch bench --parallel N`: generation with 1, 2, 4, ... N streams decoded together
/// (one weight pass per step for all of them, as `serve --parallel N` runs): aggregate
/// and per-stream tokens/s. The stream counts alternate within each repetition, so a
/// load change on the machine touches them alike.
fn parallel<P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    toks: &[u32],
    out: &mut Out<'_, P>,
    json: &mut heapless::String<2048>,
) -> Result<(), AppError> {
    let (o, p) = (ctx.o, ctx.p);
    let n_seq = ctx.sess.n_seq();
    let n = o.n_predict.min(ctx.sess.opts.n_ctx.saturating_sub(1));
    let mut counts: heapless::Vec<usize, 8> = heapless::Vec::new();
    let mut c = 1;
    while c < n_seq {
        let _ = counts.push(c);
        c *= 2;
    }
    let _ = counts.push(n_seq);
    let reps = o.bench_reps.clamp(1, 32);
    // Per repetition, per stream count.
    let mut tps = [[0.0f64; 8]; 32];
    // `--profile`: time per kind of operation and decode step, per stream count.
    let mut prof = [[0u64; crate::model::Op::COUNT]; 8];
    let t = ctx.sess.opts.threads;
    for row in tps.iter_mut().take(reps) {
        for (ci, &streams) in counts.iter().enumerate() {
            // Every stream starts from one prompt token of its own.
            for s in 0..streams {
                ctx.sess.select_seq(s)?;
                ctx.sess.reset();
                ctx.sess
                    .eval(p, &toks[s..s + 1], Logits::Last, &mut |_, _| {})?;
            }
            let mut rows: heapless::Vec<(usize, u32), { crate::model::forward::MAX_SEQS }> =
                heapless::Vec::new();
            let before = ctx.sess.profile;
            let t0 = p.now_ns();
            for i in 0..n {
                rows.clear();
                for s in 0..streams {
                    let _ = rows.push((s, toks[(i * streams + s + 1) % toks.len()]));
                }
                ctx.sess.decode_seqs(p, &rows, &mut |_, _| {})?;
            }
            row[ci] = (streams * n) as f64 / secs(t0, p.now_ns()).max(1e-9);
            for (acc, (a, b)) in prof[ci]
                .iter_mut()
                .zip(ctx.sess.profile.ns.iter().zip(before.ns))
            {
                *acc += a - b;
            }
        }
    }
    if o.profile {
        let _ = writeln!(out, "\nms per decode step, by operation and stream count:");
        for (ci, &streams) in counts.iter().enumerate() {
            let _ = write!(out, "{streams} streams:");
            for op in crate::model::Op::ALL {
                let ms = prof[ci][op as usize] as f64 / 1e6 / (reps * n).max(1) as f64;
                if ms >= 0.005 {
                    let _ = write!(out, " {} {ms:.2};", op.name());
                }
            }
            let _ = writeln!(out);
        }
    }
    ctx.sess.select_seq(0)?;
    let _ = writeln!(
        out,
        "\n| model | threads | streams | test | aggregate t/s | per-stream t/s | vs 1 stream |"
    );
    let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let column = |ci: usize| -> [f64; 32] { core::array::from_fn(|r| tps[r][ci]) };
    let one = mean_sd(&column(0)[..reps]).0.max(1e-9);
    for (ci, &streams) in counts.iter().enumerate() {
        let (m, sd) = mean_sd(&column(ci)[..reps]);
        let _ = writeln!(
            out,
            "| {} | {t} | {streams} | tg{n} | {m:.2} ± {sd:.2} | {:.2} | {:.2}x |",
            ctx.cfg.arch.name(),
            m / streams as f64,
            m / one
        );
        let _ = write!(
            json,
            ",{{\"test\":\"tg{n}\",\"threads\":{t},\"streams\":{streams},\"tps\":{m:.3},\"sd\":{sd:.3}}}"
        );
    }
    out.flush();
    Ok(())
}

/// Bytes per read of the storage benchmark (as large as the stream engine's reads).
pub const STORAGE_CHUNK: usize = 4 << 20;
/// The storage benchmark reads at most this much of the file.
pub const STORAGE_MAX: u64 = 1 << 30;
/// Alignment of the read buffer (direct I/O needs the logical block size).
const ALIGN: usize = 4096;

/// Read the first `len` bytes of `file` in `buf`-sized chunks; the seconds it took.
fn read_pass<P: Platform>(
    p: &P,
    file: &P::File,
    buf: &mut [u8],
    len: u64,
    direct: bool,
) -> Result<f64, AppError> {
    let t0 = p.now_ns();
    let mut off = 0u64;
    while off < len {
        let want = buf.len().min((len - off) as usize);
        let n = p
            .read_at(file, off, &mut buf[..want], direct)
            .map_err(|e| AppError::Model(ModelError::Platform(e)))?;
        if n == 0 {
            return Err(AppError::Model(ModelError::ShortRead { offset: off }));
        }
        off += n as u64;
    }
    Ok(secs(t0, p.now_ns()))
}

/// `pinch bench --storage FILE`: sequential read speed of FILE (its first
/// [`STORAGE_MAX`] bytes at most) in [`STORAGE_CHUNK`] reads into an aligned buffer
/// carved from the arena: uncached (direct) reads, which is what streamed weights cost,
/// then buffered reads, first and again (the second from the page cache when it holds
/// the file). Prints the `--read-bw` value to pass to later runs. Needs no model.
pub fn storage<P: Platform>(p: &P, o: &Opts, region: &mut [u8]) -> Result<(), AppError> {
    let path = o
        .storage
        .ok_or(AppError::Usage("give the file to read with --storage FILE"))?;
    let file = p.open(path).map_err(AppError::Open)?;
    let len = p.file_size(&file).min(STORAGE_MAX);
    if len == 0 {
        return Err(AppError::Usage("the --storage file is empty"));
    }
    let mut arena = Arena::new(region);
    let raw = arena.bytes("storage bench", STORAGE_CHUNK + ALIGN)?;
    let skip = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
    let buf = &mut raw[skip..skip + STORAGE_CHUNK];
    let reps = o.bench_reps.clamp(1, 32);
    let mbps = |s: f64| len as f64 / s.max(1e-9) / 1e6;
    let mut direct = [0.0f64; 32];
    for d in direct.iter_mut().take(reps) {
        *d = mbps(read_pass(p, &file, buf, len, true)?);
    }
    let first = mbps(read_pass(p, &file, buf, len, false)?);
    let mut again = [0.0f64; 32];
    for a in again.iter_mut().take(reps) {
        *a = mbps(read_pass(p, &file, buf, len, false)?);
    }
    let (dm, dsd) = mean_sd(&direct[..reps]);
    let (am, asd) = mean_sd(&again[..reps]);
    let rate = dm.max(0.001);
    let mut out = Out::stdout(p);
    if o.json {
        let _ = write!(out, "{{\"command\":\"bench-storage\",\"file\":");
        let _ = json_str(&mut out, path);
        let _ = writeln!(
            out,
            ",\"bytes\":{len},\"chunk\":{STORAGE_CHUNK},\"reps\":{reps},\"direct_mbps\":{dm:.3},\"direct_sd\":{dsd:.3},\"buffered_first_mbps\":{first:.3},\"buffered_again_mbps\":{am:.3},\"buffered_again_sd\":{asd:.3},\"read_bw\":{},\"peak_rss\":{}}}",
            (rate * 1e6) as u64,
            p.peak_rss().unwrap_or(0)
        );
    } else {
        let _ = writeln!(
            out,
            "storage: {path}: {} read in {} MiB chunks, {reps} time(s) each",
            Mib(len),
            STORAGE_CHUNK >> 20
        );
        let _ = writeln!(out, "| read | MB/s |");
        let _ = writeln!(out, "| --- | ---: |");
        let _ = writeln!(out, "| direct (uncached) | {dm:.1} ± {dsd:.1} |");
        let _ = writeln!(out, "| buffered, first pass | {first:.1} |");
        let _ = writeln!(out, "| buffered, again | {am:.1} ± {asd:.1} |");
        let _ = write!(out, "streamed weights are read uncached: pass --read-bw ");
        if rate >= 1.0 {
            let _ = write!(out, "{}M", rate as u64);
        } else {
            let _ = write!(out, "{}", ((rate * 1e6) as u64).max(1));
        }
        let _ = writeln!(out, " to plan with this speed");
        if dm > 0.8 * am {
            let _ = writeln!(
                out,
                "note: direct reads ran at page-cache speed; this file system may not allow \
                 uncached reads (tmpfs does not), so the figure may not be the device's"
            );
        }
    }
    drop(out);
    print_peak_rss(p);
    Ok(())
}

/// Bytes the memory-bandwidth pass reads by default: past the last-level cache of the
/// CPUs pinch runs on (480 MiB on this Xeon VM, 32 MiB on the EPYC one, 512 KiB on a
/// Cortex-A55), inside the process region (1 GiB without a model). Halved until the
/// arena gives it (a small device), down to [`MEMBW_MIN`].
pub const MEMBW_BYTES: usize = 768 << 20;
/// The smallest buffer the bandwidth pass accepts.
pub const MEMBW_MIN: usize = 16 << 20;

/// The wrapping sum of `w` over eight independent lanes (the compiler vectorises it):
/// a read of every word that nothing can skip, at the speed the loads arrive.
fn sum_words(w: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = w.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*v);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, v| a.wrapping_add(*v));
    acc.iter().fold(tail, |a, v| a.wrapping_add(*v))
}

/// One read pass over `buf`, split into `threads` contiguous parts read in parallel;
/// the seconds it took and the sum (so the reads cannot be optimised away).
fn membw_pass<P: Platform>(p: &P, buf: &[u64], threads: usize) -> (f64, u64) {
    use core::sync::atomic::{AtomicU64, Ordering};
    let total = AtomicU64::new(0);
    let part = buf.len().div_ceil(threads.max(1));
    let t0 = p.now_ns();
    p.parallel(threads, &|i| {
        let lo = (i * part).min(buf.len());
        let hi = (lo + part).min(buf.len());
        total.fetch_add(sum_words(&buf[lo..hi]), Ordering::Relaxed);
    });
    (secs(t0, p.now_ns()), total.load(Ordering::Relaxed))
}

/// `pinch bench --membw [-t N] [-r R] [--membw-bytes SIZE]`: the memory read bandwidth
/// at N threads (the ceiling of generation, which reads every resident weight once per
/// token): R timed passes over [`MEMBW_BYTES`] (or SIZE) after one warm-up pass. The best pass is the ceiling
/// (`read_bw` in the JSON, bytes/s); mean and spread are printed beside it.
pub fn membw<P: Platform>(p: &P, o: &Opts, region: &mut [u8]) -> Result<(), AppError> {
    let threads = o.threads.max(1).min(p.workers().max(1));
    let mut arena = Arena::new(region);
    let asked = usize::try_from(o.membw_bytes).unwrap_or(usize::MAX);
    let mut bytes = if asked > 0 { asked } else { MEMBW_BYTES };
    let buf = loop {
        match arena.slice::<u64>("memory bandwidth buffer", bytes / 8) {
            Ok(b) => break b,
            Err(e) if asked > 0 || bytes / 2 < MEMBW_MIN => return Err(e.into()),
            Err(_) => bytes /= 2,
        }
    };
    let bytes = buf.len() * 8;
    // Touch every page with distinct values (a zero page could be shared, not read).
    for (i, w) in buf.iter_mut().enumerate() {
        *w = i as u64;
    }
    let buf = &*buf;
    let reps = o.bench_reps.clamp(1, 32);
    let (_, check) = membw_pass(p, buf, threads);
    let n = buf.len() as u64;
    if check != n.wrapping_mul(n.wrapping_sub(1)) / 2 {
        return Err(AppError::Usage("memory bandwidth pass read wrong values"));
    }
    let mut gbps = [0.0f64; 32];
    for g in gbps.iter_mut().take(reps) {
        let (s, _) = membw_pass(p, buf, threads);
        *g = bytes as f64 / s.max(1e-9) / 1e9;
    }
    let (m, sd) = mean_sd(&gbps[..reps]);
    let best = gbps[..reps].iter().copied().fold(0.0f64, f64::max);
    let mut out = Out::stdout(p);
    if o.json {
        let _ = writeln!(
            out,
            "{{\"command\":\"bench-membw\",\"threads\":{threads},\"bytes\":{bytes},\"reps\":{reps},\"mean_gbps\":{m:.3},\"sd_gbps\":{sd:.3},\"best_gbps\":{best:.3},\"read_bw\":{}}}",
            (best * 1e9) as u64
        );
    } else {
        let _ = writeln!(
            out,
            "memory read bandwidth, {threads} thread(s), {} MiB x {reps}: best {best:.2} GB/s, mean {m:.2} ± {sd:.2} GB/s",
            bytes >> 20
        );
    }
    Ok(())
}
