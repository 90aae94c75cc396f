//! Random-shape models (tools/gen_random.py) against llama.cpp's logits.
//!
//! The tiny fixtures have one shape per architecture; these have shapes drawn from a
//! seed (head counts with and without grouping, head_dim 32..256 and 80/104/..., odd
//! FFN lengths, 1-4 layers, layer patterns, expert counts, vocabularies that are not a
//! multiple of 8, tied and untied heads) in F32 and llama.cpp-quantized types.
//! `cargo xtask randshape` generates them (with llama.cpp's logits) into a cache
//! directory and runs this test with `PINCH_RANDSHAPE_DIR` naming it; the test is
//! `#[ignore]`d otherwise, and fails when the variable is set but the files are missing.
//!
//! Tolerances are golden_tiny.rs's: the f32 oracle (`Math::Reference`) within 1e-4 of
//! llama.cpp on the dequantized weights (gemma3: 1.5e-3 x (layers + 1), see below;
//! never below 1.5 x llama.cpp's own
//! batched-vs-one-token distance on that file) and the same top-1 where
//! llama.cpp's margin exceeds twice that (below, a flip is within the tolerance); the
//! fast path (`Math::Fast`) on the quantized file within 1.5 x max(llama.cpp's own
//! quantized-vs-dequantized distance, 0.05), at most 1/8 of the positions (3 of 24)
//! beyond 1e-4 on x86 (not for the [`FAST_INEXACT`] types), and the same top-1 where
//! llama.cpp's margin is at least 0.5. Both batched (one eval
//! of all tokens) and one token at a time.
use std::path::{Path, PathBuf};

use pinch_kernels::GgmlType;
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::model::{KvType, Math, ModelError};
use pinch_tests::*;

/// Architectures gen_random.py writes that pinch does not run yet: every file of theirs
/// must fail with `UnsupportedArch`. An architecture leaves this list in the change
/// that makes it pass this test.
const PENDING_ARCHS: &[&str] = &[];

/// Weight types whose fast path does not reproduce llama.cpp's x86 sums on every shape
/// (found by this test): a file holding one is held to the quantization bound and the
/// top-1 rule only, not to "few positions beyond 1e-4", and its row says so.
/// F16 with rows not a multiple of 64 (checked below): seen on several seeds of every
/// run (all positions differ, by about 3e-3). A type leaves this list in the change that
/// makes its kernel sum as llama.cpp does (Q4_1 / Q5_1 left it when pinch's Q8_1
/// activations and their dot products became llama.cpp's x86 arithmetic).
const FAST_INEXACT: &[GgmlType] = &[GgmlType::F16];

/// (seed, quant) runs known to differ beyond 1e-4 at more than a few positions while
/// staying inside the quantization bound with no top-1 flip: shown as KNOWN FAIL in the
/// table. An entry excuses only that rule (a run beyond the bound or with a flipped top-1
/// still fails). An entry that passes is shown, not failed: llama.cpp is built for the
/// machine's CPU, and its sums differ with the build (on a 2-vCPU AMD EPYC with AVX2 and
/// no AVX-512, seed 3 Q5_0 and 17 Q5_1 pass: 17's worst position 3e-6 where the list's
/// machine saw 0.35; 3's one-token logits there differ by 0.11 where its batched ones
/// agree, the other way round from below). Taken
/// from a fresh generation (numpy 2.4.6 from the oracle's cache, llama-cpp-python 0.3.36;
/// the seeds' shapes differ from the earlier cache the first list was made from):
/// - 3 Q5_0 / Q6_K (gemma3 e256 L3, ffn 448: Q5_0 / Q8_0 fallbacks), batched only: 5 and 9
///   of 32 positions, max 0.11 / 0.17; llama.cpp's own batched and one-token logits of
///   these files differ by the same 0.11 / 0.17 (its batched path sums otherwise), and
///   pinch one token at a time matches llama.cpp's within 3e-6.
/// - 15 Q5_K_M (lfm2 e256), batched only: 19 of 26, max 0.14; one token at a time 2.9e-6.
/// - 6 F16 (qwen35 e512) and 19 F16 (gemma3 e256, rows a multiple of 64): up to all
///   positions, max 6e-3: the F16 dot product's summation order is not llama.cpp's.
/// - 17 Q5_1 (qwen2 e256 h8/1x32): 7 of 25, max 0.35 (bound 0.46), batched and one token.
/// - 18 Q4_K_M (qwen3 e448: Q5_0 fallbacks for rows of 448): 19 of 30, max 0.11.
/// - 23 Q2_K (lfm2 e256 L4): 10 of 31, max 0.16 (bound 0.85).
const KNOWN_FAILURES: &[(&str, &str)] = &[
    ("3", "Q5_0"),
    ("3", "Q6_K"),
    ("6", "F16"),
    ("15", "Q5_K_M"),
    ("17", "Q5_1"),
    ("18", "Q4_K_M"),
    ("19", "F16"),
    ("23", "Q2_K"),
];

