//! `cargo xtask bench --draft`: speculative decoding with prompt-lookup drafts (issue
//! #19) on Gemma 3 270M at 40 % of its all-resident need, where the streamed weights make
//! generation storage-bound. Per prompt (two that quote their context, free text greedy
//! and sampled), runs with `--draft 0` and `--draft 8` alternate `REPS` times in the same
//! session of this command; the table gives the medians, their ratio, the acceptance
//! rate, tokens per weight pass, and the bytes the OS read per generated token. The
//! model is the pretrained one (no instruction tuning): its greedy free text soon
//! repeats itself, which drafts predict well; the sampled row (temperature 0.8, top-k
//! 40, seed 1) is the harder case.
use crate::bench::{field, median, resident_need};
use crate::util::Result;
use std::path::Path;
use std::process::Command;

const REPS: usize = 3;
/// Tokens generated per run (greedy, stopping at the end of the answer).
const N: &str = "48";

/// (name, prompt, sampled): chat-format prompts, and a plain text continuation.
const PROMPTS: [(&str, &str, bool); 4] = [
    (
        "summary of a given paragraph",
        "<start_of_turn>user\nSummarize the following paragraph in two sentences, reusing its wording.\n\nThe old lighthouse on the northern cliff was built in 1872 by the harbour board to guard ships from the rocks below. For nearly a century its keepers lit the lamp every evening, wound the clockwork that turned the lens, and wrote the weather into a leather logbook. In 1968 the lamp was automated, the last keeper moved to the village, and the tower was left to the gulls until a group of volunteers restored it in 2004 as a small museum.<end_of_turn>\n<start_of_turn>model\n",
        false,
    ),
    (
        "code edit of a given function",
        "<start_of_turn>user\nRename the variable `total` to `sum` in this Python function and add a docstring. Reply with the whole function.\n\ndef average(values):\n    total = 0\n    count = 0\n    for v in values:\n        total += v\n        count += 1\n    if count == 0:\n        return 0\n    return total / count\n<end_of_turn>\n<start_of_turn>model\n",
        false,
    ),
    (
        "free text, greedy",
        "The history of the printing press begins in",
        false,
    ),
    (
        "free text, sampled (temp 0.8)",
        "The history of the printing press begins in",
        true,
    ),
];

/// One `pinch run`'s JSON summary.
struct Run {
    tps: f64,
    gen: f64,
    passes: f64,
    drafted: f64,
    accepted: f64,
    os_read: f64,
    text: String,
}

fn run(
    pinch: &Path,
    model: &Path,
    prompt: &Path,
    budget: u64,
    draft: usize,
    sampled: bool,
) -> Result<Run> {
    run_with(pinch, model, prompt, Some(budget), draft, sampled, &[])
}

