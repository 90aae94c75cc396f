//! Speculative decoding with prompt-lookup drafts (`pinch_runtime_min::draft`) produces
//! exactly the tokens of plain greedy decoding, with and without a repetition penalty,
//! on tiny fixtures of three architectures; and the drafts were really used.
use pinch_runtime_min::draft::{verify, PromptLookup};
use pinch_runtime_min::model::{KvType, Logits, Math};
use pinch_runtime_min::sampler::{Sampler, SamplerParams};
use pinch_tests::*;

fn greedy_params(repeat_penalty: f32) -> SamplerParams {
    SamplerParams {
        temp: 0.0,
        repeat_penalty,
        repeat_last_n: 16,
        ..SamplerParams::default()
    }
}

/// A prompt that repeats itself, so the text that follows tends to as well.
fn prompt() -> Vec<u32> {
    let phrase = [40u32, 71, 112, 9, 200, 133, 57, 260, 18];
    let mut p = vec![];
    for _ in 0..4 {
        p.extend_from_slice(&phrase);
    }
    p
}

/// Plain greedy: one token per eval.
fn plain(bytes: &[u8], spec: RunSpec, penalty: f32, n: usize) -> Vec<u32> {
    with_session(bytes, spec, |sess, p| {
        let mut s = Sampler::new(greedy_params(penalty));
        let prompt = prompt();
        for &t in &prompt {
            s.accept(t);
        }
        let mut last = None;
        sess.eval(p, &prompt, Logits::Last, &mut |_, l| {
            last = Some(s.sample(l))
        })
        .unwrap();
        let mut out = vec![last.unwrap()];
        s.accept(out[0]);
        while out.len() < n {
            let mut next = None;
            sess.eval(p, &[*out.last().unwrap()], Logits::Last, &mut |_, l| {
                next = Some(s.sample(l))
            })
            .unwrap();
            s.accept(next.unwrap());
            out.push(next.unwrap());
        }
        out
    })
    .unwrap()
}

/// Speculative greedy: drafts from the history, verified in one pass each.
fn speculative(bytes: &[u8], spec: RunSpec, penalty: f32, n: usize) -> (Vec<u32>, usize) {
    with_session(bytes, spec, |sess, p| {
        let mut s = Sampler::new(greedy_params(penalty));
        let lookup = PromptLookup {
            max_ngram: 3,
            min_ngram: 1,
            max_draft: 6,
        };
        let mut history = prompt();
        for &t in &history {
            s.accept(t);
        }
        let mut first = None;
        sess.eval(p, &history, Logits::Last, &mut |_, l| {
            first = Some(s.sample(l))
        })
        .unwrap();
        let first = first.unwrap();
        s.accept(first);
        history.push(first);
        let mut out = vec![first];
        let mut accepted = 0;
        while out.len() < n {
            let mut draft = [0u32; 8];
            let k = lookup.draft(&history, &mut draft);
            let mut got = [0u32; 9];
            let step =
                verify(sess, p, &mut s, *out.last().unwrap(), &draft[..k], &mut got).unwrap();
            accepted += step.accepted;
            out.extend_from_slice(&got[..step.produced]);
            history.extend_from_slice(&got[..step.produced]);
        }
        out.truncate(n);
        (out, accepted)
    })
    .unwrap()
}

#[test]
fn speculative_greedy_equals_plain_greedy() {
    let mut report = String::new();
    for (name, math) in [
        ("tiny-llama-Q8_0.gguf", Math::Reference),
        ("tiny-llama-Q8_0.gguf", Math::Fast),
        ("tiny-qwen3-Q4_K_M.gguf", Math::Fast),
        ("tiny-gemma3-Q8_0.gguf", Math::Fast),
    ] {
        let bytes = std::fs::read(data_dir().join("tiny").join(name)).unwrap();
        for penalty in [1.0f32, 1.15] {
            let spec = RunSpec {
                math,
                kv: KvType::F32,
                batch: 16,
                threads: 2,
                attn_skip: false,
            };
            let want = plain(&bytes, spec, penalty, 60);
            let (got, accepted) = speculative(&bytes, spec, penalty, 60);
            report +=
                &format!("{name} {math:?} penalty {penalty}: {accepted} drafted tokens accepted\n");
            assert_eq!(got, want, "{name} {math:?} penalty {penalty}");
            if penalty == 1.0 {
                assert!(accepted > 0, "{name}: no draft was ever accepted");
            }
        }
    }
    println!("{report}");
}
