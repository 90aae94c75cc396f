//! Constrained output through the generation driver (`generate::Constrain`): text
//! sampled at temperature 1 from random-weight tiny fixtures (a SentencePiece vocab
//! with byte tokens, a byte-level BPE one) and from SmolLM2-135M-Instruct always
//! follows the grammar, and what a JSON schema's grammar lets out parses as JSON with
//! the schema's shape.
use pinch_runtime_min::arena::Arena;
use pinch_runtime_min::generate::{self, Constrain, Emit, Settings};
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::grammar::{json_schema, parse, Matcher, MatcherBufs, SortedVocab, Store};
use pinch_runtime_min::guard::MemoryGuard;
use pinch_runtime_min::model::{KvType, Math, Session};
use pinch_runtime_min::platform::MemPlatform;
use pinch_runtime_min::sampler::{Sampler, SamplerParams};
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_tests::*;

/// What one constrained generation gave.
struct Out {
    text: Vec<u8>,
    tokens: usize,
    /// Steps whose sampled token the grammar refused (the full mask ran).
    masked: usize,
    /// The grammar reached its end (and so the generation stopped).
    complete: bool,
}

/// Parse `gbnf` into fresh buffers and give `f` a matcher at its start.
fn with_matcher<R>(gbnf: &str, f: impl FnOnce(Matcher<'_, '_>) -> R) -> R {
    let (mut elems, mut sets, mut rules, mut work) = (
        vec![0u32; 16384],
        vec![0u32; 8192],
        vec![0u32; 2048],
        vec![0u32; 8192],
    );
    let mut store = Store {
        elems: &mut elems,
        sets: &mut sets,
        rules: &mut rules,
        work: &mut work,
    };
    let parsed = parse(gbnf, &mut store).unwrap_or_else(|e| panic!("{e}\n{gbnf}"));
    let (mut nodes, mut spare, mut fwd, mut tops) = (
        vec![0u32; 32768],
        vec![0u32; 32768],
        vec![0u32; 16384],
        vec![0u32; 8192],
    );
    let m = Matcher::new(
        parsed.view(&store),
        MatcherBufs {
            nodes: &mut nodes,
            spare: &mut spare,
            fwd: &mut fwd,
            tops: &mut tops,
        },
    )
    .unwrap();
    f(m)
}

/// Generate up to `n` tokens after `prompt` from `model` under `gbnf` (`None`: free).
fn generate_under(model: &[u8], prompt: &str, gbnf: Option<&str>, n: usize, seed: u64) -> Out {
    let g = Gguf::parse(model, model.len() as u64).unwrap();
    let mut region = vec![0u64; (32 << 20) / 8];
    let mut arena = Arena::new(pinch_kernels::blocks::bytes_of_mut(&mut region[..]));
    let tok = Tokenizer::from_gguf(&g, &mut arena).unwrap();
    let spec = RunSpec {
        math: Math::Fast,
        kv: KvType::F16,
        batch: 64,
        threads: 2,
        attn_skip: true,
    };
    with_session(model, spec, |sess, plat| {
        generate_in(sess, plat, &tok, prompt, gbnf, n, seed)
    })
    .unwrap()
}

fn generate_in(
    sess: &mut Session<'_, '_>,
    plat: &MemPlatform<'_>,
    tok: &Tokenizer<'_>,
    prompt: &str,
    gbnf: Option<&str>,
    n: usize,
    seed: u64,
) -> Out {
    let mut scratch = vec![0u8; tok.scratch_bytes(prompt.len())];
    let mut ids = vec![0u32; 256];
    let np = tok
        .encode(prompt, true, true, &mut scratch, &mut ids)
        .unwrap();
    let n = n.min(255 - np);

    let nv = tok.n_vocab() as usize;
    let (mut order, mut lcp, mut masked) = (vec![0u32; nv], vec![0u16; nv], vec![0f32; nv]);
    let vocab = SortedVocab::build(tok, &mut order, &mut lcp);
    match gbnf {
        Some(g) => with_matcher(g, |m| {
            // Moved into a local whose lifetimes the borrow below may shorten.
            let mut m: Matcher<'_, '_> = m;
            sample(
                sess,
                plat,
                tok,
                &ids[..np],
                Some(&mut m),
                &vocab,
                &mut masked,
                n,
                seed,
            )
        }),
        None => sample(
            sess,
            plat,
            tok,
            &ids[..np],
            None,
            &vocab,
            &mut masked,
            n,
            seed,
        ),
    }
}

