//! `cargo xtask bench --bonsai [--vocab N]`: the Bonsai-shaped Q1_0 model of issue 14.
//!
//! A random-weight qwen3 model shaped like Bonsai-1.7B (Qwen3-1.7B's shape, tied head,
//! vocab 151,936 unless `--vocab` says otherwise), quantized to Q1_0 by llama.cpp's
//! quantizer (`tools/gen_bonsai_bench.py`), generated on first use into
//! `.cache/bench-bonsai/` (about 0.4 GB; never committed). Prints
//! - x86 tokens/s, pinch and llama.cpp (llama-cpp-python 0.3.36) side by side at `-t 1`
//!   and `-t 2`, generating (tg32) and in a prompt (pp64), medians of 3 alternating runs
//!   (target: pinch >= 2x llama.cpp generating);
//! - instructions per generated token under `qemu-aarch64 -cpu max` and `-cpu
//!   cortex-a53` (single thread, difference of 4 and 12 generated tokens, so loading
//!   and the repack at load cancel).
use crate::bench::{field, llama_bench, median, pinch_bench};
use crate::device::{self, Device};
use crate::util::{output, root, run, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn table(args: &[String]) -> Result<()> {
    let vocab = args
        .iter()
        .position(|a| a == "--vocab")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(151_936), |v| v.parse::<usize>())
        .map_err(|e| format!("--vocab: {e}"))?;
    let model = model(vocab)?;
    let pinch = device::build(Device::Host)?;
    let site = crate::randshape::llama_cpp_site()?;
    let reps = 3;
    println!("\n## x86: random qwen3 shaped like Bonsai-1.7B, Q1_0 (vocab {vocab}; medians of {reps} alternating runs)\n");
    println!("| test | threads | pinch t/s | llama.cpp t/s | ratio | target |");
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    for t in [1usize, 2] {
        for (test, pp, tg, target) in [("tg32", 0, 32, ">= 2.0"), ("pp64", 64, 0, "(record)")] {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                ours.push(pinch_bench(&pinch, &model, t, pp, tg, 0)?);
                theirs.push(llama_bench(&site, &model, t, pp, tg)?.0);
            }
            let (us, them) = (median(&mut ours), median(&mut theirs));
            println!(
                "| {test} | {t} | {us:.2} | {them:.2} | {:.2} | {target} |",
                us / them
            );
        }
    }
    qemu(&model)
}

/// The model, generated and quantized on first use.
fn model(vocab: usize) -> Result<PathBuf> {
    let dir = root().join(".cache/bench-bonsai");
    let q = dir.join(format!("bonsai-{vocab}-Q1_0.gguf"));
    if q.is_file() {
        return Ok(q);
    }
    let site = crate::randshape::llama_cpp_site()?;
    run(Command::new("python3")
        .env("PYTHONPATH", crate::randshape::python_path()?)
        .arg(root().join("tools/gen_bonsai_bench.py"))
        .arg(&dir)
        .arg(&site)
        .arg(vocab.to_string()))?;
    let _ = std::fs::remove_file(dir.join("bonsai-F16.gguf"));
    std::fs::rename(dir.join("bonsai-Q1_0.gguf"), &q)
        .map_err(|e| format!("{}: {e}", q.display()))?;
    Ok(q)
}

/// Instructions per generated token under qemu-aarch64, both CPU models.
fn qemu(model: &Path) -> Result<()> {
    let bin = device::build(Device::Tv)?;
    let plugin = root().join("target/libinsn.so");
    run(Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(root().join("tools/qemu-insn/insn.c")))?;
    println!("\n## ARM under qemu: instructions per generated token (single thread)\n");
    println!("| cpu | generated token | with `--lut8` |\n| --- | ---: | ---: |");
    for cpu in ["max", "cortex-a53"] {
        let count = |n: usize, extra: &[&str]| -> Result<u64> {
            let out_file = root().join(format!("target/insn-bonsai-{cpu}.txt"));
            let _ = std::fs::remove_file(&out_file);
            let stdout = output(
                Command::new("qemu-aarch64")
                    .args(["-cpu", cpu, "-plugin"])
                    .arg(format!("{},out={}", plugin.display(), out_file.display()))
                    .arg(&bin)
                    .args(["run", "-m"])
                    .arg(model)
                    .args(["-p", "Hello", "-n", &n.to_string(), "-t", "1", "-c", "64"])
                    .args(["--temp", "0", "--ignore-eos", "--json"])
                    .args(extra),
            )?;
            if !stdout
                .lines()
                .any(|l| l.starts_with('{') && field(l, "gen_tokens").is_some())
            {
                return Err(format!("pinch run under qemu ({cpu}) printed no summary"));
            }
            let text = std::fs::read_to_string(&out_file)
                .map_err(|e| format!("{}: {e}", out_file.display()))?;
            text.lines()
                .rev()
                .find_map(|l| l.strip_prefix("insns: "))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| "no insns line".into())
        };
        let per_token = |extra: &[&str]| -> Result<f64> {
            let (a, b) = (count(4, extra)?, count(12, extra)?);
            Ok((b - a) as f64 / 8.0 / 1e6)
        };
        let (exact, lut8) = (per_token(&[])?, per_token(&["--lut8"])?);
        println!("| {cpu} | {exact:.1} M | {lut8:.1} M |");
    }
    Ok(())
}
