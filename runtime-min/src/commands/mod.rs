//! The commands (`run`, `chat`, `ppl`, `tokenize`, `bench`, `inspect`), generic over the
//! platform. The OS crate parses nothing itself: it hands the arguments to [`main`].
pub mod bench;
pub mod head_select;
pub mod logits;
pub mod loops;
pub mod moe;
pub mod moe_sim;
pub mod mtp_drafts;
pub mod out;
pub mod ppl;
pub mod recut;
pub mod run;
pub mod serve;
pub mod tokenize;
pub mod tune;

use core::fmt::Write;

use crate::arena::{Arena, ArenaError};
use crate::cli::{Command, Opts, USAGE};
use crate::engine::{self, OverBudget, Plan};
use crate::gguf::{Gguf, GgufError};
use crate::header_len::{header_len, HeaderLenError};
use crate::model::forward::MAX_SEQS;
use crate::model::{Config, Loader, ModelError, Session, SessionOptions, Weights};
use crate::platform::{Platform, PlatformError};
use crate::tokenizer::{Tokenizer, TokenizerError};
use out::Out;

/// Anything a command can fail with; each message names the file or value at fault.
#[derive(Debug)]
pub enum AppError {
    NoModel,
    Open(PlatformError),
    Header(HeaderLenError),
    Gguf(GgufError),
    Model(ModelError),
    Tokenizer(TokenizerError),
    Arena(ArenaError),
    Budget(OverBudget),
    Usage(&'static str),
    Chat(crate::chat::ChatError),
    PromptTooLong {
        tokens: usize,
        n_ctx: usize,
    },
    Head(crate::head::HeadError),
    /// The memory guard stopped the generation.
    Stopped(crate::guard::GuardStop),
    /// A MoE trace file or its replay was refused.
    Trace(crate::pager::TraceError),
    Pool(crate::pager::PoolError),
    /// Writing an output file (`-o`) failed.
    Output(heapless::String<80>, PlatformError),
    /// Reading an input file other than the model (a corpus file, an ids list) failed.
    Input(heapless::String<80>, PlatformError),
    /// `--chat-template(-file)` names no built-in template and no readable file.
    TemplateFile(heapless::String<80>, PlatformError),
    /// `pinch tune` found nothing to recommend.
    Tune(crate::tune::TuneError),
}

impl From<ModelError> for AppError {
    fn from(e: ModelError) -> Self {
        AppError::Model(e)
    }
}
impl From<ArenaError> for AppError {
    fn from(e: ArenaError) -> Self {
        AppError::Arena(e)
    }
}
impl From<TokenizerError> for AppError {
    fn from(e: TokenizerError) -> Self {
        AppError::Tokenizer(e)
    }
}

impl core::fmt::Display for AppError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AppError::NoModel => write!(f, "no model given (use -m FILE.gguf)"),
            AppError::Open(err) => write!(f, "{err}"),
            AppError::Header(e) => write!(f, "{e}"),
            AppError::Gguf(e) => write!(f, "{e}"),
            AppError::Model(e) => write!(f, "{e}"),
            AppError::Tokenizer(e) => write!(f, "{e}"),
            AppError::Arena(e) => write!(f, "{e}"),
            AppError::Budget(e) => write!(f, "{e}"),
            AppError::Usage(s) => write!(f, "{s}"),
            AppError::Chat(e) => write!(f, "{e}"),
            AppError::Head(e) => write!(f, "{e}"),
            AppError::Trace(e) => write!(f, "{e}"),
            AppError::Pool(e) => write!(f, "{e}"),
            AppError::Stopped(e) => write!(f, "{e}"),
            AppError::Output(file, e) | AppError::Input(file, e) => write!(f, "{file}: {e}"),
            AppError::Tune(e) => write!(f, "{e}"),
            AppError::TemplateFile(file, e) => write!(
                f,
                "chat template '{file}' is not readable ({e}); {}",
                crate::chat::ChatError::UnknownName
            ),
            AppError::PromptTooLong { tokens, n_ctx } => write!(
                f,
                "the prompt has {tokens} tokens but the context holds {n_ctx}: shorten it or raise -c"
            ),
        }
    }
}