/// Sample `n` tokens after `prompt` (under `matcher` when given) at temperature 1.
#[allow(clippy::too_many_arguments)]
fn sample<'c>(
    sess: &mut Session<'_, '_>,
    plat: &MemPlatform<'_>,
    tok: &Tokenizer<'_>,
    prompt: &[u32],
    matcher: Option<&'c mut Matcher<'c, 'c>>,
    vocab: &'c SortedVocab<'c>,
    masked: &'c mut [f32],
    n: usize,
    seed: u64,
) -> Out {
    let mut constrain = matcher.map(|m| Constrain {
        matcher: m,
        vocab,
        scratch: masked,
        masked: 0,
    });
    let mut sampler = Sampler::new(SamplerParams {
        temp: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplerParams::default()
    });
    let mut guard = MemoryGuard::new(0);
    let settings = Settings {
        sampler: &mut sampler,
        guard: &mut guard,
        adjust: None,
        max_new: n,
        ignore_eos: false,
        feed_last: false,
        draft: None,
        grammar: constrain.as_mut(),
    };
    let mut text = vec![];
    let st = generate::generate(
        plat,
        tok,
        sess,
        settings,
        prompt,
        &mut Emit(|_, b: &[u8]| text.extend_from_slice(b)),
    )
    .unwrap();
    let masked_steps = constrain.as_ref().map_or(0, |c| c.masked);
    let complete = constrain.as_ref().is_some_and(|c| c.matcher.can_end());
    Out {
        text,
        tokens: st.gen_tokens,
        masked: masked_steps,
        complete,
    }
}

fn schema_gbnf(schema: &str) -> String {
    let mut s = String::new();
    json_schema::text_to_gbnf(schema, &mut s).unwrap();
    s
}

fn tiny(name: &str) -> Vec<u8> {
    std::fs::read(data_dir().join("tiny").join(name)).unwrap()
}

const PERSON: &str = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"]}"#;

/// Check `text` as the PERSON schema's output: JSON, an object with those members.
fn check_person(text: &[u8]) {
    let s = std::str::from_utf8(text).unwrap_or_else(|e| panic!("not UTF-8 ({e}): {text:?}"));
    let v: serde_json::Value = serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s:?}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {s}"));
    assert!(
        o["name"].as_str().is_some_and(|n| n.chars().count() <= 12),
        "{s}"
    );
    assert!(o["age"].is_i64() || o["age"].is_u64(), "{s}");
    assert!(o["ok"].is_boolean(), "{s}");
    assert_eq!(o.len(), 3, "{s}");
}

