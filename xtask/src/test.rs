//! `cargo xtask test`: the one test command, run by CI (`.ci/run`) and by people.
//!
//! Steps run in order and stop at the first failure, cheapest and most likely to fail
//! first. The aarch64 tests run twice under qemu-user: `QEMU_CPU=max` exercises the
//! dotprod/fp16/i8mm paths, `QEMU_CPU=cortex-a53` proves the baseline NEON path never
//! meets an illegal instruction. `PINCH_SKIP_MODEL_TESTS=1` skips the model download for
//! quick local runs (CI must not set it). The platform's unit tests (`pinch-linux --lib`)
//! join the qemu runs too: its feature detection and O_DIRECT flag are per-architecture.
//! Two of the engine's test files with no architecture-specific code run on the host only
//! (`HOST_ONLY_ENGINE_TESTS`).
//! The shipped armv7 musl binary itself is built and run under qemu-arm on the tiny
//! goldens (`pinch logits`), so what users copy to a router is what passed.
//! The last step runs every fuzz target (`fuzz/`, nightly) for 5 s; long fuzz runs and the
//! soak test are `cargo xtask fuzz` / `cargo xtask soak`, by hand.
//! Disk: builds are not incremental, a cross target's builds are removed once its tests
//! have passed (`--keep-builds` keeps them), and the closing table gives the target
//! directory's size and the free space after each step (a CI machine ran out of disk).
use crate::device::{self, Device, ARMV7, IOS, LINUX_ARM};
use crate::fetch;
use crate::util::{cargo, have, output, run, run_tests, target_dir, Counts, Result};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// A step: its name, what it runs, and the build directories (under the target
/// directory) that no later step reads, removed once it has passed ([`free_builds`]).
type Step = (
    &'static str,
    fn() -> Result<Outcome>,
    &'static [&'static [&'static str]],
);

enum Outcome {
    Done,
    Tested(Counts),
    Skipped(&'static str),
}

const STEPS: &[Step] = &[
    ("tools", tools, &[]),
    ("fmt", fmt, &[]),
    ("clippy", clippy, &[]),
    ("clippy (aarch64)", clippy_aarch64, &[]),
    ("fetch-model", fetch_model, &[]),
    ("test (host)", test_host, &[]),
    ("random shapes + ppl vs llama.cpp", random_shapes, &[]),
    ("test (aarch64, qemu max)", || test_aarch64("max"), &[]),
    (
        "test (aarch64, qemu cortex-a53)",
        || test_aarch64("cortex-a53"),
        &[&[LINUX_ARM]],
    ),
    ("test (armv7, qemu-arm cortex-a7)", test_armv7, &[&[ARMV7]]),
    (
        "armv7 musl binary vs tiny goldens (qemu-arm cortex-a7)",
        test_armv7_musl_binary,
        &[&[device::DEVICE_DIR, crate::armv7_musl::TARGET]],
    ),
    ("model + server checks (release, --ignored)", test_slow, &[]),
    ("browser test (headless chromium)", test_browser, &[]),
    (
        "llama.cpp server tests (cargo xtask compat)",
        test_compat,
        &[],
    ),
    ("build no_std (aarch64-unknown-none)", build_no_std, &[]),
    ("build --device tv", build_tv, &[]),
    ("fuzz (5 s a target)", fuzz_short, &[]),
];

pub fn main(args: &[String]) -> Result<()> {
    // `--keep-going` runs every step even after a failure (to see everything that is
    // broken, or to time all steps); the exit status still reports the failure.
    // `--keep-builds` keeps every step's builds for a quicker rerun; by default each cross
    // target's builds go once its tests have passed ([`free_builds`]).
    let mut keep_going = false;
    let mut keep_builds = false;
    for arg in args {
        match arg.as_str() {
            "--keep-going" => keep_going = true,
            "--keep-builds" => keep_builds = true,
            _ => {
                return Err(format!(
                    "usage: cargo xtask test [--keep-going] [--keep-builds] (got {arg:?})"
                ))
            }
        }
    }
    // Release test builds without LTO and with 16 codegen units: the same code and the
    // same bits (floating point does not depend on either), built and linked in about
    // half the time, for every test binary. The device builds (the TV binary, the armv7
    // musl binary the goldens run on) remove these and build as shipped.
    for (key, value) in device::TEST_PROFILE_ENV {
        if std::env::var_os(key).is_none() {
            std::env::set_var(key, value);
        }
    }
    // Incremental caches serve a rebuild after an edit, not a one-off run of every test:
    // they were 1.0 of the 2.2 GB in the host's build directory after its tests, and a CI
    // machine ran out of disk during the armv7 step.
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        std::env::set_var("CARGO_INCREMENTAL", "0");
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut total = Counts::default();
    let mut counted = true;
    let mut failures = Vec::new();
    for (name, step, builds) in STEPS {
        eprintln!("\n=== xtask test: {name} ===");
        let start = Instant::now();
        let result = step();
        let secs = start.elapsed().as_secs_f64();
        if result.is_ok() && !keep_builds {
            free_builds(builds);
        }
        let disk = Disk::now();
        eprintln!("xtask test: disk after the step: {disk}");
        let mut row = |result: String| rows.push((name, secs, disk, result));
        match result {
            Ok(Outcome::Done) => row("ok".into()),
            Ok(Outcome::Tested(c)) => {
                if c.passed == 0 && c.failed == 0 {
                    counted = false;
                }
                total.add(c);
                row(format!("ok ({} passed)", c.passed));
            }
            Ok(Outcome::Skipped(why)) => row(format!("skipped: {why}")),
            Err(msg) => {
                row("FAILED".into());
                failures.push(format!("step `{name}` failed: {msg}"));
                if !keep_going {
                    break;
                }
            }
        }
    }
    print_table(&rows);
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    if counted {
        println!("{} passed, {} failed", total.passed, total.failed);
    }
    Ok(())
}

/// Remove build directories no later step reads (each a path under the target
/// directory), so the disk holds one cross target's builds at a time: host, aarch64,
/// armv7 and the device builds together outgrew a CI machine's disk. A failure to
/// remove is shown and not fatal: the space is only wanted, not needed for correctness.
fn free_builds(builds: &[&[&str]]) {
    for parts in builds {
        let dir = parts.iter().fold(target_dir(), |d, p| d.join(p));
        if dir.exists() {
            let freed = dir_bytes(&dir);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => eprintln!(
                    "xtask test: removed {} ({:.2} GB no later step reads)",
                    dir.display(),
                    freed as f64 / 1e9
                ),
                Err(e) => eprintln!("xtask test: cannot remove {}: {e}", dir.display()),
            }
        }
    }
}

/// The target directory's size and the free space beside it, after a step: the table
/// shows where a run's disk goes (a CI machine once ran out during the armv7 step).
#[derive(Clone, Copy)]
struct Disk {
    target: u64,
    free: Option<u64>,
}

impl Disk {
    fn now() -> Disk {
        let dir = target_dir();
        Disk {
            target: dir_bytes(&dir),
            free: free_bytes(&dir),
        }
    }
}

impl std::fmt::Display for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "target directory {:.2} GB", self.target as f64 / 1e9)?;
        match self.free {
            Some(free) => write!(f, ", {:.1} GB free", free as f64 / 1e9),
            None => write!(f, " (free space unknown: `df` did not answer)"),
        }
    }
}

