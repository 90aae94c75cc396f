//! The forward pass: tokens in, logits out, reading top to bottom like the diagram.
//!
//! ```text
//! x = embed(tokens) [* sqrt(n_embd)]
//! per layer:  h = norm(x); q,k,v = h·Wq,Wk,Wv [+b]; [qk-norm]; rope; cache k,v
//!             a = softmax(q·K / sqrt(d)) · V ; o = a·Wo ; [post-norm] ; x += o
//!             h = norm(x); f = act(h·Wgate) * (h·Wup) ; d = f·Wdown ; [post-norm] ; x += d
//! logits = norm(x) · Wout
//! ```
use core::ops::Range;

use pinch_kernels::attn;
use pinch_kernels::matvec::{
    dequantize_row, matmul_rows, matvec_rows, quantize_activation, KernelError,
};
use pinch_kernels::ops::{self, rms_norm, rms_norm_inplace, rope};
use pinch_kernels::quant::float::hsum16;
use pinch_kernels::CpuFeatures;

use crate::arena::Arena;
use crate::model::config::{Config, FfnAct};
use crate::model::kv::{KvCache, KvPlane, KvType};
use crate::model::weights::{Tensor, Weights};
use crate::model::ModelError;
use crate::platform::Platform;

/// Largest head dimension the attention scratch holds (Gemma 3: 256).
pub const MAX_HEAD_DIM: usize = 256;

/// Most workers a matmul is split across.
pub const MAX_WORKERS: usize = 16;

/// How the arithmetic is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Math {
    /// Weights dequantized to f32, activations never quantized: the oracle.
    Reference,
    /// Activations quantized to the weight's pairing format, SIMD kernels (llama.cpp's way).
    Fast,
}

/// Which positions of an `eval` call produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    Last,
    All,
    None,
}

/// Sizes and modes of a session.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    pub n_ctx: usize,
    /// Most tokens processed per weight pass.
    pub n_batch: usize,
    pub kv: KvType,
    pub math: Math,
    pub threads: usize,
    /// Positions whose LM-head rows are computed together (when all logits are wanted).
    pub head_group: usize,
    pub cpu: CpuFeatures,
    /// Skip exp and V for keys whose score is below max + ln(1e-4) (their weight is
    /// under 1e-4 of the best key's).
    pub attn_skip: bool,
}

/// Where the time of `eval` goes, by kind of operation (nanoseconds, cumulative).
#[derive(Clone, Copy, Debug, Default)]
pub struct Profile {
    pub ns: [u64; Op::COUNT],
}

/// Kinds of operations the profile separates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Embed,
    QkvProj,
    RopeAndCache,
    Attention,
    OutProj,
    FfnGateUp,
    FfnAct,
    FfnDown,
    NormsAndAdds,
    LmHead,
}

impl Op {
    pub const COUNT: usize = 10;
    pub const ALL: [Op; Op::COUNT] = [
        Op::Embed,
        Op::QkvProj,
        Op::RopeAndCache,
        Op::Attention,
        Op::OutProj,
        Op::FfnGateUp,
        Op::FfnAct,
        Op::FfnDown,
        Op::NormsAndAdds,
        Op::LmHead,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Op::Embed => "embedding rows",
            Op::QkvProj => "q/k/v projections",
            Op::RopeAndCache => "qk-norm, rope, kv write",
            Op::Attention => "attention",
            Op::OutProj => "attention output proj",
            Op::FfnGateUp => "ffn gate+up",
            Op::FfnAct => "ffn activation",
            Op::FfnDown => "ffn down",
            Op::NormsAndAdds => "norms and residual adds",
            Op::LmHead => "output norm + LM head",
        }
    }
}

impl Profile {
    #[inline]
    fn add(&mut self, op: Op, t0: u64, t1: u64) {
        self.ns[op as usize] += t1.saturating_sub(t0);
    }
    pub fn total(&self) -> u64 {
        self.ns.iter().sum()
    }
}

/// A model plus its KV cache and scratch: everything one conversation needs.
pub struct Session<'w, 'a> {
    pub cfg: Config,
    w: &'w Weights<'a>,
    kv: KvCache<'a>,
    pub opts: SessionOptions,
    /// Positions already in the cache.
    pub n_past: usize,
    /// Time per kind of operation since the session was made.
    pub profile: Profile,
    s: Scratch<'a>,
}