/// The [`FAST_INEXACT`] types among the file's tensors (F16 only with a row length
/// that is not a multiple of 64).
fn inexact_types(bytes: &[u8]) -> Vec<GgmlType> {
    let g = Gguf::parse(bytes, bytes.len() as u64).expect("gguf parses");
    FAST_INEXACT
        .iter()
        .copied()
        .filter(|ty| {
            g.tensors()
                .any(|t| t.ty == *ty && (*ty != GgmlType::F16 || !t.dims[0].is_multiple_of(64)))
        })
        .collect()
}

/// The seed directories under `PINCH_RANDSHAPE_DIR`, in seed order: those named by
/// `PINCH_RANDSHAPE_SEEDS` (comma-separated; each must exist), else all.
fn seed_dirs() -> Vec<PathBuf> {
    let root = std::env::var_os("PINCH_RANDSHAPE_DIR")
        .expect("PINCH_RANDSHAPE_DIR is not set: run `cargo xtask randshape`");
    let root = PathBuf::from(root);
    if let Ok(list) = std::env::var("PINCH_RANDSHAPE_SEEDS") {
        let dirs: Vec<PathBuf> = list.split(',').map(|s| root.join(s.trim())).collect();
        for d in &dirs {
            assert!(
                d.is_dir(),
                "{} missing: run `cargo xtask randshape`",
                d.display()
            );
        }
        return dirs;
    }
    let mut dirs: Vec<(u64, PathBuf)> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let seed = e.file_name().to_str()?.parse().ok()?;
            Some((seed, e.path()))
        })
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no seed directories in {}: run `cargo xtask randshape`",
        root.display()
    );
    dirs.into_iter().map(|(_, p)| p).collect()
}

/// llama.cpp's logits `<dir>/<name>.<kind>.f32` (kind: batched or seq).
fn llama_rows(dir: &Path, name: &str, kind: &str, n_vocab: usize) -> Vec<Vec<f32>> {
    read_rows(&dir.join(format!("{name}.{kind}.f32")), n_vocab)
}

/// Worst difference, positions beyond 1e-4, and top-1 flips where llama.cpp's
/// margin is at least `margin`.
struct Cmp {
    worst: f32,
    over: usize,
    flips: usize,
}

fn compare(got: &[Vec<f32>], want: &[Vec<f32>], margin: f32) -> Cmp {
    assert_eq!(got.len(), want.len(), "row counts differ");
    let mut c = Cmp {
        worst: 0.0,
        over: 0,
        flips: 0,
    };
    for (g, w) in got.iter().zip(want) {
        let d = max_abs_diff(g, w);
        c.worst = c.worst.max(d);
        c.over += usize::from(d > 1e-4);
        c.flips += usize::from(top1_margin(w) >= margin && argmax(g) != argmax(w));
    }
    c
}

fn spec(math: Math, batch: usize) -> RunSpec {
    RunSpec {
        math,
        kv: KvType::F32,
        batch,
        threads: if math == Math::Fast { 2 } else { 1 },
        attn_skip: false,
    }
}

