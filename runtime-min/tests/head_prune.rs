//! Pruned LM heads: encoding with kept tokens only (Gemma 3's SentencePiece vocab and a
//! byte-level BPE vocab), and pruned-head logits against full-head logits.
//!
//! Gemma 3 270M is not in git (`cargo xtask fetch-model gemma3-270m`); its tests fail
//! without it unless `PINCH_SKIP_MODEL_TESTS=1`.
use std::path::{Path, PathBuf};

use pinch_kernels::CpuFeatures;
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::head;
use pinch_runtime_min::model::{Config, Loader, Logits, Math, Session, SessionOptions};
use pinch_runtime_min::platform::MemPlatform;
use pinch_runtime_min::platform::Platform;
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_runtime_min::Arena;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn gemma() -> Option<Vec<u8>> {
    let p = root().join("models/gemma-3-270m-q4_k_m.gguf");
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        Err(_) if std::env::var("PINCH_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") => None,
        Err(e) => panic!(
            "{}: {e} (cargo xtask fetch-model gemma3-270m, or PINCH_SKIP_MODEL_TESTS=1)",
            p.display()
        ),
    }
}

fn region(n: usize) -> Vec<u64> {
    vec![0u64; n / 8 + 1]
}

fn corpus_texts() -> Vec<String> {
    let dir = root().join("tests/data/corpus");
    let list = std::fs::read_to_string(dir.join("files.txt")).unwrap();
    list.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|n| std::fs::read_to_string(dir.join(n)).unwrap())
        .collect()
}

fn encode(tok: &Tokenizer<'_>, text: &str) -> Vec<u32> {
    let mut scratch = vec![0u8; tok.scratch_bytes(text.len())];
    let mut out = vec![0u32; text.len() + 8];
    let n = tok
        .encode(text, false, false, &mut scratch, &mut out)
        .unwrap();
    out.truncate(n);
    out
}

/// Head of about `rows` rows chosen from the test corpus.
fn select(tok: &Tokenizer<'_>, rows: usize) -> Vec<u32> {
    let nv = tok.n_vocab() as usize;
    let mut counts = vec![0u32; nv];
    for t in corpus_texts() {
        for id in encode(tok, &t) {
            counts[id as usize] += 1;
        }
    }
    let mut order = vec![0u32; nv];
    let mut out = vec![0u32; nv];
    let k = head::select(tok, &counts, rows, &mut order, &mut out);
    out.truncate(k);
    out
}

fn decode(tok: &Tokenizer<'_>, ids: &[u32]) -> Vec<u8> {
    let mut b: Vec<u8> = ids
        .iter()
        .flat_map(|&i| tok.token_bytes(i).to_vec())
        .collect();
    if tok.adds_space_prefix() && b.first() == Some(&b' ') {
        b.remove(0);
    }
    b
}

const TEXTS: &[&str] = &[
    "The quick brown fox jumps over the lazy dog.",
    "Quantum chromodynamics describes the strong interaction; Schrödinger's cat, naïve café.",
    "Привет, как дела? Съешь же ещё этих мягких французских булок.",
    "日本語のテキストと中文文本，还有한국어 문장과 ελληνικά.",
    "fn main() { let x: Vec<u32> = (0..10).map(|i| i * 2).collect(); }",
    "emoji 🦀🎉 and rare symbols ∮ ⊗ ℵ₀ \u{10FFFD}",
];