struct Scratch<'a> {
    x: &'a mut [f32],
    xn: &'a mut [f32],
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    att: &'a mut [f32],
    gate: &'a mut [f32],
    up: &'a mut [f32],
    scores: &'a mut [f32],
    act_q: &'a mut [u8],
    mm_tmp: &'a mut [f32],
    row: &'a mut [f32],
    logits: &'a mut [f32],
    /// Pruned-head logits before they are spread over the vocabulary (empty: full head).
    head_logits: &'a mut [f32],
    /// ggml's f16 GELU table (GELU models only; empty otherwise).
    gelu: &'a mut [u16],
}

impl<'w, 'a> Session<'w, 'a> {
    /// Bytes of scratch and KV a session with `o` needs (for the budget plan).
    pub fn bytes_needed(cfg: &Config, o: &SessionOptions) -> usize {
        let (nb, g) = (o.n_batch.max(1), o.head_group.max(1));
        let maxd = cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff);
        let floats = nb * (3 * cfg.n_embd + 2 * cfg.q_dim() + 2 * cfg.kv_dim() + 2 * cfg.n_ff)
            + o.threads.clamp(1, MAX_WORKERS) * o.n_ctx
            + (nb * maxd).max(cfg.n_vocab * g)
            + maxd
            + cfg.n_vocab * g;
        let kv = KvCache::bytes_needed(o.kv, cfg.n_layer, o.n_ctx, cfg.kv_dim());
        floats * 4 + nb.max(g) * maxd * 4 + kv + 64 * 20 + (1 << 17)
    }

    pub fn new(
        cfg: Config,
        w: &'w Weights<'a>,
        arena: &mut Arena<'a>,
        opts: SessionOptions,
    ) -> Result<Session<'w, 'a>, ModelError> {
        let mut opts = opts;
        opts.n_batch = opts.n_batch.max(1);
        opts.head_group = opts.head_group.max(1);
        opts.threads = opts.threads.clamp(1, MAX_WORKERS);
        if cfg.head_dim > MAX_HEAD_DIM {
            return Err(ModelError::BadShape(
                "head_dim above 256 (attention scratch)",
            ));
        }
        let (nb, g) = (opts.n_batch, opts.head_group);
        let maxd = cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff);
        let kv = KvCache::new(arena, opts.kv, cfg.n_layer, opts.n_ctx, cfg.kv_dim())?;
        let a = "activations";
        let s = Scratch {
            x: arena.slice(a, nb * cfg.n_embd)?,
            xn: arena.slice(a, nb.max(g) * cfg.n_embd.max(cfg.q_dim()))?,
            q: arena.slice(a, nb * cfg.q_dim())?,
            k: arena.slice(a, nb * cfg.kv_dim())?,
            v: arena.slice(a, nb * cfg.kv_dim())?,
            att: arena.slice(a, nb * cfg.q_dim())?,
            gate: arena.slice(a, nb * cfg.n_ff)?,
            up: arena.slice(a, nb * cfg.n_ff)?,
            scores: arena.slice(a, opts.threads * opts.n_ctx)?,
            // f32 activations are the widest format (4 bytes per value).
            act_q: arena.bytes(a, nb.max(g) * maxd * 4)?,
            mm_tmp: arena.slice(a, (nb * maxd).max(cfg.n_vocab * g))?,
            row: arena.slice(a, maxd)?,
            logits: arena.slice("logits", cfg.n_vocab * g)?,
            head_logits: arena.slice(
                "logits",
                if w.head_ids.is_some() {
                    w.output.rows * g
                } else {
                    0
                },
            )?,
            gelu: arena.slice(
                "activations",
                if cfg.ffn_act == FfnAct::GeluTanh {
                    1 << 16
                } else {
                    0
                },
            )?,
        };
        ops::gelu_table_fill(s.gelu);
        Ok(Session {
            cfg,
            w,
            kv,
            opts,
            n_past: 0,
            profile: Profile::default(),
            s,
        })
    }

    /// Forget the conversation (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Run `tokens` at positions `n_past..`, calling `on_logits(i, logits)` for the
    /// positions `which` selects (i indexes `tokens`).
    pub fn eval<P: Platform>(
        &mut self,
        p: &P,
        tokens: &[u32],
        which: Logits,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        let needed = self.n_past + tokens.len();
        if needed > self.opts.n_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: self.opts.n_ctx,
                needed,
            });
        }
        for &t in tokens {
            if t as usize >= self.cfg.n_vocab {
                return Err(ModelError::BadToken {
                    id: t,
                    n_vocab: self.cfg.n_vocab,
                });
            }
        }
        let nb = self.opts.n_batch;
        let mut start = 0;
        while start < tokens.len() {
            let end = (start + nb).min(tokens.len());
            let chunk = &tokens[start..end];
            self.layers(p, chunk)?;
            let last_chunk = end == tokens.len();
            let sel: Range<usize> = match which {
                Logits::All => 0..chunk.len(),
                Logits::Last if last_chunk => chunk.len() - 1..chunk.len(),
                _ => 0..0,
            };
            self.head(p, sel, start, on_logits)?;
            self.n_past += chunk.len();
            start = end;
        }
        Ok(())
    }

    /// All transformer blocks for one batch; leaves the residual stream in `s.x`.
    fn layers<P: Platform>(&mut self, p: &P, tokens: &[u32]) -> Result<(), ModelError> {
        let c = self.cfg;
        let n = tokens.len();
        let pos0 = self.n_past;
        let (e, qd, kvd, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.head_dim);
        let mm = MatMul {
            p,
            math: self.opts.math,
            threads: self.opts.threads,
            cpu: self.opts.cpu,
        };
        let s = &mut self.s;
        let prof = &mut self.profile;
        let mut t0 = p.now_ns();
        let mut lap = |op: Op, prof: &mut Profile| {
            let t1 = p.now_ns();
            prof.add(op, t0, t1);
            t0 = t1;
        };

        // Input embeddings.
        for (t, &id) in tokens.iter().enumerate() {
            let xt = &mut s.x[t * e..(t + 1) * e];
            dequantize_row(self.w.token_embd.ty, self.w.token_embd.row(id as usize), xt)?;
            if let Some(scale) = c.embd_scale {
                ops::scale_inplace(xt, scale);
            }
        }

        lap(Op::Embed, prof);
        for (il, lw) in self.w.layers.iter().enumerate() {
            // Attention block.
            for t in 0..n {
                rms_norm(
                    &s.x[t * e..(t + 1) * e],
                    lw.attn_norm,
                    c.rms_eps,
                    &mut s.xn[t * e..(t + 1) * e],
                );
            }
            lap(Op::NormsAndAdds, prof);
            let xn = &s.xn[..n * e];
            mm.linear(&lw.wq, xn, n, &mut s.q[..n * qd], s.act_q, s.mm_tmp, s.row)?;
            mm.linear(&lw.wk, xn, n, &mut s.k[..n * kvd], s.act_q, s.mm_tmp, s.row)?;
            mm.linear(&lw.wv, xn, n, &mut s.v[..n * kvd], s.act_q, s.mm_tmp, s.row)?;
            lap(Op::QkvProj, prof);
            for t in 0..n {
                add_bias(&mut s.q[t * qd..(t + 1) * qd], lw.bq);
                add_bias(&mut s.k[t * kvd..(t + 1) * kvd], lw.bk);
                add_bias(&mut s.v[t * kvd..(t + 1) * kvd], lw.bv);
            }
            let swa = c.is_swa(il);
            let (base, fscale) = if swa {
                (c.rope_base_swa, 1.0)
            } else {
                (c.rope_base, c.rope_freq_scale)
            };
            let q_scale = 1.0 / libm::sqrtf(hd as f32);
            for t in 0..n {
                let pos = pos0 + t;
                for h in s.q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                    if let Some(g) = lw.q_norm {
                        rms_norm_inplace(h, g, c.rms_eps);
                    }
                    rope(h, pos, c.n_rot, base, fscale, c.rope_kind);
                    if c.scale_q {
                        ops::scale_inplace(h, q_scale);
                    }
                }
                for h in s.k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                    if let Some(g) = lw.k_norm {
                        rms_norm_inplace(h, g, c.rms_eps);
                    }
                    rope(h, pos, c.n_rot, base, fscale, c.rope_kind);
                }
                self.kv.k[il].write(pos, &s.k[t * kvd..(t + 1) * kvd]);
                self.kv.v[il].write(pos, &s.v[t * kvd..(t + 1) * kvd]);
            }
            let kq_scale = if c.scale_q { 1.0 } else { q_scale };
            let at = Attend {
                cfg: &c,
                k: &self.kv.k[il],
                v: &self.kv.v[il],
                pos0,
                swa,
                kq_scale,
                skip: self.opts.attn_skip,
                cpu: self.opts.cpu,
            };
            lap(Op::RopeAndCache, prof);
            at.run(
                p,
                self.opts.threads,
                &s.q[..n * qd],
                &mut s.att[..n * qd],
                s.scores,
            );
            lap(Op::Attention, prof);
            mm.linear(
                &lw.wo,
                &s.att[..n * qd],
                n,
                &mut s.xn[..n * e],
                s.act_q,
                s.mm_tmp,
                s.row,
            )?;
            lap(Op::OutProj, prof);
            for t in 0..n {
                let o = &mut s.xn[t * e..(t + 1) * e];
                if let Some(g) = lw.post_attn_norm {
                    rms_norm_inplace(o, g, c.rms_eps);
                }
                ops::add_inplace(&mut s.x[t * e..(t + 1) * e], o);
            }

            // Feed-forward block.
            for t in 0..n {
                rms_norm(
                    &s.x[t * e..(t + 1) * e],
                    lw.ffn_norm,
                    c.rms_eps,
                    &mut s.xn[t * e..(t + 1) * e],
                );
            }
            lap(Op::NormsAndAdds, prof);
            let xn = &s.xn[..n * e];
            let f = c.n_ff;
            mm.linear(
                &lw.w_gate,
                xn,
                n,
                &mut s.gate[..n * f],
                s.act_q,
                s.mm_tmp,
                s.row,
            )?;
            mm.linear(
                &lw.w_up,
                xn,
                n,
                &mut s.up[..n * f],
                s.act_q,
                s.mm_tmp,
                s.row,
            )?;
            lap(Op::FfnGateUp, prof);
            match c.ffn_act {
                FfnAct::Silu => ops::swiglu(&mut s.gate[..n * f], &s.up[..n * f]),
                FfnAct::GeluTanh => {
                    ops::geglu_with_table(&mut s.gate[..n * f], &s.up[..n * f], s.gelu)
                }
            }
            lap(Op::FfnAct, prof);
            mm.linear(
                &lw.w_down,
                &s.gate[..n * f],
                n,
                &mut s.xn[..n * e],
                s.act_q,
                s.mm_tmp,
                s.row,
            )?;
            lap(Op::FfnDown, prof);
            for t in 0..n {
                let d = &mut s.xn[t * e..(t + 1) * e];
                if let Some(g) = lw.post_ffn_norm {
                    rms_norm_inplace(d, g, c.rms_eps);
                }
                ops::add_inplace(&mut s.x[t * e..(t + 1) * e], d);
            }
            lap(Op::NormsAndAdds, prof);
        }
        Ok(())
    }

    /// Final norm and LM head for batch positions `sel`; `base` is the index of the
    /// batch's first token in the caller's token list.
    fn head<P: Platform>(
        &mut self,
        p: &P,
        sel: Range<usize>,
        base: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        let c = self.cfg;
        let (e, nv) = (c.n_embd, c.n_vocab);
        let mm = MatMul {
            p,
            math: self.opts.math,
            threads: self.opts.threads,
            cpu: self.opts.cpu,
        };
        let g = self.opts.head_group;
        let s = &mut self.s;
        let mut t0 = sel.start;
        while t0 < sel.end {
            let start_ns = p.now_ns();
            let t1 = (t0 + g).min(sel.end);
            let m = t1 - t0;
            for i in 0..m {
                let t = t0 + i;
                rms_norm(
                    &s.x[t * e..(t + 1) * e],
                    self.w.output_norm,
                    c.rms_eps,
                    &mut s.xn[i * e..(i + 1) * e],
                );
            }
            match self.w.head_ids {
                None => mm.linear(
                    &self.w.output,
                    &s.xn[..m * e],
                    m,
                    &mut s.logits[..m * nv],
                    s.act_q,
                    s.mm_tmp,
                    s.row,
                )?,
                Some(ids) => {
                    let k = self.w.output.rows;
                    mm.linear(
                        &self.w.output,
                        &s.xn[..m * e],
                        m,
                        &mut s.head_logits[..m * k],
                        s.act_q,
                        s.mm_tmp,
                        s.row,
                    )?;
                    // Callers keep a full-vocabulary view; ids the head dropped can
                    // never be sampled and score as impossible.
                    for i in 0..m {
                        let l = &mut s.logits[i * nv..(i + 1) * nv];
                        l.fill(f32::NEG_INFINITY);
                        for (&id, &v) in ids.iter().zip(&s.head_logits[i * k..(i + 1) * k]) {
                            if let Some(slot) = l.get_mut(id as usize) {
                                *slot = v;
                            }
                        }
                    }
                }
            }
            let t_end = p.now_ns();
            for i in 0..m {
                on_logits(base + t0 + i, &s.logits[i * nv..(i + 1) * nv]);
            }
            self.profile.ns[Op::LmHead as usize] += t_end.saturating_sub(start_ns);
            t0 = t1;
        }
        Ok(())
    }
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        ops::add_inplace(x, b);
    }
}

