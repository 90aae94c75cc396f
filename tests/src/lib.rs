//! Shared helpers for the golden tests: load a GGUF into an in-memory platform, run the
//! forward pass, and compare logits with llama.cpp's reference files.
pub mod memfs;
pub mod tiny;

use std::path::{Path, PathBuf};

use pinch_kernels::CpuFeatures;
use pinch_runtime_min::arena::Arena;
use pinch_runtime_min::gguf::Gguf;
use pinch_runtime_min::model::stream::StreamStats;
use pinch_runtime_min::model::{
    Config, KvType, Loader, Logits, Math, ModelError, Session, SessionOptions,
};
use pinch_runtime_min::platform::{MemPlatform, Platform};
use pinch_runtime_min::repack_cache::{self, Repack, Repacking};
use pinch_runtime_min::residency::{self, ResidencyPlan};

/// Directory of the repo's test data.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// The CPU features of the machine running the test (the fast path uses them).
pub fn host_cpu() -> CpuFeatures {
    CpuFeatures::detect()
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
    run_logits_streamed(gguf_bytes, tokens, spec, None).map(|(c, rows, _)| (c, rows))
}

/// What [`run_logits_streamed`] returns: config, logits rows, plan and stream stats.
pub type StreamedRun = (Config, Vec<Vec<f32>>, (ResidencyPlan, StreamStats));

/// [`run_logits`] with the weights planned into `weight_budget` bytes (what does not fit
/// is streamed from the in-memory "file"; `threaded`: by a reader thread, else by the
/// compute thread); also returns the plan and what streaming read.
pub fn run_logits_streamed(
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
    weight_budget: Option<u64>,
) -> Result<StreamedRun, ModelError> {
    let plat = MemPlatform {
        bytes: gguf_bytes,
        cpu: host_cpu(),
    };
    run_on(&plat, gguf_bytes, tokens, spec, weight_budget, false).map(|(r, _)| r)
}

/// [`run_logits`] with sliding-window layers keeping a KV row for every position
/// (`--swa-full`) instead of a ring of their window.
pub fn run_logits_swa_full(
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let plat = MemPlatform {
        bytes: gguf_bytes,
        cpu: host_cpu(),
    };
    let full = Options {
        swa_ring: false,
        ..Options::default()
    };
    run_with(&plat, gguf_bytes, tokens, spec, full).map(|((_, rows, _), _)| rows)
}

/// [`run_logits`] with the matrices repacked at load as `pinch run` does
/// (`Layout::preferred` for this CPU); also returns how many tensors were repacked.
pub fn run_logits_repacked(
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
) -> Result<(Vec<Vec<f32>>, usize), ModelError> {
    run_repacked(gguf_bytes, tokens, spec, Repack::Exact)
}

/// [`run_logits_repacked`] with `--lut8` (Q1_0 / Q2_0 through 8-bit tables where this
/// CPU has the kernels).
pub fn run_logits_lut8(
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
) -> Result<(Vec<Vec<f32>>, usize), ModelError> {
    run_repacked(gguf_bytes, tokens, spec, Repack::Lut8)
}

fn run_repacked(
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
    repack: Repack,
) -> Result<(Vec<Vec<f32>>, usize), ModelError> {
    let plat = MemPlatform {
        bytes: gguf_bytes,
        cpu: host_cpu(),
    };
    let o = Options {
        repack,
        ..Options::default()
    };
    run_with(&plat, gguf_bytes, tokens, spec, o).map(|((_, rows, _), n)| (rows, n))
}

/// [`run_logits_streamed`] with a reader thread.
pub fn run_logits_threaded(
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
    weight_budget: Option<u64>,
) -> Result<StreamedRun, ModelError> {
    let plat = ThreadedMem::over(gguf_bytes, 1);
    run_on(&plat, gguf_bytes, tokens, spec, weight_budget, false).map(|(r, _)| r)
}

/// [`run_logits`] with the work split as for `workers` threads ([`ThreadedMem`]).
pub fn run_logits_workers(
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
    workers: usize,
) -> Result<(Config, Vec<Vec<f32>>), ModelError> {
    let plat = ThreadedMem::over(gguf_bytes, workers);
    run_on(&plat, gguf_bytes, tokens, spec, None, false).map(|((c, rows, _), _)| (c, rows))
}

