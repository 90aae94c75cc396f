//! SmolLM2-135M-Instruct Q4_1 (the second real model: llama architecture, byte-level BPE
//! vocab with the `smollm` pre-tokenizer, no BOS) against llama.cpp's goldens in
//! tests/data/smollm2-135m (see its README): tokenization, top-20 logits at every prompt
//! position, teacher-forced greedy continuations, and the chat template. Perplexity,
//! `pinch run` and `pinch serve` are checked through the binary
//! (runtime-linux/tests/smollm2_cli.rs).
//!
//! Tolerances follow the Gemma tests' policy (tests/data/tiny/README.md): a logit may be
//! off by about llama.cpp's own spread between its KV configurations, with room to spare
//! (see [`LOGIT_TOL`]); top-1 must match wherever llama.cpp's top-1 margin is at least 0.5.
//!
//! Release-mode checks: `cargo xtask test` fetches the model and runs them with
//! `--ignored` in its "model + server checks" step.
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::model::{KvType, Math};
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_runtime_min::Arena;
use pinch_tests::*;
use serde_json::Value;
use std::path::PathBuf;

/// Largest allowed |pinch - llama.cpp| of a top-20 logit (both with an F32 KV cache).
/// On x86 pinch's fast path computes llama.cpp's x86 arithmetic for every weight of
/// this model (Q4_1 with Q8_1 activations made as llama.cpp's AVX2 `quantize_row_q8_1`,
/// the Q8_0 embedding/head in eight lanes), so the logits agree to the golden's printed
/// precision: measured 4.96e-5 over the 640 entries (0.643 before Q8_1's `s` followed
/// llama.cpp); 1e-3 is rounding room. Elsewhere (NEON sums the Q8_0 head per block)
/// the bound is llama.cpp's own spread between its KV configurations, 0.63
/// (prompts.json, `llama_cpp_self_consistency`), with room: 1.0.
const LOGIT_TOL: f32 = if cfg!(target_arch = "x86_64") {
    1e-3
} else {
    1.0
};

fn model() -> Option<PathBuf> {
    real_model("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m")
}

fn golden(name: &str) -> Value {
    let s = std::fs::read_to_string(data_dir().join("smollm2-135m").join(name)).unwrap();
    serde_json::from_str(&s).unwrap()
}

use pinch_tests::json_ids as ids;

fn spec() -> RunSpec {
    RunSpec {
        math: Math::Fast,
        kv: KvType::F32,
        batch: 64,
        threads: 2,
        attn_skip: false,
    }
}

fn tokenizer(bytes: &'static [u8]) -> Tokenizer<'static> {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let region: &'static mut [u8] = Vec::leak(vec![0u8; 64 << 20]);
    Tokenizer::from_gguf(&g, &mut Arena::new(region)).expect("the smollm vocab loads")
}

fn encode(t: &Tokenizer, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
    let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
    let mut out = vec![0u32; text.len() + 8];
    let n = t
        .encode(text, add_special, parse_special, &mut scratch, &mut out)
        .unwrap();
    out.truncate(n);
    out
}

#[test]
#[ignore = "needs the real model: cargo xtask test runs it with --ignored"]
fn tokenization_matches_llama_cpp() {
    let Some(path) = model() else { return };
    let bytes: &'static [u8] = Vec::leak(std::fs::read(path).unwrap());
    let t = tokenizer(bytes);
    let g = golden("tokenization.json");
    let mut n = 0;
    for s in g["strings"].as_array().unwrap() {
        let text = s["text"].as_str().unwrap();
        for (field, add, parse) in [
            ("ids_add_special", true, false),
            ("ids_no_special", false, false),
            ("ids_add_special_parse_special", true, true),
        ] {
            assert_eq!(
                encode(&t, text, add, parse),
                ids(&s[field]),
                "{field} of {text:?}"
            );
            n += 1;
        }
        for (id, want) in ids(&s["ids_no_special"])
            .iter()
            .zip(s["pieces_no_special"].as_array().unwrap())
        {
            let got = t.token_to_piece(*id, true);
            match want.as_str() {
                Some(w) => assert_eq!(got, w.as_bytes(), "piece of {id}"),
                None => {
                    let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
                    assert_eq!(hex, want["bytes_hex"].as_str().unwrap(), "piece of {id}");
                }
            }
        }
    }
    assert!(n >= 30);
}

#[test]
#[ignore = "needs the real model: cargo xtask test runs it with --ignored"]
fn top20_logits_match_llama_cpp_at_every_prompt_position() {
    let Some(path) = model() else { return };
    let bytes = std::fs::read(path).unwrap();
    let mut failures = Vec::new();
    let (mut worst, mut checked) = (0.0f32, 0);
    for pr in golden("prompts.json")["prompts"].as_array().unwrap() {
        let toks = ids(&pr["token_ids"]);
        let (_, got) = run_logits(&bytes, &toks, spec()).unwrap();
        for entry in pr["f32kv"]["top20"].as_array().unwrap() {
            let pos = entry["pos"].as_u64().unwrap() as usize;
            let top: Vec<(usize, f32)> = entry["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    (
                        t[0].as_u64().unwrap() as usize,
                        t[1].as_f64().unwrap() as f32,
                    )
                })
                .collect();
            for &(id, want) in &top {
                let d = (got[pos][id] - want).abs();
                worst = worst.max(d);
                checked += 1;
                if d > LOGIT_TOL {
                    failures.push(format!(
                        "{:?} pos {pos} id {id}: {} vs {want}",
                        pr["text"], got[pos][id]
                    ));
                }
            }
            if top[0].1 - top[1].1 >= 0.5 && argmax(&got[pos]) != top[0].0 {
                failures.push(format!(
                    "{:?} pos {pos}: top-1 {} vs {}",
                    pr["text"],
                    argmax(&got[pos]),
                    top[0].0
                ));
            }
        }
    }
    println!("{checked} top-20 logits, worst difference {worst:.2e}");
    assert!(checked >= 600);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs the real model: cargo xtask test runs it with --ignored"]
