//! `pinch bench`: prompt-processing and generation tokens/s, llama-bench style.
use core::fmt::Write;

use super::out::{Mib, Out};
use super::{secs, AppError, Ctx};
use crate::model::Logits;
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
    let _ = writeln!(out, "| model | size | threads | test | t/s |");
    let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: |");
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
            let _ = writeln!(
                out,
                "| {} | {} | {t} | {label} | {m:.2} ± {sd:.2} |",
                ctx.cfg.arch.name(),
                Mib(size)
            );
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
    if o.json {
        let _ = writeln!(out, "{json}],\"peak_rss\":{}}}", p.peak_rss().unwrap_or(0));
    }
    Ok(())
}