/// How [`run_with`] loads and runs beyond the [`RunSpec`].
#[derive(Clone, Copy)]
struct Options {
    weight_budget: Option<u64>,
    repack: Repack,
    swa_ring: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            weight_budget: None,
            repack: Repack::Off,
            swa_ring: true,
        }
    }
}

/// The run behind the helpers above, with the weights read through the repacking
/// platform when `repack` (and the number of tensors it repacked).
fn run_on<P: Platform<File = ()>>(
    plat: &P,
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
    weight_budget: Option<u64>,
    repack: bool,
) -> Result<(StreamedRun, usize), ModelError> {
    let o = Options {
        weight_budget,
        repack: repack.into(),
        ..Options::default()
    };
    run_with(plat, gguf_bytes, tokens, spec, o)
}

fn run_with<P: Platform<File = ()>>(
    plat: &P,
    gguf_bytes: &[u8],
    tokens: &[u32],
    spec: RunSpec,
    o: Options,
) -> Result<(StreamedRun, usize), ModelError> {
    let Options {
        weight_budget,
        repack,
        swa_ring,
    } = o;
    let g = Gguf::parse(gguf_bytes, gguf_bytes.len() as u64)
        .map_err(|_| ModelError::BadShape("gguf parse"))?;
    let cfg = Config::from_gguf(&g)?;
    let mut region = vec![0u64; (gguf_bytes.len() * 2 + (64 << 20)) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let mut arena = Arena::new(region);
    let rp = Repacking::new(plat, &(), &g, "model.gguf", None, repack, &mut arena)
        .map_err(|_| ModelError::BadShape("repack scratch"))?;
    let mut weights = {
        let mut loader = Loader {
            platform: &rp,
            file: &(),
            gguf: &g,
            arena: &mut arena,
        };
        let plan = residency::plan(&g, &cfg, weight_budget, None)
            .map_err(|_| ModelError::BadShape("no residency plan fits"))?;
        loader.load_planned(&cfg, None, &plan)?
    };
    let repacked = repack_cache::apply(&rp, &g, &mut weights, &mut arena)?.repacked;
    let opts = session_options(&spec, tokens.len(), swa_ring, plat.cpu());
    let read = |off: u64, buf: &mut [u8], d: bool| plat.read_at(&(), off, buf, d);
    let mut sess = Session::new(cfg, &weights, &mut arena, opts)?;
    sess.set_reader(&read);
    let mut rows = vec![Vec::new(); tokens.len()];
    let mut start = 0;
    while start < tokens.len() {
        let end = (start + spec.batch.max(1)).min(tokens.len());
        sess.eval(plat, &tokens[start..end], Logits::All, &mut |i, l| {
            rows[start + i] = l.to_vec()
        })?;
        start = end;
    }
    Ok(((cfg, rows, (weights.plan, sess.stream)), repacked))
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
    real_model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m")
}

/// Path of the real model `file` under `models/` (`cargo xtask fetch-model fetch_name`
/// puts it there), or `None` as for [`gemma_model`].
pub fn real_model(file: &str, fetch_name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(file);
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
        "{} is missing: run `cargo xtask fetch-model {fetch_name}`",
        p.display()
    );
}

/// One prompt of a golden file with llama.cpp's greedy continuation of it.
pub struct GreedyCase {
    /// What to name the prompt by in a failure.
    pub text: String,
    pub prompt: Vec<u32>,
    /// llama.cpp's greedy tokens after the prompt.
    pub greedy: Vec<u32>,
    /// llama.cpp's top-1 margin at each greedy step.
    pub margins: Vec<f32>,
}

/// A JSON array of token ids.
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The cases of a golden `prompts.json` (`{"prompts": [{"text", "token_ids", "f32kv":
/// {"greedy_ids", "greedy_top1_margins"}}]}`, written by the tools/ generators).
pub fn greedy_cases(golden: &serde_json::Value) -> Vec<GreedyCase> {
    let ids = json_ids;
    golden["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pr| GreedyCase {
            text: pr["text"].as_str().unwrap_or_default().to_string(),
            prompt: ids(&pr["token_ids"]),
            greedy: ids(&pr["f32kv"]["greedy_ids"]),
            margins: pr["f32kv"]["greedy_top1_margins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_f64().unwrap() as f32)
                .collect(),
        })
        .collect()
}

