//! Where the tokenizer tests find llama.cpp's vocab files too large to copy into the repo.
use std::path::PathBuf;

/// llama.cpp's `models/` in the llama-cpp-python 0.3.36 sdist (gemma-4, nomic-bert-moe).
/// `cargo xtask test` downloads it into `$HOME/.cache/pinch/sdist` before the host tests;
/// `$PINCH_LLAMA_CPP_MODELS` points elsewhere.
pub fn models() -> PathBuf {
    std::env::var_os("PINCH_LLAMA_CPP_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/pinch/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/models")
        })
}
