//! `cargo xtask bench [--vs-llama-cpp] [--qemu]`: the speed and memory targets of issue #4
//! on Gemma 3 270M Q4_K_M, each printed next to its target.
//!
//! - x86 table: `pinch bench` tg128 and pp512 at 1 and 2 threads; with `--vs-llama-cpp`
//!   llama.cpp (llama-cpp-python 0.3.36 from PyPI, built once into `$HOME/.cache/pinch`) is timed
//!   alternately with pinch on the same token ids, and medians and ratios are quoted.
//! - memory: peak RSS of `pinch run -c 512 -n 128` (target <= 270 MiB).
//! - long answers: tg32 at depth 1000 over tg32 at depth 0 (target >= 0.8).
//! - `--qemu`: guest instructions per generated and per prompt token under
//!   `qemu-aarch64 -cpu max` and `-cpu cortex-a53` (and the armv7 build under
//!   `qemu-arm -cpu cortex-a7`, for the record), with the counter plugin in
//!   `tools/qemu-insn` (difference of two lengths, as the llama.cpp anchors were made).
//! - `--arch qwen35|moe` (`--moe` = `--arch moe`): the x86 table (and with `--qemu` the
//!   instruction counts) on a scaled random model instead, generated and quantized to
//!   Q4_K_M by llama.cpp's quantizer on first use into `.cache/bench-<arch>/`:
//!   `tools/gen_qwen35_bench.py` (Qwen3.5-0.8B's shape) or `tools/gen_moe_bench.py`
//!   (bailingmoe2-shaped, 32 experts top-6). Targets (issue 12): tg >= 1.3x llama.cpp,
//!   pp >= 1.0x, at -t 1 and -t 2.
//! - the dense and qwen35 tables also measure the memory read bandwidth at each thread count just
//!   before its runs (`pinch bench --membw`, a pass over 768 MiB, past this Xeon's
//!   480 MiB L3) and prints generation's share of it: weight bytes per token (the
//!   plan's resident weights; Gemma's tied embedding is its head, so every byte is read
//!   per token) x tok/s / bandwidth, beside issue 19's 85 % target, and llama.cpp's
//!   share, whose inverse is the largest ratio a kernel reading the same bytes can reach.
//! - `--stream`: weight streaming (issue #5) at budgets of 100 %, 60 % and 40 % of the
//!   all-resident need: tokens/s, bytes read per token (the OS's count and the plan's),
//!   the plan's ceiling at the storage speed `pinch bench --storage` measured, peak RSS.
//! - `--draft`: speculative decoding at 40 % of the resident need (`crate::draft_bench`).
//! - `--busy-core`: generation idle and while another thread spins on a core, at 1 and 2
//!   threads (`crate::busy_bench`; issue 19's loss of at most 25 % at `-t 2`).
//! - `--bonsai [--vocab N]`: the Bonsai-1.7B-shaped Q1_0 model (`crate::bonsai_bench`).
//! - `--moe-scaled`: the expert pager on a 1.8 GB random MoE with Q2_K experts at pools
//!   of 100 / 50 / 25 % of its experts (`crate::moe_bench`).
use crate::device::{self, Device};
use crate::fetch;
use crate::util::{output, root, run, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// llama.cpp's figures on this machine (shared/anchors/perf-llamacpp.md, idle-VM run).
const LLAMA_TG: [(usize, f64); 2] = [(1, 48.26), (2, 66.96)];
const LLAMA_PP512: [(usize, f64); 2] = [(1, 351.45), (2, 677.48)];

pub fn main(args: &[String]) -> Result<()> {
    let vs = args.iter().any(|a| a == "--vs-llama-cpp");
    let qemu = args.iter().any(|a| a == "--qemu");
    if args.iter().any(|a| a == "--moe-scaled") {
        return crate::moe_bench::table(&device::build(Device::Host)?);
    }
    let arch = match args.iter().position(|a| a == "--arch") {
        Some(i) => args
            .get(i + 1)
            .map(String::as_str)
            .ok_or("--arch needs qwen35 or moe")?,
        None if args.iter().any(|a| a == "--moe") => "moe",
        None => "gemma3",
    };
    let reps: usize = 3;
    let (model, title) = match arch {
        "moe" => (
            arch_model("moe")?,
            "random MoE (bailingmoe2-shaped, tools/gen_moe_bench.py) Q4_K_M",
        ),
        "qwen35" => (
            arch_model("qwen35")?,
            "random Qwen3.5-0.8B-shaped (qwen35, tools/gen_qwen35_bench.py) Q4_K_M",
        ),
        "gemma3" => (fetch::ensure("gemma3-270m")?, "Gemma 3 270M Q4_K_M"),
        other => return Err(format!("--arch {other}: give qwen35 or moe")),
    };
    let dense = arch == "gemma3";
    // Every weight byte is read once per generated token (no experts skipped), so the
    // read bandwidth bounds generation for these; for MoE the selected experts vary.
    let reads_all = arch != "moe";
    let pinch = device::build(Device::Host)?;
    if args.iter().any(|a| a == "--stream") {
        return stream_table(&pinch, &model);
    }
    if args.iter().any(|a| a == "--bonsai") {
        return crate::bonsai_bench::table(args);
    }
    if args.iter().any(|a| a == "--draft") {
        return match arch {
            "qwen35" => crate::draft_bench::mtp_table(&pinch),
            _ => crate::draft_bench::table(&pinch, &model),
        };
    }
    let llama = if vs {
        Some(crate::randshape::llama_cpp_site()?)
    } else {
        None
    };
    if args.iter().any(|a| a == "--busy-core") {
        return crate::busy_bench::table(&pinch, &model, title, llama.as_deref());
    }

    println!("\n## x86: {title} (medians of {reps} alternating runs)\n");
    let mut no_extra = false;
    let mut share_rows = Vec::new();
    println!("| test | threads | pinch t/s | llama.cpp t/s | ratio | target | met |");
    println!("| --- | ---: | ---: | ---: | ---: | --- | --- |");
    for t in [1usize, 2] {
        // The bandwidth ceiling with this thread count, just before its runs.
        let bw = if reads_all { membw(&pinch, t)? } else { 0.0 };
        for (test, pp, tg) in [("tg128", 0usize, 128usize), ("pp512", 512, 0)] {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                ours.push(pinch_bench(&pinch, &model, t, pp, tg, 0)?);
                if let Some(site) = &llama {
                    let (tps, plain) = llama_bench(site, &model, t, pp, tg)?;
                    theirs.push(tps);
                    no_extra |= plain;
                }
            }
            let anchor = if tg > 0 { LLAMA_TG } else { LLAMA_PP512 };
            // The anchors are Gemma's: other models compare only side by side.
            let anchor = anchor
                .iter()
                .find(|a| a.0 == t && dense)
                .map_or(f64::NAN, |a| a.1);
            let (them, source) = if theirs.is_empty() {
                (anchor, " (anchor)")
            } else {
                (median(&mut theirs), "")
            };
            let us = median(&mut ours);
            if tg > 0 && reads_all {
                share_rows.push((t, bw, us, if theirs.is_empty() { f64::NAN } else { them }));
            }
            // Issue 4's targets for every model, issue 19's (dense generation and
            // prompts) beside them for Gemma.
            let (target, goal, goal19) = match (tg > 0, dense) {
                (true, true) => ("ratio >= 1.3 (#4), >= 1.5 (#19)", 1.3, 1.5),
                (false, true) => ("ratio >= 1.0 (#4), >= 1.2 (#19)", 1.0, 1.2),
                (true, false) => ("ratio >= 1.3", 1.3, 1.3),
                (false, false) => ("ratio >= 1.0", 1.0, 1.0),
            };
            let ratio = us / them;
            let met = if ratio.is_nan() {
                "(no llama.cpp run)"
            } else if ratio >= goal19 {
                "met"
            } else if ratio >= goal {
                "#4 met, #19 not met"
            } else {
                "not met"
            };
            println!(
                "| {test} | {t} | {us:.1} | {them:.1}{source} | {ratio:.2} | {target} | {met} |"
            );
        }
    }
    if reads_all {
        // llama.cpp's share says how much room the ceiling leaves: pinch can be at most
        // `bw / (weights x llama.cpp's t/s)` times faster while it reads every weight
        // byte per token (the recurrent state and KV reads come on top).
        let weights = weight_bytes(&pinch, &model)?;
        println!("\n| generation vs memory bandwidth | threads | read bw (pinch bench --membw) | weights / token | tg128 t/s | share | llama.cpp share | largest ratio the ceiling allows | target | met |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |");
        for (t, bw, tps, theirs) in share_rows {
            let share = weights * tps / bw;
            let their_share = weights * theirs / bw;
            let met = if share >= 0.85 { "met" } else { "not met" };
            println!(
                "| tg128 | {t} | {:.2} GB/s | {:.1} MB | {tps:.1} | {:.1} % | {:.1} % | {:.2}x | >= 85 % | {met} |",
                bw / 1e9,
                weights / 1e6,
                100.0 * share,
                100.0 * their_share,
                1.0 / their_share
            );
        }
    }
    if no_extra {
        println!("\nllama.cpp ran without its extra buffer types (AMX, CPU_REPACK): with them it crashed on this machine.");
    }
    if !dense {
        if qemu {
            qemu_table(&model, false)?;
        }
        return Ok(());
    }

    let rss = peak_rss(&pinch, &model)?;
    println!("\n| memory | measured | target |\n| --- | ---: | --- |");
    println!(
        "| peak RSS, run -c 512 -n 128 -t 2 | {:.1} MiB | <= 270 MiB |",
        rss as f64 / (1u64 << 20) as f64
    );

    let d0 = pinch_bench(&pinch, &model, 1, 0, 32, 0)?;
    let d1000 = pinch_bench(&pinch, &model, 1, 0, 32, 1000)?;
    println!("\n| long answers (t=1) | tok/s | ratio | target |\n| --- | ---: | ---: | --- |");
    println!("| tg32 at position 0 | {d0:.1} | | |");
    println!(
        "| tg32 at position 1000 | {d1000:.1} | {:.2} | >= 0.80 |",
        d1000 / d0
    );

    if qemu {
        qemu_table(&model, true)?;
    }
    Ok(())
}