/// Teacher-forced greedy check: feed each prompt and llama.cpp's continuation in one
/// pass, and at every step whose llama.cpp margin is at least 0.5 compare pinch's
/// argmax with llama.cpp's token. Returns the steps checked and the mismatches.
pub fn teacher_forced_mismatches(
    gguf_bytes: &[u8],
    cases: &[GreedyCase],
    spec: RunSpec,
) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for c in cases {
        let p = c.prompt.len();
        let mut toks = c.prompt.clone();
        toks.extend_from_slice(&c.greedy[..c.greedy.len() - 1]);
        let (_, got) = run_logits(gguf_bytes, &toks, spec).unwrap();
        for k in 0..c.greedy.len() {
            if c.margins[k] >= 0.5 {
                checked += 1;
                if argmax(&got[p - 1 + k]) as u32 != c.greedy[k] {
                    failures.push(format!(
                        "{:?} step {k}: {} vs {}",
                        c.text,
                        argmax(&got[p - 1 + k]),
                        c.greedy[k]
                    ));
                }
            }
        }
    }
    (checked, failures)
}

/// A copy of the GGUF `src` with `n_layer` transformer blocks: block `il` is a copy of
/// the source's block `il % n_src` (renamed), everything else unchanged and
/// `{arch}.block_count` set to `n_layer`. The output is garbage text, but a
/// deterministic model as large as wanted, built from a real fixture's layouts.
pub fn scale_layers(src: &[u8], n_layer: usize) -> Vec<u8> {
    use pinch_runtime_min::gguf::{CountSink, GgufWriter, Sink, SliceSink, Value};
    let g = Gguf::parse(src, src.len() as u64).expect("source parses");
    let arch = g.get_str("general.architecture").expect("architecture");
    let bc_key = format!("{arch}.block_count");
    let n_src = g.get_u32(&bc_key).expect("block_count") as usize;
    let layer_of = |name: &str| -> Option<(usize, String)> {
        let rest = name.strip_prefix("blk.")?;
        let (n, tail) = rest.split_once('.')?;
        Some((n.parse().ok()?, tail.to_string()))
    };
    let others: Vec<_> = g.tensors().filter(|t| layer_of(t.name).is_none()).collect();
    let mut layered: Vec<(String, pinch_runtime_min::gguf::TensorInfo)> = Vec::new();
    for il in 0..n_layer {
        for t in g.tensors() {
            if let Some((n, tail)) = layer_of(t.name) {
                if n == il % n_src {
                    layered.push((format!("blk.{il}.{tail}"), t));
                }
            }
        }
    }
    let n_kv = g.keys().count() as u64;
    let n_tensors = (others.len() + layered.len()) as u64;
    #[allow(clippy::too_many_arguments)]
    fn emit<S: Sink>(
        sink: S,
        g: &Gguf,
        src: &[u8],
        bc_key: &str,
        n_layer: usize,
        others: &[pinch_runtime_min::gguf::TensorInfo],
        layered: &[(String, pinch_runtime_min::gguf::TensorInfo)],
        n_kv: u64,
        n_tensors: u64,
    ) -> S {
        let mut w = GgufWriter::new(sink, n_tensors, n_kv).ok().unwrap();
        for (k, v) in g.kv() {
            if k == bc_key {
                w.kv(k, Value::U32(n_layer as u32)).ok().unwrap();
            } else {
                w.kv(k, v).ok().unwrap();
            }
        }
        for t in others {
            w.copy_tensor_info(t).ok().unwrap();
        }
        for (name, t) in layered {
            w.tensor_info(name, t.ty, t.shape()).ok().unwrap();
        }
        let all = others.iter().chain(layered.iter().map(|(_, t)| t));
        for t in all {
            let data = &src[t.offset as usize..(t.offset + t.bytes) as usize];
            w.tensor_data(data).ok().unwrap();
        }
        w.finish().ok().unwrap()
    }
    let count = emit(
        CountSink { bytes: 0 },
        &g,
        src,
        &bc_key,
        n_layer,
        &others,
        &layered,
        n_kv,
        n_tensors,
    );
    let mut buf = vec![0u8; count.bytes as usize];
    let n = {
        let sink = emit(
            SliceSink::new(&mut buf),
            &g,
            src,
            &bc_key,
            n_layer,
            &others,
            &layered,
            n_kv,
            n_tensors,
        );
        sink.written().len()
    };
    buf.truncate(n);
    buf
}