fn greedy_continuations_match_teacher_forced() {
    let Some(path) = model() else { return };
    let bytes = std::fs::read(path).unwrap();
    let cases = greedy_cases(&golden("prompts.json"));
    let (checked, failures) = teacher_forced_mismatches(&bytes, &cases, spec());
    println!("checked {checked} greedy steps");
    assert!(checked > 50);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The template `pinch chat`/`pinch serve` pick for this model (its GGUF's Jinja text,
/// run by pinch's interpreter) renders as jinja2 does, and the ChatML format llama.cpp's
/// `llama_chat_apply_template` detects from that text (what `--chat-template chatml`
/// selects) renders as llama.cpp does: tests/data/templates/expected.json, made by
/// tools/gen_chat_templates.py on the copy `SmolLM2-135M-Instruct.gguf.jinja`, which must
/// be this GGUF's `tokenizer.chat_template`.
#[test]
#[ignore = "needs the real model: cargo xtask test runs it with --ignored"]
fn chat_template_renders_like_llama_cpp() {
    use pinch_runtime_min::chat::{ChatMessage, Kind, Named, Source, Template};
    let Some(path) = model() else { return };
    let bytes = std::fs::read(path).unwrap();
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let copy =
        std::fs::read_to_string(data_dir().join("templates/SmolLM2-135M-Instruct.gguf.jinja"))
            .unwrap();
    assert_eq!(g.get_str("tokenizer.chat_template"), Some(copy.as_str()));
    let jinja = Template::select(&g, None).unwrap();
    assert_eq!(jinja.source, Source::GgufJinja);
    assert!(matches!(jinja.kind, Kind::Jinja(_)));
    assert_eq!(jinja.named, Named::ChatMl);
    let chatml = Template::select(&g, Some("chatml")).unwrap();
    assert_eq!(chatml.kind, Kind::Named(Named::ChatMl));

    let d = golden_templates();
    let src = "SmolLM2-135M-Instruct.gguf.jinja";
    let mut checked = 0;
    for (section, t) in [("jinja", &jinja), ("detected", &chatml)] {
        for e in d[section].as_array().unwrap() {
            if e["source"] != src || !e["out"].is_string() {
                continue;
            }
            let conv = &d["conversations"][e["conv"].as_str().unwrap()];
            let Some(msgs) = conv
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    Some(ChatMessage::new(
                        m["role"].as_str()?,
                        m["content"].as_str()?,
                    ))
                })
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let add = e["add_generation_prompt"].as_bool().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let n = t.render(&msgs, add, &mut buf).unwrap();
            assert_eq!(
                std::str::from_utf8(&buf[..n]).unwrap(),
                e["out"].as_str().unwrap(),
                "{section} {} add={add}",
                e["conv"]
            );
            checked += 1;
        }
    }
    println!("{checked} renderings checked");
    assert!(checked >= 20, "only {checked} renderings");
}

fn golden_templates() -> Value {
    let s = std::fs::read_to_string(data_dir().join("templates/expected.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}
