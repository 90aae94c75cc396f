//! Shared helpers for the golden tests: load a GGUF into an in-memory platform, run the
//! forward pass, and compare logits with llama.cpp's reference files.
use std::path::{Path, PathBuf};

use pinch_kernels::CpuFeatures;
use pinch_runtime_min::arena::Arena;
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::model::{
    Config, KvType, Loader, Logits, Math, ModelError, Session, SessionOptions,
};
use pinch_runtime_min::platform::MemPlatform;

/// Directory of the repo's test data.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// The CPU features of the machine running the test (the fast path uses them).
pub fn host_cpu() -> CpuFeatures {
    let mut f = CpuFeatures::default();
    #[cfg(target_arch = "x86_64")]
    {
        f.avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
    }
    #[cfg(target_arch = "aarch64")]
    {
        f.neon = true;
        f.dotprod = std::arch::is_aarch64_feature_detected!("dotprod");
    }
    f
}

/// How a test wants the model run.
#[derive(Clone, Copy, Debug)]
pub struct RunSpec {
    pub math: Math,
    pub kv: KvType,
    /// Tokens per eval call (1 = one token at a time).
    pub batch: usize,
    pub threads: usize,
    /// Skip keys with weight < 1e-4 of the best (pinch's default; llama.cpp has no such skip).
    pub attn_skip: bool,
}

/// Logits for every position of `tokens` (rows of n_vocab).
pub fn run_logits(
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
) -> Result<(Config, Vec<Vec<f32>>), ModelError> {
    let g = Gguf::parse(gguf_bytes, gguf_bytes.len() as u64)
        .map_err(|_| ModelError::BadShape("gguf parse"))?;
    let cfg = Config::from_gguf(&g)?;
    let mut region = vec![0u64; (gguf_bytes.len() * 2 + (64 << 20)) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let mut arena = Arena::new(region);
    let plat = MemPlatform {
        bytes: gguf_bytes,
        cpu: host_cpu(),
    };
    let weights = {
        let mut loader = Loader {
            platform: &plat,
            file: &(),
            gguf: &g,
            arena: &mut arena,
        };
        loader.load(&cfg)?
    };
    let opts = SessionOptions {
        n_ctx: 256,
        n_batch: spec.batch.max(1),
        kv: spec.kv,
        math: spec.math,
        threads: spec.threads,
        head_group: 4,
        attn_skip: spec.attn_skip,
        cpu: plat.cpu,
    };
    let mut sess = Session::new(cfg, &weights, &mut arena, opts)?;
    let mut rows = vec![Vec::new(); tokens.len()];
    let mut start = 0;
    while start < tokens.len() {
        let end = (start + spec.batch.max(1)).min(tokens.len());
        sess.eval(&plat, &tokens[start..end], Logits::All, &mut |i, l| {
            rows[start + i] = l.to_vec()
        })?;
        start = end;
    }
    Ok((cfg, rows))
}

/// Read a raw little-endian f32 file as rows of `n`.
pub fn read_rows(path: &Path, n: usize) -> Vec<Vec<f32>> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Vec<f32> = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    v.chunks(n).map(|c| c.to_vec()).collect()
}

/// `key: v v v` lines of a `.meta` file.
pub struct Meta(pub Vec<(String, String)>);

impl Meta {
    pub fn load(path: &Path) -> Meta {
        let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Meta(
            s.lines()
                .filter_map(|l| {
                    l.split_once(": ")
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect(),
        )
    }
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(a, _)| a == k).map(|(_, b)| b.as_str())
    }
    pub fn u32s(&self, k: &str) -> Vec<u32> {
        self.get(k)
            .map(|v| v.split(' ').map(|x| x.parse().unwrap()).collect())
            .unwrap_or_default()
    }
    pub fn f32s(&self, k: &str) -> Vec<f32> {
        self.get(k)
            .map(|v| v.split(' ').map(|x| x.parse().unwrap()).collect())
            .unwrap_or_default()
    }
}

/// Index of the first maximum.
pub fn argmax(v: &[f32]) -> usize {
    let mut b = 0;
    for i in 1..v.len() {
        if v[i] > v[b] {
            b = i;
        }
    }
    b
}

/// Difference between the best and second-best value.
pub fn top1_margin(v: &[f32]) -> f32 {
    let a = argmax(v);
    let second = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != a)
        .map(|(_, x)| *x)
        .fold(f32::NEG_INFINITY, f32::max);
    v[a] - second
}

/// Largest absolute difference of two rows.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Path of the real Gemma 3 270M model, or `None` (after printing why) when the
/// caller set PINCH_SKIP_MODEL_TESTS=1. Without that variable a missing model fails the
/// test: `cargo xtask test` fetches it first.
pub fn gemma_model() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gemma-3-270m-q4_k_m.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("PINCH_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!(
            "SKIPPED: {} missing and PINCH_SKIP_MODEL_TESTS=1",
            p.display()
        );
        return None;
    }
    panic!(
        "{} is missing: run `cargo xtask fetch-model gemma3-270m`",
        p.display()
    );
}
