//! Differential test against llama.cpp's tokenizer: the vectors in
//! `tests/data/vocab/diff/` (made by `tools/tokenizer_diff_cases.py` with
//! llama-cpp-python 0.3.36 = llama.cpp 0c1e570; format in that folder's README) are
//! replayed through pinch's tokenizer for every vocab file in `tests/data/vocab/`, for two
//! read from llama.cpp's `models/` in the sdist (nomic-bert-moe, gemma-4), and for copies
//! of the Llama 3 and Gemma 4 vocabs set to the pre-tokenizers no file uses. Encoding
//! (with and without special tokens), detokenizing in both of llama.cpp's modes, and every
//! token of each vocab detokenized must agree exactly. No Python needed.
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_runtime_min::Arena;
use std::collections::BTreeMap;
use std::path::PathBuf;

mod sdist;

fn vocab_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/vocab")
}

/// The vectors: `tests/data/vocab/diff/`, or `$PINCH_TOKENIZER_DIFF_DIR` (what
/// `cargo xtask tokenizer-diff --random N` writes: more random strings than CI's).
fn diff_dir() -> PathBuf {
    std::env::var_os("PINCH_TOKENIZER_DIFF_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| vocab_dir().join("diff"))
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn ids(s: &str) -> Vec<u32> {
    s.split(' ')
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().unwrap())
        .collect()
}

/// 64-bit FNV-1a, as the generator writes long detokenized texts.
fn fnv(b: &[u8]) -> String {
    let h = b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!("{h:016x}")
}

/// A copy of the vocab-only GGUF `base` with `tokenizer.ggml.pre` set to `name`.
fn with_pre(base: &[u8], name: &str) -> Vec<u8> {
    let key = b"tokenizer.ggml.pre";
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(key);
    let at = base
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("base has tokenizer.ggml.pre");
    let p = at + needle.len();
    assert_eq!(
        base[p..p + 4],
        8u32.to_le_bytes(),
        "tokenizer.ggml.pre is a string"
    );
    let n = u64::from_le_bytes(base[p + 4..p + 12].try_into().unwrap()) as usize;
    let mut out = base[..p + 4].to_vec();
    out.extend_from_slice(&(name.len() as u64).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&base[p + 12 + n..]);
    out
}

/// A copy of the vocab-only GGUF `base`, which has no `tokenizer.ggml.pre`, with
/// `tokenizer.ggml.model` set to `gpt2` and `tokenizer.ggml.pre = name` added (as the
/// generator's `gpt2_with_pre`): Gemma 4's vocab under the SentencePiece-style
/// pre-tokenizers no vocab file uses.
fn gpt2_with_pre(base: &[u8], name: &str) -> Vec<u8> {
    let string_key = |k: &[u8]| [&(k.len() as u64).to_le_bytes()[..], k].concat();
    let pre = b"tokenizer.ggml.pre";
    assert!(
        !base.windows(8 + pre.len()).any(|w| w == string_key(pre)),
        "base has tokenizer.ggml.pre"
    );
    let needle = string_key(b"tokenizer.ggml.model");
    let at = base
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("base has tokenizer.ggml.model");
    let p = at + needle.len();
    assert_eq!(base[p..p + 4], 8u32.to_le_bytes(), "the model is a string");
    let n = u64::from_le_bytes(base[p + 4..p + 12].try_into().unwrap()) as usize;
    let n_kv = u64::from_le_bytes(base[16..24].try_into().unwrap());
    let mut out = base[..16].to_vec();
    out.extend_from_slice(&(n_kv + 1).to_le_bytes());
    out.extend_from_slice(&base[24..p + 4]);
    out.extend_from_slice(&string_key(b"gpt2"));
    out.extend_from_slice(&string_key(pre));
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&string_key(name.as_bytes()));
    out.extend_from_slice(&base[p + 12 + n..]);
    out
}

