//! llama.cpp's tokenizer test vectors (tests/data/vocab, see its README) and the Gemma 3
//! 270M golden tokenization (tests/data/gemma3-270m/tokenization.json).
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_runtime_min::Arena;
use std::path::PathBuf;

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
    let dir = data_dir().join("vocab");
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