/// Matrix products on the session's math mode and workers.
struct MatMul<'p, P: Platform> {
    p: &'p P,
    math: Math,
    threads: usize,
    cpu: CpuFeatures,
}

impl<P: Platform> MatMul<'_, P> {
    /// `out[t * rows + r] = dot(w row r, x[t])` for `n` activation rows of `w.cols`.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        w: &Tensor,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
    ) -> Result<(), ModelError> {
        let (cols, rows) = (w.cols, w.rows);
        match self.math {
            Math::Reference => {
                let row = &mut row[..cols];
                for r in 0..rows {
                    dequantize_row(w.ty, w.row(r), row)?;
                    for t in 0..n {
                        let xt = &x[t * cols..(t + 1) * cols];
                        let mut acc = 0.0f64;
                        for (a, b) in row.iter().zip(xt) {
                            acc += (*a as f64) * (*b as f64);
                        }
                        out[t * rows + r] = acc as f32;
                    }
                }
                Ok(())
            }
            Math::Fast => {
                let fmt = w.ty.act_format().ok_or(KernelError::Unsupported(w.ty))?;
                let arb = fmt.row_bytes(cols).ok_or(KernelError::Unsupported(w.ty))?;
                for t in 0..n {
                    quantize_activation(
                        fmt,
                        &x[t * cols..(t + 1) * cols],
                        &mut act_q[t * arb..(t + 1) * arb],
                    )?;
                }
                let acts = &act_q[..n * arb];
                let rb = w.row_bytes();
                let err = spin::Mutex::new(None::<KernelError>);
                let cpu = self.cpu;
                if n == 1 {
                    par_rows(self.p, self.threads, rows, 1, &mut out[..rows], &|r, o| {
                        if let Err(e) = matvec_rows(w.ty, &cpu, w.data, rb, r, acts, o) {
                            *err.lock() = Some(e);
                        }
                    });
                } else {
                    let tmp = &mut tmp[..rows * n];
                    par_rows(self.p, self.threads, rows, n, tmp, &|r, o| {
                        if let Err(e) = matmul_rows(w.ty, &cpu, w.data, rb, r, acts, arb, o) {
                            *err.lock() = Some(e);
                        }
                    });
                    for r in 0..rows {
                        for t in 0..n {
                            out[t * rows + r] = tmp[r * n + t];
                        }
                    }
                }
                match err.into_inner() {
                    Some(e) => Err(e.into()),
                    None => Ok(()),
                }
            }
        }
    }
}

