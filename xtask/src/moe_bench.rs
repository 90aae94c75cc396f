//! `cargo xtask bench --moe-scaled`: the expert pager (issue 13) on the scaled random MoE
//! model of `tools/gen_moe_scaled.py` (qwen3moe-shaped, 16 layers x 64 Q2_K experts,
//! top-8, Zipf-skewed routers; made in `.cache/moe-scaled/` on first use, never
//! committed), at budgets whose pools hold 100 %, 50 % and 25 % of the experts.
//!
//! Per budget and policy (LFU, LRU), prefetch off and on: tokens/s, hit rate, bytes read
//! per generated token as the OS counts them (`read_bytes` of /proc/self/io: the expert
//! reads are direct, so they reach storage even with the file in the page cache) and as
//! the pager counts them, the ceiling those bytes give at 278 MB/s (the TV box's eMMC),
//! the time the compute waited for experts, the share of would-be misses read ahead,
//! peak RSS, and whether the greedy text is the all-resident run's. Then the simulator
//! on the all-resident run's trace over the same generated tokens (best fixed pool,
//! LFU, LRU), a warm start
//! (`--moe-warm`, the hot list written by a run on another prompt), and `--moe-bias`
//! 0 / 0.03 / 0.3 with the KL divergence `pinch` measures against the exact run. Last,
//! at the smallest pool: `--moe-readers 1` against 4, on the storage as it is and with
//! an emulated per-read latency (`PINCH_READ_DELAY_US`), and `--experts N` with its KL
//! and top-1 agreement.
use crate::bench::field;
use crate::util::{root, run, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The TV box's eMMC (the figure).
const READ_BW: u64 = 278_000_000;
const PROMPT: &str = "The history of computing";
const WARM_PROMPT: &str = "A quick brown fox jumps over the lazy dog";
const GEN: usize = 64;

pub fn table(pinch: &Path) -> Result<()> {
    let model = model()?;
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let n_expert = 64;
    let resident = pinch_run(pinch, &model, None, &[])?;
    let trace = crate::util::target_dir().join("moe-scaled.trace");
    let traced = pinch_run(
        pinch,
        &model,
        None,
        &["--moe-trace", &trace.display().to_string()],
    )?;
    println!(
        "\n## Expert pager: {} (Q2_K experts, {:.2} GB), -t 2, {GEN} generated tokens after a {}-token prompt, ceiling at {} MB/s\n",
        model.file_name().unwrap_or_default().to_string_lossy(),
        std::fs::metadata(&model).map_or(0, |m| m.len()) as f64 / 1e9,
        resident.f("prompt_tokens"),
        READ_BW / 1_000_000
    );
    println!("| budget (experts held) | policy | prefetch | tok/s | hit rate (generation / whole run) | read / token (OS) | read / token (pager) | ceiling tok/s | waiting for experts / token | misses read ahead | peak RSS | text = resident |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    println!(
        "| all resident (64 of 64) | – | – | {:.2} | – | {:.1} MiB | 0 | – | – | – | {:.1} MiB | yes |",
        resident.f("gen_tps"),
        mib(resident.per_token("os_read_bytes")),
        mib(resident.f("peak_rss"))
    );
    let mut rows = Vec::new();
    for pct in [50usize, 25] {
        let slots = n_expert * pct / 100;
        let budget = budget_for(pinch, &model, slots)?;
        for policy in ["lfu", "lru"] {
            for prefetch in [false, true] {
                let mut args = vec!["--policy", policy];
                if prefetch {
                    args.push("--moe-prefetch");
                }
                let r = pinch_run(pinch, &model, Some(budget), &args)?;
                let ahead = if prefetch {
                    format!("{:.0} %", 100.0 * r.read_ahead_share())
                } else {
                    "–".into()
                };
                println!(
                    "| {:.0} MiB ({slots} of {n_expert}) | {} | {} | {:.2} | {:.1} / {:.1} % | {:.1} MiB | {:.1} MiB | {:.2} | {:.0} ms | {ahead} | {:.1} MiB | {} |",
                    mib(budget as f64),
                    policy.to_uppercase(),
                    if prefetch { "on" } else { "off" },
                    r.f("gen_tps"),
                    100.0 * r.hit_rate(),
                    r.whole,
                    mib(r.per_token("os_read_bytes")),
                    mib(r.per_token("expert_bytes")),
                    READ_BW as f64 / r.per_token("expert_bytes").max(1.0),
                    r.per_token("expert_wait_ns") / 1e6,
                    mib(r.f("peak_rss")),
                    if r.text == resident.text { "yes" } else { "NO" }
                );
            }
        }
        rows.push((pct, slots, budget));
    }
    let from = traced.f("prompt_tokens") as usize;
    println!("\nThe simulator (`pinch moe-sim`) on the all-resident run's trace, one token at a time, counting the {GEN} generated tokens (`--from {from}`: the prompt only warms the pools; the pager's rates above count the same tokens):\n");
    println!("| pool | LFU | LRU | best fixed pool |\n|---:|---:|---:|---:|");
    let mut best = Vec::new();
    for &(_, slots, _) in &rows {
        let (lfu, b) = sim(pinch, &trace, slots, "lfu", from)?;
        let (lru, _) = sim(pinch, &trace, slots, "lru", from)?;
        println!("| {slots} | {lfu:.1} % | {lru:.1} % | {b:.1} % |");
        best.push(b);
    }
    println!("\nLFU from a warm start (`--moe-warm`: the hot list a {GEN}-token run on another prompt wrote), prefetch off and on, against the best fixed pool of the generated tokens:\n");
    println!("| budget | prefetch | tok/s | hit rate (generation / whole run) | best fixed pool (generation) | read / token (OS) | misses read ahead |\n|---|---|---:|---:|---:|---:|---:|");
    for (&(pct, slots, budget), b) in rows.iter().zip(&best) {
        let hot = crate::util::target_dir().join(format!("moe-scaled-{pct}.hot"));
        let _ = std::fs::remove_file(&hot);
        let hot_s = hot.display().to_string();
        warm_up(pinch, &model, budget, &hot_s)?;
        for prefetch in [false, true] {
            let mut args = vec!["--moe-warm", hot_s.as_str()];
            if prefetch {
                args.push("--moe-prefetch");
            }
            let r = pinch_run(pinch, &model, Some(budget), &args)?;
            println!(
                "| {slots} of {n_expert} | {} | {:.2} | {:.1} / {:.1} % | {b:.1} % | {:.1} MiB | {} |",
                if prefetch { "on" } else { "off" },
                r.f("gen_tps"),
                100.0 * r.hit_rate(),
                r.whole,
                mib(r.per_token("os_read_bytes")),
                if prefetch {
                    format!("{:.0} %", 100.0 * r.read_ahead_share())
                } else {
                    "–".into()
                }
            );
        }
    }
    println!("\nCache-aware routing (`--moe-bias X`, LFU, prefetch off); KL and top-1 agreement as `pinch` measures them on its cost text against the exact run, both from the pools a first exact pass over the text filled:\n");
    println!("| budget | bias | tok/s | hit rate | read / token (OS) | KL(exact ‖ biased) nats/token | top-1 agreement | text = resident |\n|---|---:|---:|---:|---:|---:|---:|---|");
    for &(_, slots, budget) in &rows {
        for bias in ["0", "0.003", "0.03", "0.3"] {
            let r = pinch_run(pinch, &model, Some(budget), &["--moe-bias", bias])?;
            let kl = match r.kl {
                Some(kl) => format!("{kl:.5}"),
                None if bias == "0" => "0 (exact)".into(),
                None => "not printed".into(),
            };
            println!(
                "| {slots} of {n_expert} | {bias} | {:.2} | {:.1} % | {:.1} MiB | {kl} | {} | {} |",
                r.f("gen_tps"),
                100.0 * r.hit_rate(),
                mib(r.per_token("os_read_bytes")),
                r.top1.map_or("100 %".into(), |t| format!("{t:.1} %")),
                if r.text == resident.text { "yes" } else { "no" }
            );
        }
    }
    let (_, slots, budget) = rows[rows.len() - 1];
    println!("\nParallel expert reads (`--moe-readers N`, LFU, prefetch off, {slots} of {n_expert}): the storage as it is, and with `PINCH_READ_DELAY_US={DELAY_US}` (each direct read first waits {DELAY_US} us, a flash device's per-request latency; reads in flight at once each wait their own):\n");
    println!("| storage | readers | tok/s | read time / token | waiting for experts / token | text = resident |\n|---|---:|---:|---:|---:|---|");
    for delay in [None, Some(DELAY_US)] {
        for readers in ["1", "4"] {
            let d = delay.map(|us| us.to_string());
            let env: Vec<(&str, &str)> = d
                .iter()
                .map(|v| ("PINCH_READ_DELAY_US", v.as_str()))
                .collect();
            let r = pinch_run_env(
                pinch,
                &model,
                Some(budget),
                PROMPT,
                &env,
                &["--moe-readers", readers],
            )?;
            println!(
                "| {} | {readers} | {:.2} | {:.0} ms | {:.0} ms | {} |",
                delay.map_or("as is".to_string(), |us| format!("+{us} us / read")),
                r.f("gen_tps"),
                r.per_token("expert_read_ns") / 1e6,
                r.per_token("expert_wait_ns") / 1e6,
                if r.text == resident.text { "yes" } else { "NO" }
            );
        }
    }
    println!("\nFewer experts per token (`--experts N`, LFU, {slots} of {n_expert}); KL and top-1 agreement as `pinch` measures them on its cost text against the exact run:\n");
    println!("| experts per token | tok/s | hit rate | read / token (OS) | KL(exact ‖ N) nats/token | top-1 agreement |\n|---:|---:|---:|---:|---:|---:|");
    for n in ["8", "6", "4", "2"] {
        let extra: &[&str] = if n == "8" { &[] } else { &["--experts", n] };
        let r = pinch_run(pinch, &model, Some(budget), extra)?;
        println!(
            "| {n}{} | {:.2} | {:.1} % | {:.1} MiB | {} | {} |",
            if n == "8" { " (the model's)" } else { "" },
            r.f("gen_tps"),
            100.0 * r.hit_rate(),
            mib(r.per_token("os_read_bytes")),
            r.kl.map_or("0 (exact)".into(), |kl| format!("{kl:.5}")),
            r.top1.map_or("100 %".into(), |t| format!("{t:.1} %")),
        );
    }
    Ok(())
}

/// Emulated per-read latency for the parallel-reads table (the eMMC's 6 ms per random
/// 1 MB read less its transfer time at 278 MB/s is about 2.4 ms).
const DELAY_US: u64 = 2000;

/// The scaled model, generated on first use.
fn model() -> Result<PathBuf> {
    let dir = root().join(".cache/moe-scaled");
    let m = dir.join("moe-scaled-Q2_K.gguf");
    if !m.is_file() {
        let path = crate::randshape::python_path()?;
        run(Command::new("python3")
            .env("PYTHONPATH", path)
            .arg(root().join("tools/gen_moe_scaled.py"))
            .arg(&dir))?;
    }
    Ok(m)
}

/// One `pinch run`: its JSON summary, text and the KL line `--moe-bias` prints.
struct Run {
    json: String,
    text: String,
    kl: Option<f64>,
    /// The top-1 agreement with the exact run on the cost text, in %.
    top1: Option<f64>,
    /// The pager's hit rate over the whole run (prompt and generation), in %.
    whole: f64,
}

impl Run {
    fn f(&self, k: &str) -> f64 {
        field(&self.json, k).unwrap_or(0.0)
    }
    fn per_token(&self, k: &str) -> f64 {
        self.f(k) / self.f("gen_tokens").max(1.0)
    }
    fn hit_rate(&self) -> f64 {
        let h = self.f("expert_hits");
        h / (h + self.f("expert_misses")).max(1.0)
    }
    /// Misses a prefetch read ahead, of all would-be misses.
    fn read_ahead_share(&self) -> f64 {
        let a = self.f("expert_read_ahead");
        a / (a + self.f("expert_misses")).max(1.0)
    }
}

fn pinch_run(pinch: &Path, model: &Path, budget: Option<u64>, extra: &[&str]) -> Result<Run> {
    pinch_run_prompt(pinch, model, budget, PROMPT, extra)
}

fn pinch_run_prompt(
    pinch: &Path,
    model: &Path,
    budget: Option<u64>,
    prompt: &str,
    extra: &[&str],
) -> Result<Run> {
    pinch_run_env(pinch, model, budget, prompt, &[], extra)
}

/// [`pinch_run_prompt`] with environment variables `env` set.
fn pinch_run_env(
    pinch: &Path,
    model: &Path,
    budget: Option<u64>,
    prompt: &str,
    env: &[(&str, &str)],
    extra: &[&str],
) -> Result<Run> {
    let mut c = Command::new(pinch);
    c.envs(env.iter().copied());
    c.args(["run", "-m"]).arg(model).args([
        "-p",
        prompt,
        "-n",
        &GEN.to_string(),
        "-t",
        "2",
        "--temp",
        "0",
        "--ignore-eos",
        "--json",
        "--draft",
        "0",
        "--read-bw",
        &READ_BW.to_string(),
    ]);
    if let Some(b) = budget {
        c.args(["--budget", &b.to_string()]);
    }
    c.args(extra);
    eprintln!("$ pinch run --budget {budget:?} {}", extra.join(" "));
    let out = c
        .output()
        .map_err(|e| format!("{}: {e}", pinch.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("pinch run failed ({}): {stderr}", out.status));
    }
    let json = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("pinch run printed no JSON")?
        .to_string();
    let text = json
        .split("\"text\":")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let kl = stderr.lines().find_map(|l| {
        let v = l.split("KL(exact || this) = ").nth(1)?;
        v.split_whitespace().next()?.parse().ok()
    });
    let top1 = stderr.lines().find_map(|l| {
        let v = l.split("top-1 agreement ").nth(1)?;
        v.split_whitespace().next()?.parse().ok()
    });
    let whole = stderr
        .lines()
        .find_map(|l| {
            let v = l.strip_prefix("experts: hit rate ")?;
            v.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(0.0);
    Ok(Run {
        json,
        text,
        kl,
        top1,
        whole,
    })
}

/// A run on another prompt that writes the hot list `hot`.
fn warm_up(pinch: &Path, model: &Path, budget: u64, hot: &str) -> Result<()> {
    pinch_run_prompt(
        pinch,
        model,
        Some(budget),
        WARM_PROMPT,
        &["--moe-warm", hot],
    )
    .map(|_| ())
}

/// Expert slots per layer the plan gives under `budget` (0: not paged).
fn slots_at(pinch: &Path, model: &Path, budget: u64) -> Result<usize> {
    let out = Command::new(pinch)
        .args(["run", "-m"])
        .arg(model)
        .args(["-n", "0", "-p", "x", "-v", "--budget", &budget.to_string()])
        .output()
        .map_err(|e| format!("{}: {e}", pinch.display()))?;
    let text = String::from_utf8_lossy(&out.stderr);
    let pool = text.lines().find_map(|l| {
        let v = l.split("a pool of ").nth(1)?;
        v.split_whitespace().next()?.parse().ok()
    });
    // No pool but a plan that fits: every expert resident, more than any pool.
    Ok(pool.unwrap_or(if text.contains("(fits)") {
        usize::MAX
    } else {
        0
    }))
}

/// The least budget (to 1 MiB) whose plan gives `slots` expert slots per layer.
fn budget_for(pinch: &Path, model: &Path, slots: usize) -> Result<u64> {
    let mb = 1u64 << 20;
    let (mut lo, mut hi) = (64 * mb, 4096 * mb);
    while hi - lo > mb {
        let mid = (lo + hi) / 2 / mb * mb;
        if slots_at(pinch, model, mid)? >= slots {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let got = slots_at(pinch, model, hi)?;
    if got != slots {
        return Err(format!("no budget gives {slots} expert slots (got {got})"));
    }
    Ok(hi)
}

/// `pinch moe-sim`: (policy's hit rate, best fixed pool's) over all layers, in %.
fn sim(pinch: &Path, trace: &Path, slots: usize, policy: &str, from: usize) -> Result<(f64, f64)> {
    let out = crate::util::output(Command::new(pinch).arg("moe-sim").arg(trace).args([
        "--pool",
        &slots.to_string(),
        "--policy",
        policy,
        "--from",
        &from.to_string(),
    ]))?;
    let all = out
        .lines()
        .find(|l| l.starts_with("| all |"))
        .ok_or("moe-sim printed no total")?;
    let pct: Vec<f64> = all
        .split('|')
        .filter_map(|c| c.trim().strip_suffix('%')?.trim().parse().ok())
        .collect();
    match pct[..] {
        [a, b] => Ok((a, b)),
        _ => Err(format!("moe-sim total not understood: {all}")),
    }
}
