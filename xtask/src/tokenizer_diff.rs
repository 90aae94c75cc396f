//! `cargo xtask tokenizer-diff [--random N] [--seed S]`: a longer hunt than CI's for
//! differences between pinch's tokenizer and llama.cpp's, run by hand.
//!
//! CI replays the committed vectors (`tests/data/vocab/diff/`, 100 random strings) without
//! Python. This command needs llama-cpp-python 0.3.36 (= llama.cpp 0c1e570, installed into
//! `$HOME/.cache/pinch/llama-cpp-python` on first use) and its sdist's `models/`:
//! 1. llama.cpp's own `.inp`/`.out` vectors of every vocab file in the sdist, also those
//!    too large for the repo (`tokenizer_vectors`, `every_llama_cpp_vocab_with_vectors`);
//! 2. `tools/tokenizer_diff_cases.py --random N --seed S` writes vectors for N random
//!    strings (default 2000, seed 1) into `target/tokenizer-diff/`, for the repo's vocab
//!    files and the models in `models/` (SmolLM2, Gemma 3 270M) when present, and
//!    `runtime-min/tests/tokenizer_diff.rs` replays them (`PINCH_TOKENIZER_DIFF_DIR`).
use crate::util::{cargo, root, run, target_dir, Result};
use std::path::PathBuf;
use std::process::Command;

/// llama.cpp's `models/` folder from the llama-cpp-python sdist, downloading it when missing
/// (the same download as `cargo xtask compat`'s: with the build backend from a wheel, not
/// built from source).
pub(crate) fn vocab_dir() -> Result<PathBuf> {
    Ok(crate::compat::llama_cpp_src()?.join("models"))
}

pub fn main(args: &[String]) -> Result<()> {
    let (mut random, mut seed) = ("2000".to_string(), "1".to_string());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let slot = match a.as_str() {
            "--random" => &mut random,
            "--seed" => &mut seed,
            _ => return Err("usage: cargo xtask tokenizer-diff [--random N] [--seed S]".into()),
        };
        *slot = it.next().ok_or(format!("{a} needs a value"))?.clone();
    }
    let py = crate::randshape::llama_cpp_site()?;
    let models = vocab_dir()?;
    run(cargo([
        "test",
        "--release",
        "-p",
        "pinch-runtime-min",
        "--test",
        "tokenizer_vectors",
        "--",
        "--ignored",
        "--nocapture",
        "every_llama_cpp_vocab_with_vectors",
    ])
    .env("PINCH_VOCAB_DIR", &models))?;

    let out = target_dir().join("tokenizer-diff");
    let _ = std::fs::remove_dir_all(&out);
    let models = [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ]
    .map(|m| root().join("models").join(m));
    run(Command::new("python3")
        .env("PYTHONPATH", &py)
        .arg(root().join("tools/tokenizer_diff_cases.py"))
        .arg("--out")
        .arg(&out)
        .args(["--random", &random, "--seed", &seed])
        .args(models.iter().filter(|p| p.is_file())))?;
    run(cargo([
        "test",
        "--release",
        "-p",
        "pinch-runtime-min",
        "--test",
        "tokenizer_diff",
        "--",
        "--nocapture",
    ])
    .env("PINCH_TOKENIZER_DIFF_DIR", &out))
}