/// A row of the closing table: step, seconds, disk after it, result.
type Row = (&'static str, f64, Disk, String);

/// Bytes in the files under `dir` (0 where it cannot be read; symlinks not followed).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => total += dir_bytes(&e.path()),
            Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
            _ => {}
        }
    }
    total
}

/// Free bytes on the filesystem holding `dir` (its nearest existing ancestor), from
/// `df -Pk`'s fourth column.
fn free_bytes(dir: &Path) -> Option<u64> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    let out = output(Command::new("df").arg("-Pk").arg(existing)).ok()?;
    let kib: u64 = out
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn print_table(rows: &[Row]) {
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(4).max(4);
    println!(
        "\n{:<width$}  {:>8}  {:>9}  {:>7}  result",
        "step", "seconds", "target GB", "free GB"
    );
    for (name, secs, disk, result) in rows {
        let free = disk
            .free
            .map_or("?".to_string(), |b| format!("{:.1}", b as f64 / 1e9));
        println!(
            "{name:<width$}  {secs:>8.1}  {:>9.2}  {free:>7}  {result}",
            disk.target as f64 / 1e9
        );
    }
}

fn tools() -> Result<Outcome> {
    if !have("qemu-aarch64") {
        if !have("apt-get") {
            return Err("qemu-aarch64 is missing; install qemu-user (qemu-user-static)".into());
        }
        run(&mut apt_get(&["update"]))?;
        run(&mut apt_get(&["install", "-y", "qemu-user"]))?;
    }
    if have("rustup") {
        // The toolchain file names these targets; adding them again is a cheap no-op.
        let mut add = Command::new("rustup");
        add.current_dir(crate::util::root()).args([
            "target",
            "add",
            LINUX_ARM,
            "aarch64-unknown-none",
            IOS,
        ]);
        run(&mut add)?;
    }
    Ok(Outcome::Done)
}