#[derive(Default)]
struct Tally {
    enc: (usize, usize),
    dec: (usize, usize),
    whole: (usize, usize),
    raised: usize,
    failures: Vec<String>,
}

impl Tally {
    fn check(&mut self, which: fn(&mut Tally) -> &mut (usize, usize), ok: bool, what: String) {
        let c = which(self);
        c.1 += 1;
        if ok {
            c.0 += 1;
        } else if self.failures.len() < 6 {
            self.failures.push(what);
        }
    }
}

fn encode(t: &Tokenizer, data: &[u8], special: bool) -> Vec<u32> {
    let mut scratch = vec![0u8; t.scratch_bytes(data.len())];
    let mut out = vec![0u32; 2 * data.len() + 16];
    let n = t
        .encode_bytes(data, special, special, &mut scratch, &mut out)
        .expect("encodes");
    out.truncate(n);
    out
}

fn detokenize(t: &Tokenizer, list: &[u32], mode: bool) -> Vec<u8> {
    let mut buf = vec![0u8; t.detokenize(list, mode, mode, &mut [])];
    let n = t.detokenize(list, mode, mode, &mut buf);
    buf.truncate(n);
    buf
}

/// Replays one vocab's file; `base_ids` are the Llama 3 file's ids00 (for `=` fields).
fn replay(
    gguf: &[u8],
    file: &str,
    shared: &[Vec<u8>],
    base_ids: &BTreeMap<usize, Vec<u32>>,
) -> (Tally, BTreeMap<usize, Vec<u32>>) {
    let g = Gguf::parse(gguf, gguf.len() as u64).expect("gguf parses");
    let mut region = vec![0u8; 96 << 20];
    let t = Tokenizer::from_gguf(&g, &mut Arena::new(&mut region))
        .unwrap_or_else(|e| panic!("{file}: pinch does not load the vocab: {e}"));
    let text = std::fs::read_to_string(diff_dir().join(file)).unwrap();
    let mut strings = shared.to_vec();
    let mut tally = Tally::default();
    let mut own_ids = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f[0] {
            "base" | "file" | "sdist" | "sdist-gpt2" => {}
            "s" => strings.push(hex(f[1])),
            "x" => tally.raised += 1,
            "e" => {
                let i: usize = f[1].parse().unwrap();
                let data = &strings[i];
                let shown = String::from_utf8_lossy(data);
                let want_a = match f[2] {
                    "=" => base_ids[&i].clone(),
                    s => ids(s),
                };
                let want_b = match f[3] {
                    "=" => want_a.clone(),
                    "B=" => [t.bos().expect("BOS")]
                        .into_iter()
                        .chain(want_a.clone())
                        .collect(),
                    s => ids(s),
                };
                let a = encode(&t, data, false);
                let b = encode(&t, data, true);
                tally.check(|t| &mut t.enc, a == want_a, format!(
                    "encode(0, 0) of string {i} {shown:?}\n    llama.cpp {want_a:?}\n    pinch     {a:?}"
                ));
                tally.check(|t| &mut t.enc, b == want_b, format!(
                    "encode(1, 1) of string {i} {shown:?}\n    llama.cpp {want_b:?}\n    pinch     {b:?}"
                ));
                for (k, (list, mode)) in [(&want_a, false), (&want_b, false), (&want_b, true)]
                    .into_iter()
                    .enumerate()
                {
                    let got = detokenize(&t, list, mode);
                    let want = f[4 + k];
                    let ok = if want == "=" {
                        got == *data
                    } else {
                        fnv(&got) == want
                    };
                    tally.check(|t| &mut t.dec, ok, format!(
                        "detokenize({mode}, {mode}) of string {i}'s ids {list:?}\n    llama.cpp {}\n    pinch     {:?}",
                        if want == "=" { format!("{shown:?}") } else { format!("FNV {want}") },
                        String::from_utf8_lossy(&got)
                    ));
                }
                own_ids.insert(i, want_a);
            }
            "v" => {
                let (first, end): (u32, u32) = (f[1].parse().unwrap(), f[2].parse().unwrap());
                let list: Vec<u32> = (first..end).collect();
                for (k, mode) in [false, true].into_iter().enumerate() {
                    let got = fnv(&detokenize(&t, &list, mode));
                    tally.check(|t| &mut t.whole, got == f[3 + k], format!(
                        "detokenize({mode}, {mode}) of tokens {first}..{end}: FNV {got}, llama.cpp {}",
                        f[3 + k]
                    ));
                }
            }
            other => panic!("{file}: unknown line kind {other:?}"),
        }
    }
    (tally, own_ids)
}

