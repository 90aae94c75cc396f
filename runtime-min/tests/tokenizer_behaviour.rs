//! Tokenizer behaviour beyond the test vectors: special tokens, BOS/EOS, errors,
//! streaming decode, hostile input and speed. Vocabs from tests/data/vocab.
use pinch_runtime_min::gguf::{ArrayView, Gguf, ValueType};
use pinch_runtime_min::tokenizer::{
    attr, PreTokenizer, Tokenizer, TokenizerError, Utf8Stream, VocabKind, VocabSource,
};
use pinch_runtime_min::Arena;
use std::path::PathBuf;
use std::sync::OnceLock;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

fn load(name: &str) -> Tokenizer<'static> {
    load_with_usage(name).0
}

/// The tokenizer and the arena bytes its tables took.
fn load_with_usage(name: &str) -> (Tokenizer<'static>, usize) {
    let path = data_dir().join(format!("vocab/ggml-vocab-{name}.gguf"));
    let bytes: &'static [u8] = Vec::leak(std::fs::read(&path).unwrap());
    let g = Gguf::parse(bytes, bytes.len() as u64).unwrap();
    let region: &'static mut [u8] = Vec::leak(vec![0u8; 96 << 20]);
    let mut arena = Arena::new(region);
    let t = Tokenizer::from_gguf(&g, &mut arena).unwrap();
    (t, arena.used())
}

#[test]
fn tables_are_a_few_bytes_per_token() {
    for name in ["llama-spm", "llama-bpe", "gpt-2"] {
        let (t, used) = load_with_usage(name);
        eprintln!(
            "{name}: {} tokens, {:.1} MB of tables",
            t.n_vocab(),
            used as f64 / 1e6
        );
        // spans 8 + score 4 + attr 1 + piece offset 4 + pieces ~7 + hash 8..16 bytes a
        // token, plus 28..40 bytes a merge.
        assert!(
            used < 64 * t.n_vocab() as usize + 40 * 300_000,
            "{name}: {used}"
        );
    }
}

fn spm() -> &'static Tokenizer<'static> {
    static T: OnceLock<Tokenizer<'static>> = OnceLock::new();
    T.get_or_init(|| load("llama-spm"))
}

fn llama3() -> &'static Tokenizer<'static> {
    static T: OnceLock<Tokenizer<'static>> = OnceLock::new();
    T.get_or_init(|| load("llama-bpe"))
}

fn qwen2() -> &'static Tokenizer<'static> {
    static T: OnceLock<Tokenizer<'static>> = OnceLock::new();
    T.get_or_init(|| load("qwen2"))
}

fn encode(t: &Tokenizer, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
    let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
    let mut out = vec![0u32; text.len() + 8];
    let n = t
        .encode_bytes(text, add_special, parse_special, &mut scratch, &mut out)
        .unwrap();
    out.truncate(n);
    out
}

fn id(t: &Tokenizer, s: &str) -> u32 {
    t.token_id(s.as_bytes())
        .unwrap_or_else(|| panic!("{s} not in vocab"))
}

#[test]
fn control_tokens_are_parsed_only_when_asked() {
    let t = llama3();
    let text = b"<|start_header_id|>user<|end_header_id|>";
    let start = id(t, "<|start_header_id|>");
    let end = id(t, "<|end_header_id|>");
    let parsed = encode(t, text, false, true);
    assert_eq!(parsed.len(), 3);
    assert_eq!((parsed[0], parsed[2]), (start, end));
    let plain = encode(t, text, false, false);
    assert!(!plain.contains(&start) && !plain.contains(&end));
    assert!(plain.len() > 3);
}

#[test]
fn user_defined_tokens_are_parsed_even_without_parse_special() {
    let t = qwen2();
    let pad = id(t, "[PAD151646]");
    assert_ne!(t.token_attr(pad) & attr::USER_DEFINED, 0);
    let ids = encode(t, b"a[PAD151646]b", false, false);
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[1], pad);
}