/// `pinch bench --membw -t T`: the best read bandwidth of a few passes, bytes/s.
fn membw(pinch: &Path, t: usize) -> Result<f64> {
    let out = output(Command::new(pinch).args([
        "bench",
        "--membw",
        "-t",
        &t.to_string(),
        "-r",
        "5",
        "--json",
    ]))?;
    last_json_field(&out, "read_bw")
}

/// The plan's resident weight bytes (`weight_bytes` of a 1-token `pinch bench`).
fn weight_bytes(pinch: &Path, model: &Path) -> Result<f64> {
    let out = output(
        Command::new(pinch)
            .args(["bench", "-m"])
            .arg(model)
            .args(["-p", "0", "-n", "1", "-r", "1", "-c", "16", "--json"]),
    )?;
    last_json_field(&out, "weight_bytes")
}

/// `key` of the last JSON line of a pinch command's output.
fn last_json_field(out: &str, key: &str) -> Result<f64> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("pinch printed no JSON")?;
    field(line, key).ok_or_else(|| format!("no {key} in {line}"))
}

/// Weight streaming at 100 / 60 / 40 % of the resident need (generation, -c 1024, t=2).
fn stream_table(pinch: &Path, model: &Path) -> Result<()> {
    let storage = output(
        Command::new(pinch)
            .args(["bench", "--storage"])
            .arg(model)
            .args(["-r", "2", "--json"]),
    )?;
    let line = storage
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("pinch bench --storage printed no JSON")?;
    let bw = field(line, "read_bw").ok_or("no read_bw")? as u64;
    let need = resident_need(pinch, model)?;
    println!(
        "\n## Weight streaming: Gemma 3 270M, -c 1024, -t 2, 32 generated tokens; storage {:.0} MB/s (direct reads, pinch bench --storage)\n",
        bw as f64 / 1e6
    );
    println!("| budget | of resident need | tok/s | read/token (OS) | read/token (plan) | plan ceiling tok/s | peak RSS |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mib = |b: f64| b / (1u64 << 20) as f64;
    for pct in [100u64, 60, 40] {
        let budget = need * pct / 100;
        let out = output(Command::new(pinch).args(["run", "-m"]).arg(model).args([
            "-c",
            "1024",
            "-p",
            "The capital of France is",
            "-n",
            "32",
            "--temp",
            "0",
            "--ignore-eos",
            "-t",
            "2",
            "--json",
            "--budget",
            &budget.to_string(),
            "--read-bw",
            &bw.to_string(),
            // One pass per token: the plan's reads (drafts: `--draft`).
            "--draft",
            "0",
        ]))?;
        let line = out
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .ok_or("pinch run printed no JSON")?;
        let f = |k: &str| field(line, k).unwrap_or(0.0);
        let passes = f("stream_passes").max(1.0);
        let plan = f("stream_plan_per_token");
        let ceiling = if plan > 0.0 {
            format!("{:.2}", bw as f64 / plan)
        } else {
            "(all resident)".to_string()
        };
        println!(
            "| {:.1} MiB | {pct} % | {:.2} | {:.1} MiB | {:.1} MiB | {ceiling} | {:.1} MiB |",
            mib(budget as f64),
            f("gen_tps"),
            mib(f("os_read_bytes") / passes),
            mib(plan),
            mib(f("peak_rss"))
        );
    }
    Ok(())
}

/// The all-resident need `pinch run -c 1024 -v` prints as its plan total, in bytes.
pub(crate) fn resident_need(pinch: &Path, model: &Path) -> Result<u64> {
    let plan = Command::new(pinch)
        .args(["run", "-m"])
        .arg(model)
        .args(["-c", "1024", "-n", "0", "-p", "x", "-v"])
        .output()
        .map_err(|e| format!("{}: {e}", pinch.display()))?;
    let text = String::from_utf8_lossy(&plan.stderr);
    let total = text
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("no plan total in {text}"))?;
    // The plan prints MiB to one decimal: round up so 100 % really holds everything.
    Ok(((total + 0.1) * (1u64 << 20) as f64) as u64)
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The number after `"key":` in a JSON line (enough for pinch's flat summaries).
pub(crate) fn field(json: &str, key: &str) -> Option<f64> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &json[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

pub(crate) fn pinch_bench(
    pinch: &Path,
    model: &Path,
    t: usize,
    pp: usize,
    tg: usize,
    depth: usize,
) -> Result<f64> {
    let out = output(Command::new(pinch).args(["bench", "-m"]).arg(model).args([
        "-p",
        &pp.to_string(),
        "-n",
        &tg.to_string(),
        "-t",
        &t.to_string(),
        "-r",
        "1",
        "-d",
        &depth.to_string(),
        "-c",
        &(pp.max(tg) + depth + 8).to_string(),
        "--json",
    ]))?;
    last_json_field(&out, "tps")
}

fn peak_rss(pinch: &Path, model: &Path) -> Result<u64> {
    let out = output(Command::new(pinch).args(["run", "-m"]).arg(model).args([
        "-p",
        "The capital of France is",
        "-c",
        "512",
        "-n",
        "128",
        "-t",
        "2",
        "--temp",
        "0",
        "--ignore-eos",
        "--json",
    ]))?;
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("pinch run printed no JSON")?;
    field(line, "peak_rss")
        .map(|v| v as u64)
        .ok_or_else(|| format!("no peak_rss in {line}"))
}

/// llama.cpp's tokens/s, and whether it had to run without its extra buffer types (its
/// AMX path crashes where a VM reports AMX but does not grant it).
pub(crate) fn llama_bench(
    site: &Path,
    model: &Path,
    t: usize,
    pp: usize,
    tg: usize,
) -> Result<(f64, bool)> {
    // numpy + gguf: the script takes deny_amx from tools/gen_random.py.
    let pythonpath = crate::randshape::python_path()?;
    let go = |plain: bool| {
        let mut c = Command::new("python3");
        c.env("PYTHONPATH", &pythonpath)
            .arg(root().join("tools/llamacpp_bench.py"))
            .arg(site)
            .arg(model)
            .args([t.to_string(), pp.to_string(), tg.to_string()]);
        if plain {
            c.env("PINCH_LLAMA_NO_EXTRA_BUFTS", "1");
        }
        output(&mut c)
    };
    let (out, plain) = match go(false) {
        Ok(o) => (o, false),
        Err(_) => (go(true)?, true),
    };
    let key = if tg > 0 { "tg_tps" } else { "pp_tps" };
    let tps = field(out.trim(), key).ok_or_else(|| format!("no {key} in {out}"))?;
    Ok((tps, plain))
}

/// The scaled random model of `arch` (`moe` or `qwen35`), generated and quantized on
/// first use into `.cache/bench-<arch>/` (never committed).
fn arch_model(arch: &str) -> Result<PathBuf> {
    let dir = root().join(format!(".cache/bench-{arch}"));
    let q = dir.join(format!("bench-{arch}-Q4_K_M.gguf"));
    if q.is_file() {
        return Ok(q);
    }
    let site = crate::randshape::llama_cpp_site()?;
    let path = crate::randshape::python_path()?;
    let mut c = Command::new("python3");
    c.env("PYTHONPATH", path)
        .arg(root().join(format!("tools/gen_{arch}_bench.py")))
        .arg(&dir);
    if arch == "moe" {
        c.arg(&site);
    }
    run(&mut c)?;
    let _ = std::fs::remove_file(dir.join("bench-moe-F16.gguf"));
    Ok(q)
}

/// The Qwen3.5-0.8B-shaped model with an MTP block (`kind`: `mtp`, a random block, or
/// `oracle`, see `tools/gen_qwen35_bench.py`), generated on first use into
/// `.cache/bench-qwen35-mtp/`.
pub fn mtp_model(kind: &str) -> Result<PathBuf> {
    let dir = root().join(".cache/bench-qwen35-mtp");
    let q = dir.join(format!("bench-qwen35-{kind}-Q4_K_M.gguf"));
    if q.is_file() {
        return Ok(q);
    }
    let path = crate::randshape::python_path()?;
    run(Command::new("python3")
        .env("PYTHONPATH", path)
        .arg(root().join("tools/gen_qwen35_bench.py"))
        .arg(&dir)
        .arg(format!(
            "--{}",
            if kind == "mtp" { "mtp" } else { "mtp-oracle" }
        )))?;
    Ok(q)
}

/// Instructions per token under qemu-aarch64 for both CPU models, and (`dense`: Gemma,
/// whose targets these are) under qemu-arm (cortex-a7: armv7 NEON) for the 32-bit
/// build, for the record; other models print theirs for the record only.
fn qemu_table(model: &Path, dense: bool) -> Result<()> {
    let bin = device::build(Device::Tv)?;
    let bin32 = if dense {
        device::build(Device::RouterArmv7)?
    } else {
        bin.clone()
    };
    let plugin = root().join("target/libinsn.so");
    run(Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(root().join("tools/qemu-insn/insn.c")))?;
    let long = "The history of computing is longer than the history of computing hardware and modern computing technology and includes the history of methods intended for pen and paper or for chalk and slate, with or without the aid of tables. Digital computing is intimately tied to the representation of numbers.";
    println!("\n## ARM under qemu: instructions per token (single thread)\n");
    println!("| cpu | generated token | target | prompt token | target |\n| --- | ---: | --- | ---: | --- |");
    let runs = [
        ("qemu-aarch64", &bin, "max", "<= 100 M", "<= 70 M"),
        ("qemu-aarch64", &bin, "cortex-a53", "<= 150 M", "<= 100 M"),
        ("qemu-arm", &bin32, "cortex-a7", "(record)", "(record)"),
    ];
    for (qemu, bin, cpu, tg_target, pp_target) in runs {
        if !dense && qemu == "qemu-arm" {
            continue;
        }
        let (tg_target, pp_target) = if dense {
            (tg_target, pp_target)
        } else {
            ("(record)", "(record)")
        };
        let count = |prompt: &str, n: usize| -> Result<(u64, usize)> {
            let out_file = root().join(format!("target/insn-{cpu}.txt"));
            let _ = std::fs::remove_file(&out_file);
            let stdout = output(
                Command::new(qemu)
                    .args(["-cpu", cpu, "-plugin"])
                    .arg(format!("{},out={}", plugin.display(), out_file.display()))
                    .arg(bin)
                    .args(["run", "-m"])
                    .arg(model)
                    .args([
                        "-p",
                        prompt,
                        "-n",
                        &n.to_string(),
                        "-t",
                        "1",
                        "-c",
                        "512",
                        "--temp",
                        "0",
                        "--ignore-eos",
                        "--json",
                    ]),
            )?;
            let text = std::fs::read_to_string(&out_file)
                .map_err(|e| format!("{}: {e}", out_file.display()))?;
            let insns = text
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("insns: "))
                .and_then(|v| v.trim().parse().ok())
                .ok_or("no insns line")?;
            let line = stdout
                .lines()
                .rev()
                .find(|l| l.starts_with('{'))
                .ok_or("no JSON")?;
            Ok((insns, field(line, "prompt_tokens").unwrap_or(0.0) as usize))
        };
        let (g8, _) = count("The capital of France is", 8)?;
        let (g24, _) = count("The capital of France is", 24)?;
        let (p_long, n_long) = count(long, 1)?;
        let (p_short, n_short) = count("Hello", 1)?;
        let per_gen = (g24 - g8) as f64 / 16.0 / 1e6;
        let per_prompt = (p_long - p_short) as f64 / (n_long - n_short) as f64 / 1e6;
        println!("| {cpu} | {per_gen:.1} M | {tg_target} | {per_prompt:.1} M | {pp_target} |");
    }
    Ok(())
}
