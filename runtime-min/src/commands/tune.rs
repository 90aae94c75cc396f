//! `pinch tune -m M [--budget SIZE] [-o FILE]`: measure this device for this model and
//! recommend the flags to run it with.
//!
//! Four measurements, each printed as it ends (on stderr): the model file's direct
//! sequential and random 1 MiB read speed (through `Platform::read_at`'s direct path,
//! what streamed weights and paged experts cost), available memory and what the memory
//! guard leaves of it, cores and CPU features, and the model's own matrices (some
//! layers and a slice of the LM head, loaded and laid out as `run` lays them out) timed
//! at 1..N threads, scaled to a whole token. `crate::tune::recommend` turns them into
//! settings with `engine::plan` as its planner; the command line and the prediction go
//! to stdout, the settings to a profile (`crate::tune::profile`) that `--tune FILE`
//! reads. The model's weights are not all loaded, so a model larger than memory can be
//! tuned for.
use core::fmt::Write;

use pinch_kernels::repack::{repack_in_place, Layout};

use super::out::{Mib, Out};
use super::{open_model, read_header, secs, session_options, AppError};
use crate::arena::Arena;
use crate::cli::Opts;
use crate::engine;
use crate::gguf::{Gguf, TensorInfo};
use crate::guard::DEFAULT_FLOOR;
use crate::model::matmul::MatMul;
use crate::model::weights::read_exact_via;
use crate::model::{Config, Math, ModelError, SessionOptions, Tensor};
use crate::platform::Platform;
use crate::residency::{self, Span};
use crate::tokenizer::Tokenizer;
use crate::tune::profile::{kv_name, Profile, ProfileError, MAX_BYTES};
use crate::tune::{
    self, Bound, Choice, Measurements, ModelFacts, MoeFacts, PlanCost, Planner, MAX_THREADS,
};

/// Bytes of each storage read.
const READ_CHUNK: usize = 1 << 20;
/// The sequential read test reads at most this much, and for at most this long.
const SEQ_MAX_BYTES: u64 = 256 << 20;
const SEQ_MAX_SECS: f64 = 3.0;
/// The random read test: at most this many reads, for at most this long.
const RAND_MAX_READS: usize = 128;
const RAND_MAX_SECS: f64 = 2.0;
/// Layer matrices loaded for the kernel test (whole layers, at least one).
const LAYER_BENCH_BYTES: u64 = 32 << 20;
/// Bytes of the LM head slice loaded for the kernel test.
const HEAD_BENCH_BYTES: u64 = 16 << 20;
/// Timed passes per thread count: at least this many and this long, at most
/// [`MAX_PASSES`].
const PASSES: usize = 5;
const MIN_SECS: f64 = 0.4;
const MAX_PASSES: usize = 10_000;
/// Matrices of the kernel test at most.
const MAX_BENCH: usize = 96;
/// Arena bytes a `--head-rows` selection takes beyond its vocabulary-long lists: the
/// corpus files and the tokenizer's scratch.
const HEAD_SELECT_SLACK: u64 = 4 << 20;
/// Alignment of the direct-read buffer.
const ALIGN: usize = 4096;

/// `engine::plan` as tune's planner.
struct EnginePlanner<'g, 'a> {
    g: &'g Gguf<'a>,
    cfg: &'g Config,
    base: SessionOptions,
    header: u64,
    tokenizer: u64,
}