#[test]
fn longer_special_tokens_win_over_shorter_ones() {
    let t = qwen2();
    // "<|im_start|>" contains no shorter special, but "<|endoftext|><|im_start|>" must give
    // both tokens back to back.
    let ids = encode(t, b"<|endoftext|><|im_start|>x", false, true);
    assert_eq!(&ids[..2], &[id(t, "<|endoftext|>"), id(t, "<|im_start|>")]);
}

#[test]
fn add_special_follows_vocab_flags() {
    let s = spm();
    assert_eq!(encode(s, b"Hello", true, false)[0], 1);
    assert_eq!(encode(s, b"", true, false), vec![1]);
    assert_eq!(encode(s, b"", false, false), Vec::<u32>::new());
    let l = llama3();
    assert_eq!(encode(l, b"Hello", true, false)[0], 128000);
    let g = load("gpt-2");
    assert_eq!(g.kind(), VocabKind::Bpe);
    assert_eq!(
        encode(&g, b"Hello", true, false),
        encode(&g, b"Hello", false, false)
    );
}

#[test]
fn end_of_generation_tokens() {
    let l = llama3();
    assert!(l.is_eog(128001));
    assert!(l.is_eog(id(l, "<|eot_id|>")));
    assert_eq!(l.eot(), Some(id(l, "<|eot_id|>")));
    assert!(!l.is_eog(128000));
    assert!(spm().is_eog(2));
    assert!(!spm().is_eog(1));
}

#[test]
fn token_bytes_undo_the_vocab_encodings() {
    let s = spm();
    assert_eq!(s.token_bytes(id(s, "▁Hello")), b" Hello");
    assert_eq!(s.token_bytes(id(s, "<0x0A>")), b"\n");
    assert_eq!(s.token_to_piece(1, false), b"");
    assert_eq!(s.token_to_piece(1, true), b"<s>");
    let l = llama3();
    assert_eq!(l.token_bytes(id(l, "Ġworld")), b" world");
    assert_eq!(l.token_bytes(id(l, "Ċ")), b"\n");
    assert_eq!(l.token_bytes(u32::MAX), b"");
}

#[test]
fn too_small_output_reports_the_needed_count() {
    for t in [spm(), llama3()] {
        let text = "The quick brown fox jumps over the lazy dog.";
        let full = encode(t, text.as_bytes(), true, false);
        let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
        let mut out = vec![0u32; full.len() - 1];
        let r = t.encode(text, true, false, &mut scratch, &mut out);
        assert_eq!(
            r,
            Err(TokenizerError::OutputFull {
                needed: full.len(),
                given: full.len() - 1
            })
        );
        // The part that fit is the prefix of the full encoding.
        assert_eq!(&out[..], &full[..full.len() - 1]);
    }
}

#[test]
fn too_small_scratch_is_an_error() {
    let t = spm();
    let mut scratch = vec![0u8; 10];
    let mut out = [0u32; 16];
    assert!(matches!(
        t.encode("hello", false, false, &mut scratch, &mut out),
        Err(TokenizerError::ScratchTooSmall { .. })
    ));
}

