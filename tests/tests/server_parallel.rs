//! `serve --parallel`'s slots (`server::slots`): answers generated together, one
//! `decode_seqs` pass per token for all, with prompts admitted while others generate,
//! are token for token (and end for end) the answers the server's single generation
//! (`generate::generate` with the server's settings) gives each request alone.
use pinch_runtime_min::generate::{Adjust, Emit, End, Settings};
use pinch_runtime_min::guard::MemoryGuard;
use pinch_runtime_min::model::{KvType, Math, Session, SessionOptions};
use pinch_runtime_min::platform::MemPlatform;
use pinch_runtime_min::sampler::{Sampler, SamplerParams};
use pinch_runtime_min::server::slots::{self, Stream, Turn};
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_tests::*;

const FIXTURES: &[&str] = &[
    "tiny-llama-Q8_0",
    "tiny-llama-Q4_K_M",
    "tiny-qwen3-Q8_0",
    "tiny-gemma3-F32",
    "tiny-gemma3-Q4_K_M",
];

/// A request: prompt (a slice of the fixture's tokens), token limit, whether it stops
/// at end-of-generation tokens, sampler, and the step of the batch it joins at.
struct Req {
    prompt: (usize, usize),
    max_new: usize,
    ignore_eos: bool,
    sp: SamplerParams,
    /// Presence and frequency penalties (and a ban of the prompt's first token) when set.
    penalties: Option<(f32, f32)>,
    joins_at: usize,
}

/// The request's logit adjustments over `scratch`, as the server makes them.
fn adjust<'b>(r: &Req, tokens: &[u32], scratch: &'b mut [f32]) -> Option<Adjust<'b>> {
    r.penalties?;
    let mut a = Adjust::new(scratch);
    a.bias
        .push((tokens[r.prompt.0], f32::NEG_INFINITY))
        .unwrap();
    Some(a)
}

impl Req {
    /// The sampler's settings, with the request's presence and frequency penalties.
    fn params(&self) -> SamplerParams {
        let (presence_penalty, frequency_penalty) = self.penalties.unwrap_or((0.0, 0.0));
        SamplerParams {
            presence_penalty,
            frequency_penalty,
            ..self.sp
        }
    }
}

fn requests() -> Vec<Req> {
    let greedy = SamplerParams {
        temp: 0.0,
        ..SamplerParams::default()
    };
    let warm = |seed| SamplerParams {
        temp: 0.8,
        top_k: 20,
        seed,
        ..SamplerParams::default()
    };
    vec![
        Req {
            prompt: (0, 5),
            max_new: 24,
            ignore_eos: true,
            sp: greedy,
            penalties: None,
            joins_at: 0,
        },
        Req {
            prompt: (3, 12),
            max_new: 9,
            ignore_eos: false,
            sp: greedy,
            penalties: Some((1.5, 0.0)),
            joins_at: 0,
        },
        Req {
            prompt: (7, 3),
            max_new: 16,
            ignore_eos: true,
            sp: warm(7),
            penalties: None,
            joins_at: 4,
        },
        Req {
            prompt: (1, 10),
            max_new: 12,
            ignore_eos: true,
            sp: warm(11),
            penalties: Some((0.0, 0.7)),
            joins_at: 10,
        },
    ]
}

/// The settings `serve` generates request `r` with (no drafts: a batched pass holds
/// one token of each stream).
fn server_settings<'s, 'b>(
    r: &Req,
    sampler: &'s mut Sampler,
    guard: &'s mut MemoryGuard,
    adjust: Option<&'s mut Adjust<'b>>,
) -> Settings<'s, 'b, 'static, 'static> {
    Settings {
        sampler,
        guard,
        adjust,
        max_new: r.max_new,
        ignore_eos: r.ignore_eos,
        feed_last: false,
        draft: None,
        grammar: None,
    }
}

fn with_session<R>(
    bytes: &[u8],
    n_seq: usize,
    f: impl FnOnce(&mut Session<'_, '_>, &Tokenizer<'_>, &MemPlatform<'_>) -> R,
) -> R {
    let opts = |cpu| SessionOptions {
        n_ctx: 256,
        n_batch: 8,
        kv: KvType::F16,
        kv_v: KvType::F16,
        math: Math::Fast,
        threads: 2,
        head_group: 1,
        attn_skip: true,
        swa_ring: true,
        state_f16: false,
        n_seq,
        cpu,
    };
    with_tokenizer_session(bytes, None, opts, |sess, tok, plat, _| f(sess, tok, plat))
}