/// Every id produced with the restriction is in the head, the text decodes back, the
/// restriction is needed (the full tokenization uses ids outside the head) and
/// without the restriction nothing changes.
fn check_restricted_encoding(tok: &mut Tokenizer<'_>, ids: &[u32], mask: &[u64]) {
    let eval = std::fs::read_to_string(root().join("tests/data/eval/wiki-excerpt.txt")).unwrap();
    let mut texts: Vec<&str> = TEXTS.to_vec();
    texts.push(&eval);
    let mut outside_full = 0;
    for text in &texts {
        let full = encode(tok, text);
        assert_eq!(decode(tok, &full), text.as_bytes());
        outside_full += full
            .iter()
            .filter(|i| ids.binary_search(i).is_err())
            .count();
        let pruned = {
            // The tokenizer borrows the mask for its own lifetime: leak a copy (test only).
            let m: &'static [u64] = Box::leak(mask.to_vec().into_boxed_slice());
            tok.set_allowed(Some(m));
            let p = encode(tok, text);
            tok.set_allowed(None);
            p
        };
        for id in &pruned {
            assert!(
                ids.binary_search(id).is_ok(),
                "id {id} outside the head in {text:?}"
            );
        }
        assert_eq!(
            String::from_utf8_lossy(&decode(tok, &pruned)),
            *text,
            "restricted encoding does not round-trip"
        );
        assert!(pruned.len() >= full.len());
        assert_eq!(encode(tok, text), full);
    }
    assert!(
        outside_full > 0,
        "the head covers every token of the texts: the test would prove nothing"
    );
}

fn mask_of(ids: &[u32], nv: usize) -> Vec<u64> {
    let mut m = vec![0u64; nv.div_ceil(64)];
    for &i in ids {
        m[i as usize / 64] |= 1 << (i % 64);
    }
    m
}

fn vocab_test(bytes: &[u8], rows: usize) {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let mut r = region(bytes.len() * 4 + (64 << 20));
    let mut arena = Arena::new(pinch_kernels::blocks::bytes_of_mut(&mut r[..]));
    let mut tok = Tokenizer::from_gguf(&g, &mut arena).unwrap();
    let ids = select(&tok, rows);
    assert_eq!(ids.len() % head::ROW_MULTIPLE, 0);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let mask = mask_of(&ids, tok.n_vocab() as usize);
    check_restricted_encoding(&mut tok, &ids, &mask);
}

#[test]
fn gemma3_restricted_encoding_stays_in_head_and_round_trips() {
    let Some(b) = gemma() else { return };
    // Gemma keeps ~6.7K special and byte tokens; 8K rows leave ~1.3K text tokens.
    vocab_test(&b, 8192);
}

#[test]
fn bpe_restricted_encoding_stays_in_head_and_round_trips() {
    let b = std::fs::read(root().join("tests/data/vocab/ggml-vocab-qwen2.gguf")).unwrap();
    vocab_test(&b, 2000);
}

#[test]
fn bpe_gpt2_restricted_encoding_stays_in_head_and_round_trips() {
    let b = std::fs::read(root().join("tests/data/vocab/ggml-vocab-gpt-2.gguf")).unwrap();
    vocab_test(&b, 1000);
}

fn host_cpu() -> CpuFeatures {
    CpuFeatures::detect()
}

/// Logits of `tokens` (every position) with the full head and with the head `ids`.
fn logits_pair(bytes: &[u8], tokens: &[u32], ids: &[u32], math: Math) -> (Vec<f32>, Vec<f32>) {
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let mut r = region(bytes.len() * 2 + (128 << 20));
    let mut arena = Arena::new(pinch_kernels::blocks::bytes_of_mut(&mut r[..]));
    let plat = MemPlatform {
        bytes,
        cpu: host_cpu(),
    };
    let mut w = Loader {
        platform: &plat,
        file: &(),
        gguf: &g,
        arena: &mut arena,
    }
    .load(&cfg)
    .unwrap();
    let opts = SessionOptions {
        n_ctx: 64,
        n_batch: 4,
        kv: pinch_runtime_min::model::KvType::F32,
        kv_v: pinch_runtime_min::model::KvType::F32,
        math,
        threads: 1,
        head_group: 2,
        attn_skip: false,
        swa_ring: true,
        state_f16: false,
        n_seq: 1,
        cpu: plat.cpu,
    };
    let full = run_all(cfg, &w, &mut arena, &plat, opts, tokens);
    let pruned_out = head::prune(&w.output, ids, &mut arena).unwrap();
    w.output = pruned_out;
    w.head_ids = Some(Box::leak(ids.to_vec().into_boxed_slice()));
    let pruned = run_all(cfg, &w, &mut arena, &plat, opts, tokens);
    (full, pruned)
}