type RowChunk<'o> = spin::Mutex<(Range<usize>, &'o mut [f32])>;

/// Split `rows` (with `n_tok` outputs each, row-major in `out`) across workers.
fn par_rows<P: Platform>(
    p: &P,
    threads: usize,
    rows: usize,
    n_tok: usize,
    out: &mut [f32],
    f: &(dyn Fn(Range<usize>, &mut [f32]) + Sync),
) {
    let nt = threads
        .min(p.workers())
        .clamp(1, MAX_WORKERS)
        .min(rows.max(1));
    if nt == 1 {
        f(0..rows, out);
        return;
    }
    let mut parts: heapless::Vec<RowChunk<'_>, MAX_WORKERS> = heapless::Vec::new();
    let mut rest = out;
    let mut start = 0;
    for i in 0..nt {
        // Chunk edges on multiples of 8 rows so interleaved kernels see whole groups.
        let end = if i + 1 == nt {
            rows
        } else {
            (rows * (i + 1) / nt) / 8 * 8
        };
        let end = end.max(start);
        let (a, b) = core::mem::take(&mut rest).split_at_mut((end - start) * n_tok);
        let _ = parts.push(spin::Mutex::new((start..end, a)));
        rest = b;
        start = end;
    }
    p.parallel(nt, &|i| {
        let mut g = parts[i].lock();
        let (r, o) = &mut *g;
        if r.start < r.end {
            f(r.clone(), o);
        }
    });
}