#[test]
#[ignore = "needs PINCH_RANDSHAPE_DIR (run by `cargo xtask randshape` / `cargo xtask test`)"]
fn random_shapes_match_llama_cpp() {
    let mut table = vec![format!(
        "{:>6}  {:12} {:62} {:7} {:>9} {:>9} {:>9} {:>9}  result",
        "seed", "arch", "shape", "quant", "orc bat", "orc seq", "fast bat", "fast seq"
    )];
    let mut failures = Vec::new();
    // Seeds new to this run: the "few positions beyond 1e-4" rule only informs (see
    // the module doc); the fixed seeds keep it.
    let fresh_seeds: Vec<String> = std::env::var("PINCH_RANDSHAPE_FRESH")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    for dir in seed_dirs() {
        let meta_path = dir.join("meta.txt");
        assert!(
            meta_path.exists(),
            "{} missing: regenerate with `cargo xtask randshape`",
            meta_path.display()
        );
        let meta = Meta::load(&meta_path);
        let seed = meta.get("seed").expect("seed").to_string();
        let arch = meta.get("arch").expect("arch").to_string();
        let shape = meta.get("summary").unwrap_or("").to_string();
        let n_vocab: usize = meta.get("n_vocab").expect("n_vocab").parse().unwrap();
        let tokens = meta.u32s("tokens");
        let quants: Vec<String> = meta
            .get("quants")
            .expect("quants")
            .split(' ')
            .map(String::from)
            .collect();
        let pending = PENDING_ARCHS.contains(&arch.as_str());
        let fresh = fresh_seeds.contains(&seed);
        // gemma3: llama.cpp's f16 GELU table makes its f32 arithmetic chaotic: a sum
        // that differs in its last bit can round to the neighbouring f16 input, a step of
        // ~5e-4 relative in that activation, and this grows with depth (its own F16-vs-F32
        // KV runs of the 3-layer fixture differ by 9e-3). Measured on 41 fresh gemma3 seeds
        // (8003..8315 step 8, 368171; 123 files): worst oracle distance 1.22e-3 at 1
        // layer, 2.92e-3 at 2, 3.14e-3 at 3, 3.25e-3 at 4 (seed 5099: 4.6e-3), the fast
        // path on F32 files as far (8035: 3.14e-3); the old bound, 2e-3 up to 3 layers,
        // failed 4 of them. So 1.5e-3 x (layers + 1): at least 1.6 x each worst case.
        let oracle_tol = if arch == "gemma3" {
            1.5e-3 * (n_layer_of(&shape) as f32 + 1.0)
        } else {
            1e-4
        };
        for q in &quants {
            let file = dir.join(format!("{q}.gguf"));
            let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let mut row = format!("{seed:>6}  {arch:12} {shape:62} {q:7}");
            if pending {
                match run_logits(&bytes, &tokens, spec(Math::Reference, tokens.len())) {
                    Err(ModelError::UnsupportedArch) => {
                        row += &format!("{:>39}  pending (UnsupportedArch)", "");
                    }
                    other => {
                        row += &format!("{:>39}  FAIL", "");
                        failures.push(format!(
                            "seed {seed} {q}: pending arch {arch} gave {:?}, not UnsupportedArch",
                            other.map(|_| ())
                        ));
                    }
                }
                table.push(row);
                continue;
            }
            // llama.cpp's logits: the oracle's reference is the dequantized copy (for F32
            // the file itself); the fast path's is the quantized file.
            let dequant = if q == "F32" {
                q.clone()
            } else {
                format!("{q}.dequant")
            };
            let qvd: f32 = meta
                .get(&format!("{q}.quant_vs_dequant"))
                .map_or(0.0, |v| v.parse().unwrap());
            let bound = qvd.max(0.05) * 1.5;
            let inexact = inexact_types(&bytes);
            // llama.cpp's own batched and one-token logits of the oracle's reference can
            // differ by more than the oracle tolerance (seed 625331, gemma3 L2 Q2_K
            // dequantized: 2.9e-3 against 2e-3): pinch cannot be within less than that of
            // both, so the oracle is held to 1.5 x llama.cpp's own spread where it is larger.
            let llama_spread: f32 = meta
                .get(&format!("{dequant}.batched_vs_seq"))
                .map_or(0.0, |v| v.parse().unwrap());
            let oracle_tol = oracle_tol.max(1.5 * llama_spread);
            // A model whose own quantized and dequantized logits differ by more than 1
            // (logits have std 2-4) amplifies every rounding difference: there a type
            // known not to sum as llama.cpp does can leave any bound (seed 892709,
            // bailingmoe2 e64 Q5_1: llama.cpp's own distance 3.85, pinch's 8.84). Such
            // runs are reported, not failed; exact types are still held to the bound.
            let chaotic = qvd > 1.0 && !inexact.is_empty();
            let mut why = Vec::new();
            let mut spread = Vec::new();
            // beyond the bound or a flipped top-1: never excused by KNOWN_FAILURES
            let mut hard_any = false;
            for (math, batch, kind) in [
                (Math::Reference, tokens.len(), "batched"),
                (Math::Reference, 1, "seq"),
                (Math::Fast, tokens.len(), "batched"),
                (Math::Fast, 1, "seq"),
            ] {
                let reference = if math == Math::Reference { &dequant } else { q };
                let want = llama_rows(&dir, reference, kind, n_vocab);
                let got = match run_logits(&bytes, &tokens, spec(math, batch)) {
                    Ok((_, rows)) => rows,
                    Err(e) => {
                        row += &format!(" {:>9}", "error");
                        why.push(format!("{math:?} {kind}: {e}"));
                        continue;
                    }
                };
                // F32 weights: the fast path has no activation quantization either, so
                // it is held to the oracle's tolerance.
                let exact = math == Math::Reference || q == "F32";
                let c = compare(&got, &want, if exact { 2.0 * oracle_tol } else { 0.5 });
                row += &format!(" {:>9.2e}", c.worst);
                // golden_tiny's "at most 3 of 24 positions", scaled to the token count
                let few = c.over * 8 <= tokens.len() || cfg!(target_arch = "aarch64");
                let hard = if exact {
                    c.worst > oracle_tol || c.flips > 0
                } else {
                    (c.worst > bound || c.flips > 0) && !chaotic
                };
                if !exact && chaotic && (c.worst > bound || c.flips > 0) {
                    spread.push(format!(
                        "{kind}: chaotic model (llama.cpp's own quant-vs-dequant {qvd:.2}): max {:.2}, {} top-1 flips, not fatal",
                        c.worst, c.flips
                    ));
                }
                if !exact && !few {
                    spread.push(format!("{kind} {}/{}", c.over, tokens.len()));
                }
                hard_any |= hard;
                if hard || (!exact && !few && inexact.is_empty() && !fresh) {
                    why.push(format!(
                        "{math:?} {kind}: max diff {:.3e} (tolerance {:.1e}), {} positions > 1e-4, {} top-1 flips",
                        c.worst,
                        if exact { oracle_tol } else { bound },
                        c.over,
                        c.flips
                    ));
                }
            }
            let known = KNOWN_FAILURES.contains(&(seed.as_str(), q.as_str())) && !hard_any;
            let note = match (spread.is_empty(), inexact.is_empty()) {
                (true, _) => String::new(),
                (false, false) => format!(" (inexact {inexact:?}: {})", spread.join(", ")),
                (false, true) if fresh => format!(
                    " (fresh seed, positions > 1e-4 not fatal: {})",
                    spread.join(", ")
                ),
                (false, true) => format!(" ({})", spread.join(", ")),
            };
            match (why.is_empty(), known) {
                (true, false) => row += &format!("  ok{note}"),
                (false, true) => row += &format!("  KNOWN FAIL{note}"),
                (true, true) => {
                    row += &format!(
                        "  ok, listed in KNOWN_FAILURES: passes with this llama.cpp build{note}"
                    );
                }
                (false, false) => {
                    row += &format!("  FAIL{note}");
                    failures.push(format!(
                        "seed {seed} ({arch} {shape}) {q}: {}",
                        why.join("; ")
                    ));
                }
            }
            table.push(row);
        }
    }
    println!("{}", table.join("\n"));
    assert!(
        failures.is_empty(),
        "{} random-shape runs differ from llama.cpp (regenerate one with `cargo xtask randshape --seed N`):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Layers of a shape summary (`... L3 ...`).
fn n_layer_of(shape: &str) -> usize {
    shape
        .split(' ')
        .find_map(|w| w.strip_prefix('L').and_then(|n| n.parse().ok()))
        .unwrap_or(1)
}
