//! `cargo xtask fuzz [--seconds N] [--runs M] [TARGET ...]`: the libFuzzer targets in
//! `fuzz/`.
//!
//! Builds them with the nightly toolchain, the coverage instrumentation cargo-fuzz
//! would add (so cargo-fuzz itself is not needed; rustup installs nightly when it is
//! missing) and LeakSanitizer (`-Zsanitizer=leak`, cargo-fuzz's `-s leak`: libFuzzer
//! then checks every input that allocates more than it frees, and the whole process at
//! exit), then runs each target for N seconds (default 60; with `--runs` alone, no time
//! limit), or until M executions if that comes first, on a copy of its seed
//! corpus `fuzz/corpus/<target>/` (libFuzzer adds what it finds to the copy, under
//! `fuzz/target/corpus/`, never to the repo). A crash, a hang (an input taking over
//! 10 s), an OOM (over 2560 MiB) or a leak stops that target; its input is saved under `fuzz/target/artifacts/`
//! and the command fails. `cargo xtask test` runs every target for a few seconds.
use crate::util::{have, output, root, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Every target, in `fuzz/fuzz_targets/<name>.rs`.
pub const TARGETS: [&str; 10] = [
    "gguf_parse",
    "tokenizer",
    "chat_template",
    "http_request",
    "json_body",
    "head_ids",
    "repack_cache",
    "moe_trace",
    "tune_profile",
    "grammar",
];

/// The coverage flags cargo-fuzz passes (sancov with 8-bit counters, PC table and
/// compare tracing), plus debug and overflow checks, as in `cargo fuzz build`.
const RUSTFLAGS: &str = "-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing -Cdebug-assertions -Coverflow-checks -Zsanitizer=leak";

/// One target's run.
pub struct Run {
    pub target: &'static str,
    pub execs: u64,
    pub secs: f64,
    /// Inputs in the working corpus at the end.
    pub corpus: usize,
    pub ok: bool,
}

pub fn main(args: &[String]) -> Result<()> {
    let usage = format!(
        "usage: cargo xtask fuzz [--seconds N] [--runs M] [TARGET ...] (targets: {})",
        TARGETS.join(", ")
    );
    let mut seconds = None;
    let mut runs = None;
    let mut chosen = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--seconds" {
            seconds = Some(
                it.next()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or(usage.clone())?,
            );
        } else if a == "--runs" {
            runs = Some(
                it.next()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or(usage.clone())?,
            );
        } else if let Some(t) = TARGETS.iter().find(|t| **t == a) {
            chosen.push(*t);
        } else {
            return Err(format!("unknown argument `{a}`\n{usage}"));
        }
    }
    if chosen.is_empty() {
        chosen = TARGETS.to_vec();
    }
    // libFuzzer's -max_total_time=0 is no limit: `--runs M` alone runs M executions.
    let seconds = seconds.unwrap_or(if runs.is_some() { 0 } else { 60 });
    let done = run_all(&chosen, seconds, runs)?;
    check(&done)
}

/// Build the targets, then run each of `targets` for `seconds` (or `max_runs`
/// executions); the table is printed.
pub fn run_all(targets: &[&'static str], seconds: u64, max_runs: Option<u64>) -> Result<Vec<Run>> {
    let bin_dir = build()?;
    let mut runs = Vec::new();
    for t in targets {
        runs.push(run_one(&bin_dir, t, seconds, max_runs)?);
    }
    println!(
        "\n{:<14} {:>12} {:>8} {:>8} {:>7}  result",
        "target", "executions", "seconds", "exec/s", "corpus"
    );
    for r in &runs {
        let result = if r.ok { "ok" } else { "CRASH (see above)" };
        let rate = r.execs as f64 / r.secs.max(1e-3);
        println!(
            "{:<14} {:>12} {:>8.1} {:>8.0} {:>7}  {result}",
            r.target, r.execs, r.secs, rate, r.corpus
        );
    }
    Ok(runs)
}

/// An error naming the targets that failed.
pub fn check(runs: &[Run]) -> Result<()> {
    let failed: Vec<&str> = runs.iter().filter(|r| !r.ok).map(|r| r.target).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "fuzz targets failed: {} (inputs in fuzz/target/artifacts/)",
            failed.join(", ")
        ))
    }
}

