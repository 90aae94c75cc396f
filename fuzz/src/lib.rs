//! Shared set-up of the fuzz targets: the vocabularies and the tiny model they run
//! against, loaded once per process from `tests/data` (the fuzzer calls a target
//! millions of times; loading a 7 MB vocab each time would be all it measured).
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::tokenizer::Tokenizer;
use pinch_runtime_min::Arena;
use std::path::PathBuf;
use std::sync::OnceLock;

/// `tests/data/<rel>` of the repository this crate sits in.
pub fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(rel)
}

/// The file's bytes for the life of the process.
pub fn leak_file(rel: &str) -> &'static [u8] {
    let path = data(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Vec::leak(bytes)
}

/// A parsed GGUF file for the life of the process.
pub fn leak_gguf(rel: &str) -> Gguf<'static> {
    let bytes = leak_file(rel);
    Gguf::parse(bytes, bytes.len() as u64).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// One vocabulary of every kind pinch supports: SentencePiece (llama, phi-3, the tiny
/// fixtures' 300-token vocab) and byte-level BPE with each pre-tokenizer the vocab
/// files use (gpt-2, llama-bpe, qwen2, qwen35).
pub const VOCABS: [&str; 7] = [
    "vocab/ggml-vocab-llama-spm.gguf",
    "vocab/ggml-vocab-phi-3.gguf",
    "tiny/tiny-llama-F32.gguf",
    "vocab/ggml-vocab-gpt-2.gguf",
    "vocab/ggml-vocab-llama-bpe.gguf",
    "vocab/ggml-vocab-qwen2.gguf",
    "vocab/ggml-vocab-qwen35.gguf",
];

/// The tokenizers of [`VOCABS`], in that order.
///
/// The parsed files live in a static of their own: a tokenizer borrows the file's
/// bytes but not its `Gguf`, so a `Box::leak`ed `Gguf` was unreachable once the
/// tokenizer was built, and LeakSanitizer (which `cargo xtask fuzz` links) reported it
/// at exit.
pub fn tokenizers() -> &'static [Tokenizer<'static>] {
    static FILES: OnceLock<Vec<Gguf<'static>>> = OnceLock::new();
    static TOKS: OnceLock<Vec<Tokenizer<'static>>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let files = FILES.get_or_init(|| VOCABS.iter().map(|rel| leak_gguf(rel)).collect());
        VOCABS
            .iter()
            .zip(files)
            .map(|(rel, g)| {
                let region: &'static mut [u8] = Vec::leak(vec![0u8; 64 << 20]);
                let mut arena = Arena::new(region);
                Tokenizer::from_gguf(g, &mut arena).unwrap_or_else(|e| panic!("{rel}: {e}"))
            })
            .collect()
    })
}

/// A `core::fmt::Write` that keeps at most `cap` bytes and fails (as a full buffer
/// does) on a write that would pass it.
pub struct Bounded {
    pub text: String,
    pub cap: usize,
}

impl core::fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        if self.text.len() + s.len() > self.cap {
            return Err(core::fmt::Error);
        }
        self.text.push_str(s);
        Ok(())
    }
}