/// Run the command line `args` (without the program name); returns the exit code.
/// `region` is the arena region (the OS crate sizes it from the budget).
pub fn main<P: Platform>(p: &P, args: &[&str], region: &mut [u8]) -> i32 {
    let mut err = Out::stderr(p);
    let o = match Opts::parse(args) {
        Ok(o) => o,
        Err(e) => {
            let _ = writeln!(err, "pinch: {e}");
            return 2;
        }
    };
    // `--tune FILE`: the profile's settings are the defaults the flags override.
    let mut prof_buf = [0u8; crate::tune::profile::MAX_BYTES + 1];
    let o = match o.tune {
        None => o,
        Some(f) => match tune::read_profile(p, f, &mut prof_buf) {
            Ok(prof) => match Opts::parse_with(args, &|x| prof.apply(x)) {
                Ok(o) => o,
                Err(e) => {
                    let _ = writeln!(err, "pinch: {e} (after the settings of {f})");
                    return 2;
                }
            },
            Err(e) => {
                let _ = writeln!(err, "pinch: {f}: {e}");
                return 2;
            }
        },
    };
    let path = o.model.or(o.storage).or(o.file).unwrap_or("");
    let res = match o.command {
        Command::Help => {
            let _ = Out::stdout(p).write_str(USAGE);
            Ok(())
        }
        Command::HeadSelect if !o.soft && o.generate == 0 && o.load_soft.is_none() => {
            head_select::head_select(p, &o, region)
        }
        Command::Recut => recut::recut(p, &o, region),
        Command::MoeSim => moe_sim::moe_sim(p, &o, region),
        Command::Tune => tune::tune(p, &o, region),
        Command::Bench if o.storage.is_some() => bench::storage(p, &o, region),
        Command::Bench if o.membw => bench::membw(p, &o, region),
        _ => with_model(p, &o, region, &mut |ctx| match ctx.o.command {
            Command::Run => run::run(ctx),
            Command::Chat => run::chat(ctx),
            Command::Ppl => ppl::ppl(ctx),
            Command::Tokenize => tokenize::tokenize(ctx),
            Command::Logits => logits::logits(ctx),
            Command::Bench => bench::bench(ctx),
            Command::Serve => serve::serve(ctx),
            Command::Loops => loops::loops(ctx),
            Command::HeadSelect => head_select::head_select_soft(ctx),
            Command::Inspect | Command::Help | Command::Recut | Command::MoeSim | Command::Tune => {
                Ok(())
            }
        }),
    };
    match res {
        Ok(()) => 0,
        // these name their own file (not the model's)
        Err(e @ (AppError::Stopped(_) | AppError::Input(..) | AppError::Output(..))) => {
            let _ = writeln!(err, "pinch: {e}");
            1
        }
        Err(e) => {
            let _ = writeln!(err, "pinch: {path}: {e}");
            1
        }
    }
}

/// A loaded model ready for a command.
pub struct Ctx<'c, 'w, 'a, P: Platform> {
    pub p: &'c P,
    pub o: &'c Opts<'c>,
    pub g: &'c Gguf<'a>,
    pub cfg: Config,
    pub tok: &'c Tokenizer<'a>,
    pub sess: Session<'w, 'a>,
    pub arena: &'c mut Arena<'a>,
    pub plan: Plan,
    pub file: &'c P::File,
    /// run, chat, serve: speculative decoding's drafter (`--draft`), when on.
    pub draft: Option<crate::draft::Drafter<'a>>,
}

fn open_model<P: Platform>(p: &P, path: &str) -> Result<P::File, AppError> {
    p.open(path).map_err(AppError::Open)
}

/// Read exactly the header into the arena and parse it.
pub fn read_header<'a, P: Platform>(
    p: &P,
    file: &P::File,
    arena: &mut Arena<'a>,
) -> Result<Gguf<'a>, AppError> {
    let hl = header_len(p, file).map_err(AppError::Header)?;
    let buf = arena.bytes("gguf header", hl as usize)?;
    let mut done = 0;
    while done < buf.len() {
        let n = p
            .read_at(file, done as u64, &mut buf[done..], false)
            .map_err(|e| AppError::Model(ModelError::Platform(e)))?;
        if n == 0 {
            return Err(AppError::Model(ModelError::ShortRead {
                offset: done as u64,
            }));
        }
        done += n;
    }
    let buf: &'a [u8] = buf;
    Gguf::parse(buf, p.file_size(file)).map_err(AppError::Gguf)
}