fn fuzz_dir() -> PathBuf {
    root().join("fuzz")
}

/// `rustup run nightly cargo ...`, without the variables the outer (stable) cargo set.
fn nightly_cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo"]).args(args);
    for v in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN", "RUSTFLAGS"] {
        cmd.env_remove(v);
    }
    cmd.current_dir(fuzz_dir());
    cmd
}

/// Install the nightly toolchain if rustup does not have it yet.
fn ensure_nightly() -> Result<()> {
    if !have("rustup") {
        return Err("fuzzing needs rustup (for the nightly toolchain)".into());
    }
    let list = output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !list.lines().any(|l| l.starts_with("nightly")) {
        crate::util::run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    Ok(())
}

/// The host triple (the coverage flags must not reach build scripts, so the build
/// names the target explicitly).
fn host() -> Result<String> {
    let v = output(Command::new("rustup").args(["run", "nightly", "rustc", "-vV"]))?;
    v.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .ok_or_else(|| "rustc -vV printed no host line".into())
}

/// Build every target; the directory holding the binaries.
fn build() -> Result<PathBuf> {
    ensure_nightly()?;
    let host = host()?;
    // Its own target directory whatever CARGO_TARGET_DIR says (the flags differ).
    let dir = fuzz_dir().join("target");
    let dir = dir.to_string_lossy();
    let mut cmd = nightly_cargo(&[
        "build",
        "--release",
        "--bins",
        "--target",
        &host,
        "--target-dir",
        &dir,
    ]);
    cmd.env("RUSTFLAGS", RUSTFLAGS);
    crate::util::run(&mut cmd)?;
    Ok(fuzz_dir().join("target").join(host).join("release"))
}

/// The count from libFuzzer's `stat::number_of_executed_units: N` line.
fn executions(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|n| n.trim().parse().ok())
}

fn run_one(
    bin_dir: &Path,
    target: &'static str,
    seconds: u64,
    max_runs: Option<u64>,
) -> Result<Run> {
    let seeds = fuzz_dir().join("corpus").join(target);
    let work = fuzz_dir().join("target/corpus").join(target);
    let artifacts = fuzz_dir().join("target/artifacts").join(target);
    for d in [&work, &artifacts] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let bin = bin_dir.join(target);
    let limit = match (seconds, max_runs) {
        (0, Some(n)) => format!("{n} executions"),
        (s, Some(n)) => format!("{s} s or {n} executions"),
        (s, None) => format!("{s} s"),
    };
    eprintln!("\n--- fuzz {target}: {limit} ---");
    let start = Instant::now();
    let mut cmd = Command::new(&bin);
    if let Some(n) = max_runs {
        cmd.arg(format!("-runs={n}"));
    }
    let out = cmd
        .arg(&work)
        .arg(&seeds)
        .arg(format!("-max_total_time={seconds}"))
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2560")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .stdout(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let secs = start.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // libFuzzer's progress lines are many; show the first few and the end.
    let lines: Vec<&str> = stderr.lines().collect();
    let tail = lines.len().saturating_sub(12);
    for l in lines.iter().take(6.min(tail)).chain(&lines[tail..]) {
        eprintln!("{l}");
    }
    Ok(Run {
        target,
        execs: executions(&stderr).unwrap_or(0),
        secs,
        corpus: std::fs::read_dir(&work).map_or(0, |d| d.count()),
        ok: out.status.success(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzers_execution_count() {
        let err =
            "#1024 pulse cov: 3\nstat::number_of_executed_units: 123456\nstat::peak_rss_mb: 40";
        assert_eq!(executions(err), Some(123456));
        assert_eq!(executions("Done 5 runs"), None);
    }

    #[test]
    fn every_target_has_a_source_and_a_seed_corpus() {
        for t in TARGETS {
            assert!(
                fuzz_dir().join(format!("fuzz_targets/{t}.rs")).is_file(),
                "{t}"
            );
            let seeds = std::fs::read_dir(fuzz_dir().join("corpus").join(t))
                .unwrap_or_else(|e| panic!("corpus of {t}: {e}"))
                .count();
            assert!(seeds > 0, "{t} has no seeds");
        }
    }
}