/// xorshift: deterministic pseudo-random bytes.
fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn arbitrary_bytes_never_panic_and_round_trip_for_spm() {
    let mut seed = 0x1234_5678_9ABC_DEF0u64;
    let alphabet: &[u8] = b" \t\n\r<>|_'sSa0\xC3\xA9\xE2\x96\x81\xF0\x9F\xA6\x99\x80\xFF";
    for t in [spm(), llama3(), qwen2()] {
        for round in 0..300 {
            let len = (rng(&mut seed) % 64) as usize;
            let words = [
                "a", " ", "  ", "\t", "\n", "é", "▁", "🦙", "中", "<s>", "'s", "Hi", "42",
            ];
            let text: Vec<u8> = if round % 4 == 1 {
                (0..len / 2)
                    .flat_map(|_| words[(rng(&mut seed) % words.len() as u64) as usize].bytes())
                    .collect()
            } else {
                (0..len)
                    .map(|_| {
                        let r = rng(&mut seed);
                        if round % 2 == 0 {
                            r as u8
                        } else {
                            alphabet[(r % alphabet.len() as u64) as usize]
                        }
                    })
                    .collect()
            };
            let ids = encode(t, &text, round % 3 == 0, round % 5 == 0);
            assert!(ids.iter().all(|&i| i < t.n_vocab()));
            let valid = std::str::from_utf8(&text).is_ok();
            if t.kind() == VocabKind::Spm && valid && round % 3 != 0 && round % 5 != 0 {
                // SentencePiece keeps every character: decoding gives back " " + text.
                // (Not for invalid UTF-8: like llama.cpp, a bad lead byte swallows the
                // bytes after it, and an escaped space among them stays `▁`.)
                let mut back = Vec::new();
                for &i in &ids {
                    back.extend_from_slice(t.token_bytes(i));
                }
                // A literal `▁` in the input reads back as the space it stands for.
                let mut want = Vec::new();
                let mut i = 0;
                while i < text.len() {
                    if text[i..].starts_with("▁".as_bytes()) {
                        want.push(b' ');
                        i += 3;
                    } else {
                        want.push(text[i]);
                        i += 1;
                    }
                }
                if !text.is_empty() {
                    assert_eq!(&back[1..], &want[..], "round {round}");
                }
            }
        }
    }
}

fn collect_stream(chunks: &[&[u8]]) -> (String, Vec<String>) {
    let mut s = Utf8Stream::new();
    let mut all = String::new();
    let mut pieces = Vec::new();
    for c in chunks {
        s.push(c, &mut |x: &str| -> Result<(), ()> {
            all.push_str(x);
            pieces.push(x.to_string());
            Ok(())
        })
        .unwrap();
    }
    s.finish(&mut |x: &str| -> Result<(), ()> {
        all.push_str(x);
        pieces.push(x.to_string());
        Ok(())
    })
    .unwrap();
    (all, pieces)
}

#[test]
fn utf8_stream_holds_back_partial_characters() {
    let llama = "🦙".as_bytes();
    let (all, pieces) = collect_stream(&[b"a", &llama[..1], &llama[1..3], &llama[3..], b"b"]);
    assert_eq!(all, "a🦙b");
    assert_eq!(pieces, vec!["a", "🦙", "b"]);
}

#[test]
fn utf8_stream_replaces_invalid_sequences() {
    let (all, _) = collect_stream(&[b"x\xE2\x82", b"y\xFF", b"\xC3"]);
    assert_eq!(all, "x\u{FFFD}y\u{FFFD}\u{FFFD}");
    let (all, _) = collect_stream(&[b"\xED\xA0\x80ok"]); // a surrogate is never valid
    assert_eq!(all, "\u{FFFD}\u{FFFD}\u{FFFD}ok");
}

#[test]
fn streaming_byte_fallback_tokens_rebuilds_the_text() {
    let s = spm();
    let text = "héllo 🦙 中文 ok";
    let ids = encode(s, text.as_bytes(), false, false);
    let chunks: Vec<&[u8]> = ids.iter().map(|&i| s.token_bytes(i)).collect();
    // The llama emoji is not in the vocab: it arrives as four one-byte tokens.
    assert!(chunks.iter().any(|c| c.len() == 1 && c[0] >= 0x80));
    let (all, pieces) = collect_stream(&chunks);
    assert_eq!(all, format!(" {text}"));
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
}

#[test]
fn encodes_42_kb_quickly() {
    let text = std::fs::read_to_string(data_dir().join("eval/wiki-excerpt.txt"))
        .or_else(|_| std::fs::read_to_string("/work/shared/eval/wiki-excerpt.txt"))
        .expect("wiki-excerpt.txt");
    for (name, t) in [
        ("llama-spm", spm()),
        ("llama-bpe", llama3()),
        ("qwen2", qwen2()),
    ] {
        let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
        let mut out = vec![0u32; text.len() + 8];
        let t0 = std::time::Instant::now();
        let n = t
            .encode(&text, true, false, &mut scratch, &mut out)
            .unwrap();
        let dt = t0.elapsed();
        eprintln!(
            "{name}: {} bytes -> {n} tokens in {:.1} ms",
            text.len(),
            dt.as_secs_f64() * 1e3
        );
        assert!(n > text.len() / 8);
        assert!(dt.as_secs_f64() < 1.0, "{name} took {dt:?}");
    }
}