impl Planner for EnginePlanner<'_, '_> {
    fn cost(&self, c: &Choice) -> PlanCost {
        let s = SessionOptions {
            n_ctx: c.ctx,
            n_batch: c.batch,
            kv: c.kv,
            threads: c.threads,
            ..self.base
        };
        let pruned = (c.head_rows > 0).then_some(c.head_rows);
        // `--head-rows` chooses its rows from the corpus at load, in a scratch scope
        // freed before the weights load: two vocabulary-long u32 lists, and the corpus
        // text and tokenizer scratch (estimated); the plan checks that peak too.
        let select = if c.head_rows > 0 {
            self.header + self.tokenizer + 12 * self.cfg.n_vocab as u64 + HEAD_SELECT_SLACK
        } else {
            0
        };
        let p = engine::plan(
            self.g,
            self.cfg,
            &s,
            self.header,
            self.tokenizer,
            c.budget,
            pruned,
            None,
            0,
            select,
            false,
        );
        let total = p.total().max(select + p.overhead);
        PlanCost {
            fits: p.fits() && c.budget.is_none_or(|b| total <= b),
            total,
            streamed_per_token: p.streamed_per_token(),
        }
    }
}

/// A matrix of the kernel test and how many times a token computes it.
struct BenchMatrix<'a> {
    t: Tensor<'a>,
    uses: usize,
}

/// Read `buf.len()` bytes at `off` (direct or buffered).
fn read_full<P: Platform>(
    p: &P,
    file: &P::File,
    off: u64,
    buf: &mut [u8],
    direct: bool,
) -> Result<(), AppError> {
    read_exact_via(p, file, off, buf, direct).map_err(AppError::Model)
}

/// Direct sequential then random 1 MiB reads of the file: bytes/s of each.
fn measure_storage<P: Platform>(
    p: &P,
    file: &P::File,
    arena: &mut Arena<'_>,
    err: &mut Out<'_, P>,
) -> Result<(f64, f64), AppError> {
    let len = p.file_size(file);
    let raw = arena.bytes("tune read buffer", READ_CHUNK + ALIGN)?;
    let skip = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
    let buf = &mut raw[skip..skip + READ_CHUNK];
    let chunks = len / READ_CHUNK as u64;
    if chunks == 0 {
        // A file smaller than one read: time what there is.
        let t0 = p.now_ns();
        read_full(p, file, 0, &mut buf[..len as usize], true)?;
        let bps = len as f64 / secs(t0, p.now_ns()).max(1e-9);
        let _ = writeln!(
            err,
            "[1/4] storage: the file is under 1 MiB: one direct read, {:.0} MB/s",
            bps / 1e6
        );
        return Ok((bps, bps));
    }
    let _ = write!(err, "[1/4] storage: direct sequential 1 MiB reads ... ");
    err.flush();
    let t0 = p.now_ns();
    let (mut off, mut n) = (0u64, 0usize);
    while off + READ_CHUNK as u64 <= len.min(SEQ_MAX_BYTES) {
        read_full(p, file, off, buf, true)?;
        off += READ_CHUNK as u64;
        n += 1;
        if n >= 8 && secs(t0, p.now_ns()) > SEQ_MAX_SECS {
            break;
        }
    }
    let s = secs(t0, p.now_ns()).max(1e-9);
    let seq = off as f64 / s;
    let _ = writeln!(err, "{:.0} MB/s ({} in {s:.2} s)", seq / 1e6, Mib(off));
    let _ = write!(err, "      direct random 1 MiB reads ... ");
    err.flush();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let t0 = p.now_ns();
    let mut reads = 0usize;
    while reads < RAND_MAX_READS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        read_full(p, file, (x % chunks) * READ_CHUNK as u64, buf, true)?;
        reads += 1;
        if reads >= 8 && secs(t0, p.now_ns()) > RAND_MAX_SECS {
            break;
        }
    }
    let s = secs(t0, p.now_ns()).max(1e-9);
    let rand = (reads * READ_CHUNK) as f64 / s;
    let _ = writeln!(err, "{:.0} MB/s ({reads} reads in {s:.2} s)", rand / 1e6);
    Ok((seq, rand))
}