/// Session options from the command line and the model.
pub fn session_options<P: Platform>(p: &P, o: &Opts, cfg: &Config) -> SessionOptions {
    let threads = if o.threads == 0 {
        p.workers()
    } else {
        o.threads
    };
    // The default context never exceeds the training context; an explicit `-c` may,
    // as in llama.cpp (with the warning `with_model` prints): positions past it are
    // computed by the same rope arithmetic (angles from the position, no table), the
    // model has just never seen them.
    let n_ctx = match (o.n_ctx, o.command) {
        (0, Command::Ppl) => 512.min(cfg.n_ctx_train.max(1)),
        (0, Command::Bench) => 1024.min(cfg.n_ctx_train.max(1)),
        (0, _) => 2048.min(cfg.n_ctx_train.max(1)),
        (n, _) => n,
    };
    // `bench --parallel N` and `serve --parallel N`: N sequences share the context as
    // llama-server's slots do, `n_ctx / N` each, rounded up to a multiple of 256.
    let n_seq = match o.command {
        Command::Bench | Command::Serve => o.serve.parallel.clamp(1, MAX_SEQS),
        _ => 1,
    };
    let n_ctx = if n_seq > 1 {
        (n_ctx / n_seq).next_multiple_of(256)
    } else {
        n_ctx
    };
    SessionOptions {
        n_ctx,
        n_batch: o.n_batch,
        kv: o.kv,
        kv_v: o.kv_v,
        math: o.math,
        threads,
        head_group: 1,
        attn_skip: o
            .attn_skip
            .unwrap_or(!matches!(o.command, Command::Ppl | Command::Logits)),
        swa_ring: !o.swa_full,
        state_f16: o.state_f16,
        n_seq,
        cpu: p.cpu(),
    }
}

