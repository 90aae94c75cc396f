//! The cost of a pruned LM head in bits per byte, end to end (`pinch head-select`,
//! then `pinch ppl` with and without `--head`) on Gemma 3 270M and English text the
//! selection never saw (the first 4.6 KB of `tests/data/eval/wiki-excerpt.txt`, about
//! 1,000 tokens; the selection reads `tests/data/corpus`).
//!
//! The target is a head of 65,536 rows within 1 % bits per byte. Corpus-count
//! selection is far from it: measured on this text, 131,072 rows (half the
//! vocabulary) still cost +10.09 %; on the first 9.7 KB of the excerpt, 65,536 rows
//! from the whole corpus cost +19.8 %, from its English file alone +52.8 %, from that
//! file with `--soft` +19.1 %. This test therefore guards the measured cost at
//! [`ROWS`] rows against regressions ([`MAX_COST`]); it is not the 1 % bound, which no
//! selection here meets yet.
//!
//! Gemma 3 270M is not in git (`cargo xtask fetch-model gemma3-270m`); the test fails
//! without it unless `PINCH_SKIP_MODEL_TESTS=1`.
mod server_util;

use server_util::repo;
use std::path::Path;
use std::process::Output;

/// Head rows checked.
const ROWS: usize = 131_072;

/// Most relative bits-per-byte cost allowed at [`ROWS`] rows (measured: 0.1009).
const MAX_COST: f64 = 0.11;

fn pinch(args: &[&str]) -> Output {
    server_util::pinch_ok(args)
}

fn bpb(o: &Output) -> f64 {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["bpb"].as_f64().unwrap()
}

#[test]
#[ignore = "minutes of compute: `cargo xtask test` runs it on a release build with --ignored"]
fn pruned_head_cost_on_held_out_english_stays_at_the_measured_level() {
    let model = repo().join("models/gemma-3-270m-q4_k_m.gguf");
    if !model.exists() && std::env::var("PINCH_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: Gemma model missing and PINCH_SKIP_MODEL_TESTS=1");
        return;
    }
    let model = model.to_string_lossy().into_owned();
    let dir = std::env::temp_dir().join(format!("pinch-head-bpb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // About 1,000 tokens: two 512-token chunks of held-out English.
    let text = std::fs::read_to_string(repo().join("tests/data/eval/wiki-excerpt.txt")).unwrap();
    let cut = text[..4600].rfind('\n').unwrap() + 1;
    let eval = dir.join("eval.txt");
    std::fs::write(&eval, &text[..cut]).unwrap();
    let ids = dir.join("head.ids");
    let corpus = repo().join("tests/data/corpus");
    pinch(&[
        "head-select",
        "-m",
        &model,
        "--corpus",
        corpus.to_str().unwrap(),
        "--rows",
        &ROWS.to_string(),
        "-o",
        ids.to_str().unwrap(),
    ]);
    let ppl = |head: Option<&Path>| {
        let mut a = vec!["ppl", "-m", &model, "-f", eval.to_str().unwrap(), "--json"];
        if let Some(h) = head {
            a.extend(["--head", h.to_str().unwrap()]);
        }
        bpb(&pinch(&a))
    };
    let (full, pruned) = (ppl(None), ppl(Some(&ids)));
    let cost = pruned / full - 1.0;
    println!(
        "{ROWS} rows: bpb {full:.4} -> {pruned:.4} ({:+.2} %)",
        100.0 * cost
    );
    assert!(
        cost <= MAX_COST,
        "{ROWS} rows cost {:.2} % bits per byte",
        100.0 * cost
    );
    let _ = std::fs::remove_dir_all(&dir);
}
