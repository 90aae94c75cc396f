//! Gemma 3 270M Q4_K_M (the real model) against llama.cpp's goldens: top-20 logits at
//! every prompt position and teacher-forced greedy continuations.
//!
//! Tolerances (`tests/data/tiny/README.md`, section gemma3-270m): llama.cpp's own
//! batched and sequential runs differ by up to 1.05 in top-20 values and its default and
//! f32kv configs by 1.5, so values must agree within 1.5 and top-1 must match wherever
//! llama.cpp's margin is at least 0.5.
use pinch_runtime_min::model::{KvType, Math};
use pinch_tests::*;
use serde_json::Value;

fn prompts() -> Value {
    let s = std::fs::read_to_string(data_dir().join("gemma3-270m/prompts.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

use pinch_tests::json_ids as ids;

#[test]
fn top20_logits_match_llama_cpp_at_every_prompt_position() {
    let Some(path) = gemma_model() else { return };
    let bytes = std::fs::read(path).unwrap();
    let mut failures = Vec::new();
    let mut worst = 0.0f32;
    for pr in prompts()["prompts"].as_array().unwrap() {
        let toks = ids(&pr["token_ids"]);
        let spec = RunSpec {
            math: Math::Fast,
            kv: KvType::F32,
            batch: 64,
            threads: 2,
            attn_skip: false,
        };
        let (_, got) = run_logits(&bytes, &toks, spec).unwrap();
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
                if d > 1.5 {
                    failures.push(format!(
                        "{:?} pos {pos} id {id}: {} vs {want}",
                        pr["text"], got[pos][id]
                    ));
                }
            }
            let margin = top[0].1 - top[1].1;
            if margin >= 0.5 && argmax(&got[pos]) != top[0].0 {
                failures.push(format!(
                    "{:?} pos {pos}: top-1 {} vs {}",
                    pr["text"],
                    argmax(&got[pos]),
                    top[0].0
                ));
            }
        }
    }
    println!("worst top-20 logit difference: {worst:.3}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn greedy_continuations_match_teacher_forced() {
    let Some(path) = gemma_model() else { return };
    let bytes = std::fs::read(path).unwrap();
    let spec = RunSpec {
        math: Math::Fast,
        kv: KvType::F32,
        batch: 64,
        threads: 2,
        attn_skip: false,
    };
    let (checked, failures) = teacher_forced_mismatches(&bytes, &greedy_cases(&prompts()), spec);
    println!("checked {checked} greedy steps");
    assert!(checked > 50);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