/// `apt-get ARGS`, through sudo when not root.
pub(crate) fn apt_get(args: &[&str]) -> Command {
    as_root("apt-get", args)
}

/// `program ARGS`, through sudo when not root.
pub(crate) fn as_root(program: &str, args: &[&str]) -> Command {
    let root = output(Command::new("id").arg("-u")).is_ok_and(|u| u.trim() == "0");
    let mut cmd = if root {
        Command::new(program)
    } else {
        let mut c = Command::new("sudo");
        c.arg(program);
        c
    };
    cmd.args(args);
    cmd
}

fn fmt() -> Result<Outcome> {
    run(&mut cargo(["fmt", "--all", "--check"]))
        .map_err(|e| format!("{e}\n  run `cargo fmt --all` to fix the formatting"))?;
    Ok(Outcome::Done)
}

fn clippy() -> Result<Outcome> {
    run(&mut cargo([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    Ok(Outcome::Done)
}

/// Lint the engine crates for a cross `target` (warnings denied).
fn clippy_for(target: &'static str) -> Result<()> {
    run(&mut cargo([
        "clippy",
        "-p",
        "pinch-kernels",
        "-p",
        "pinch-runtime-min",
        "-p",
        "pinch-linux",
        "--all-targets",
        "--target",
        target,
        "--",
        "-D",
        "warnings",
    ]))
}

/// The NEON kernels and the aarch64 feature detection are compiled out on an x86 host, so
/// lint them for the device target too.
fn clippy_aarch64() -> Result<Outcome> {
    clippy_for(LINUX_ARM)?;
    Ok(Outcome::Done)
}

fn fetch_model() -> Result<Outcome> {
    if std::env::var_os("PINCH_SKIP_MODEL_TESTS").is_some_and(|v| v == "1") {
        return Ok(Outcome::Skipped("PINCH_SKIP_MODEL_TESTS=1"));
    }
    fetch::ensure("gemma3-270m")?;
    fetch::ensure("smollm2-135m")?;
    Ok(Outcome::Done)
}

fn test_host() -> Result<Outcome> {
    // runtime-min/tests/tokenizer_diff.rs reads the UGM vocab (6.8 MB, not in the repo)
    // from llama.cpp's models/ in the llama-cpp-python sdist.
    crate::tokenizer_diff::vocab_dir()?;
    run_tests(&mut cargo(["test", "--workspace"])).map(Outcome::Tested)
}

/// Random-shape models (fixed seeds plus 4 new ones) and `pinch ppl` against llama.cpp.
fn random_shapes() -> Result<Outcome> {
    crate::randshape::check(&[], 4).map(Outcome::Tested)
}

/// The slow checks, on a release build: Gemma 3 270M's perplexity and bits per byte
/// against llama.cpp's, Gemma streamed under a budget, the 60 s server load test, and
/// SmolLM2-135M-Instruct's goldens.
fn test_slow() -> Result<Outcome> {
    if std::env::var_os("PINCH_SKIP_MODEL_TESTS").is_some_and(|v| v == "1") {
        return Ok(Outcome::Skipped("PINCH_SKIP_MODEL_TESTS=1"));
    }
    // One cargo call per package: the test binaries build in parallel, then run one
    // after another. SmolLM2-135M-Instruct against llama.cpp's goldens (tokens, logits,
    // greedy, template; run and serve through the binary), and the pruned head's
    // bits-per-byte cost on Gemma.
    let mut counts = run_tests(&mut cargo([
        "test",
        "--release",
        "-p",
        "pinch-linux",
        "--test",
        "cli",
        "--test",
        "stream_cli",
        "--test",
        "server_load",
        "--test",
        "smollm2_cli",
        "--test",
        "head_bpb",
        "--",
        "--ignored",
    ]))?;
    counts.add(run_tests(&mut cargo([
        "test",
        "--release",
        "-p",
        "pinch-tests",
        "--test",
        "smollm2_135m",
        "--",
        "--ignored",
    ]))?);
    Ok(Outcome::Tested(counts))
}

/// llama.cpp's own server test suite against `pinch serve` (`crate::compat`; about
/// 20 s once its Python packages are cached). Known failures are listed, not counted.
fn test_compat() -> Result<Outcome> {
    let t = crate::compat::suite(&[])?;
    Ok(Outcome::Tested(Counts {
        passed: t.passed as u64,
        failed: 0,
    }))
}

/// The chat page in Debian's headless Chromium (installed here when missing).
fn test_browser() -> Result<Outcome> {
    if !have("chromium") {
        if !have("apt-get") {
            return Err("chromium is missing and apt-get is not available".into());
        }
        let install = ["install", "-y", "--no-install-recommends", "chromium"];
        if run(&mut apt_get(&install)).is_err() {
            run(&mut apt_get(&["update"]))?;
            run(&mut apt_get(&install))?;
        }
    }
    run_tests(&mut cargo([
        "test",
        "-p",
        "pinch-linux",
        "--test",
        "server_browser",
        "--",
        "--ignored",
    ]))
    .map(Outcome::Tested)
}

/// Test files of `runtime-min` that run on the host only, not under qemu: they check
/// byte- and string-level code (the GGUF parser under a mutation storm, the tokenizer
/// against llama.cpp's vectors) that has no architecture-specific path (`runtime-min` has
/// no `cfg(target_arch)`; its only ISA code is the kernels', which every qemu run covers)
/// and took 194 s of each qemu run (148 s and 46 s under `-cpu max`).
const HOST_ONLY_ENGINE_TESTS: [&str; 2] = ["tokenizer_diff", "gguf_mutation"];

/// `--lib` and every test file of `runtime-min` but [`HOST_ONLY_ENGINE_TESTS`].
fn engine_test_targets() -> Result<Vec<String>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime-min/tests");
    let mut names = Vec::new();
    for e in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = e.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if let (Some(stem), Some("rs")) = (
            path.file_stem().and_then(|s| s.to_str()),
            path.extension().and_then(|s| s.to_str()),
        ) {
            if !HOST_ONLY_ENGINE_TESTS.contains(&stem) {
                names.push(stem.to_string());
            }
        }
    }
    names.sort();
    for host_only in HOST_ONLY_ENGINE_TESTS {
        if !dir.join(format!("{host_only}.rs")).exists() {
            return Err(format!(
                "HOST_ONLY_ENGINE_TESTS names {host_only}, which runtime-min/tests lacks"
            ));
        }
    }
    let mut args = vec!["--lib".to_string()];
    for n in names {
        args.push("--test".into());
        args.push(n);
    }
    Ok(args)
}

fn test_aarch64(cpu: &'static str) -> Result<Outcome> {
    let mut kernels = cargo(["test", "-p", "pinch-kernels", "--target", LINUX_ARM]);
    kernels.env("QEMU_CPU", cpu);
    let mut counts = run_tests(&mut kernels)?;
    let mut engine = cargo(["test", "-p", "pinch-runtime-min", "--target", LINUX_ARM]);
    engine.args(engine_test_targets()?).env("QEMU_CPU", cpu);
    counts.add(run_tests(&mut engine)?);
    // Only the platform's unit tests: its CLI integration tests run whole models, which
    // the host run covers and which would take hours under emulation.
    let mut platform = cargo(["test", "-p", "pinch-linux", "--lib", "--target", LINUX_ARM]);
    platform.env("QEMU_CPU", cpu);
    counts.add(run_tests(&mut platform)?);
    // The tiny fixtures against llama.cpp's logits on ARM arithmetic (NEON sums Q8_0/Q5_0
    // per block, unlike x86), and the expert pager's paged and repacked slots (Q2Kx8 and
    // the other ARM layouts) against the all-resident plain run (about 25 s each):
    // release, as a debug build takes minutes under emulation.
    let mut golden = cargo([
        "test",
        "--release",
        "-p",
        "pinch-tests",
        "--test",
        "golden_tiny",
        "--test",
        "moe_pager",
        "--target",
        LINUX_ARM,
    ]);
    if cpu != "max" {
        // The f32 oracle's tests (`Math::Reference`: dequantized weights, scalar f32 math)
        // have no path that depends on dotprod, i8mm or fp16: `-cpu max` and armv7 run
        // them, and a second aarch64 run only repeats them (about 100 s under emulation).
        golden.args([
            "--",
            "--skip",
            "oracle_matches_llama_cpp_batched_and_sequential",
            "--skip",
            "greedy_teacher_forced_matches_llama_cpp",
        ]);
    }
    golden.env("QEMU_CPU", cpu);
    counts.add(run_tests(&mut golden)?);
    Ok(Outcome::Tested(counts))
}

/// 32-bit ARM (`router-armv7`): lint the armv7-only code, then the kernels (the NEON
/// kernels against scalar, bit for bit), the gguf checks that differ with a 32-bit
/// `usize`, the platform's unit tests (NEON detection from the auxv) and the tiny goldens,
/// under qemu-arm's cortex-a7 (NEON, no dotprod).
fn test_armv7() -> Result<Outcome> {
    device::ensure_armv7_toolchain()?;
    clippy_for(ARMV7)?;
    let on_a7 = |mut c: Command| {
        c.env("QEMU_CPU", "cortex-a7");
        c
    };
    let mut counts = run_tests(&mut on_a7(cargo([
        "test",
        "-p",
        "pinch-kernels",
        "--target",
        ARMV7,
    ])))?;
    // Release: its bounded-time check of a maximal header allows 10 s, which a debug
    // build under qemu-arm on a busy machine can exceed.
    counts.add(run_tests(&mut on_a7(cargo([
        "test",
        "--release",
        "-p",
        "pinch-runtime-min",
        "--test",
        "gguf_errors",
        "--target",
        ARMV7,
    ])))?);
    counts.add(run_tests(&mut on_a7(cargo([
        "test",
        "-p",
        "pinch-linux",
        "--lib",
        "--target",
        ARMV7,
    ])))?);
    counts.add(run_tests(&mut on_a7(cargo([
        "test",
        "--release",
        "-p",
        "pinch-tests",
        "--test",
        "golden_tiny",
        "--target",
        ARMV7,
    ])))?);
    Ok(Outcome::Tested(counts))
}

/// The binary users copy to a 32-bit router (`--device router-armv7`: static musl, std
/// built from source, release profile), built as shipped and run under qemu-arm's
/// cortex-a7 on every tiny fixture through `pinch logits`, against llama.cpp's goldens
/// (`tests/tests/device_binary.rs`). The comparison itself runs on the host, in the
/// release build of `pinch-tests` that the model checks reuse.
fn test_armv7_musl_binary() -> Result<Outcome> {
    let bin = crate::armv7_musl::build()?;
    let mut golden = cargo([
        "test",
        "--release",
        "-p",
        "pinch-tests",
        "--test",
        "device_binary",
        "--",
        "--ignored",
    ]);
    golden
        .env("PINCH_DEVICE_BIN", &bin)
        .env("PINCH_DEVICE_RUNNER", "qemu-arm")
        .env("QEMU_CPU", "cortex-a7");
    run_tests(&mut golden).map(Outcome::Tested)
}

fn build_no_std() -> Result<Outcome> {
    run(&mut cargo([
        "build",
        "-p",
        "pinch-kernels",
        "-p",
        "pinch-runtime-min",
        "--target",
        "aarch64-unknown-none",
    ]))?;
    Ok(Outcome::Done)
}

fn build_tv() -> Result<Outcome> {
    device::build(Device::Tv)?;
    Ok(Outcome::Done)
}

/// Every fuzz target for a few seconds (the long runs are `cargo xtask fuzz` by hand).
fn fuzz_short() -> Result<Outcome> {
    let runs = crate::fuzz::run_all(&crate::fuzz::TARGETS, 5, None)?;
    crate::fuzz::check(&runs)?;
    Ok(Outcome::Done)
}