#[test]
fn pinch_tokenizes_and_detokenizes_as_llama_cpp() {
    let dir = vocab_dir();
    let shared: Vec<Vec<u8>> = std::fs::read_to_string(diff_dir().join("strings.txt"))
        .unwrap()
        .lines()
        .map(hex)
        .collect();
    assert!(
        shared.len() > 200,
        "strings.txt has {} strings",
        shared.len()
    );
    let mut files: Vec<String> = std::fs::read_dir(diff_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tsv"))
        .collect();
    // The vocab files first: the pre-tokenizer copies refer to the Llama 3 file's ids.
    files.sort_by_key(|n| (n.starts_with("pre-"), n.clone()));
    // Every vocab file in the repo has vectors.
    for e in std::fs::read_dir(&dir).unwrap() {
        let n = e.unwrap().file_name().into_string().unwrap();
        if let Some(stem) = n.strip_suffix(".gguf") {
            assert!(
                files.contains(&format!("{stem}.tsv")),
                "{n} has no vectors in diff/"
            );
        }
    }
    let mut base_ids = BTreeMap::new();
    let mut bad = Vec::new();
    let (mut n_enc, mut n_dec, mut n_whole) = (0, 0, 0);
    for file in &files {
        let first = std::fs::read_to_string(diff_dir().join(file)).unwrap();
        let gguf = match first
            .lines()
            .next()
            .map(|l| l.split('\t').collect::<Vec<_>>())
        {
            Some(h) if h[0] == "base" => with_pre(&std::fs::read(dir.join(h[1])).unwrap(), h[2]),
            Some(h) if h[0] == "file" => std::fs::read(h[1]).unwrap(),
            Some(h) if h[0] == "sdist" || h[0] == "sdist-gpt2" => {
                let p = sdist::models().join(h[1]);
                let bytes = std::fs::read(&p).unwrap_or_else(|e| {
                    panic!(
                        "{}: {e} (llama.cpp's vocab file; `cargo xtask test` downloads \
                         the sdist holding it)",
                        p.display()
                    )
                });
                match h[0] {
                    "sdist" => bytes,
                    _ => gpt2_with_pre(&bytes, h[2]),
                }
            }
            _ => std::fs::read(dir.join(file.replace(".tsv", ".gguf"))).unwrap(),
        };
        let (t, own) = replay(&gguf, file, &shared, &base_ids);
        if file == "ggml-vocab-llama-bpe.tsv" {
            base_ids = own;
        }
        println!(
            "{file}: encode {}/{}, detokenize {}/{}, whole vocab {}/{} runs{}",
            t.enc.0,
            t.enc.1,
            t.dec.0,
            t.dec.1,
            t.whole.0,
            t.whole.1,
            if t.raised > 0 {
                format!(" ({} strings llama.cpp raised on, not compared)", t.raised)
            } else {
                String::new()
            }
        );
        for f in &t.failures {
            println!("  {f}");
        }
        if !t.failures.is_empty() {
            bad.push(file.clone());
        }
        n_enc += t.enc.1;
        n_dec += t.dec.1;
        n_whole += t.whole.1;
    }
    println!(
        "{} files: {n_enc} encodings, {n_dec} detokenizations, {n_whole} whole-vocab runs",
        files.len()
    );
    assert!(files.len() >= 40 && n_enc > 15_000 && n_whole > 700);
    assert!(bad.is_empty(), "differ from llama.cpp: {bad:?} (see above)");
}

#[test]
fn gpt2_copy_of_gemma4_sets_model_and_adds_pre() {
    let p = sdist::models().join("ggml-vocab-gemma-4.gguf");
    let base = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let copy = gpt2_with_pre(&base, "sarvam-moe");
    let g = Gguf::parse(&copy, copy.len() as u64).expect("the copy parses");
    assert_eq!(g.get_str("tokenizer.ggml.model"), Some("gpt2"));
    assert_eq!(g.get_str("tokenizer.ggml.pre"), Some("sarvam-moe"));
    let b = Gguf::parse(&base, base.len() as u64).unwrap();
    assert_eq!(b.get_str("tokenizer.ggml.pre"), None);
    assert_eq!(
        g.get_u32("tokenizer.ggml.bos_token_id"),
        b.get_u32("tokenizer.ggml.bos_token_id")
    );
}

#[test]
fn pre_tokenizer_copy_changes_only_the_name() {
    let base = std::fs::read(vocab_dir().join("ggml-vocab-llama-bpe.gguf")).unwrap();
    let copy = with_pre(&base, "smollm");
    let g = Gguf::parse(&copy, copy.len() as u64).expect("the copy parses");
    assert_eq!(g.get_str("tokenizer.ggml.pre"), Some("smollm"));
    assert_eq!(copy.len(), base.len() - "llama-bpe".len() + "smollm".len());
}

/// A 4-byte UTF-8 form past U+10FFFF makes llama.cpp 0c1e570 abort the process
/// (`std::invalid_argument: invalid codepoint` thrown through `llama_tokenize`), so the
/// generator cannot ask it; pinch reads the four bytes as one U+FFFD (BPE) and encodes.
#[test]
fn code_points_past_u10ffff_encode_where_llama_cpp_aborts() {
    for name in ["gpt-2", "llama-bpe", "llama-spm"] {
        let bytes = std::fs::read(vocab_dir().join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
        let mut region = vec![0u8; 96 << 20];
        let t = Tokenizer::from_gguf(&g, &mut Arena::new(&mut region)).unwrap();
        for bad in [&b"\xf4\x90\x80\x80"[..], b"\xf7\xbf\xbf\xbf"] {
            let text = [&b"ab"[..], bad, b"cd"].concat();
            let got = encode(&t, &text, false);
            assert!(!got.is_empty(), "{name}");
            if name != "llama-spm" {
                assert_eq!(got, encode(&t, "ab\u{FFFD}cd".as_bytes(), false), "{name}");
            }
        }
    }
}

/// The unigram scratch bound holds where normalization grows text most: XLM-R's
/// charsmap turns U+FDFA (3 bytes) into 33, and spaces around it become `▁`.
#[test]
fn unigram_scratch_bound_holds_for_the_longest_replacement() {
    let p = sdist::models().join("ggml-vocab-nomic-bert-moe.gguf");
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let g = Gguf::parse(&bytes, bytes.len() as u64).unwrap();
    let mut region = vec![0u8; 96 << 20];
    let t = Tokenizer::from_gguf(&g, &mut Arena::new(&mut region)).unwrap();
    for text in [
        "\u{FDFA}".repeat(300),
        "\u{FDFA} ".repeat(200),
        " \u{FDFA}".repeat(200),
        "\u{FDFA}a\u{FDFA} \u{3000}\u{FDFA}".repeat(50),
    ] {
        let ids = encode(&t, text.as_bytes(), true);
        eprintln!("{} bytes -> {} tokens", text.len(), ids.len());
        assert!(ids.len() > text.len() / 3, "{}", ids.len());
    }
}
