//! `serve --parallel`'s slots (`server::slots`): answers generated together, one
//! `decode_seqs` pass per token for all, with prompts admitted while others generate,
//! are token for token (and end for end) the answers the server's single generation
//! (`generate::generate` with the server's settings) gives each request alone.
use pinch_runtime_min::generate::{self, Emit, End, Settings};
use pinch_runtime_min::guard::MemoryGuard;
use pinch_runtime_min::model::{KvType, Math, Session, SessionOptions};
use pinch_runtime_min::platform::MemPlatform;
use pinch_runtime_min::sampler::{Sampler, SamplerParams};
use pinch_runtime_min::server::slots::{self, Stream};
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
    joins_at: usize,
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
            joins_at: 0,
        },
        Req {
            prompt: (3, 12),
            max_new: 9,
            ignore_eos: false,
            sp: greedy,
            joins_at: 0,
        },
        Req {
            prompt: (7, 3),
            max_new: 16,
            ignore_eos: true,
            sp: warm(7),
            joins_at: 4,
        },
        Req {
            prompt: (1, 10),
            max_new: 12,
            ignore_eos: true,
            sp: warm(11),
            joins_at: 10,
        },
    ]
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
        let mut sampler = Sampler::new(r.sp);
        let mut guard = MemoryGuard::new(0);
        let settings = Settings {
            sampler: &mut sampler,
            guard: &mut guard,
            adjust: None,
            max_new: r.max_new,
            ignore_eos: r.ignore_eos,
            feed_last: false,
            draft: None,
            grammar: None,
        };
        let (a, n) = r.prompt;
        let mut out = vec![];
        let st = generate::generate(
            plat,
            tok,
            sess,
            settings,
            &tokens[a..a + n],
            &mut Emit(|id, _: &[u8]| out.push(id)),
        )
        .unwrap();
        (out, st.end)
    })
}

/// All requests in one session, one sequence each, joining at their step.
fn together(bytes: &[u8], tokens: &[u32], reqs: &[Req]) -> Vec<(Vec<u32>, End)> {
    with_session(bytes, reqs.len(), |sess, tok, plat| {
        let mut streams: Vec<Stream> = Vec::new();
        let mut index: Vec<usize> = Vec::new();
        let mut out = vec![Vec::new(); reqs.len()];
        let mut passes_with = std::collections::BTreeSet::new();
        for step in 0.. {
            for (k, r) in reqs.iter().enumerate().filter(|(_, r)| r.joins_at == step) {
                let mut s = Stream::new(k, Sampler::new(r.sp), r.max_new, r.ignore_eos);
                let (a, n) = r.prompt;
                s.start(plat, sess, &tokens[a..a + n]).unwrap();
                streams.push(s);
                index.push(k);
            }
            let live = slots::step(plat, sess, tok, &mut streams, &mut |s, id, _| {
                out[index[s]].push(id);
                true
            })
            .unwrap();
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
        let mut ends = vec![End::Length; reqs.len()];
        for s in &streams {
            ends[s.seq] = s.end.unwrap();
        }
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
