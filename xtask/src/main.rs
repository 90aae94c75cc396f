//! `cargo xtask`: the project's build, fetch and test commands in one place.
//!
//! One module per command, std only, so a fresh checkout needs nothing but rustup, python3
//! (for the model download) and qemu-user (installed on demand by `test`):
//! - [`fetch`]: `fetch-model <name>` downloads and verifies a GGUF file into `models/`.
//! - [`device`]: `build --device tv|router|ipad|host` builds the shipping artifact
//!   ([`armv7_musl`]: the static musl route of `router-armv7`).
//! - [`test`]: `test`, the one test command CI runs (lint, native, qemu, no_std, device).
//! - [`size`]: `size` reports the device binary size.
//! - [`run`]: `run -- <pinch args>` builds the host binary and runs it on the test model.
//! - [`bench`]: `bench [--vs-llama-cpp] [--qemu]`, the speed and memory targets.
//! - [`fuzz`]: `fuzz [--seconds N] [TARGET ...]`, the libFuzzer targets in `fuzz/`.
//! - [`soak`]: `soak --minutes N`, hours of mixed traffic against `pinch serve`.
//! - [`randshape`]: `randshape [--seed N] [--new K]`, random-shape models vs llama.cpp.
//! - [`compat`]: `compat`, llama.cpp's server test suite against `pinch serve`.
//! - [`tokenizer_diff`]: `tokenizer-diff [--random N]`, a long tokenizer hunt vs llama.cpp.
//! - [`util`]: running commands, finding the workspace and the target directory.
mod armv7_musl;
mod bench;
mod bonsai_bench;
mod busy_bench;
mod compat;
mod device;
mod draft_bench;
mod fetch;
mod fuzz;
mod moe_bench;
mod randshape;
mod run;
mod size;
mod soak;
mod test;
mod tokenizer_diff;
mod util;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command>
  fetch-model gemma3-270m|smollm2-135m  download + verify a test model into models/
  tokenizer-diff [--random N] [--seed S]  N random strings vs llama.cpp's tokenizer
  build --device tv|router|ipad|host build the release artifact for a device
  test [--keep-going]               the one test command (what CI runs)
  size                              build the tv binary and report its size
  run -- <pinch args>               build the host binary and run `pinch run` on the test model
  bench [--vs-llama-cpp] [--qemu] [--moe] [--moe-scaled] [--stream] [--draft] [--busy-core]   speed and memory targets (issue #4) on Gemma 3 270M
                                   (--moe: the x86 table on a scaled random MoE model)
  fuzz [--seconds N] [TARGET ...]   run the fuzz targets (nightly + libFuzzer), N s each
  soak --minutes N [--model PATH]   20 clients of good and hostile traffic against `pinch serve`
  randshape [--seed N ...] [--new K] random-shape models and pinch ppl vs llama.cpp
  compat [--files a,b] [-k EXPR]    llama.cpp's server tests against `pinch serve`";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or(&[]);
    let result = match args.first().map(String::as_str) {
        Some("fetch-model") => fetch::main(rest),
        Some("build") => device::main(rest),
        Some("test") => test::main(rest),
        Some("size") => size::main(rest),
        Some("run") => run::main(rest),
        Some("bench") => bench::main(rest),
        Some("fuzz") => fuzz::main(rest),
        Some("soak") => soak::main(rest),
        Some("randshape") => randshape::main(rest),
        Some("compat") => compat::main(rest),
        Some("tokenizer-diff") => tokenizer_diff::main(rest),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(format!("unknown command `{other}`\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("xtask: error: {msg}");
            ExitCode::FAILURE
        }
    }
}