/// Load `rows` rows of `t` (of `uses` per token) in the layout `run` gives them.
fn load_matrix<'a, P: Platform>(
    p: &P,
    file: &P::File,
    arena: &mut Arena<'a>,
    info: &TensorInfo,
    rows: usize,
    cpu: &pinch_kernels::CpuFeatures,
    repack: bool,
) -> Result<Tensor<'a>, AppError> {
    let rb = info
        .ty
        .row_bytes(info.dims[0])
        .ok_or(AppError::Model(ModelError::BadShape(
            "matrix rows are not whole blocks",
        )))? as usize;
    let data = arena.bytes("tune matrices", rows * rb)?;
    read_full(p, file, info.offset, data, false)?;
    let mut layout = Layout::Plain;
    if let Some(l) = Layout::preferred(info.ty, cpu).filter(|l| repack && rows >= l.group_rows()) {
        let scratch = arena.bytes("tune repack scratch", l.scratch_bytes(rb))?;
        repack_in_place(l, info.ty, data, rb, scratch).map_err(ModelError::from)?;
        layout = l;
    }
    Ok(Tensor {
        ty: info.ty,
        cols: info.dims[0] as usize,
        rows,
        data,
        layout,
        file: Span {
            offset: info.offset,
            len: (rows * rb) as u64,
        },
    })
}

/// Wall seconds of one pass over `ms` at `threads` (each matrix computed `uses` times),
/// averaged over at least [`PASSES`] passes and [`MIN_SECS`] after a warm-up pass: the
/// wall clock, so a core the OS gives to others counts as it does in a long run.
fn pass_secs<P: Platform>(
    p: &P,
    cpu: pinch_kernels::CpuFeatures,
    threads: usize,
    ms: &[BenchMatrix],
    x: &[f32],
    out: &mut [f32],
    act_q: &mut [u8],
) -> Result<f64, AppError> {
    if ms.is_empty() {
        return Ok(0.0);
    }
    let mm = MatMul {
        p,
        math: Math::Fast,
        threads,
        cpu,
    };
    let pass = |out: &mut [f32], act_q: &mut [u8]| -> Result<(), AppError> {
        for m in ms {
            for _ in 0..m.uses {
                mm.linear(&m.t, &x[..m.t.cols], 1, out, act_q, &mut [], &mut [])?;
            }
        }
        Ok(())
    };
    pass(out, act_q)?;
    let t0 = p.now_ns();
    let mut n = 0usize;
    loop {
        pass(out, act_q)?;
        n += 1;
        let s = secs(t0, p.now_ns());
        if (n >= PASSES && s >= MIN_SECS) || n >= MAX_PASSES {
            return Ok(s / n as f64);
        }
    }
}

/// The matrices of the kernel test and the factors that scale their times to a token.
struct Bench<'a> {
    layers: heapless::Vec<BenchMatrix<'a>, MAX_BENCH>,
    /// Whole layers loaded (from layer 0).
    n_layers: usize,
    head: Option<BenchMatrix<'a>>,
    layer_scale: f64,
    head_scale: f64,
}

