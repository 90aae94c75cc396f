//! Inputs the fuzz targets (`fuzz/`, `cargo xtask fuzz`) found, each kept as a test of
//! the behaviour the parser must have on it.
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_runtime_min::Arena;
use std::path::PathBuf;

fn load(rel: &str) -> Tokenizer<'static> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(rel);
    let bytes: &'static [u8] = Vec::leak(std::fs::read(&path).unwrap());
    let g = Box::leak(Box::new(Gguf::parse(bytes, bytes.len() as u64).unwrap()));
    let mut arena = Arena::new(Vec::leak(vec![0u8; 32 << 20]));
    Tokenizer::from_gguf(g, &mut arena).unwrap()
}

fn encode(
    t: &Tokenizer,
    text: &[u8],
) -> Result<Vec<u32>, pinch_runtime_min::tokenizer::TokenizerError> {
    let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
    let mut out = vec![0u32; 4 * text.len() + 8];
    let n = t.encode_bytes(text, false, false, &mut scratch, &mut out)?;
    out.truncate(n);
    Ok(out)
}

/// fuzz/tokenizer crash-44d4d335: an invalid UTF-8 lead byte before a space takes the
/// first byte of the space's `▁` into its character, so the other two bytes become
/// characters of their own: more SentencePiece symbols than input bytes (3 for each
/// such pair). `encode` refused the text with `ScratchTooSmall { needed: 0, given: 0 }`
/// although the caller gave `scratch_bytes()`; the symbol table now holds 1.5 symbols a
/// byte. The text is the worst case (every byte in such a pair), at several lengths, and
/// each piece falls back to its byte tokens (one id per escaped byte).
#[test]
fn spm_encodes_invalid_lead_bytes_before_spaces() {
    let t = load("vocab/ggml-vocab-llama-spm.gguf");
    for pairs in [1, 2, 8, 100] {
        let text = b"\xc1 ".repeat(pairs);
        let ids = encode(&t, &text).expect("scratch_bytes() is enough for any text");
        assert!(
            ids.len() >= 2 * pairs,
            "{pairs} pairs gave {} ids",
            ids.len()
        );
    }
    // Odd length, and a lone lead byte at the end.
    let ids = encode(&t, b"a\xc1 \xc1 \xc1").expect("scratch_bytes() is enough");
    assert!(!ids.is_empty());
}