/// [`MemPlatform`] with an I/O thread: `overlap` runs the reader on a scoped thread,
/// so the streaming engine's threaded path runs in tests too. It reports `.1` workers,
/// and its `parallel(n, f)` runs `f(0)`, `f(1)`, ... one after another: with more than
/// one, the engine splits its work as for that many threads (the row ranges of guided
/// scheduling, token and head parts), cheaply enough for qemu (a thread per call took
/// minutes there); concurrency itself is the `pinch-linux` pool's tests' job.
pub struct ThreadedMem<'b>(pub MemPlatform<'b>, pub usize);

impl<'b> ThreadedMem<'b> {
    /// The model bytes on the host's CPU features, reporting `workers` workers.
    pub fn over(bytes: &'b [u8], workers: usize) -> Self {
        ThreadedMem(
            MemPlatform {
                bytes,
                cpu: host_cpu(),
            },
            workers,
        )
    }
}

impl Platform for ThreadedMem<'_> {
    type File = ();
    fn open(&self, path: &str) -> Result<(), pinch_runtime_min::platform::PlatformError> {
        self.0.open(path)
    }
    fn file_size(&self, f: &()) -> u64 {
        self.0.file_size(f)
    }
    fn read_at(
        &self,
        f: &(),
        offset: u64,
        buf: &mut [u8],
        direct: bool,
    ) -> Result<usize, pinch_runtime_min::platform::PlatformError> {
        self.0.read_at(f, offset, buf, direct)
    }
    fn map<'f>(&self, _f: &'f (), _o: u64, _l: usize) -> Option<&'f [u8]> {
        None
    }
    fn region(
        &self,
        bytes: usize,
    ) -> Result<&'static mut [u8], pinch_runtime_min::platform::PlatformError> {
        self.0.region(bytes)
    }
    fn available_memory(&self) -> Option<u64> {
        None
    }
    fn rss(&self) -> Option<u64> {
        None
    }
    fn peak_rss(&self) -> Option<u64> {
        None
    }
    fn workers(&self) -> usize {
        self.1
    }
    fn parallel(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.0.parallel(n, f)
    }
    fn cpu(&self) -> CpuFeatures {
        self.0.cpu
    }
    fn now_ns(&self) -> u64 {
        0
    }
    fn stdout(&self, _b: &[u8]) {}
    fn stderr(&self, _b: &[u8]) {}
    fn io_thread(&self) -> bool {
        true
    }
    fn overlap(&self, io: &mut (dyn FnMut() + Send), work: &mut dyn FnMut()) {
        std::thread::scope(|s| {
            let h = s.spawn(io);
            work();
            h.join().expect("reader thread");
        });
    }
    fn yield_now(&self) {
        std::thread::yield_now();
    }
}

/// Run `f` with a session over `gguf_bytes` (all weights resident, plain layout, context
/// 256, batch `spec.batch`) and the in-memory platform it reads from.
pub fn with_session<R>(
    gguf_bytes: &[u8],
    spec: RunSpec,
    f: impl FnOnce(&mut Session<'_, '_>, &MemPlatform<'_>) -> R,
) -> Result<R, ModelError> {
    with_session_budget(gguf_bytes, spec, None, false, |s, p, _| f(s, p))
}

/// [`with_session`] with the weights planned into `weight_budget` bytes (MoE models: the
/// expert pager's pools); `f` also gets the arena's accounts after the session was made.
/// `repack`: the resident weights repacked into this CPU's layouts as `pinch run` loads
/// them, and the paged experts of every type with a layout repacked in their slots as
/// they are read (`ExpertPager::repack_slots`; `pinch run` does it for Q2_K only).
pub fn with_session_budget<R>(
    gguf_bytes: &[u8],
    spec: RunSpec,
    weight_budget: Option<u64>,
    repack: bool,
    f: impl FnOnce(&mut Session<'_, '_>, &MemPlatform<'_>, &[(&'static str, usize)]) -> R,
) -> Result<R, ModelError> {
    let plat = MemPlatform {
        bytes: gguf_bytes,
        cpu: host_cpu(),
    };
    session_on(&plat, gguf_bytes, spec, weight_budget, None, repack, 1, f)
}