/// The matrices of the kernel test: whole layers from the first (expert stacks as one
/// expert, used `n_used` times), and the first rows of the LM head.
fn load_bench<'a, P: Platform>(
    p: &P,
    file: &P::File,
    g: &Gguf,
    cfg: &Config,
    arena: &mut Arena<'a>,
    cpu: &pinch_kernels::CpuFeatures,
    repack: bool,
) -> Result<Bench<'a>, AppError> {
    let n_used = cfg.moe.map_or(1, |m| m.n_used);
    // Bytes a token computes with in matrix products of a layer.
    let active = |t: &TensorInfo| {
        if t.dims[2] > 1 {
            t.bytes as f64 / t.dims[2] as f64 * n_used as f64
        } else {
            t.bytes as f64
        }
    };
    let mut total_active = 0.0;
    for il in 0..cfg.n_layer {
        total_active += residency::layer_matrices(g, il)
            .map(|t| active(&t))
            .sum::<f64>();
    }
    let mut layers = heapless::Vec::new();
    let (mut loaded, mut bench_active, mut n_layers) = (0u64, 0.0f64, 0);
    for il in 0..cfg.n_layer {
        let count = residency::layer_matrices(g, il).count();
        if loaded >= LAYER_BENCH_BYTES || layers.len() + count > MAX_BENCH {
            break;
        }
        for t in residency::layer_matrices(g, il) {
            let rows = t.dims[1] as usize;
            let uses = if t.dims[2] > 1 { n_used } else { 1 };
            let m = load_matrix(p, file, arena, &t, rows, cpu, repack)?;
            loaded += m.data.len() as u64;
            bench_active += (m.data.len() * uses) as f64;
            let _ = layers.push(BenchMatrix { t: m, uses });
        }
        n_layers += 1;
    }
    let layer_scale = if bench_active > 0.0 {
        total_active / bench_active
    } else {
        0.0
    };
    let head = residency::head_tensor(g);
    let (head, head_scale) = match head {
        Some(h) if h.dims[1] > 0 => {
            let rows = h.dims[1] as usize;
            let row_bytes = (h.bytes / rows as u64).max(1);
            let take = ((HEAD_BENCH_BYTES / row_bytes) as usize / 16 * 16).clamp(16, rows);
            let take = if take < rows { take } else { rows };
            let m = load_matrix(p, file, arena, &h, take, cpu, repack)?;
            (
                Some(BenchMatrix { t: m, uses: 1 }),
                rows as f64 / take as f64,
            )
        }
        _ => (None, 0.0),
    };
    Ok(Bench {
        layers,
        n_layers,
        head,
        layer_scale,
        head_scale,
    })
}

