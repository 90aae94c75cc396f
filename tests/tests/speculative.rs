//! Speculative decoding with prompt-lookup drafts (`pinch_runtime_min::draft`) produces
//! exactly the tokens of plain greedy decoding, with and without a repetition penalty,
//! on tiny fixtures of three architectures; and the drafts were really used. The same
//! through the generation driver `run`, `chat` and `serve` share (`generate`), with
//! weights resident and streamed, on six tiny fixtures and Gemma 3 270M.
use pinch_runtime_min::draft::{verify, PromptLookup};
use pinch_runtime_min::generate::{self, GenStats, Settings};
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::guard::MemoryGuard;
use pinch_runtime_min::model::{Config, KvType, Logits, Math, SessionOptions};
use pinch_runtime_min::platform::MemPlatform;
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

/// Prompts that quote their context (a summary of a given paragraph, a code edit of a
/// given function) and one of free text.
const TEXTS: [&str; 3] = [
    "<start_of_turn>user\nSummarize this paragraph, reusing its wording: The old lighthouse on the northern cliff was built in 1872 to guard ships from the rocks below. For nearly a century its keepers lit the lamp every evening and wrote the weather into a logbook.<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nRename the variable `total` to `sum` in this function:\n\nfn add_all(xs: &[i32]) -> i32 {\n    let mut total = 0;\n    for x in xs {\n        total += x;\n    }\n    total\n}<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nWrite a short story about a fox who learns to sail.<end_of_turn>\n<start_of_turn>model\n",
];

/// What one generation through the shared driver produced.
struct Gen {
    tokens: Vec<u32>,
    stats: GenStats,
    /// Positions the cache holds at the end (rejected drafts must not be among them).
    n_past: usize,
}

/// `pinch run`'s generation ([`generate::generate`]) on `bytes` (`serve`: the server's,
/// which stops at end-of-generation tokens and does not feed the last token), with the
/// weights planned into `budget` (streamed beyond it), the head computed `draft + 1`
/// positions per read as the command sets it, and `draft` tokens drafted (0: plain).
fn drive(
    serve: bool,
    bytes: &[u8],
    budget: Option<u64>,
    text: &str,
    n: usize,
    draft: usize,
    sp: SamplerParams,
) -> Gen {
    with_tokenizer_session(
        bytes,
        budget,
        |cpu| SessionOptions {
            n_ctx: 512,
            n_batch: 32,
            kv: KvType::F16,
            kv_v: KvType::F16,
            math: Math::Fast,
            threads: 2,
            head_group: draft + 1,
            attn_skip: true,
            swa_ring: true,
            state_f16: false,
            n_seq: 1,
            cpu,
        },
        |sess, tok, plat, arena| {
            if draft > 0 {
                // As the commands do: a recurrent model keeps a draft point.
                sess.keep_draft_point(arena).unwrap();
            }
            let mut drafter = generate::drafter(draft, sess.opts.n_ctx, arena).unwrap();
            let mut scratch = vec![0u8; tok.scratch_bytes(text.len())];
            let mut prompt = vec![0u32; 512];
            let np = tok
                .encode(text, true, true, &mut scratch, &mut prompt)
                .unwrap();
            let mut sampler = Sampler::new(sp);
            let mut guard = MemoryGuard::new(0);
            let settings = Settings {
                sampler: &mut sampler,
                guard: &mut guard,
                adjust: None,
                max_new: n,
                ignore_eos: !serve,
                feed_last: !serve,
                draft: drafter.as_mut(),
                grammar: None,
            };
            let (tokens, stats) = generate_tokens(plat, tok, sess, settings, &prompt[..np]);
            Gen {
                tokens,
                stats,
                n_past: sess.n_past(),
            }
        },
    )
}

fn greedy() -> SamplerParams {
    SamplerParams {
        temp: 0.0,
        ..SamplerParams::default()
    }
}