#[test]
fn random_weight_models_sample_only_what_the_grammar_allows() {
    for model in ["tiny-llama-Q8_0.gguf", "tiny-qwen3-Q8_0.gguf"] {
        let bytes = tiny(model);
        // A fixed-length grammar: exactly what llama.cpp's server test asks for.
        for seed in 0..4 {
            let o = generate_under(&bytes, "Hello", Some(r#"root ::= "a"{5,5}"#), 8, seed);
            assert_eq!(o.text, b"aaaaa", "{model} seed {seed}");
            assert!(o.complete);
        }
        // Choices and repetitions, with multi-byte characters in the alphabet.
        let g = "root ::= (\"yes\" | \"no\" | [é€0-9]{1,3}) (\" \" [a-c]+)?";
        for seed in 0..6 {
            let o = generate_under(&bytes, "Question:", Some(g), 24, seed);
            let s = std::str::from_utf8(&o.text).unwrap();
            let (head, tail) = s.split_once(' ').unwrap_or((s, ""));
            assert!(
                ["yes", "no"].contains(&head)
                    || (1..=3).contains(&head.chars().count())
                        && head.chars().all(|c| "é€0123456789".contains(c)),
                "{model}: {s:?}"
            );
            assert!(tail.chars().all(|c| "abc".contains(c)), "{model}: {s:?}");
            assert!(o.masked > 0, "a random model needs the mask");
        }
        // A JSON schema: whatever comes out before the limit is a prefix the grammar
        // allows; when the grammar completes, it is JSON of the schema's shape.
        let g = schema_gbnf(PERSON);
        let mut complete = 0;
        for seed in 0..6 {
            let o = generate_under(&bytes, "{", Some(&g), 120, seed);
            if o.complete {
                check_person(&o.text);
                complete += 1;
            }
        }
        assert!(
            complete >= 1,
            "{model}: no answer completed within 120 tokens"
        );
    }
}

/// SmolLM2-135M-Instruct asked for a person as JSON: the answer is JSON of the schema
/// and the grammar ended the generation (the speed with and without a grammar is
/// measured through `pinch serve`, see the README).
#[test]
fn smollm2_answers_in_the_schema() {
    let Some(path) = real_model("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m") else {
        return;
    };
    let bytes = std::fs::read(path).unwrap();
    let prompt = "<|im_start|>user\nDescribe a person (name, age, whether they are ok) as JSON.<|im_end|>\n<|im_start|>assistant\n";
    let g = schema_gbnf(PERSON);
    let with = generate_under(&bytes, prompt, Some(&g), 64, 1);
    assert!(with.complete, "{:?}", String::from_utf8_lossy(&with.text));
    check_person(&with.text);
    assert!(with.tokens < 64);
}

/// The time of one full mask (every token of the vocabulary tested) for SmolLM2's
/// 49,152-token and Gemma 3's 262,144-token vocabularies, in three states of a JSON
/// schema's grammar: at the start, inside a string (nearly every token allowed) and
/// after a key (few allowed). Printed; bounded loosely so a pathological slowdown fails.
#[test]
fn a_full_mask_takes_milliseconds_on_real_vocabularies() {
    let models = [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m"),
        ("gemma-3-270m-q4_k_m.gguf", "gemma3-270m"),
    ];
    let g = schema_gbnf(PERSON);
    for (file, fetch) in models {
        let Some(path) = real_model(file, fetch) else {
            continue;
        };
        let bytes = std::fs::read(path).unwrap();
        let gguf = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
        let mut region = vec![0u64; (64 << 20) / 8];
        let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
        let mut arena = Arena::new(region);
        let tok = Tokenizer::from_gguf(&gguf, &mut arena).unwrap();
        let nv = tok.n_vocab() as usize;
        let t0 = std::time::Instant::now();
        let (mut order, mut lcp) = (vec![0u32; nv], vec![0u16; nv]);
        let vocab = SortedVocab::build(&tok, &mut order, &mut lcp);
        let sort_ms = t0.elapsed().as_secs_f64() * 1e3;
        with_matcher(&g, |mut m| {
            let mut logits = vec![0f32; nv];
            let mut line = format!("{file}: {nv} tokens, sorted in {sort_ms:.1} ms; full mask");
            for (state, feed) in [
                ("start", ""),
                ("in a string", "{\"name\": \"Jo"),
                ("after a key", "\""),
            ] {
                assert!(m.accept(feed.as_bytes()), "{feed}");
                let reps = 5;
                let t = std::time::Instant::now();
                let mut allowed = 0;
                for _ in 0..reps {
                    logits.fill(0.0);
                    allowed = m.mask(&tok, &vocab, &mut logits);
                }
                let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
                let kept = logits.iter().filter(|l| l.is_finite()).count();
                assert_eq!(kept, allowed, "{state}");
                assert!(allowed > 0 && !m.overflowed, "{state}");
                // Every kept token really is allowed (checked one by one).
                for (id, l) in logits.iter().enumerate().step_by(97) {
                    assert_eq!(
                        l.is_finite(),
                        m.allows_token(&tok, id as u32),
                        "{state}: token {id}"
                    );
                }
                assert!(ms < 2000.0, "{state}: {ms} ms");
                line += &format!(" {state} {ms:.1} ms ({allowed} allowed),");
            }
            println!("{line}");
        });
    }
}