/// `pinch tune`: see the module doc.
pub fn tune<P: Platform>(p: &P, o: &Opts, region: &mut [u8]) -> Result<(), AppError> {
    let path = o.model.ok_or(AppError::NoModel)?;
    let file = open_model(p, path)?;
    let mut arena = Arena::new(region);
    let g = read_header(p, &file, &mut arena)?;
    let header = arena.used() as u64;
    let cfg = Config::from_gguf(&g)?;
    let before = arena.used();
    let tok = Tokenizer::from_gguf(&g, &mut arena)?;
    let tok_bytes = (arena.used() - before) as u64;
    drop(tok);
    let mut err = Out::stderr(p);
    let _ = writeln!(
        err,
        "pinch tune: {path} ({}, {} layers, {})",
        cfg.arch.name(),
        cfg.n_layer,
        Mib(p.file_size(&file))
    );
    let (seq, rand) = measure_storage(p, &file, &mut arena, &mut err)?;

    let floor = o.guard.unwrap_or(DEFAULT_FLOOR);
    let available = p.available_memory();
    let _ = write!(err, "[2/4] memory: ");
    match available {
        Some(a) => {
            let _ = writeln!(
                err,
                "{} available; the guard (--guard {}) leaves {}",
                Mib(a),
                Mib(floor),
                Mib(a.saturating_sub(floor))
            );
        }
        None => {
            let _ = writeln!(err, "unknown (the platform does not tell)");
        }
    }
    let cpu = p.cpu();
    let cores = p.workers().clamp(1, MAX_THREADS);
    let _ = writeln!(err, "[3/4] cpu: {cores} cores, {}", cpu.describe());

    let repack = !o.no_repack;
    let Bench {
        layers,
        n_layers,
        head,
        layer_scale,
        head_scale,
    } = load_bench(p, &file, &g, &cfg, &mut arena, &cpu, repack)?;
    let widest = |dim: fn(&Tensor) -> usize| {
        layers
            .iter()
            .chain(head.iter())
            .map(|m| dim(&m.t))
            .max()
            .unwrap_or(1)
    };
    let (max_cols, max_rows) = (widest(|t| t.cols), widest(|t| t.rows));
    let x = arena.slice::<f32>("tune input", max_cols)?;
    for (i, v) in x.iter_mut().enumerate() {
        *v = ((i * 7919 % 997) as f32 / 997.0 - 0.5) * 2.0;
    }
    let out = arena.slice::<f32>("tune output", max_rows)?;
    // The widest activation row of any format (Q8_K rows are the largest per value).
    let act_q = arena.bytes("tune activations", max_cols * 2 + 1024)?;
    let head_rows_loaded = head.as_ref().map_or(0, |h| h.t.rows);
    let _ = writeln!(
        err,
        "[4/4] kernels on the model's matrices ({} matrices of {} layers, {} head rows), one token:",
        layers.len(),
        n_layers,
        head_rows_loaded
    );
    let _ = writeln!(
        err,
        "      | threads | layers ms | head ms | token ms | tok/s (matrices only) |"
    );
    let mut layer_secs = heapless::Vec::new();
    let mut head_secs = heapless::Vec::new();
    for t in 1..=cores {
        let ls = layer_scale * pass_secs(p, cpu, t, &layers, x, out, act_q)?;
        let hs = head_scale * pass_secs(p, cpu, t, head.as_slice(), x, out, act_q)?;
        let _ = layer_secs.push(ls);
        let _ = head_secs.push(hs);
        let _ = writeln!(
            err,
            "      | {t} | {:.2} | {:.2} | {:.2} | {:.1} |",
            ls * 1e3,
            hs * 1e3,
            (ls + hs) * 1e3,
            1.0 / (ls + hs).max(1e-9)
        );
        err.flush();
    }
    drop(err);

    let m = Measurements {
        seq_read_bps: seq,
        rand_read_bps: rand,
        available,
        guard_floor: floor,
        cores,
        layer_secs,
        head_secs,
    };
    let base = session_options(p, o, &cfg);
    let facts = ModelFacts {
        head_rows: cfg.n_vocab,
        n_ctx: base.n_ctx,
        moe: moe_facts(&g, &cfg),
    };
    let planner = EnginePlanner {
        g: &g,
        cfg: &cfg,
        base,
        header,
        tokenizer: tok_bytes,
    };
    let r = tune::recommend(&m, &facts, &planner, o.budget).map_err(AppError::Tune)?;
    let read_bw = seq as u64;
    print_recommendation(p, path, &r, read_bw, facts.n_ctx);

    let name = path.rsplit('/').next().unwrap_or(path);
    let c = r.choice;
    let prof = Profile {
        threads: Some(c.threads),
        budget: c.budget,
        batch: Some(c.batch),
        head_rows: Some(c.head_rows),
        kv: Some(c.kv),
        expert_pool: (c.expert_pool > 0).then_some(c.expert_pool),
        ctx: (c.ctx != facts.n_ctx).then_some(c.ctx),
        read_bw: Some(read_bw.max(1)),
        model: Some(name).filter(|n| !n.contains('\n') && n.len() < 200),
        model_bytes: Some(p.file_size(&file)),
        predicted_tps: Some(r.predicted_tps),
        ceiling_tps: r.ceiling_tps.filter(|c| c.is_finite()),
    };
    let mut text = heapless::String::<1024>::new();
    let _ = prof.write(&mut text);
    let mut dest = heapless::String::<256>::new();
    match o.output {
        Some(f) => {
            let _ = dest.push_str(f);
        }
        None => {
            let _ = write!(dest, "{path}.tune");
        }
    }
    let mut out = Out::stdout(p);
    match p.write_file(&dest, &[text.as_bytes()]) {
        Ok(()) => {
            let _ = writeln!(
                out,
                "profile written to {dest}: pinch run --tune {dest} -m {path} (flags given there win)"
            );
        }
        Err(e) => {
            let _ = writeln!(out, "profile not written ({dest}: {e}); its contents:");
            let _ = out.write_str(&text);
        }
    }
    Ok(())
}

/// The routed experts of a MoE model, as tune plans their pool.
fn moe_facts(g: &Gguf, cfg: &Config) -> Option<MoeFacts> {
    let moe = cfg.moe?;
    let mut layers = 0;
    let mut expert_bytes = 0u64;
    for il in 0..cfg.n_layer {
        let stacks = residency::layer_matrices(g, il).filter(|t| t.dims[2] > 1);
        let b: u64 = stacks.map(|t| t.bytes / t.dims[2].max(1)).sum();
        if b > 0 {
            layers += 1;
            expert_bytes = expert_bytes.max(b);
        }
    }
    Some(MoeFacts {
        moe_layers: layers,
        n_expert: moe.n_expert,
        n_used: moe.n_used,
        expert_bytes,
    })
}