/// Each request alone, as `serve` runs it today.
fn alone(bytes: &[u8], tokens: &[u32], r: &Req) -> (Vec<u32>, End) {
    with_session(bytes, 1, |sess, tok, plat| {
        let mut sampler = Sampler::new(r.params());
        let mut guard = MemoryGuard::new(0);
        let mut scratch = vec![0.0f32; tok.n_vocab() as usize];
        let mut adjust = adjust(r, tokens, &mut scratch);
        let settings = server_settings(r, &mut sampler, &mut guard, adjust.as_mut());
        let (a, n) = r.prompt;
        let (out, st) = generate_tokens(plat, tok, sess, settings, &tokens[a..a + n]);
        (out, st.end)
    })
}

/// All requests in one session, one sequence each, joining at their step.
fn together(bytes: &[u8], tokens: &[u32], reqs: &[Req]) -> Vec<(Vec<u32>, End)> {
    with_session(bytes, reqs.len(), |sess, tok, plat| {
        let n = reqs.len();
        let mut samplers: Vec<Sampler> = reqs.iter().map(|r| Sampler::new(r.params())).collect();
        let mut guards: Vec<MemoryGuard> = (0..n).map(|_| MemoryGuard::new(0)).collect();
        let mut scratch = vec![vec![0.0f32; tok.n_vocab() as usize]; n];
        let mut adjusts: Vec<Option<Adjust>> = reqs
            .iter()
            .zip(scratch.iter_mut())
            .map(|(r, sc)| adjust(r, tokens, sc))
            .collect();
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut streams: Vec<Option<Stream>> = (0..n).map(|_| None).collect();
        let mut passes_with = std::collections::BTreeSet::new();
        for step in 0.. {
            let mut sinks: Vec<_> = out
                .iter_mut()
                .map(|o| Emit(move |id, _: &[u8]| o.push(id)))
                .collect();
            let mut settings: Vec<Settings> = samplers
                .iter_mut()
                .zip(guards.iter_mut())
                .zip(adjusts.iter_mut())
                .zip(reqs)
                .map(|(((sampler, guard), adjust), r)| {
                    server_settings(r, sampler, guard, adjust.as_mut())
                })
                .collect();
            for (k, r) in reqs.iter().enumerate().filter(|(_, r)| r.joins_at == step) {
                let (a, len) = r.prompt;
                let prompt = &tokens[a..a + len];
                let s = Stream::start(plat, sess, tok, k, &mut settings[k], prompt, &mut sinks[k]);
                streams[k] = Some(s.unwrap());
            }
            let mut turns: Vec<Turn> = streams
                .iter_mut()
                .zip(settings)
                .zip(sinks.iter_mut())
                .filter_map(|((st, settings), sink)| {
                    Some(Turn {
                        stream: st.as_mut()?,
                        settings,
                        sink,
                    })
                })
                .collect();
            let live = slots::step(plat, sess, tok, &mut turns).unwrap();
            passes_with.insert(live);
            let waiting = reqs.iter().any(|r| r.joins_at > step);
            if live == 0 && !waiting {
                break;
            }
        }
        // The point of the slots: passes that carry several streams at once.
        assert!(
            passes_with.iter().any(|&n| n >= 3),
            "passes carried {passes_with:?} streams"
        );
        let ends = streams.iter().map(|s| {
            let s = s.as_ref().unwrap();
            assert!(s.done);
            s.st.end
        });
        out.into_iter().zip(ends).collect::<Vec<_>>()
    })
}

#[test]
fn streams_decoded_together_give_each_request_its_answer_alone() {
    let dir = data_dir().join("tiny");
    let reqs = requests();
    for name in FIXTURES {
        let bytes = std::fs::read(dir.join(format!("{name}.gguf"))).unwrap();
        let tokens = Meta::load(&dir.join(format!("{name}.gguf.meta"))).u32s("token_ids");
        let got = together(&bytes, &tokens, &reqs);
        for (k, r) in reqs.iter().enumerate() {
            let want = alone(&bytes, &tokens, r);
            assert_eq!(got[k].0, want.0, "{name} request {k}: tokens differ");
            assert_eq!(got[k].1, want.1, "{name} request {k}: end differs");
            assert!(!want.0.is_empty(), "{name} request {k}: no tokens");
        }
    }
}