/// Generate with and without drafts and require the same tokens; returns the accepted
/// drafted tokens and the passes saved.
fn same_tokens(
    serve: bool,
    name: &str,
    bytes: &[u8],
    budget: Option<u64>,
    n: usize,
    drafts: &[usize],
) -> (usize, usize) {
    let (mut accepted, mut saved) = (0, 0);
    for (i, text) in TEXTS.iter().enumerate() {
        let plain = drive(serve, bytes, budget, text, n, 0, greedy());
        let n = plain.stats.gen_tokens;
        assert_eq!(plain.stats.drafted, 0);
        // One pass per token fed back: all of them, or all but the last (serve, at the
        // token limit); an end-of-generation token is not handed on.
        let fed = if serve && plain.stats.end == generate::End::Length {
            n - 1
        } else {
            n
        };
        assert_eq!(
            plain.stats.passes, fed,
            "{name}: one pass per token without drafts"
        );
        for &draft in drafts {
            let spec = drive(serve, bytes, budget, text, n, draft, greedy());
            assert_eq!(
                spec.tokens, plain.tokens,
                "{name} prompt {i} --draft {draft}: tokens differ from plain greedy"
            );
            assert_eq!(spec.stats.gen_tokens, n);
            assert_eq!(spec.stats.end, plain.stats.end, "{name} prompt {i}");
            assert_eq!(spec.n_past, plain.n_past, "{name} prompt {i}: cache length");
            assert!(spec.stats.accepted <= spec.stats.drafted);
            // Every pass yields one token of the sampler's own plus the accepted drafts.
            assert_eq!(
                spec.stats.passes + spec.stats.accepted,
                fed,
                "{name} prompt {i}"
            );
            accepted += spec.stats.accepted;
            saved += plain.stats.passes - spec.stats.passes;
        }
    }
    (accepted, saved)
}

#[test]
fn drafted_generation_gives_the_tokens_of_plain_greedy_on_tiny_fixtures() {
    for name in [
        "tiny-llama-Q8_0.gguf",
        "tiny-llama-Q4_K_M.gguf",
        "tiny-qwen3-Q4_K_M.gguf",
        "tiny-gemma3-Q8_0.gguf",
        "tiny-qwen3moe-Q4_K_M.gguf",
        "tiny-bailingmoe2-Q8_0.gguf",
    ] {
        let bytes = std::fs::read(data_dir().join("tiny").join(name)).unwrap();
        // All resident, and as much streamed as any plan streams.
        for (serve, budget) in [(false, None), (false, Some(0)), (true, Some(0))] {
            let (accepted, saved) = same_tokens(serve, name, &bytes, budget, 48, &[3, 8]);
            println!("{name} serve {serve} budget {budget:?}: {accepted} drafted tokens accepted, {saved} passes saved");
            assert!(accepted > 0, "{name}: no draft was ever accepted");
        }
    }
}

#[test]
fn drafted_generation_gives_the_tokens_of_plain_greedy_on_gemma_270m() {
    let Some(path) = gemma_model() else { return };
    let bytes = std::fs::read(path).unwrap();
    // About 40 % of the weights resident: most of the head streams, as in the benchmark.
    let budget = Some(bytes.len() as u64 * 2 / 5);
    let (accepted, saved) = same_tokens(false, "gemma-3-270m", &bytes, budget, 40, &[8]);
    println!("gemma-3-270m: {accepted} drafted tokens accepted, {saved} passes saved");
    assert!(accepted > 0);
}

