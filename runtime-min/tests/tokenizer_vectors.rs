//! llama.cpp's tokenizer test vectors (tests/data/vocab, see its README) and the Gemma 3
//! 270M golden tokenization (tests/data/gemma3-270m/tokenization.json).
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_runtime_min::Arena;
use std::path::PathBuf;

mod sdist;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

/// Load a tokenizer; file bytes and arena are leaked so the tokenizer can be `'static`.
fn load(path: &std::path::Path) -> Tokenizer<'static> {
    let bytes: &'static [u8] =
        Vec::leak(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    let g = Gguf::parse(bytes, bytes.len() as u64).expect("gguf parses");
    let region: &'static mut [u8] = Vec::leak(vec![0u8; 96 << 20]);
    let mut arena = Arena::new(region);
    Tokenizer::from_gguf(&g, &mut arena).expect("tokenizer loads")
}

fn encode(t: &Tokenizer, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
    let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
    let mut out = vec![0u32; text.len() + 8];
    let n = t
        .encode(text, add_special, parse_special, &mut scratch, &mut out)
        .expect("encodes");
    out.truncate(n);
    out
}

const SEP: &str = "\n__ggml_vocab_test__\n";

fn split_inputs(raw: &str) -> Vec<&str> {
    let mut v = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].find(SEP) {
            Some(i) => {
                v.push(&raw[pos..pos + i]);
                pos += i + SEP.len();
            }
            None => {
                v.push(&raw[pos..]);
                break;
            }
        }
    }
    v
}

fn run_vocab(name: &str) {
    run_vocab_in(&data_dir().join("vocab"), name);
}