/// Which session reads fail: `(offset, len) -> true` for an I/O error.
pub type FailRead<'a> = &'a (dyn Fn(u64, usize) -> bool + Sync);

/// [`with_session_budget`] whose session reads (streamed units, paged experts, embedding
/// rows) fail with an I/O error where `fail` says so (the weights planned resident load
/// as usual).
pub fn with_session_reads<R>(
    gguf_bytes: &[u8],
    spec: RunSpec,
    weight_budget: Option<u64>,
    fail: Option<FailRead<'_>>,
    f: impl FnOnce(&mut Session<'_, '_>, &MemPlatform<'_>, &[(&'static str, usize)]) -> R,
) -> Result<R, ModelError> {
    let plat = MemPlatform {
        bytes: gguf_bytes,
        cpu: host_cpu(),
    };
    session_on(&plat, gguf_bytes, spec, weight_budget, fail, false, 1, f)
}

/// [`with_session_budget`] on [`ThreadedMem`]: the expert pager reads on the I/O thread
/// while the compute thread works.
pub fn with_session_threaded<R>(
    gguf_bytes: &[u8],
    spec: RunSpec,
    weight_budget: Option<u64>,
    repack: bool,
    f: impl FnOnce(&mut Session<'_, '_>, &ThreadedMem<'_>, &[(&'static str, usize)]) -> R,
) -> Result<R, ModelError> {
    let plat = ThreadedMem::over(gguf_bytes, 1);
    session_on(&plat, gguf_bytes, spec, weight_budget, None, repack, 1, f)
}