fn with_model<P: Platform>(
    p: &P,
    o: &Opts,
    region: &mut [u8],
    f: &mut dyn FnMut(&mut Ctx<'_, '_, '_, P>) -> Result<(), AppError>,
) -> Result<(), AppError> {
    let path = o.model.ok_or(AppError::NoModel)?;
    let file = open_model(p, path)?;
    let mut arena = Arena::new(region);
    let g = read_header(p, &file, &mut arena)?;
    if o.command == Command::Inspect {
        let mut out = Out::stdout(p);
        let _ = crate::inspect::inspect(&g, &p.cpu(), &mut out);
        return Ok(());
    }
    let header = arena.used() as u64;
    let cfg = Config::from_gguf(&g)?;
    let before = arena.used();
    let mut tok = Tokenizer::from_gguf(&g, &mut arena)?;
    let tok_bytes = (arena.used() - before) as u64;
    let mut sopts = session_options(p, o, &cfg);
    if sopts.n_ctx > cfg.n_ctx_train {
        let _ = writeln!(
            Out::stderr(p),
            "pinch: warning: -c {} is more than the model's training context ({}): the model has not seen positions past it",
            sopts.n_ctx,
            cfg.n_ctx_train
        );
    }
    if o.command == Command::Ppl {
        if !o.n_batch_given {
            sopts.n_batch = sopts.n_ctx;
        }
        sopts.head_group = 16;
    }
    let requested = head_select::requested_ids(p, o, &tok, &mut arena)?;
    let pruned = requested.map(|h| h.len());
    // The selection's scratch is free again, but the budget had to hold it.
    let select_peak = if requested.is_some() {
        arena.peak() as u64
    } else {
        0
    };
    let buffers = if o.command == Command::Serve {
        serve::buffer_bytes(o, sopts.n_ctx, &tok)
    } else {
        0
    };
    let plan_keeping = |s: &SessionOptions, buffers: u64, keep_head: bool| {
        let (budget, bw) = (o.budget, o.read_bw);
        engine::plan(
            &g,
            &cfg,
            s,
            header,
            tok_bytes,
            budget,
            pruned,
            bw,
            buffers,
            select_peak,
            keep_head,
        )
    };
    let plan_for = |s: &SessionOptions, buffers: u64| plan_keeping(s, buffers, false);
    let mut plan = plan_for(&sopts, buffers);
    // Speculative decoding verifies a draft in one pass, the head included: the head
    // then computes a group of positions per read of its rows (and the draft history
    // is one of the command's buffers).
    let n_draft = crate::generate::draft_len(p, o, &cfg, plan.res.streams());
    // Drafts from the model's MTP block where it has one pinch runs (`--spec-type`).
    let mut mtp_block = mtp_drafts::choose(p, o, &g, &cfg, n_draft, sopts.n_seq);
    if n_draft > 0 {
        sopts.head_group = n_draft + 1;
        // The history, and for a recurrent model the state copy and pass log that take
        // it back to the last kept token.
        let point = Session::draft_point_bytes(&cfg, sopts.state_f16) as u64;
        let buffers = buffers + (sopts.n_ctx * 4) as u64 + point;
        plan = plan_for(&sopts, buffers);
        if let Some(il) = mtp_block {
            let keeping = |extra, keep| plan_keeping(&sopts, buffers + extra, keep);
            match mtp_drafts::plan(p, o, &g, &cfg, &sopts, il, &keeping) {
                Some(with) => plan = with,
                None => mtp_block = None,
            }
        }
    }
    let mut err = Out::stderr(p);
    if o.verbose || o.budget.is_some() {
        let _ = plan.print(&mut err, &cfg, &sopts);
        moe::print_plan(&mut err, &g, cfg.n_layer, &plan.res, o.read_bw);
    }
    drop(err);
    engine::check_budget(&plan, &g, &cfg, &sopts, pruned).map_err(AppError::Budget)?;
    // The row-interleaved layouts pay for one token at a time; `ppl` computes the head
    // for 16 positions at once, where the plain layout's tiles are faster (but with
    // `--lut8` it measures that arithmetic, which only the repacked layout has).
    let fast = o.math == crate::model::Math::Fast && !o.no_repack;
    let repack = fast && (o.command != Command::Ppl || o.lut8);
    let mode = match (repack, o.lut8) {
        (false, _) => crate::repack_cache::Repack::Off,
        (true, false) => crate::repack_cache::Repack::Exact,
        (true, true) => crate::repack_cache::Repack::Lut8,
    };
    let rp =
        crate::repack_cache::Repacking::new(p, &file, &g, path, o.repack_cache, mode, &mut arena)?;
    let lut8_kernel = pinch_kernels::repack::has_fast_kernel(
        pinch_kernels::repack::Layout::Q1_0x16Lut8,
        &p.cpu(),
    );
    if mode == crate::repack_cache::Repack::Lut8 && !lut8_kernel {
        let _ = writeln!(
            Out::stderr(p),
            "note: --lut8: no 8-bit table kernel on this CPU ({}); Q1_0 / Q2_0 keep the exact kernels",
            p.cpu().describe()
        );
    }
    let mut weights: Weights = {
        let mut loader = Loader {
            platform: &rp,
            file: &file,
            gguf: &g,
            arena: &mut arena,
        };
        loader.load_planned(&cfg, requested, &plan.res)?
    };
    crate::repack_cache::apply(&rp, &g, &mut weights, &mut arena)?;
    if let Some(ids) = weights.head_ids {
        if o.command == Command::Ppl {
            head_select::report_outside(p, o, &tok, ids, &mut arena)?;
        }
        head_select::set_mask(ids, cfg.n_vocab, &mut tok, &mut arena)?;
    }
    let read = |off: u64, buf: &mut [u8], direct: bool| p.read_at(&file, off, buf, direct);
    let mut sess = Session::new(cfg, &weights, &mut arena, sopts)?;
    sess.set_reader(&read);
    if let Some(x) = sess.experts_mut().filter(|x| repack && x.pages()) {
        let n = x.repack_slots(&p.cpu(), &crate::pager::paged::repack_pays, &mut arena)?;
        if n > 0 && (o.verbose || o.budget.is_some()) {
            let _ = writeln!(
                Out::stderr(p),
                "  paged experts: {n} expert matrices (all layers) repacked in their slots as they are read"
            );
        }
    }
    if o.verify_stream {
        sess.set_verify(arena.bytes("stream verify", crate::model::stream::VERIFY_CHUNK)?);
        if let Some(x) = sess.experts_mut().filter(|x| x.pages()) {
            x.set_verify(arena.bytes("stream verify", crate::model::stream::VERIFY_CHUNK)?);
        }
    }
    if n_draft > 0 {
        sess.keep_draft_point(&mut arena)?;
    }
    if let Some(il) = mtp_block {
        let on = mtp_drafts::attach(
            p, o, &file, &g, &cfg, il, n_draft, &weights, &mut sess, &mut arena,
        );
        mtp_block = mtp_block.filter(|_| on);
    }
    let mut draft = crate::generate::drafter(n_draft, sopts.n_ctx, &mut arena)?;
    if let Some(d) = draft.as_mut().filter(|_| mtp_block.is_some()) {
        d.mtp_p_min = Some(o.draft_p_min);
    }
    let mut ctx = Ctx {
        draft,
        p,
        o,
        g: &g,
        cfg,
        tok: &tok,
        sess,
        arena: &mut arena,
        plan,
        file: &file,
    };
    moe::setup(&mut ctx)?;
    f(&mut ctx)?;
    moe::finish(&mut ctx)
}

/// Seconds between two `now_ns` readings.
pub fn secs(t0: u64, t1: u64) -> f64 {
    (t1.saturating_sub(t0)) as f64 / 1e9
}