fn run_vocab_in(dir: &std::path::Path, name: &str) {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let t = load(&base);
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let outp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let inputs = split_inputs(&inp);
    let expected: Vec<Vec<u32>> = outp
        .lines()
        .map(|l| {
            let l = l.trim();
            if l.is_empty() {
                vec![]
            } else {
                l.split(' ').map(|x| x.parse().unwrap()).collect()
            }
        })
        .collect();
    assert_eq!(inputs.len(), expected.len(), "{name}: input/output count");
    let mut failures = Vec::new();
    for (text, want) in inputs.iter().zip(&expected) {
        let got = encode(&t, text, false, false);
        if &got != want {
            failures.push(format!("{text:?}\n   want {want:?}\n   got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} vectors differ:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_spm_vectors_match_llama_cpp() {
    run_vocab("llama-spm");
}

#[test]
fn phi3_vectors_match_llama_cpp() {
    run_vocab("phi-3");
}

#[test]
fn llama3_bpe_vectors_match_llama_cpp() {
    run_vocab("llama-bpe");
}

#[test]
fn qwen2_vectors_match_llama_cpp() {
    run_vocab("qwen2");
}

#[test]
fn qwen35_vectors_match_llama_cpp() {
    run_vocab("qwen35");
}

#[test]
fn gpt2_vectors_match_llama_cpp() {
    run_vocab("gpt-2");
}

#[test]
fn deepseek_coder_vectors_match_llama_cpp() {
    run_vocab("deepseek-coder");
}

#[test]
fn deepseek_llm_vectors_match_llama_cpp() {
    run_vocab("deepseek-llm");
}

#[test]
fn falcon_vectors_match_llama_cpp() {
    run_vocab("falcon");
}

#[test]
fn mpt_vectors_match_llama_cpp() {
    run_vocab("mpt");
}

#[test]
fn starcoder_vectors_match_llama_cpp() {
    run_vocab("starcoder");
}

#[test]
fn refact_vectors_match_llama_cpp() {
    run_vocab("refact");
}

/// Gemma 4 (`tokenizer.ggml.model = gemma4`, 262,144 tokens, 514,906 merges, 16 MB: read
/// from the sdist): SentencePiece-style BPE, spaces as `▁`, merges over UTF-8 characters,
/// `<0xXX>` byte fallback, newline runs as whole tokens.
#[test]
fn gemma4_vectors_match_llama_cpp() {
    let dir = sdist::models();
    assert!(
        dir.join("ggml-vocab-gemma-4.gguf").is_file(),
        "{}: no ggml-vocab-gemma-4.gguf (llama.cpp's models/ from the llama-cpp-python \
         sdist; `cargo xtask test` downloads it)",
        dir.display()
    );
    run_vocab_in(&dir, "gemma-4");
}

/// Gemma 4's 262,144 tokens and 514,906 merges load into a bounded arena (the tables of
/// the byte-level path, no per-character index) and whole lines merge fast: its
/// pre-tokenizer cuts only at newlines, so a line without one is a single word.
#[test]
fn gemma4_tables_stay_small_and_long_lines_merge_fast() {
    let path = sdist::models().join("ggml-vocab-gemma-4.gguf");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let g = Gguf::parse(&bytes, bytes.len() as u64).expect("gguf parses");
    let mut region = vec![0u8; 96 << 20];
    let mut arena = Arena::new(&mut region);
    let t0 = std::time::Instant::now();
    let t = Tokenizer::from_gguf(&g, &mut arena).expect("tokenizer loads");
    let load = t0.elapsed();
    let used = arena.used();
    eprintln!(
        "gemma-4: {} tokens, {:.1} MB of tables, loaded in {:.0} ms",
        t.n_vocab(),
        used as f64 / 1e6,
        load.as_secs_f64() * 1e3
    );
    // As the repo's vocabs: ~64 bytes a token plus 40 a merge at most.
    assert!(used < 64 * t.n_vocab() as usize + 40 * 514_906, "{used}");
    let wiki = std::fs::read_to_string(data_dir().join("eval/wiki-excerpt.txt"))
        .expect("wiki-excerpt.txt");
    let mut seed = 7u64;
    let mixed: String = (0..42_000)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (b'a' + (seed >> 33) as u8 % 27) as char
        })
        .map(|c| if c == '{' { ' ' } else { c })
        .collect();
    for (what, text) in [
        ("wiki-excerpt", wiki.clone()),
        ("wiki-excerpt on one line", wiki.replace('\n', " ")),
        ("a*", "a".repeat(42_000)),
        ("spaces", " ".repeat(42_000)),
        ("newlines", "\n".repeat(42_000)),
        ("random letters and spaces", mixed),
    ] {
        let t0 = std::time::Instant::now();
        let n = encode(&t, &text, true, false).len();
        let dt = t0.elapsed();
        eprintln!(
            "gemma-4 {what}: {} bytes -> {n} tokens in {:.1} ms",
            text.len(),
            dt.as_secs_f64() * 1e3
        );
        assert!(
            n > 1 && dt.as_secs_f64() < 1.0,
            "{what}: {n} tokens, {dt:?}"
        );
    }
}

/// Every `ggml-vocab-*.gguf` with `.inp`/`.out` vectors in `$PINCH_VOCAB_DIR` (llama.cpp's
/// `models/` folder, e.g. in the llama-cpp-python sdist): also the ones too large to keep
/// in the repo (command-r 11 MB, gemma-4 16 MB) and the generation vocabs pinch does not
/// tokenize are listed. `cargo xtask tokenizer-diff` runs it; without the variable it fails.
#[test]
#[ignore = "needs PINCH_VOCAB_DIR (llama.cpp's models/); cargo xtask tokenizer-diff sets it"]
fn every_llama_cpp_vocab_with_vectors() {
    let dir = PathBuf::from(std::env::var("PINCH_VOCAB_DIR").expect("PINCH_VOCAB_DIR is not set"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            let n = n.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf.inp")?;
            Some(n.to_string())
        })
        .collect();
    names.sort();
    let mut passed = Vec::new();
    let mut unsupported = Vec::new();
    for name in &names {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let bytes: &'static [u8] = Vec::leak(std::fs::read(&path).unwrap());
        let g = Gguf::parse(bytes, bytes.len() as u64).expect("gguf parses");
        let region: &'static mut [u8] = Vec::leak(vec![0u8; 96 << 20]);
        match Tokenizer::from_gguf(&g, &mut Arena::new(region)) {
            Err(e @ pinch_runtime_min::tokenizer::TokenizerError::UnsupportedModel { .. })
            | Err(
                e @ pinch_runtime_min::tokenizer::TokenizerError::UnsupportedPreTokenizer { .. },
            ) => {
                unsupported.push(format!("{name} ({e})"));
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
            Ok(_) => {}
        }
        run_vocab_in(&dir, name);
        passed.push(name.clone());
    }
    println!(
        "vectors passed: {} files: {}",
        passed.len(),
        passed.join(", ")
    );
    println!("not tokenized by pinch: {}", unsupported.join("; "));
    assert!(
        passed.len() >= 14,
        "only {} vocab files passed",
        passed.len()
    );
}