#[test]
fn drafts_are_on_when_weights_stream_and_for_recurrent_models_when_asked() {
    let plat = MemPlatform {
        bytes: &[],
        cpu: host_cpu(),
    };
    let cfg_of = |name: &str| {
        let bytes = std::fs::read(data_dir().join("tiny").join(name)).unwrap();
        let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
        Config::from_gguf(&g).unwrap()
    };
    let opts = |args: &[&'static str]| pinch_runtime_min::cli::Opts::parse(args).unwrap();
    let llama = cfg_of("tiny-llama-Q8_0.gguf");
    let run = opts(&["run"]);
    assert_eq!(
        generate::draft_len(&plat, &run, &llama, true),
        generate::DEFAULT_DRAFT
    );
    assert_eq!(generate::draft_len(&plat, &run, &llama, false), 0);
    let off = opts(&["serve", "--draft", "0"]);
    assert_eq!(generate::draft_len(&plat, &off, &llama, true), 0);
    let four = opts(&["chat", "--draft", "4"]);
    assert_eq!(generate::draft_len(&plat, &four, &llama, false), 4);
    assert_eq!(
        generate::draft_len(&plat, &opts(&["ppl", "--draft", "4"]), &llama, true),
        0
    );
    let f16 = opts(&["run", "--draft", "4", "--state-f16"]);
    for name in ["tiny-qwen35-Q8_0.gguf", "tiny-lfm2-Q8_0.gguf"] {
        let cfg = cfg_of(name);
        assert_eq!(generate::draft_len(&plat, &four, &cfg, true), 4, "{name}");
        // Not by default: the state copy takes budget from resident weights.
        assert_eq!(generate::draft_len(&plat, &run, &cfg, true), 0, "{name}");
        assert_eq!(generate::draft_len(&plat, &f16, &cfg, true), 0, "{name}");
    }
    // f16 state goes with llama's config too: there it changes nothing.
    assert_eq!(generate::draft_len(&plat, &f16, &llama, true), 4);
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

fn recurrent_opts(cpu: pinch_kernels::CpuFeatures) -> SessionOptions {
    SessionOptions {
        n_ctx: 256,
        n_batch: 32,
        kv: KvType::F32,
        kv_v: KvType::F32,
        math: Math::Fast,
        threads: 2,
        head_group: 1,
        attn_skip: false,
        swa_ring: true,
        state_f16: false,
        n_seq: 1,
        cpu,
    }
}

/// Recurrent layers (Gated DeltaNet in qwen35, short conv in lfm2; llama as the
/// control): a draft verified in one pass and kept in part takes the state back to the
/// last kept token (`Session::eval_draft` / `rewind_draft`: the copy from before the pass
/// and the pass's log, no weights read). For every draft length `k` and every count `j`
/// of right drafted tokens, the pass's logits of the kept positions and those of the
/// plain decoding that continues after the rewind are plain greedy decoding's, bit for
/// bit; and without a draft point the session refuses instead of going on wrong.
#[test]
fn rejected_drafts_take_recurrent_states_back_to_plain_decoding() {
    const STEPS: usize = 20;
    // The draft pass starts after this many plain steps.
    const AT: usize = 3;
    for name in [
        "tiny-qwen35-Q8_0.gguf",
        "tiny-qwen35-F32.gguf",
        "tiny-lfm2-Q8_0.gguf",
        "tiny-llama-Q8_0.gguf",
    ] {
        let bytes = std::fs::read(data_dir().join("tiny").join(name)).unwrap();
        let prompt = prompt();
        // Plain greedy: logits L[i] of generated token i, one token per pass after the
        // prompt.
        let (toks, logits) =
            with_tokenizer_session(&bytes, None, recurrent_opts, |sess, _, p, _| {
                let mut rows: Vec<Vec<f32>> = vec![];
                sess.eval(p, &prompt, Logits::Last, &mut |_, l| rows.push(l.to_vec()))
                    .unwrap();
                let mut toks = vec![argmax(&rows[0])];
                while toks.len() < STEPS {
                    let last = *toks.last().unwrap();
                    sess.eval(p, &[last], Logits::Last, &mut |_, l| rows.push(l.to_vec()))
                        .unwrap();
                    toks.push(argmax(rows.last().unwrap()));
                }
                (toks, rows)
            });
        let n_vocab = logits[0].len() as u32;
        for k in [1usize, 3, 6] {
            for j in 0..=k {
                with_tokenizer_session(&bytes, None, recurrent_opts, |sess, _, p, arena| {
                    sess.keep_draft_point(arena).unwrap();
                    assert!(sess.can_verify_drafts());
                    sess.eval(p, &prompt, Logits::Last, &mut |_, _| {}).unwrap();
                    for &t in &toks[..AT] {
                        sess.eval(p, &[t], Logits::Last, &mut |_, _| {}).unwrap();
                    }
                    // Feed token AT and k drafted tokens, the first j right.
                    let mut feed = vec![toks[AT]];
                    for i in 1..=k {
                        let right = toks[AT + i];
                        feed.push(if i <= j { right } else { (right + 1) % n_vocab });
                    }
                    let start = sess.n_past();
                    let mut rows: Vec<Vec<f32>> = vec![];
                    sess.eval_draft(p, &feed, &mut |_, l| rows.push(l.to_vec()))
                        .unwrap();
                    assert_eq!(rows.len(), k + 1);
                    for (i, row) in rows.iter().enumerate().take(j + 1) {
                        assert!(
                            row.iter()
                                .zip(&logits[AT + 1 + i])
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{name} k {k} j {j}: pass row {i} differs from plain decoding"
                        );
                    }
                    sess.rewind_draft(start + 1 + j).unwrap();
                    assert_eq!(sess.n_past(), start + 1 + j);
                    // Plain decoding goes on from the last kept token.
                    let mut next = toks[AT + 1 + j];
                    for step in AT + 2 + j..STEPS {
                        let mut row = vec![];
                        sess.eval(p, &[next], Logits::Last, &mut |_, l| row = l.to_vec())
                            .unwrap();
                        assert!(
                            row.iter()
                                .zip(&logits[step])
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{name} k {k} j {j}: step {step} after the rewind differs"
                        );
                        next = toks[step];
                    }
                });
            }
        }
        // Without a draft point a recurrent session refuses the pass and keeps its state.
        with_tokenizer_session(&bytes, None, recurrent_opts, |sess, _, p, _| {
            sess.eval(p, &prompt, Logits::Last, &mut |_, _| {}).unwrap();
            let n = sess.n_past();
            let res = sess.eval_draft(p, &toks[..3], &mut |_, _| {});
            if sess.has_recurrent() {
                assert!(!sess.can_verify_drafts());
                assert!(res.is_err(), "{name}");
                assert_eq!(sess.n_past(), n);
            } else {
                res.unwrap();
            }
        });
    }
}