/// [`run`] with `extra` flags, and without `--budget` for `None`.
fn run_with(
    pinch: &Path,
    model: &Path,
    prompt: &Path,
    budget: Option<u64>,
    draft: usize,
    sampled: bool,
    extra: &[&str],
) -> Result<Run> {
    let temp: &[&str] = if sampled {
        &["--temp", "0.8", "--seed", "1"]
    } else {
        &["--temp", "0"]
    };
    let out = Command::new(pinch)
        .args(["run", "-m"])
        .arg(model)
        .arg("-f")
        .arg(prompt)
        .args(["-c", "1024", "-n", N, "-t", "2", "--json"])
        .args(temp)
        .args(
            budget
                .map(|b| ["--budget".to_string(), b.to_string()])
                .into_iter()
                .flatten(),
        )
        .args(["--draft", &draft.to_string()])
        .args(extra)
        .output()
        .map_err(|e| format!("{}: {e}", pinch.display()))?;
    if !out.status.success() {
        return Err(format!(
            "pinch run --draft {draft} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("pinch run printed no JSON")?;
    let f = |k: &str| field(line, k).unwrap_or(0.0);
    let text = line
        .find("\"text\":")
        .map_or(String::new(), |i| line[i..].to_string());
    Ok(Run {
        tps: f("gen_tps"),
        gen: f("gen_tokens"),
        passes: f("gen_passes"),
        drafted: f("drafted"),
        accepted: f("accepted"),
        os_read: f("os_read_bytes"),
        text,
    })
}

pub fn table(pinch: &Path, model: &Path) -> Result<()> {
    let need = resident_need(pinch, model)?;
    let budget = need * 40 / 100;
    let mib = |b: f64| b / (1u64 << 20) as f64;
    println!(
        "\n## Speculative decoding: Gemma 3 270M at 40 % of the resident need ({:.1} of {:.1} MiB), -c 1024, -t 2, up to {N} tokens; medians of {REPS} alternating runs\n",
        mib(budget as f64),
        mib(need as f64)
    );
    println!("| prompt | tokens | tok/s --draft 0 | tok/s --draft 8 | ratio | accepted | tokens/pass | read/token (OS) --draft 0 | --draft 8 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let dir = std::env::temp_dir().join(format!("pinch-draft-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (i, &(name, text, sampled)) in PROMPTS.iter().enumerate() {
        let prompt = dir.join(format!("prompt{i}.txt"));
        std::fs::write(&prompt, text).map_err(|e| format!("{}: {e}", prompt.display()))?;
        let (mut plain, mut spec) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            plain.push(run(pinch, model, &prompt, budget, 0, sampled)?);
            spec.push(run(pinch, model, &prompt, budget, 8, sampled)?);
        }
        // Greedy output with drafts is that of plain decoding (tests/tests/speculative.rs;
        // sampled output is distributed alike, but drafts use the random numbers
        // differently, so the text differs).
        if !sampled && spec.iter().chain(&plain).any(|r| r.text != plain[0].text) {
            return Err(format!("{name}: the texts of the runs differ"));
        }
        let med =
            |v: &[Run], f: &dyn Fn(&Run) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
        let (a, b) = (med(&plain, &|r| r.tps), med(&spec, &|r| r.tps));
        let s = &spec[0];
        println!(
            "| {name} | {:.0} | {a:.2} | {b:.2} | {:.2}x | {:.0} % ({:.0}/{:.0}) | {:.2} | {:.1} MiB | {:.1} MiB |",
            s.gen,
            b / a,
            100.0 * s.accepted / s.drafted.max(1.0),
            s.accepted,
            s.drafted,
            s.gen / s.passes.max(1.0),
            mib(med(&plain, &|r| r.os_read / r.gen.max(1.0))),
            mib(med(&spec, &|r| r.os_read / r.gen.max(1.0))),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `cargo xtask bench --draft --arch qwen35`: drafts from a Qwen3.5 MTP block on the
/// Qwen3.5-0.8B shape (`tools/gen_qwen35_bench.py --mtp | --mtp-oracle`: a random block,
/// whose guesses are wrong, and the trunk made a bigram model whose block is its
/// oracle), all resident and at 65 % of the resident need (a plan with MTP drafts keeps
/// the LM head and streams layers; without, layers come first). `--draft 0`, `--draft 3`
/// (the block) and `--draft 3 --spec-type lookup` alternate `REPS` times; medians.
pub fn mtp_table(pinch: &Path) -> Result<()> {
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let dir = std::env::temp_dir().join(format!("pinch-mtp-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let prompt = dir.join("prompt.txt");
    std::fs::write(&prompt, "The history of the city begins with")
        .map_err(|e| format!("{}: {e}", prompt.display()))?;
    println!("\n## MTP drafts: Qwen3.5-0.8B-shaped Q4_K_M (random weights), -c 1024, -t 2, {N} tokens, greedy; medians of {REPS} alternating runs\n");
    println!("| block | budget | tok/s --draft 0 | --draft 3 (MTP) | ratio | accepted | tokens/pass | --draft 3 lookup | read/token (OS) 0 / MTP / lookup |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (kind, name) in [("mtp", "random"), ("oracle", "oracle of a bigram trunk")] {
        let model = crate::bench::mtp_model(kind)?;
        let need = crate::bench::resident_need(pinch, &model)?;
        for budget in [None, Some(need * 65 / 100)] {
            let (mut plain, mut mtp, mut lookup) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..REPS {
                plain.push(run_with(pinch, &model, &prompt, budget, 0, false, &[])?);
                mtp.push(run_with(
                    pinch,
                    &model,
                    &prompt,
                    budget,
                    3,
                    false,
                    &["--spec-type", "mtp"],
                )?);
                lookup.push(run_with(
                    pinch,
                    &model,
                    &prompt,
                    budget,
                    3,
                    false,
                    &["--spec-type", "lookup"],
                )?);
            }
            if mtp
                .iter()
                .chain(&lookup)
                .chain(&plain)
                .any(|r| r.text != plain[0].text)
            {
                return Err(format!("{name}: the texts of the runs differ"));
            }
            let med = |v: &[Run], f: &dyn Fn(&Run) -> f64| {
                median(&mut v.iter().map(f).collect::<Vec<_>>())
            };
            let tps = |v: &[Run]| med(v, &|r| r.tps);
            let read = |v: &[Run]| mib(med(v, &|r| r.os_read / r.gen.max(1.0)));
            let m = &mtp[0];
            let b = budget.map_or("all resident".to_string(), |b| {
                format!("{:.0} MiB (65 %)", mib(b as f64))
            });
            println!(
                "| {name} | {b} | {:.2} | {:.2} | {:.2}x | {:.0}/{:.0} | {:.2} | {:.2} | {:.1} / {:.1} / {:.1} MiB |",
                tps(&plain),
                tps(&mtp),
                tps(&mtp) / tps(&plain),
                m.accepted,
                m.drafted,
                m.gen / m.passes.max(1.0),
                tps(&lookup),
                read(&plain),
                read(&mtp),
                read(&lookup),
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
