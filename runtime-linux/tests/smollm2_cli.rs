//! SmolLM2-135M-Instruct Q4_1 through the `pinch` binary: `pinch run`'s greedy text
//! against llama.cpp's, `pinch serve` answering a chat with the model's own template, and
//! `pinch ppl` on wiki-excerpt against llama-perplexity's figures
//! (tests/data/smollm2-135m/perplexity.json). `cargo xtask test` fetches the model and
//! runs these with `--ignored`.
mod server_util;

use serde_json::{json, Value};
use server_util::{connect, post_text, read_response, repo, Server};
use std::io::Write;
use std::process::Output;
use std::time::Duration;

fn model() -> Option<String> {
    let p = repo().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p.to_string_lossy().into_owned());
    }
    if std::env::var("PINCH_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: SmolLM2 model missing and PINCH_SKIP_MODEL_TESTS=1");
        return None;
    }
    panic!(
        "{} is missing: run `cargo xtask fetch-model smollm2-135m`",
        p.display()
    );
}

fn golden(name: &str) -> Value {
    let p = repo().join("tests/data/smollm2-135m").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn pinch(args: &[&str]) -> Output {
    server_util::pinch_ok(args)
}

/// `pinch run` greedy on a plain prompt prints the start of llama.cpp's greedy
/// continuation: its first 5 tokens, whose top-1 margins in prompts.json are all at least
/// 0.5 (so rounding cannot flip them; step 6 is a near tie, 0.03).
#[test]
#[ignore = "needs the real model: `cargo xtask test` runs it with --ignored"]
fn run_prints_llama_cpp_greedy_text() {
    let Some(m) = model() else { return };
    let pr = &golden("prompts.json")["prompts"][0];
    let prompt = pr["text"].as_str().unwrap();
    let margins = pr["f32kv"]["greedy_top1_margins"].as_array().unwrap();
    assert!(margins[..5].iter().all(|x| x.as_f64().unwrap() >= 0.5));
    let o = pinch(&[
        "run",
        "-m",
        &m,
        "-p",
        prompt,
        "-n",
        "5",
        "--temp",
        "0",
        "--ignore-eos",
        "-t",
        "2",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    // llama.cpp's greedy text of 48 tokens starts with what pinch's 5 tokens print.
    let want = pr["f32kv"]["greedy_text"].as_str().unwrap();
    let got = out
        .strip_prefix(prompt)
        .unwrap_or(&out)
        .trim_end_matches('\n');
    assert!(
        !got.trim().is_empty() && want.starts_with(got.trim_end()),
        "pinch printed {got:?}; llama.cpp's greedy text is {want:?}"
    );
    assert!(got.contains("Paris"), "{got:?}");
}

/// `pinch ppl -c 512` with an F32 KV cache on wiki-excerpt (19 chunks) gives
/// llama-perplexity's PPL and the protocol's bits per byte (llama.cpp's `f32kv` run)
/// within 0.5 %, the Gemma test's bound. Measured: PPL 26.8882 vs 26.9213 (-0.12 %), bpb
/// 1.209936 vs 1.210208 (-0.02 %); about 2 minutes of CPU with `-t 2` since Q4_1 has SIMD
/// kernels (16 minutes on the scalar path before).
#[test]
#[ignore = "needs the real model: `cargo xtask test` runs it with --ignored"]
fn ppl_matches_llama_perplexity() {
    let Some(m) = model() else { return };
    let want = &golden("perplexity.json")["results"]["wiki-excerpt.f32kv"];
    let f = repo().join("tests/data/eval/wiki-excerpt.txt");
    let o = pinch(&[
        "ppl",
        "-m",
        &m,
        "-f",
        f.to_str().unwrap(),
        "-c",
        "512",
        "-ctk",
        "f32",
        "-ctv",
        "f32",
        "-t",
        "2",
        "--json",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap();
    let j: Value = serde_json::from_str(line).unwrap();
    let (ppl, bpb) = (j["ppl"].as_f64().unwrap(), j["bpb"].as_f64().unwrap());
    let (want_ppl, want_bpb) = (want["ppl"].as_f64().unwrap(), want["bpb"].as_f64().unwrap());
    eprintln!("ppl {ppl:.4} (llama.cpp {want_ppl}), bpb {bpb:.6} (llama.cpp {want_bpb})");
    assert_eq!(j["n_chunks"], want["n_chunks"]);
    assert!(
        (ppl / want_ppl - 1.0).abs() < 0.005,
        "ppl {ppl} vs {want_ppl}"
    );
    assert!(
        (bpb / want_bpb - 1.0).abs() < 0.005,
        "bpb {bpb} vs {want_bpb}"
    );
}

/// `pinch serve` on SmolLM2 renders the chat with the GGUF's Jinja template and answers.
/// The prompt's token count is llama.cpp's for that rendering: 27 (llama-cpp-python
/// 0.3.36, `tokenize(text, add_bos=True, special=True)` of the text below). llama.cpp's
/// greedy answer (F32 KV) is "The capital of France is Paris." with top-1 margins 0.11,
/// 6.4, 5.9, 4.7, 3.9, 3.7, 1.0: the first token is a near tie, so only "Paris" is
/// required. (Without a system message the template adds its own, and llama.cpp answers
/// "L'Étoile, la Mar", first margin 0.06; pinch printed the same.)
#[test]
#[ignore = "needs the real model: `cargo xtask test` runs it with --ignored"]
fn serve_answers_a_chat() {
    let Some(m) = model() else { return };
    let s = Server::start_model(m.trim_end_matches(".gguf"), &["-c", "512", "-t", "2"]);
    let body = json!({
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}
        ],
        "max_tokens": 8,
        "temperature": 0
    });
    // Longer than server_util's 60 s read timeout: a loaded 2-core machine decodes the
    // 27-token prompt and 8 tokens in about that.
    let mut c = connect(s.port);
    c.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    c.write_all(post_text("/v1/chat/completions", &body.to_string()).as_bytes())
        .unwrap();
    let r = read_response(&mut c);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(r.status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    eprintln!("answer: {text:?}, usage {}", v["usage"]);
    assert!(text.contains("Paris"), "{text:?}");
    // "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n
    // What is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    assert_eq!(v["usage"]["prompt_tokens"], 27);
}