/// The session behind the helpers above; `repack`: as `pinch run` (resident weights
/// and paged experts in this CPU's layouts); `n_seq` sequences.
#[allow(clippy::too_many_arguments)]
fn session_on<P: Platform<File = ()>, R>(
    plat: &P,
    gguf_bytes: &[u8],
    spec: RunSpec,
    weight_budget: Option<u64>,
    fail: Option<FailRead<'_>>,
    repack: bool,
    n_seq: usize,
    f: impl FnOnce(&mut Session<'_, '_>, &P, &[(&'static str, usize)]) -> R,
) -> Result<R, ModelError> {
    let g = Gguf::parse(gguf_bytes, gguf_bytes.len() as u64)
        .map_err(|_| ModelError::BadShape("gguf parse"))?;
    let cfg = Config::from_gguf(&g)?;
    let mut region = vec![0u64; (gguf_bytes.len() * 2 + (64 << 20)) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let mut arena = Arena::new(region);
    let plan = residency::plan(&g, &cfg, weight_budget, None)
        .map_err(|_| ModelError::BadShape("no residency plan fits"))?;
    let rp = Repacking::new(plat, &(), &g, "model.gguf", None, repack, &mut arena)
        .map_err(|_| ModelError::BadShape("repack scratch"))?;
    let mut weights = Loader {
        platform: &rp,
        file: &(),
        gguf: &g,
        arena: &mut arena,
    }
    .load_planned(&cfg, None, &plan)?;
    repack_cache::apply(&rp, &g, &mut weights, &mut arena)?;
    let mut opts = session_options(&spec, 0, true, plat.cpu());
    opts.n_seq = n_seq;
    let read = |off: u64, buf: &mut [u8], d: bool| {
        if fail.is_some_and(|fail| fail(off, buf.len())) {
            const EIO: i32 = 5;
            return Err(pinch_runtime_min::platform::PlatformError::Read {
                offset: off,
                code: EIO,
            });
        }
        plat.read_at(&(), off, buf, d)
    };
    let mut sess = Session::new(cfg, &weights, &mut arena, opts)?;
    sess.set_reader(&read);
    if let Some(x) = sess.experts_mut().filter(|x| repack && x.pages()) {
        // Every type with a layout (not only those `pinch run` repacks in slots): the
        // bits must hold for all.
        x.repack_slots(&plat.cpu(), &|_| true, &mut arena)?;
    }
    let accounts: Vec<_> = arena.accounts().to_vec();
    Ok(f(&mut sess, plat, &accounts))
}

/// Run `f` with a session of `n_seq` sequences over `gguf_bytes` (all weights resident;
/// `repack`: the matrices in this CPU's preferred layouts, as `pinch run` and `pinch
/// serve` load them; context 256 per sequence, batch `spec.batch`).
pub fn with_session_seqs<R>(
    gguf_bytes: &[u8],
    spec: RunSpec,
    n_seq: usize,
    repack: bool,
    f: impl FnOnce(&mut Session<'_, '_>, &MemPlatform<'_>) -> R,
) -> Result<R, ModelError> {
    let plat = MemPlatform {
        bytes: gguf_bytes,
        cpu: host_cpu(),
    };
    session_on(
        &plat,
        gguf_bytes,
        spec,
        None,
        None,
        repack,
        n_seq,
        |s, p, _| f(s, p),
    )
}

/// The session options of the helpers above: context 256 (or `n_tokens` when longer),
/// head groups of 4.
fn session_options(
    spec: &RunSpec,
    n_tokens: usize,
    swa_ring: bool,
    cpu: CpuFeatures,
) -> SessionOptions {
    SessionOptions {
        n_ctx: n_tokens.max(256),
        n_batch: spec.batch.max(1),
        kv: spec.kv,
        kv_v: spec.kv,
        math: spec.math,
        threads: spec.threads,
        head_group: 4,
        attn_skip: spec.attn_skip,
        swa_ring,
        state_f16: false,
        n_seq: 1,
        cpu,
    }
}

/// Run `f` with the model's tokenizer and a session over `gguf_bytes` whose weights are
/// planned into `budget` (the least any plan needs when that is below it, so the rest
/// streams), with the options `opts` makes for the host CPU; `f` also gets the arena,
/// for what the generation needs beside the session (a draft history).
pub fn with_tokenizer_session<R>(
    gguf_bytes: &[u8],
    budget: Option<u64>,
    opts: impl FnOnce(CpuFeatures) -> SessionOptions,
    f: impl for<'a> FnOnce(
        &mut Session<'_, 'a>,
        &pinch_runtime_min::tokenizer::Tokenizer<'_>,
        &MemPlatform<'_>,
        &mut Arena<'a>,
    ) -> R,
) -> R {
    let plat = MemPlatform {
        bytes: gguf_bytes,
        cpu: host_cpu(),
    };
    let g = Gguf::parse(gguf_bytes, gguf_bytes.len() as u64).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    let mut region = vec![0u64; (gguf_bytes.len() * 2 + (96 << 20)) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let mut arena = Arena::new(region);
    let tok = pinch_runtime_min::tokenizer::Tokenizer::from_gguf(&g, &mut arena).unwrap();
    let plan = residency::plan(&g, &cfg, budget, None)
        .or_else(|e| residency::plan(&g, &cfg, Some(e.min_bytes), None))
        .unwrap();
    let weights = Loader {
        platform: &plat,
        file: &(),
        gguf: &g,
        arena: &mut arena,
    }
    .load_planned(&cfg, None, &plan)
    .unwrap();
    let opts = opts(plat.cpu());
    let read = |off: u64, buf: &mut [u8], d: bool| plat.read_at(&(), off, buf, d);
    let mut sess = Session::new(cfg, &weights, &mut arena, opts).unwrap();
    sess.set_reader(&read);
    f(&mut sess, &tok, &plat, &mut arena)
}

/// The tokens [`pinch_runtime_min::generate::generate`] (the driver `run`, `chat` and
/// `serve` share) emits for `prompt` under `settings`, and its statistics.
pub fn generate_tokens(
    plat: &MemPlatform<'_>,
    tok: &pinch_runtime_min::tokenizer::Tokenizer<'_>,
    sess: &mut Session<'_, '_>,
    settings: pinch_runtime_min::generate::Settings<'_, '_, '_, '_>,
    prompt: &[u32],
) -> (Vec<u32>, pinch_runtime_min::generate::GenStats) {
    use pinch_runtime_min::generate::{generate, Emit};
    let mut tokens = vec![];
    let stats = generate(
        plat,
        tok,
        sess,
        settings,
        prompt,
        &mut Emit(|id, _: &[u8]| tokens.push(id)),
    )
    .unwrap();
    (tokens, stats)
}