/// One layer's attention over the cache for a batch of queries.
struct Attend<'k, 'c> {
    cfg: &'c Config,
    k: &'k KvPlane<'k>,
    v: &'k KvPlane<'k>,
    pos0: usize,
    swa: bool,
    kq_scale: f32,
    skip: bool,
    cpu: CpuFeatures,
}

type AttnChunk<'o> = spin::Mutex<(Range<usize>, &'o mut [f32], &'o mut [f32])>;

impl Attend<'_, '_> {
    /// `att[t][h] = softmax(q[t][h] · K / sqrt(d)) · V` for every query `t` and head
    /// `h`, the (t, h) pairs split across workers (each with its own score buffer).
    fn run<P: Platform>(
        &self,
        p: &P,
        threads: usize,
        q: &[f32],
        att: &mut [f32],
        scores: &mut [f32],
    ) {
        let c = self.cfg;
        let hd = c.head_dim;
        let items = att.len() / hd;
        let n_ctx = scores.len() / threads.max(1);
        let nt = threads
            .min(p.workers())
            .clamp(1, MAX_WORKERS)
            .min(items.max(1));
        if nt == 1 {
            self.items(0..items, q, att, &mut scores[..n_ctx]);
            return;
        }
        let mut parts: heapless::Vec<AttnChunk<'_>, MAX_WORKERS> = heapless::Vec::new();
        let (mut rest_a, mut rest_s) = (att, scores);
        let mut start = 0;
        for i in 0..nt {
            let end = items * (i + 1) / nt;
            let (a, b) = core::mem::take(&mut rest_a).split_at_mut((end - start) * hd);
            let (sa, sb) = core::mem::take(&mut rest_s).split_at_mut(n_ctx);
            let _ = parts.push(spin::Mutex::new((start..end, a, sa)));
            rest_a = b;
            rest_s = sb;
            start = end;
        }
        p.parallel(nt, &|w| {
            let mut g = parts[w].lock();
            let (r, a, sc) = &mut *g;
            self.items(r.clone(), q, a, sc);
        });
    }