#[test]
fn pathological_inputs_stay_fast() {
    // One 42 KB "word": every merge happens inside a single symbol chain.
    let letters = "a".repeat(42_000);
    let mut seed = 7u64;
    let mixed: String = (0..42_000)
        .map(|_| (b'a' + (rng(&mut seed) % 26) as u8) as char)
        .collect();
    let spaces = " ".repeat(42_000);
    for (name, t) in [
        ("llama-spm", spm()),
        ("llama-bpe", llama3()),
        ("qwen2", qwen2()),
    ] {
        for (what, text) in [
            ("a*", &letters),
            ("random letters", &mixed),
            ("spaces", &spaces),
        ] {
            let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
            let mut out = vec![0u32; text.len() + 8];
            let t0 = std::time::Instant::now();
            let n = t
                .encode(text, false, false, &mut scratch, &mut out)
                .unwrap();
            let dt = t0.elapsed();
            eprintln!(
                "{name} {what}: {n} tokens in {:.1} ms",
                dt.as_secs_f64() * 1e3
            );
            assert!(dt.as_secs_f64() < 1.0, "{name} {what} took {dt:?}");
        }
    }
}

fn gguf_strings(items: &[&str]) -> Vec<u8> {
    let mut v = Vec::new();
    for s in items {
        v.extend_from_slice(&(s.len() as u64).to_le_bytes());
        v.extend_from_slice(s.as_bytes());
    }
    v
}

fn source<'a>(tokens: &'a [u8], count: u64, model: &'a str) -> VocabSource<'a> {
    VocabSource {
        model,
        pre: None,
        name: None,
        tokens: ArrayView {
            elem: ValueType::Str,
            len: count,
            bytes: tokens,
        },
        scores: None,
        types: None,
        merges: None,
        bos: None,
        eos: None,
        eot: None,
        eom: None,
        unk: None,
        fim: [None; 6],
        add_bos: None,
        add_eos: None,
        add_space_prefix: None,
        remove_extra_whitespaces: None,
        charsmap: None,
    }
}

