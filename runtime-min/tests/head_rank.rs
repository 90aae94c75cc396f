//! Head ranking by marginal cost under the restricted encoding (`head_rank::choose`)
//! against ranking by raw counts (`head::select`), on a constructed SentencePiece
//! vocabulary where the two disagree.
use pinch_runtime_min::gguf::{ArrayView, ValueType};
use pinch_runtime_min::head::{self, CharSet, CHARSET_WORDS};
use pinch_runtime_min::head_rank::{self, CharModel, Signals, CHAR_MODEL_WORDS};
use pinch_runtime_min::tokenizer::{Tokenizer, VocabSource};
use pinch_runtime_min::Arena;

/// 256 byte tokens, 15 letters `c`..`q`, then `a`, `b`, `ab` (merged from `a` and `b`)
/// and `€` (one 3-byte character: one token, or three byte tokens without it).
fn vocab() -> (Vec<u8>, Vec<u8>, Vec<u8>, u64) {
    let mut texts: Vec<String> = (0..256).map(|b| format!("<0x{b:02X}>")).collect();
    let mut types = vec![6i32; 256];
    for c in b'c'..=b'q' {
        texts.push((c as char).to_string());
    }
    texts.extend(["a", "b", "ab", "€"].map(String::from));
    types.resize(texts.len(), 1);
    let n = texts.len();
    let mut strs = Vec::new();
    for s in &texts {
        strs.extend_from_slice(&(s.len() as u64).to_le_bytes());
        strs.extend_from_slice(s.as_bytes());
    }
    let scores: Vec<u8> = (0..n).flat_map(|i| (-(i as f32)).to_le_bytes()).collect();
    let types: Vec<u8> = types.iter().flat_map(|t| t.to_le_bytes()).collect();
    (strs, scores, types, n as u64)
}

fn source<'a>(toks: &'a [u8], scores: &'a [u8], types: &'a [u8], n: u64) -> VocabSource<'a> {
    let view = |elem, bytes| ArrayView {
        elem,
        len: n,
        bytes,
    };
    VocabSource {
        model: "llama",
        pre: None,
        name: None,
        tokens: view(ValueType::Str, toks),
        scores: Some(view(ValueType::F32, scores)),
        types: Some(view(ValueType::I32, types)),
        merges: None,
        bos: None,
        eos: None,
        eot: None,
        eom: None,
        unk: None,
        fim: [None; 6],
        add_bos: None,
        add_eos: None,
        add_space_prefix: Some(false),
        remove_extra_whitespaces: None,
        charsmap: None,
    }
}

/// Tokens of `text` when only `ids` may be produced.
fn restricted_len(tok: &Tokenizer<'_>, ids: &[u32], text: &str) -> usize {
    let mut mask = vec![0u64; (tok.n_vocab() as usize).div_ceil(64)];
    for &i in ids {
        mask[i as usize / 64] |= 1 << (i % 64);
    }
    let mut t = tok.clone();
    t.set_allowed(Some(&mask));
    let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
    let mut out = vec![0u32; 4 * text.len() + 8];
    t.encode(text, false, false, &mut scratch, &mut out)
        .unwrap()
}

#[test]
fn marginal_cost_keeps_what_raw_counts_drop() {
    let (toks, scores, types, n) = vocab();
    let mut region = vec![0u8; 8 << 20];
    let mut arena = Arena::new(&mut region);
    let tok = Tokenizer::from_source(&source(&toks, &scores, &types, n), &mut arena).unwrap();
    let id = |s: &str| tok.token_id(s.as_bytes()).unwrap();
    let (ab, euro) = (id("ab"), id("€"));
    // The corpus: each letter 100 times, `ab` 12 times, `€` 10 times.
    let mut corpus = String::new();
    for c in 'c'..='q' {
        corpus.extend(std::iter::repeat_n(c, 100));
    }
    corpus += &"ab".repeat(12);
    corpus += &"€".repeat(10);
    let mut counts = vec![0u32; n as usize];
    for c in 'c'..='q' {
        counts[id(&c.to_string()) as usize] = 100;
    }
    counts[ab as usize] = 12;
    counts[euro as usize] = 10;
    // 256 byte tokens + 16 rows: the 15 letters and one of `ab` / `€`.
    let rows = 272;
    let mut order = vec![0u32; n as usize];
    let mut by_count = vec![0u32; n as usize];
    let k = head::select(&tok, &counts, rows, &mut order, &mut by_count);
    by_count.truncate(k);
    assert!(by_count.contains(&ab) && !by_count.contains(&euro));

    let mut chars_bits = vec![0u64; CHARSET_WORDS];
    let chars = CharSet::new(&mut chars_bits);
    let mut lm = vec![0u32; CHAR_MODEL_WORDS];
    let model = CharModel::new(&mut lm);
    let sig = Signals {
        chars: &chars,
        model: Some(&model),
    };
    let mut by_cost = vec![0u32; n as usize];
    let mut c2 = counts.clone();
    let k = head_rank::choose(&tok, &mut c2, &sig, rows, &mut arena, &mut by_cost).unwrap();
    by_cost.truncate(k);
    assert_eq!(k, rows);
    // Dropping `ab` costs 12 tokens (two bytes each), dropping `€` 20 (three bytes for
    // one token): the cost ranking keeps `€`; `a` and `b` (single characters, which
    // merging starts from) are not needed to reach `ab` and stay out.
    assert!(
        by_cost.contains(&euro) && !by_cost.contains(&ab),
        "{by_cost:?}"
    );
    assert!(!by_cost.contains(&id("a")) && !by_cost.contains(&id("b")));
    // The restricted encoding of the corpus is shorter with the cost ranking's head.
    let (cost_len, count_len) = (
        restricted_len(&tok, &by_cost, &corpus),
        restricted_len(&tok, &by_count, &corpus),
    );
    assert_eq!(cost_len, 15 * 100 + 24 + 10);
    assert_eq!(count_len, 15 * 100 + 12 + 30);
}

#[test]
fn prior_ranks_corpus_characters_then_score_rank() {
    let (toks, scores, types, n) = vocab();
    let mut region = vec![0u8; 8 << 20];
    let mut arena = Arena::new(&mut region);
    let tok = Tokenizer::from_source(&source(&toks, &scores, &types, n), &mut arena).unwrap();
    let id = |s: &str| tok.token_id(s.as_bytes()).unwrap();
    // No corpus counts: every row past the bytes comes from the prior. Single ASCII
    // characters (the character prior's top) by score rank fill the 16 rows: the 15
    // letters and `a`; not `b`, `ab` (several characters) or `€` (not the corpus's).
    let mut counts = vec![0u32; n as usize];
    let mut chars_bits = vec![0u64; CHARSET_WORDS];
    let chars = CharSet::new(&mut chars_bits);
    let sig = Signals {
        chars: &chars,
        model: None,
    };
    let mut out = vec![0u32; n as usize];
    let k = head_rank::choose(&tok, &mut counts, &sig, 272, &mut arena, &mut out).unwrap();
    out.truncate(k);
    assert_eq!(k, 272);
    for c in 'c'..='q' {
        assert!(out.contains(&id(&c.to_string())));
    }
    assert!(out.contains(&id("a")));
    for s in ["b", "ab", "€"] {
        assert!(!out.contains(&id(s)), "{s} kept");
    }
}