/// The recommended command line and its prediction, on stdout.
fn print_recommendation<P: Platform>(
    p: &P,
    path: &str,
    r: &tune::Recommendation,
    read_bw: u64,
    default_ctx: usize,
) {
    let c = &r.choice;
    let mut out = Out::stdout(p);
    let _ = write!(out, "recommended: pinch run -m {path} -t {} ", c.threads);
    if let Some(b) = c.budget {
        let _ = write!(out, "--budget {}M ", b.div_ceil(1 << 20));
    }
    let _ = write!(out, "-b {} --cache-type-k {}", c.batch, kv_name(c.kv));
    if c.head_rows > 0 {
        let _ = write!(out, " --head-rows {}", c.head_rows);
    }
    if c.expert_pool > 0 {
        let _ = write!(out, " --pool {}", c.expert_pool);
    }
    if c.ctx != default_ctx {
        let _ = write!(out, " -c {}", c.ctx);
    }
    let _ = writeln!(out, " --read-bw {}M", (read_bw / 1_000_000).max(1));
    let bound = match r.bound {
        Bound::Compute => "compute-bound",
        Bound::Storage => "storage-bound",
    };
    let _ = write!(
        out,
        "predicted: {:.2} tok/s generation ({bound}), plan {}",
        r.predicted_tps,
        Mib(r.total)
    );
    if let Some(u) = r.usable {
        let _ = write!(out, " of {} usable", Mib(u));
    }
    let _ = writeln!(out);
    match r.ceiling_tps {
        Some(cl) => {
            let _ = writeln!(
                out,
                "ceiling: {cl:.2} tok/s from storage ({} read per token at {:.0} MB/s)",
                Mib(r.streamed_per_token),
                read_bw as f64 / 1e6
            );
        }
        None => {
            let _ = writeln!(
                out,
                "ceiling: none from storage (all weights resident); the matrices set the speed"
            );
        }
    }
    if let Some(full) = r.full_head_tps {
        let _ = writeln!(
            out,
            "note: --head-rows {} prunes the LM head to the rows most used in --corpus (other tokens are never generated); without it: {full:.2} tok/s",
            c.head_rows
        );
    }
    if c.expert_pool > 0 {
        let _ = writeln!(
            out,
            "note: the expert pool's prediction takes routing as uniform (a real trace hits more: pinch moe-sim)"
        );
    }
}

/// Read and parse the profile at `path` into `buf` (at most [`MAX_BYTES`]).
pub fn read_profile<'b, P: Platform>(
    p: &P,
    path: &str,
    buf: &'b mut [u8; MAX_BYTES + 1],
) -> Result<Profile<'b>, ProfileReadError> {
    let file = p.open(path).map_err(ProfileReadError::Io)?;
    let len = p.file_size(&file);
    let n = (len as usize).min(buf.len());
    read_exact_via(p, &file, 0, &mut buf[..n], false).map_err(ProfileReadError::Model)?;
    Profile::parse(&buf[..n]).map_err(ProfileReadError::Parse)
}

/// A `--tune` profile that could not be used.
#[derive(Clone, Debug, PartialEq)]
pub enum ProfileReadError {
    Io(crate::platform::PlatformError),
    /// The file could not be read whole (it shrank, or a read failed).
    Model(ModelError),
    Parse(ProfileError),
}

impl core::fmt::Display for ProfileReadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ProfileReadError::Io(e) => write!(f, "{e}"),
            ProfileReadError::Model(e) => write!(f, "{e}"),
            ProfileReadError::Parse(e) => write!(f, "{e}"),
        }
    }
}