#[test]
fn malformed_metadata_is_an_error_not_a_panic() {
    let toks = gguf_strings(&["<unk>", "a", "b", "ab"]);
    let mut region = vec![0u8; 1 << 20];
    let mut arena = Arena::new(&mut region);
    // Count larger than the bytes hold.
    let r = Tokenizer::from_source(&source(&toks, 5, "llama"), &mut arena);
    assert!(
        matches!(r, Err(TokenizerError::Malformed { index: 4, .. })),
        "{:?}",
        r.err()
    );
    // Every truncation of the string array.
    for cut in 0..toks.len() {
        let mut arena = Arena::new(&mut region);
        let r = Tokenizer::from_source(&source(&toks[..cut], 4, "llama"), &mut arena);
        assert!(
            matches!(r, Err(TokenizerError::Malformed { .. })),
            "cut {cut}"
        );
    }
    let mut arena = Arena::new(&mut region);
    match Tokenizer::from_source(&source(&toks, 4, "bert"), &mut arena).err() {
        Some(e @ TokenizerError::UnsupportedModel { name }) => {
            assert_eq!(name.as_str(), "bert");
            assert!(e.to_string().contains("'bert'"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // Scores of the wrong type, too few types, BPE without merges, unknown pre-tokenizer.
    let mut s = source(&toks, 4, "llama");
    s.scores = Some(ArrayView {
        elem: ValueType::Str,
        len: 4,
        bytes: &toks,
    });
    let mut arena = Arena::new(&mut region);
    assert!(matches!(
        Tokenizer::from_source(&s, &mut arena),
        Err(TokenizerError::WrongType { .. })
    ));
    let types = 1i32.to_le_bytes();
    let mut s = source(&toks, 4, "llama");
    s.types = Some(ArrayView {
        elem: ValueType::I32,
        len: 1,
        bytes: &types,
    });
    let mut arena = Arena::new(&mut region);
    assert!(matches!(
        Tokenizer::from_source(&s, &mut arena),
        Err(TokenizerError::CountMismatch {
            expected: 4,
            found: 1,
            ..
        })
    ));
    let mut arena = Arena::new(&mut region);
    assert!(matches!(
        Tokenizer::from_source(&source(&toks, 4, "gpt2"), &mut arena),
        Err(TokenizerError::MissingKey { .. })
    ));
    let merges = gguf_strings(&["a b"]);
    let mut s = source(&toks, 4, "gpt2");
    s.merges = Some(ArrayView {
        elem: ValueType::Str,
        len: 1,
        bytes: &merges,
    });
    // `whitespace` (an embedding model's pre-tokenizer) is llama.cpp's only one pinch
    // still refuses.
    for bad in ["no-such-pre", "whitespace"] {
        s.pre = Some(bad);
        let mut arena = Arena::new(&mut region);
        match Tokenizer::from_source(&s, &mut arena).err() {
            Some(e @ TokenizerError::UnsupportedPreTokenizer { name }) => {
                // The error names the value and lists what is supported.
                assert_eq!(name.as_str(), bad);
                let msg = e.to_string();
                let quoted = format!("'{bad}'");
                for want in [
                    &quoted,
                    " smollm",
                    " llama-bpe",
                    " deepseek-v3",
                    " kimi-k2",
                    " gemma4",
                    " granite-embed-multi-311m",
                    " sarvam-moe",
                ] {
                    assert!(msg.contains(want), "{want} missing from: {msg}");
                }
            }
            other => panic!("{other:?}"),
        }
    }
    // An arena too small is reported, naming the account.
    let mut tiny = [0u8; 256];
    let mut arena = Arena::new(&mut tiny);
    assert!(matches!(
        Tokenizer::from_source(&source(&toks, 4, "llama"), &mut arena),
        Err(TokenizerError::Arena(_))
    ));
}

/// SentencePiece-style BPE (Gemma 4's `gemma4`, `granite-embed-multi-311m`,
/// `sarvam-moe`) on a tiny vocab, against the rules of llama.cpp's BPE session: spaces
/// become `▁`, merges start from UTF-8 characters, a piece that is no token falls back to
/// `<0xXX>` tokens (bytes without one are dropped), Gemma 4 takes a newline run that is a
/// token whole, and decoding gives spaces back.
#[test]
fn spm_style_bpe_escapes_spaces_and_falls_back_to_hex_bytes() {
    let names = [
        "<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "ab", "▁", "\n", "\n\n", "\n\n\n", "<0xC3>",
        "<0xA9>", ".",
    ];
    let toks = gguf_strings(&names);
    let mut types = Vec::new();
    for ty in [3i32, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6, 6, 1] {
        types.extend_from_slice(&ty.to_le_bytes());
    }
    // "▁ a" joins two tokens into no token: it still merges, and the piece falls back to
    // byte tokens.
    let merges = gguf_strings(&["a b", "▁ a", "\n \n"]);
    let n = names.len() as u64;
    let mut region = vec![0u8; 1 << 20];
    let with = |model: &'static str, pre: Option<&'static str>| {
        let mut s = source(&toks, n, model);
        s.pre = pre;
        s.types = Some(ArrayView {
            elem: ValueType::I32,
            len: n,
            bytes: &types,
        });
        s.merges = Some(ArrayView {
            elem: ValueType::Str,
            len: 3,
            bytes: &merges,
        });
        s.bos = Some(2);
        s.eos = Some(1);
        s.add_bos = Some(false);
        s
    };
    let id = |s: &str| names.iter().position(|n| *n == s).unwrap() as u32;
    for (model, pre, gemma) in [
        ("gemma4", None, true),
        // A `gemma4` model is Gemma 4 whatever its pre-tokenizer key says.
        ("gemma4", Some("llama-bpe"), true),
        ("gpt2", Some("gemma4"), true),
        ("gpt2", Some("granite-embed-multi-311m"), true),
        ("gpt2", Some("sarvam-moe"), false),
    ] {
        let what = format!("{model} {pre:?}");
        let t = Tokenizer::from_source(&with(model, pre), &mut Arena::new(&mut region))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(t.escapes_spaces(), "{what}");
        let want_pre = if gemma {
            PreTokenizer::Gemma4
        } else {
            PreTokenizer::SarvamMoe
        };
        assert_eq!(t.pre_tokenizer(), want_pre, "{what}");
        // "ab ab" -> ab ▁ ab: "▁ a" would merge, but "a b" on the same "a" ranks first.
        // "\n\n\n": Gemma 4 takes the token; merging gives "\n\n" + "\n".
        // "é": no token, so its bytes <0xC3> <0xA9>; "z": neither a token nor a byte token,
        // dropped; " a": "▁a" is merged but no token, and its bytes have no tokens.
        let newlines = if gemma {
            vec![id("\n\n\n")]
        } else {
            vec![id("\n\n"), id("\n")]
        };
        let want: Vec<u32> = [id("ab"), id("▁"), id("ab")]
            .into_iter()
            .chain(newlines)
            .chain([id("<0xC3>"), id("<0xA9>")])
            .collect();
        let got = encode(&t, "ab ab\n\n\néz a".as_bytes(), false, false);
        assert_eq!(got, want, "{what}");
        // Gemma 4 always adds BOS (llama.cpp overrides add_bos_token = false for it).
        let got = encode(&t, b"a", true, false);
        assert_eq!(got.first() == Some(&2), gemma, "{what}: {got:?}");
        // Decoding: ▁ is a space, byte tokens their byte; clean_spaces (not Sarvam's)
        // drops the space before '.'.
        let ids = [
            id("ab"),
            id("▁"),
            id("<0xC3>"),
            id("<0xA9>"),
            id("▁"),
            id("."),
        ];
        let mut buf = [0u8; 32];
        let k = t.detokenize(&ids, false, false, &mut buf);
        let want = if gemma { "ab é." } else { "ab é ." };
        assert_eq!(&buf[..k], want.as_bytes(), "{what}");
        assert_eq!(t.token_bytes(id("▁")), b" ", "{what}");
    }
    // A `gemma4` model has no default BOS: without the key, adding one is an error.
    let mut s = with("gemma4", None);
    s.bos = None;
    let t = Tokenizer::from_source(&s, &mut Arena::new(&mut region)).unwrap();
    assert_eq!(t.bos(), None);
    let mut scratch = vec![0u8; t.scratch_bytes(1)];
    assert!(matches!(
        t.encode("a", true, false, &mut scratch, &mut [0; 4]),
        Err(TokenizerError::MissingSpecialToken { which: "BOS" })
    ));
}

#[test]
fn tiny_spm_vocab_merges_by_score_and_falls_back_to_unk_without_byte_tokens() {
    // "ab" scores above "bc", so "abc" -> ab + c.
    let toks = gguf_strings(&["<unk>", "a", "b", "c", "ab", "bc", "▁"]);
    let mut scores = Vec::new();
    for s in [0.0f32, -1.0, -1.0, -1.0, -2.0, -3.0, -1.0] {
        scores.extend_from_slice(&s.to_le_bytes());
    }
    let mut s = source(&toks, 7, "llama");
    s.scores = Some(ArrayView {
        elem: ValueType::F32,
        len: 7,
        bytes: &scores,
    });
    s.add_space_prefix = Some(false);
    let mut region = vec![0u8; 1 << 20];
    let mut arena = Arena::new(&mut region);
    let t = Tokenizer::from_source(&s, &mut arena).unwrap();
    assert_eq!(encode(&t, b"abc", false, false), vec![4, 3]);
    assert_eq!(encode(&t, b"bca", false, false), vec![5, 1]);
    // 'z' has no token and there are no byte tokens: <unk>.
    assert_eq!(encode(&t, b"z a", false, false), vec![0, 6, 1]);
}

/// A unigram (t5) vocab without a charsmap: the best-scoring split wins over the greedy
/// one, characters no token covers become one `<unk>` per run, and the default special
/// ids and flags are llama.cpp's (EOS 1, UNK 2, no BOS, EOS added).
#[test]
fn unigram_picks_the_best_split_and_merges_unknown_runs() {
    let toks = gguf_strings(&["<pad>", "</s>", "<unk>", "▁ab", "▁a", "bc", "c", "▁", "x"]);
    let scores: Vec<u8> = [0.0f32, 0.0, 0.0, -1.0, -2.0, -2.0, -5.0, -3.0, -4.0]
        .iter()
        .flat_map(|s| s.to_le_bytes())
        .collect();
    let types: Vec<u8> = [3i32, 3, 2, 1, 1, 1, 1, 1, 1]
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    let mut s = source(&toks, 9, "t5");
    s.scores = Some(ArrayView {
        elem: ValueType::F32,
        len: 9,
        bytes: &scores,
    });
    s.types = Some(ArrayView {
        elem: ValueType::I32,
        len: 9,
        bytes: &types,
    });
    s.add_space_prefix = Some(true);
    let mut region = vec![0u8; 1 << 20];
    let t = Tokenizer::from_source(&s, &mut Arena::new(&mut region)).unwrap();
    assert_eq!(t.kind(), VocabKind::Ugm);
    assert_eq!((t.bos(), t.eos(), t.unk()), (None, Some(1), Some(2)));
    assert!(t.adds_eos() && !t.adds_bos());
    let enc = |text: &str, special: bool| {
        let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
        let mut out = vec![0u32; 64];
        let n = t
            .encode(text, special, false, &mut scratch, &mut out)
            .unwrap();
        out[..n].to_vec()
    };
    // "▁abc": ▁a + bc (-4) beats ▁ab + c (-6).
    assert_eq!(enc("abc", false), [4, 5]);
    // "▁x€€yx": the unknown run €, €, y is one <unk>.
    assert_eq!(enc("x€€yx", false), [7, 8, 2, 8]);
    assert_eq!(enc("abc", true), [4, 5, 1]);
    let mut out = [0u8; 16];
    let n = t.detokenize(&[4, 5], false, false, &mut out);
    assert_eq!(&out[..n], b"abc");
}

#[test]
fn unigram_charsmap_errors_name_the_key() {
    let toks = gguf_strings(&["<pad>", "</s>", "<unk>", "a"]);
    let mut region = vec![0u8; 1 << 20];
    // Too short for its size header, a size past the end, and a wrong element type.
    for (elem, bytes) in [
        (ValueType::U8, &[1u8, 0][..]),
        (ValueType::U8, &[8, 0, 0, 0, 1, 2, 3, 4][..]),
        (ValueType::I32, &[0, 0, 0, 0, 0, 0, 0, 0][..]),
    ] {
        let mut s = source(&toks, 4, "t5");
        s.charsmap = Some(ArrayView {
            elem,
            len: bytes.len() as u64,
            bytes,
        });
        let r = Tokenizer::from_source(&s, &mut Arena::new(&mut region));
        let want = match elem {
            ValueType::U8 => matches!(
                r,
                Err(TokenizerError::Malformed {
                    key: "tokenizer.ggml.precompiled_charsmap",
                    ..
                })
            ),
            _ => matches!(
                r,
                Err(TokenizerError::WrongType {
                    key: "tokenizer.ggml.precompiled_charsmap"
                })
            ),
        };
        assert!(want, "{:?}", r.err());
    }
    // An XCDA whose root points outside it: encoding reports the charsmap, no panic.
    let bad = [4u8, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, b'x', 0];
    let mut s = source(&toks, 4, "t5");
    s.charsmap = Some(ArrayView {
        elem: ValueType::U8,
        len: bad.len() as u64,
        bytes: &bad,
    });
    let t = Tokenizer::from_source(&s, &mut Arena::new(&mut region)).unwrap();
    let mut scratch = vec![0u8; t.scratch_bytes(3)];
    let r = t.encode("abc", false, false, &mut scratch, &mut [0u32; 16]);
    assert!(
        matches!(
            r,
            Err(TokenizerError::Malformed {
                key: "tokenizer.ggml.precompiled_charsmap",
                ..
            })
        ),
        "{r:?}"
    );
}
