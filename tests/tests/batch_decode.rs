//! Several sequences decoded in one weight pass (`Session::decode_seqs`, what `pinch
//! serve --parallel N` runs) give each sequence exactly the logits it gets alone: the
//! batched matrix products compute every row as the one-row product does, and each row
//! attends over its own sequence's cache.
use pinch_runtime_min::model::{KvType, Logits, Math, ModelError};
use pinch_tests::*;

/// Fixtures of the attention-only architectures the server batches, in the types whose
/// kernels differ most (float, Q8_0, K-quants).
const FIXTURES: &[&str] = &[
    "tiny-llama-F32",
    "tiny-llama-Q8_0",
    "tiny-llama-Q4_K_M",
    "tiny-llama-Q4_0",
    "tiny-qwen3-Q8_0",
    "tiny-qwen3-Q4_K_M",
    "tiny-gemma3-F32",
    "tiny-gemma3-Q8_0",
    "tiny-gemma3-Q4_K_M",
];

/// Sequences and their prompts (slices of the fixture's token list, of different
/// lengths so that every sequence is at its own position).
const PROMPTS: [(usize, usize); 3] = [(0, 5), (3, 12), (7, 8)];

/// Steps decoded after the prompts; sequence `s` takes part in step `k` unless
/// `(k + s) % 4 == 3` (so passes hold 1, 2 or 3 rows, in varying combinations).
const STEPS: usize = 10;

fn takes_part(seq: usize, step: usize) -> bool {
    (step + seq) % 4 != 3
}

/// The token sequence `s` is fed at step `k` (teacher-forced: a fixed, valid id).
fn fed(tokens: &[u32], seq: usize, step: usize) -> u32 {
    tokens[(5 * seq + 3 * step + 1) % tokens.len()]
}

type Rows = Vec<Vec<Vec<f32>>>;

fn spec(math: Math) -> RunSpec {
    RunSpec {
        math,
        kv: KvType::F16,
        batch: 8,
        threads: 2,
        attn_skip: true,
    }
}

/// Each sequence alone in a one-sequence session: its prompt's last logits, then one
/// row per step it takes part in.
fn alone(bytes: &[u8], tokens: &[u32], math: Math, repack: bool) -> Rows {
    let mut out = Vec::new();
    for (seq, &(a, n)) in PROMPTS.iter().enumerate() {
        let rows = with_session_seqs(bytes, spec(math), 1, repack, |s, p| {
            let mut rows = Vec::new();
            s.eval(p, &tokens[a..a + n], Logits::Last, &mut |_, l| {
                rows.push(l.to_vec())
            })
            .unwrap();
            for step in (0..STEPS).filter(|&k| takes_part(seq, k)) {
                let t = [fed(tokens, seq, step)];
                s.eval(p, &t, Logits::Last, &mut |_, l| rows.push(l.to_vec()))
                    .unwrap();
            }
            rows
        })
        .unwrap();
        out.push(rows);
    }
    out
}

/// All sequences in one session: prompts one after another, then every step one pass.
fn together(bytes: &[u8], tokens: &[u32], math: Math, repack: bool) -> Rows {
    with_session_seqs(bytes, spec(math), PROMPTS.len(), repack, |s, p| {
        let mut out = vec![Vec::new(); PROMPTS.len()];
        for (seq, &(a, n)) in PROMPTS.iter().enumerate() {
            s.select_seq(seq).unwrap();
            s.eval(p, &tokens[a..a + n], Logits::Last, &mut |_, l| {
                out[seq].push(l.to_vec())
            })
            .unwrap();
        }
        // Leave another sequence selected than the last one evaluated: decode_seqs
        // must not depend on the selection.
        s.select_seq(1).unwrap();
        for step in 0..STEPS {
            // Rows in a changing order, not by sequence.
            let mut rows: Vec<(usize, u32)> = (0..PROMPTS.len())
                .filter(|&q| takes_part(q, step))
                .map(|q| (q, fed(tokens, q, step)))
                .collect();
            let turn = step % rows.len().max(1);
            rows.rotate_left(turn);
            s.decode_seqs(p, &rows, &mut |i, l| out[rows[i].0].push(l.to_vec()))
                .unwrap();
        }
        for (seq, &(_, n)) in PROMPTS.iter().enumerate() {
            let steps = (0..STEPS).filter(|&k| takes_part(seq, k)).count();
            assert_eq!(s.n_past_of(seq), n + steps, "sequence {seq} position");
        }
        assert_eq!(s.n_past(), s.n_past_of(1));
        out
    })
    .unwrap()
}

fn check(name: &str, math: Math, repack: bool) {
    let dir = data_dir().join("tiny");
    let bytes = std::fs::read(dir.join(format!("{name}.gguf"))).unwrap();
    let tokens = Meta::load(&dir.join(format!("{name}.gguf.meta"))).u32s("token_ids");
    let a = alone(&bytes, &tokens, math, repack);
    let b = together(&bytes, &tokens, math, repack);
    for (seq, (ra, rb)) in a.iter().zip(&b).enumerate() {
        assert_eq!(ra.len(), rb.len(), "{name} seq {seq}: row count");
        for (k, (x, y)) in ra.iter().zip(rb).enumerate() {
            let same = x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits());
            assert!(
                same,
                "{name} {math:?} repack={repack} seq {seq} row {k}: batched logits differ (max {})",
                max_abs_diff(x, y)
            );
        }
    }
}

#[test]
fn batched_sequences_match_each_alone_bit_for_bit_fast() {
    for name in FIXTURES {
        check(name, Math::Fast, false);
    }
}

#[test]
fn batched_sequences_match_each_alone_bit_for_bit_repacked() {
    for name in FIXTURES {
        check(name, Math::Fast, true);
    }
}

#[test]
fn batched_sequences_match_each_alone_bit_for_bit_reference() {
    for name in ["tiny-llama-Q8_0", "tiny-gemma3-Q4_K_M", "tiny-qwen3-F32"] {
        check(name, Math::Reference, false);
    }
}

#[test]
fn recurrent_models_refuse_several_sequences_and_bad_ids_are_errors() {
    let dir = data_dir().join("tiny");
    for name in ["tiny-qwen35-Q8_0", "tiny-lfm2-F32"] {
        let bytes = std::fs::read(dir.join(format!("{name}.gguf"))).unwrap();
        let r = with_session_seqs(&bytes, spec(Math::Fast), 2, false, |_, _| ());
        assert!(
            matches!(r, Err(ModelError::ParallelRecurrent)),
            "{name}: {:?}",
            r.err()
        );
        // One sequence still runs.
        with_session_seqs(&bytes, spec(Math::Fast), 1, false, |_, _| ()).unwrap();
    }
    let bytes = std::fs::read(dir.join("tiny-llama-Q8_0.gguf")).unwrap();
    with_session_seqs(&bytes, spec(Math::Fast), 2, false, |s, p| {
        let bad = |r: Result<(), ModelError>| matches!(r, Err(ModelError::BadSeq { .. }));
        assert!(bad(s.select_seq(2)));
        assert!(bad(s.decode_seqs(p, &[(2, 1)], &mut |_, _| {})));
        assert!(bad(s.decode_seqs(p, &[(0, 1), (0, 2)], &mut |_, _| {})));
        let r = s.decode_seqs(p, &[(1, 1 << 20)], &mut |_, _| {});
        assert!(matches!(r, Err(ModelError::BadToken { .. })));
        // Nothing ran: every sequence is still empty.
        assert_eq!((s.n_past_of(0), s.n_past_of(1)), (0, 0));
    })
    .unwrap();
}