fn run_all<'a>(
    cfg: Config,
    w: &pinch_runtime_min::model::Weights<'a>,
    arena: &mut Arena<'a>,
    plat: &MemPlatform<'_>,
    opts: SessionOptions,
    tokens: &[u32],
) -> Vec<f32> {
    let read = |off: u64, buf: &mut [u8], d: bool| plat.read_at(&(), off, buf, d);
    let mut s = Session::new(cfg, w, arena, opts).unwrap();
    s.set_reader(&read);
    let mut all = Vec::new();
    s.eval(plat, tokens, Logits::All, &mut |_, l| {
        all.extend_from_slice(l)
    })
    .unwrap();
    all
}

fn check_pruned(full: &[f32], pruned: &[f32], ids: &[u32], nv: usize) {
    assert_eq!(full.len(), pruned.len());
    let mut kept = vec![false; nv];
    for &i in ids {
        kept[i as usize] = true;
    }
    for (j, (a, b)) in full.iter().zip(pruned).enumerate() {
        if kept[j % nv] {
            assert_eq!(a.to_bits(), b.to_bits(), "id {} logit {a} vs {b}", j % nv);
        } else {
            assert_eq!(*b, f32::NEG_INFINITY, "id {} should be -inf", j % nv);
        }
    }
}

/// Every third id plus a ragged tail: not a multiple of 16 on purpose.
fn some_ids(nv: usize) -> Vec<u32> {
    (0..nv as u32)
        .filter(|i| i % 3 == 1 || *i + 5 >= nv as u32)
        .collect()
}

#[test]
fn tiny_pruned_head_logits_equal_full_head_on_kept_ids() {
    for name in [
        "tiny-llama-Q4_K_M.gguf",
        "tiny-llama-Q8_0.gguf",
        "tiny-gemma3-Q4_K_M.gguf",
        "tiny-qwen3-Q8_0.gguf",
        "tiny-llama-F32.gguf",
    ] {
        let b = std::fs::read(root().join("tests/data/tiny").join(name)).unwrap();
        let g = Gguf::parse(&b, b.len() as u64).unwrap();
        let nv = Config::from_gguf(&g).unwrap().n_vocab;
        let ids = some_ids(nv);
        for math in [Math::Fast, Math::Reference] {
            let (full, pruned) = logits_pair(&b, &[1, 5, 9, 2, 7, 3], &ids, math);
            check_pruned(&full, &pruned, &ids, nv);
        }
    }
}

#[test]
fn gemma3_pruned_head_logits_equal_full_head_on_kept_ids() {
    let Some(b) = gemma() else { return };
    let g = Gguf::parse(&b, b.len() as u64).unwrap();
    let nv = Config::from_gguf(&g).unwrap().n_vocab;
    let ids: Vec<u32> = (0..nv as u32).filter(|i| i % 4 == 0).collect();
    let (full, pruned) = logits_pair(&b, &[2, 818, 5279, 529, 7001, 563], &ids, Math::Fast);
    check_pruned(&full, &pruned, &ids, nv);
}