    /// Items `r` (index = t * n_head + h) into `out` (which starts at item `r.start`).
    fn items(&self, r: Range<usize>, q: &[f32], out: &mut [f32], scores: &mut [f32]) {
        let c = self.cfg;
        let (hd, qd) = (c.head_dim, c.q_dim());
        let group = c.n_head / c.n_head_kv;
        let mut lanes = [0.0f32; 16 * MAX_HEAD_DIM];
        let lanes = &mut lanes[..16 * hd];
        for (i, item) in r.enumerate() {
            let (t, h) = (item / c.n_head, item % c.n_head);
            let pos = self.pos0 + t;
            let first = if self.swa {
                (pos + 1).saturating_sub(c.n_swa)
            } else {
                0
            };
            let off = (h / group) * hd;
            let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
            let sc = &mut scores[..pos + 1 - first];
            for (j, v) in sc.iter_mut().enumerate() {
                *v = attn::dot(&self.cpu, self.k.row(first + j, off, hd), qh) * self.kq_scale;
            }
            ops::softmax_skip_on(
                &self.cpu,
                sc,
                if self.skip {
                    SKIP_LOG_RATIO
                } else {
                    f32::NEG_INFINITY
                },
            );
            // llama.cpp multiplies V^T by the scores with tinyBLAS: 16 lanes over the key
            // positions (position j in lane j % 16), fused multiply-adds, the
            // `_mm512_reduce_add_ps` tree per output. A zero weight adds exactly nothing,
            // so skipped keys cost no V read and change no bit.
            lanes.fill(0.0);
            for (j, w) in sc.iter().enumerate() {
                if *w != 0.0 {
                    let l = (j % 16) * hd;
                    attn::fma_row(
                        &self.cpu,
                        self.v.row(first + j, off, hd),
                        *w,
                        &mut lanes[l..l + hd],
                    );
                }
            }
            let o = &mut out[i * hd..(i + 1) * hd];
            for (d, od) in o.iter_mut().enumerate() {
                *od = hsum16(core::array::from_fn(|l| lanes[l * hd + d]));
            }
        }
    }
}

/// ln(1e-4): keys whose score is this far below the best get weight 0.
const SKIP_LOG_RATIO: f32 = -9.210_34;