/// `load_with_head` (rows read one by one for an untied output, copied from the
/// embedding for a tied one) builds the same matrix as pruning the full one.
#[test]
fn load_with_head_matches_pruning_the_full_output() {
    for name in ["tiny-llama-Q4_K_M.gguf", "tiny-gemma3-Q8_0.gguf"] {
        let b = std::fs::read(root().join("tests/data/tiny").join(name)).unwrap();
        let g = Gguf::parse(&b, b.len() as u64).unwrap();
        let cfg = Config::from_gguf(&g).unwrap();
        let ids: &'static [u32] = Box::leak(some_ids(cfg.n_vocab).into_boxed_slice());
        let mut r = region(b.len() * 3 + (16 << 20));
        let mut arena = Arena::new(pinch_kernels::blocks::bytes_of_mut(&mut r[..]));
        let plat = MemPlatform {
            bytes: &b,
            cpu: host_cpu(),
        };
        let mut loader = Loader {
            platform: &plat,
            file: &(),
            gguf: &g,
            arena: &mut arena,
        };
        let full = loader.load(&cfg).unwrap();
        let pruned = loader.load_with_head(&cfg, Some(ids)).unwrap();
        assert_eq!(pruned.head_ids, Some(ids));
        assert_eq!(pruned.output.rows, ids.len());
        assert_eq!(pruned.output.ty, full.output.ty);
        for (j, &id) in ids.iter().enumerate() {
            assert_eq!(
                pruned.output.row(j),
                full.output.row(id as usize),
                "{name} row {id}"
            );
        }
        assert_eq!(pruned.token_embd.rows, cfg.n_vocab);
    }
}

/// Gemma's 6,242 `<unusedN>` control tokens are placeholders: not forced into a head,
/// ranked last, and text naming one encodes as text under a head without it. The
/// character prior keeps scripts the corpus lacks out of the uncounted rows.
#[test]
fn gemma3_head_drops_unused_placeholders_and_prefers_the_corpus_scripts() {
    let Some(b) = gemma() else { return };
    let g = Gguf::parse(&b, b.len() as u64).unwrap();
    let mut r = region(b.len() * 4 + (64 << 20));
    let mut arena = Arena::new(pinch_kernels::blocks::bytes_of_mut(&mut r[..]));
    let mut tok = Tokenizer::from_gguf(&g, &mut arena).unwrap();
    let nv = tok.n_vocab() as usize;
    let unused: Vec<u32> = (0..nv as u32)
        .filter(|&i| head::is_unused(&tok, i))
        .collect();
    assert_eq!(unused.len(), 6242);
    assert!(unused.iter().all(|&i| {
        let t = tok.token_text(i);
        t.starts_with(b"<unused") && !head::must_keep(&tok, i)
    }));
    // English-only corpus: counts plus the character prior, as `--head-lang en` ranks.
    let en = std::fs::read_to_string(root().join("tests/data/corpus/en.txt")).unwrap();
    let mut counts = vec![0u32; nv];
    for id in encode(&tok, &en) {
        counts[id as usize] += 1;
    }
    let mut bits = vec![0u64; head::CHARSET_WORDS];
    let mut chars = head::CharSet::new(&mut bits);
    chars.add_text(en.as_bytes());
    head::add_char_prior(&tok, &chars, &mut counts);
    let (mut order, mut out) = (vec![0u32; nv], vec![0u32; nv]);
    let k = head::select(&tok, &counts, 65536, &mut order, &mut out);
    let ids = &out[..k];
    assert_eq!(k, 65536);
    assert!(ids.iter().all(|i| !head::is_unused(&tok, *i)));
    let outside_script = ids
        .iter()
        .filter(|&&i| !head::must_keep(&tok, i) && head::char_prior(&tok, &chars, i) < 2)
        .count();
    assert_eq!(
        outside_script, 0,
        "uncounted rows hold scripts the corpus lacks"
    );
    // `<unused5>` in text, special tokens parsed: its id under the full vocab, its
    // characters under the head.
    let mask: &'static [u64] = Box::leak(mask_of(ids, nv).into_boxed_slice());
    let text = "a <unused5> b";
    let mut scratch = vec![0u8; tok.scratch_bytes(text.len())];
    let mut buf = vec![0u32; text.len() + 8];
    let n = tok
        .encode(text, false, true, &mut scratch, &mut buf)
        .unwrap();
    assert!(buf[..n].contains(&unused[5]));
    tok.set_allowed(Some(mask));
    let n = tok
        .encode(text, false, true, &mut scratch, &mut buf)
        .unwrap();
    assert!(buf[..n].iter().all(|i| ids.binary_search(i).is_ok()));
    assert_eq!(decode(&tok, &buf[..n]), text.as_bytes());
}
