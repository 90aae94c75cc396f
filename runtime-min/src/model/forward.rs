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
use pinch_kernels::matvec::{dequantize_row, quantize_activation, KernelError};
use pinch_kernels::ops::{self, rms_norm, rope_angles, rope_apply};
use pinch_kernels::repack::matmul_rows as repack_rows;
use pinch_kernels::{ActFormat, CpuFeatures};

use crate::arena::Arena;
use crate::model::config::{Config, FfnAct};
use crate::model::kv::{KvCache, KvPlane, KvType};
use crate::model::stream::{Exchange, ReadFn, Schedule, Source, StreamStats, Zones};
use crate::model::weights::{Tensor, Weights};
use crate::model::ModelError;
use crate::platform::Platform;
use crate::residency::{EMBD_CACHE_ROWS, IO_ALIGN, STREAM_ZONES};

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
    /// Waiting for streamed weights (or reading them, without an I/O thread).
    StreamWait,
}

impl Op {
    pub const COUNT: usize = 11;
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
        Op::StreamWait,
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
            Op::StreamWait => "waiting for streamed weights",
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
    /// Positions already in the cache: changed only by `eval`, `reset` and `truncate`.
    n_past: usize,
    /// Time per kind of operation since the session was made.
    pub profile: Profile,
    /// What weight streaming read and waited for since the session was made.
    pub stream: StreamStats,
    s: Scratch<'a>,
    /// Reads the model file: streamed weights and on-demand embedding rows.
    read: Option<&'w ReadFn<'w>>,
    zones: Zones<'a>,
    /// `--verify-stream`: buffer for comparing streamed units with the file.
    verify: Option<&'a mut [u8]>,
    /// On-demand input embedding rows, direct-mapped by id.
    embd_cache: &'a mut [u8],
    embd_tags: [u32; EMBD_CACHE_ROWS],
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
    gelu: &'a mut [f32],
    /// Rope (sin, cos) pairs per batch token: global base, then sliding-window base.
    rope: &'a mut [f32],
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
            + cfg.n_vocab * g
            + nb * 2 * cfg.n_rot;
        let kv = KvCache::bytes_needed(o.kv, cfg.n_layer, o.n_ctx, cfg.kv_dim());
        floats * 4 + nb.max(g) * maxd * 4 + kv + 64 * 20 + 4 * ops::GELU_TABLE_LEN
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
                    w.head_rows() * g
                } else {
                    0
                },
            )?,
            gelu: arena.slice(
                "activations",
                if cfg.ffn_act == FfnAct::GeluTanh {
                    ops::GELU_TABLE_LEN
                } else {
                    0
                },
            )?,
            rope: arena.slice("activations", nb * 2 * cfg.n_rot)?,
        };
        ops::gelu_table_fill(s.gelu);
        let mut zones = Zones::new();
        if w.plan.streams() {
            for _ in 0..STREAM_ZONES {
                let z = arena.bytes_aligned(
                    "stream zones",
                    w.plan.zone_bytes as usize,
                    IO_ALIGN as usize,
                )?;
                let _ = zones.push(z);
            }
        }
        let e = &w.token_embd;
        let cache_rows = if e.resident.rows < e.rows {
            EMBD_CACHE_ROWS
        } else {
            0
        };
        let embd_cache = arena.bytes("embedding cache", cache_rows * e.row_bytes)?;
        Ok(Session {
            cfg,
            w,
            kv,
            opts,
            n_past: 0,
            profile: Profile::default(),
            stream: StreamStats::default(),
            s,
            read: None,
            zones,
            verify: None,
            embd_cache,
            embd_tags: [u32::MAX; EMBD_CACHE_ROWS],
        })
    }

    /// Give the session the model file's reader (needed when weights are streamed or
    /// embedding rows are read on demand).
    pub fn set_reader(&mut self, read: &'w ReadFn<'w>) {
        self.read = Some(read);
    }

    /// Compare every streamed unit with a buffered read of the file (`--verify-stream`);
    /// `buf` is the comparison buffer.
    pub fn set_verify(&mut self, buf: &'a mut [u8]) {
        self.verify = Some(buf);
    }

    /// Give the OS back the KV cache pages past the positions in use (left there by an
    /// earlier, longer conversation); returns the bytes given back. The memory guard
    /// calls this before it stops a generation.
    pub fn give_back<P: Platform>(&mut self, p: &P) -> u64 {
        let n = self.n_past;
        let mut freed = 0;
        for plane in self.kv.k.iter_mut().chain(self.kv.v.iter_mut()) {
            freed += p.discard(plane.tail_bytes_mut(n));
        }
        freed
    }

    /// The loaded weights.
    pub fn weights(&self) -> &'w Weights<'a> {
        self.w
    }

    /// Forget the conversation (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Positions already evaluated (the next token goes to this position).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Keep the first `n` positions and forget the rest, so the next `eval` continues at
    /// position `n`. Attention layers keep their KV rows (rows past `n` are overwritten).
    ///
    /// # Errors
    /// `n` beyond the positions evaluated: [`ModelError::Truncate`].
    pub fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        if n > self.n_past {
            return Err(ModelError::Truncate {
                to: n,
                n_past: self.n_past,
            });
        }
        self.n_past = n;
        Ok(())
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
            let last_chunk = end == tokens.len();
            let sel: Range<usize> = match which {
                Logits::All => 0..chunk.len(),
                Logits::Last if last_chunk => chunk.len() - 1..chunk.len(),
                _ => 0..0,
            };
            self.pass(p, chunk, sel, start, on_logits)?;
            self.n_past += chunk.len();
            start = end;
        }
        Ok(())
    }

    /// One weight pass: the layers for `chunk`, then the head for positions `sel`,
    /// with streamed weights read alongside (see `crate::model::stream`).
    fn pass<P: Platform>(
        &mut self,
        p: &P,
        chunk: &[u32],
        sel: Range<usize>,
        base: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        let sched = Schedule {
            w: self.w,
            head_groups: sel.len().div_ceil(self.opts.head_group.max(1)),
        };
        if sched.is_empty() {
            let mut src = Source::<P>::None;
            self.layers(p, chunk, &mut src)?;
            return self.head(p, sel, base, on_logits, &mut src);
        }
        let read = self.read.ok_or(ModelError::NoReader)?;
        let mut zones = core::mem::take(&mut self.zones);
        let mut verify = self.verify.take();
        let res = if p.io_thread() {
            let ex = Exchange::new(core::mem::take(&mut zones));
            let mut res = Ok(());
            let mut wait_ns = 0;
            {
                let mut verify = verify.as_deref_mut();
                let mut io = || ex.reader(p, &sched, read, verify.as_deref_mut());
                let mut work = || {
                    let mut src = Source::Async {
                        p,
                        ex: &ex,
                        next: 0,
                        wait_ns: 0,
                    };
                    res = self
                        .layers(p, chunk, &mut src)
                        .and_then(|()| self.head(p, sel.clone(), base, on_logits, &mut src));
                    if let Source::Async { wait_ns: w, .. } = src {
                        wait_ns = w;
                    }
                    ex.stop();
                };
                p.overlap(&mut io, &mut work);
            }
            let (back, mut st) = ex.finish();
            zones = back;
            st.wait_ns = wait_ns;
            self.add_stream(st);
            res
        } else {
            let mut src = Source::Sync {
                p,
                zones: &mut zones,
                sched,
                read,
                verify: verify.as_deref_mut(),
                next: 0,
                stats: StreamStats::default(),
            };
            let res = self
                .layers(p, chunk, &mut src)
                .and_then(|()| self.head(p, sel, base, on_logits, &mut src));
            if let Source::Sync { mut stats, .. } = src {
                stats.passes = 1;
                self.add_stream(stats);
            }
            res
        };
        self.zones = zones;
        self.verify = verify;
        res
    }

    fn add_stream(&mut self, st: StreamStats) {
        let t = &mut self.stream;
        t.bytes += st.bytes;
        t.units += st.units;
        t.passes += st.passes;
        t.wait_ns += st.wait_ns;
        t.verified += st.verified;
    }

    /// Input embedding row `id` into `out` (resident, cached or read from the file).
    fn embed_row(&mut self, id: usize, out: &mut [f32]) -> Result<(), ModelError> {
        let e = self.w.token_embd;
        if id < e.resident.rows {
            let r = &e.resident;
            pinch_kernels::repack::dequantize_row(r.layout, e.ty, r.data, r.row_bytes(), id, out)?;
            return Ok(());
        }
        let slot = id % EMBD_CACHE_ROWS;
        let rb = e.row_bytes;
        let row = &mut self.embd_cache[slot * rb..(slot + 1) * rb];
        if self.embd_tags[slot] != id as u32 {
            let read = self.read.ok_or(ModelError::NoReader)?;
            let off = e.offset + (id * rb) as u64;
            let mut done = 0;
            while done < rb {
                let n = read(off + done as u64, &mut row[done..], false)
                    .map_err(ModelError::Platform)?;
                if n == 0 {
                    return Err(ModelError::ShortRead {
                        offset: off + done as u64,
                    });
                }
                done += n;
            }
            self.embd_tags[slot] = id as u32;
        }
        dequantize_row(e.ty, row, out)?;
        Ok(())
    }

    /// All transformer blocks for one batch; leaves the residual stream in `s.x`.
    fn layers<P: Platform>(
        &mut self,
        p: &P,
        tokens: &[u32],
        src: &mut Source<'_, 'a, '_, '_, P>,
    ) -> Result<(), ModelError> {
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
        let mut t0 = p.now_ns();

        // Input embeddings.
        for (t, &id) in tokens.iter().enumerate() {
            let xt = core::mem::take(&mut self.s.x);
            let r = self.embed_row(id as usize, &mut xt[t * e..(t + 1) * e]);
            self.s.x = xt;
            r?;
            if let Some(scale) = c.embd_scale {
                ops::scale_inplace(&mut self.s.x[t * e..(t + 1) * e], scale);
            }
        }

        // Rope angles per token, for the global and the sliding-window base: every head
        // of every layer of a kind rotates by the same ones.
        let nr = c.n_rot;
        for t in 0..n {
            let at = 2 * t * nr;
            let (g, w) = self.s.rope[at..at + 2 * nr].split_at_mut(nr);
            rope_angles(pos0 + t, nr, c.rope_base, c.rope_freq_scale, g);
            rope_angles(pos0 + t, nr, c.rope_base_swa, 1.0, w);
        }

        let s = &mut self.s;
        let prof = &mut self.profile;
        let mut lap = |op: Op, prof: &mut Profile| {
            let t1 = p.now_ns();
            prof.add(op, t0, t1);
            t0 = t1;
        };
        lap(Op::Embed, prof);
        let w = self.w;
        for il in 0..w.layers.len() {
            let stored = &w.layers[il];
            let mut zone = None;
            if stored.stream.is_some() {
                zone = Some(src.fetch()?.0);
                lap(Op::StreamWait, prof);
            }
            let lw = &match &zone {
                Some(z) => stored.in_zone(z)?,
                None => *stored,
            };
            // Attention block.
            ops::rms_norm_rows(
                &s.x[..n * e],
                lw.attn_norm,
                c.rms_eps,
                &mut s.xn[..n * e],
                e,
            );
            lap(Op::NormsAndAdds, prof);
            let xn = &s.xn[..n * e];
            mm.linear_many(
                xn,
                n,
                &mut [
                    (&lw.wq, &mut s.q[..n * qd]),
                    (&lw.wk, &mut s.k[..n * kvd]),
                    (&lw.wv, &mut s.v[..n * kvd]),
                ],
                s.act_q,
                s.mm_tmp,
                s.row,
            )?;
            lap(Op::QkvProj, prof);
            for t in 0..n {
                add_bias(&mut s.q[t * qd..(t + 1) * qd], lw.bq);
                add_bias(&mut s.k[t * kvd..(t + 1) * kvd], lw.bk);
                add_bias(&mut s.v[t * kvd..(t + 1) * kvd], lw.bv);
            }
            let swa = c.is_swa(il);
            let q_scale = 1.0 / libm::sqrtf(hd as f32);
            let nr = c.n_rot;
            // Per-head norms of all tokens first (side by side), then rope.
            if let Some(g) = lw.q_norm {
                ops::rms_norm_rows_inplace(&mut s.q[..n * qd], g, c.rms_eps, hd);
            }
            if let Some(g) = lw.k_norm {
                ops::rms_norm_rows_inplace(&mut s.k[..n * kvd], g, c.rms_eps, hd);
            }
            for t in 0..n {
                let pos = pos0 + t;
                let table = (2 * t + swa as usize) * nr;
                let angles = &s.rope[table..table + nr];
                for h in s.q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                    rope_apply(h, angles, c.rope_kind);
                    if c.scale_q {
                        ops::scale_inplace(h, q_scale);
                    }
                }
                for h in s.k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                    rope_apply(h, angles, c.rope_kind);
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
            if let Some(g) = lw.post_attn_norm {
                ops::rms_norm_rows_inplace(&mut s.xn[..n * e], g, c.rms_eps, e);
            }
            ops::add_inplace(&mut s.x[..n * e], &s.xn[..n * e]);

            // Feed-forward block.
            ops::rms_norm_rows(&s.x[..n * e], lw.ffn_norm, c.rms_eps, &mut s.xn[..n * e], e);
            lap(Op::NormsAndAdds, prof);
            let xn = &s.xn[..n * e];
            let f = c.n_ff;
            mm.linear_many(
                xn,
                n,
                &mut [
                    (&lw.w_gate, &mut s.gate[..n * f]),
                    (&lw.w_up, &mut s.up[..n * f]),
                ],
                s.act_q,
                s.mm_tmp,
                s.row,
            )?;
            lap(Op::FfnGateUp, prof);
            // Elementwise, so split across the workers by tokens (one token's 2048
            // values are not worth waking them for).
            let (up, gelu, cpu) = (&s.up[..n * f], &*s.gelu, self.opts.cpu);
            let act = |ts: Range<usize>, g: &mut [f32]| {
                let u = &up[ts.start * f..ts.end * f];
                match c.ffn_act {
                    FfnAct::Silu => ops::swiglu(g, u),
                    FfnAct::GeluTanh => ops::geglu_with_table(&cpu, g, u, gelu),
                }
            };
            par_chunks(p, self.opts.threads, n, &mut s.gate[..n * f], f, &act);
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
            if let Some(g) = lw.post_ffn_norm {
                ops::rms_norm_rows_inplace(&mut s.xn[..n * e], g, c.rms_eps, e);
            }
            ops::add_inplace(&mut s.x[..n * e], &s.xn[..n * e]);
            lap(Op::NormsAndAdds, prof);
            if let Some(z) = zone {
                src.release(z);
            }
        }
        Ok(())
    }

    /// Final norm and LM head for batch positions `sel`; `base` is the index of the
    /// batch's first token in the caller's token list. Resident head rows first, then
    /// the streamed chunks, each into its columns of the logits.
    fn head<P: Platform>(
        &mut self,
        p: &P,
        sel: Range<usize>,
        base: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
        src: &mut Source<'_, 'a, '_, '_, P>,
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
        let w = self.w;
        let k = w.head_rows();
        let sched = Schedule { w, head_groups: 0 };
        let s = &mut self.s;
        let mut t0 = sel.start;
        while t0 < sel.end {
            let start_ns = p.now_ns();
            let mut wait_ns = 0;
            let t1 = (t0 + g).min(sel.end);
            let m = t1 - t0;
            for i in 0..m {
                let t = t0 + i;
                rms_norm(
                    &s.x[t * e..(t + 1) * e],
                    w.output_norm,
                    c.rms_eps,
                    &mut s.xn[i * e..(i + 1) * e],
                );
            }
            let xn = &s.xn[..m * e];
            let dst = match w.head_ids {
                None => &mut s.logits[..m * nv],
                Some(_) => &mut s.head_logits[..m * k],
            };
            // The resident rows and every streamed chunk share one quantized input.
            let mut have = None;
            if w.output.rows > 0 {
                let (aq, tmp, row) = (&mut *s.act_q, &mut *s.mm_tmp, &mut *s.row);
                mm.linear_reusing(&w.output, xn, m, dst, k, 0, aq, tmp, row, &mut have)?;
            }
            for ci in 0..sched.head_chunks_per_group() {
                let tw = p.now_ns();
                let (zone, lead) = src.fetch()?;
                wait_ns += p.now_ns().saturating_sub(tw);
                let rows = sched.head_chunk_rows(ci);
                let rb = w.head_stream.map_or(0, |h| h.row_bytes);
                let chunk = Tensor {
                    ty: w.output.ty,
                    cols: w.output.cols,
                    rows: rows.len(),
                    data: &zone[lead..lead + rows.len() * rb],
                    layout: pinch_kernels::repack::Layout::Plain,
                };
                let (aq, tmp, row) = (&mut *s.act_q, &mut *s.mm_tmp, &mut *s.row);
                let r0 = rows.start;
                let r = mm.linear_reusing(&chunk, xn, m, dst, k, r0, aq, tmp, row, &mut have);
                src.release(zone);
                r?;
            }
            if let Some(ids) = w.head_ids {
                // Callers keep a full-vocabulary view; ids the head dropped can never be
                // sampled and score as impossible.
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
            let t_end = p.now_ns();
            for i in 0..m {
                on_logits(base + t0 + i, &s.logits[i * nv..(i + 1) * nv]);
            }
            let total = t_end.saturating_sub(start_ns);
            self.profile.ns[Op::LmHead as usize] += total - wait_ns.min(total);
            self.profile.ns[Op::StreamWait as usize] += wait_ns.min(total);
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
        self.linear_to(w, x, n, out, w.rows, 0, act_q, tmp, row)
    }

    /// [`Self::linear`] into columns `row0..row0 + w.rows` of an output whose rows
    /// (one per activation) are `stride` long: `out[t * stride + row0 + r]`.
    #[allow(clippy::too_many_arguments)]
    fn linear_to(
        &self,
        w: &Tensor,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        stride: usize,
        row0: usize,
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
    ) -> Result<(), ModelError> {
        let (cols, rows) = (w.cols, w.rows);
        match self.math {
            Math::Reference => {
                let row = &mut row[..cols];
                for r in 0..rows {
                    pinch_kernels::repack::dequantize_row(
                        w.layout,
                        w.ty,
                        w.data,
                        w.row_bytes(),
                        r,
                        row,
                    )?;
                    for t in 0..n {
                        let xt = &x[t * cols..(t + 1) * cols];
                        let mut acc = 0.0f64;
                        for (a, b) in row.iter().zip(xt) {
                            acc += (*a as f64) * (*b as f64);
                        }
                        out[t * stride + row0 + r] = acc as f32;
                    }
                }
                Ok(())
            }
            Math::Fast => {
                let fmt = w.ty.act_format().ok_or(KernelError::Unsupported(w.ty))?;
                self.quantize(fmt, x, n, cols, act_q)?;
                self.linear_pre(w, fmt, n, out, stride, row0, act_q, tmp)
            }
        }
    }

    /// Several matrices of the same input (q/k/v, gate/up): the input is quantized once
    /// per activation format, not once per matrix.
    #[allow(clippy::too_many_arguments)]
    fn linear_many(
        &self,
        x: &[f32],
        n: usize,
        jobs: &mut [(&Tensor, &mut [f32])],
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
    ) -> Result<(), ModelError> {
        let mut have = None;
        for (w, out) in jobs.iter_mut() {
            self.linear_reusing(w, x, n, out, w.rows, 0, act_q, tmp, row, &mut have)?;
        }
        Ok(())
    }

    /// [`Self::linear_to`] where `have` is the format `act_q` already holds `x` in (if
    /// any): the input is quantized only when the format changes, and `have` updated.
    #[allow(clippy::too_many_arguments)]
    fn linear_reusing(
        &self,
        w: &Tensor,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        stride: usize,
        row0: usize,
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
        have: &mut Option<ActFormat>,
    ) -> Result<(), ModelError> {
        if self.math == Math::Reference {
            return self.linear_to(w, x, n, out, stride, row0, act_q, tmp, row);
        }
        let fmt = w.ty.act_format().ok_or(KernelError::Unsupported(w.ty))?;
        if *have != Some(fmt) {
            self.quantize(fmt, x, n, w.cols, act_q)?;
            *have = Some(fmt);
        }
        self.linear_pre(w, fmt, n, out, stride, row0, act_q, tmp)
    }

    /// Quantize `n` rows of `cols` values of `x` into `act_q` (rows split across the
    /// workers when there are several).
    fn quantize(
        &self,
        fmt: ActFormat,
        x: &[f32],
        n: usize,
        cols: usize,
        act_q: &mut [u8],
    ) -> Result<(), ModelError> {
        let arb = fmt
            .row_bytes(cols)
            .ok_or(ModelError::BadShape("activation row is not whole blocks"))?;
        let err = spin::Mutex::new(None::<KernelError>);
        par_chunks(
            self.p,
            self.threads,
            n,
            &mut act_q[..n * arb],
            arb,
            &|ts, dst| {
                for (i, t) in ts.enumerate() {
                    let r = quantize_activation(
                        fmt,
                        &x[t * cols..(t + 1) * cols],
                        &mut dst[i * arb..(i + 1) * arb],
                    );
                    if let Err(e) = r {
                        *err.lock() = Some(e);
                    }
                }
            },
        );
        match err.into_inner() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// The product of `w` with `n` activation rows already quantized (by
    /// [`Self::quantize`], format `fmt`) in `act_q`, into columns `row0..` of `out`.
    #[allow(clippy::too_many_arguments)]
    fn linear_pre(
        &self,
        w: &Tensor,
        fmt: ActFormat,
        n: usize,
        out: &mut [f32],
        stride: usize,
        row0: usize,
        act_q: &[u8],
        tmp: &mut [f32],
    ) -> Result<(), ModelError> {
        let (cols, rows) = (w.cols, w.rows);
        let arb = fmt.row_bytes(cols).ok_or(KernelError::Unsupported(w.ty))?;
        let acts = &act_q[..n * arb];
        let rb = w.row_bytes();
        let err = spin::Mutex::new(None::<KernelError>);
        let cpu = self.cpu;
        if n == 1 {
            let o1 = &mut out[row0..row0 + rows];
            par_rows(self.p, self.threads, rows, 1, o1, &|r, o| {
                if let Err(e) = repack_rows(w.layout, w.ty, &cpu, w.data, rb, r, acts, arb, o) {
                    *err.lock() = Some(e);
                }
            });
        } else {
            let tmp = &mut tmp[..rows * n];
            par_rows(self.p, self.threads, rows, n, tmp, &|r, o| {
                if let Err(e) = repack_rows(w.layout, w.ty, &cpu, w.data, rb, r, acts, arb, o) {
                    *err.lock() = Some(e);
                }
            });
            // [rows][n] -> [n][stride] at column row0, tokens split across workers.
            let tmp: &[f32] = tmp;
            par_chunks(
                self.p,
                self.threads,
                n,
                &mut out[..n * stride],
                stride,
                &|ts, dst| {
                    for (i, t) in ts.enumerate() {
                        let o = &mut dst[i * stride + row0..i * stride + row0 + rows];
                        for (r, v) in o.iter_mut().enumerate() {
                            *v = tmp[r * n + t];
                        }
                    }
                },
            );
        }
        match err.into_inner() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// Split `n` items of `width` elements each (consecutive in `out`) across workers;
/// `f(items, their elements)`. Small jobs stay on the calling thread.
fn par_chunks<P: Platform, T: Send>(
    p: &P,
    threads: usize,
    n: usize,
    out: &mut [T],
    width: usize,
    f: &(dyn Fn(Range<usize>, &mut [T]) + Sync),
) {
    let nt = threads.min(p.workers()).clamp(1, MAX_WORKERS).min(n.max(1));
    if nt == 1 || n < 4 {
        f(0..n, out);
        return;
    }
    let mut parts: heapless::Vec<spin::Mutex<(Range<usize>, &mut [T])>, MAX_WORKERS> =
        heapless::Vec::new();
    let mut rest = out;
    let mut start = 0;
    for i in 0..nt {
        let end = n * (i + 1) / nt;
        let (a, b) = core::mem::take(&mut rest).split_at_mut((end - start) * width);
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
    ///
    /// The heads of one KV head and token are done together: each K and V row is read
    /// (and widened) once for all of them. Their scores go to `scores` and, when it
    /// holds fewer than the group, to a buffer on the stack; a group that fits neither
    /// is split.
    fn items(&self, r: Range<usize>, q: &[f32], out: &mut [f32], scores: &mut [f32]) {
        let c = self.cfg;
        let (hd, qd, kvd) = (c.head_dim, c.q_dim(), c.kv_dim());
        let group = c.n_head / c.n_head_kv;
        let skip = if self.skip {
            SKIP_LOG_RATIO
        } else {
            f32::NEG_INFINITY
        };
        let mut extra = [0.0f32; EXTRA_SCORES];
        let mut item = r.start;
        while item < r.end {
            let (t, h) = (item / c.n_head, item % c.n_head);
            let pos = self.pos0 + t;
            let first = if self.swa {
                (pos + 1).saturating_sub(c.n_swa)
            } else {
                0
            };
            let span = pos + 1 - first;
            let fit = scores.len() / span + extra.len() / span;
            let g = (group - h % group)
                .min(r.end - item)
                .min(fit)
                .clamp(1, MAX_GROUP);
            let mut sc: heapless::Vec<&mut [f32], MAX_GROUP> = heapless::Vec::new();
            let (mut a, mut b) = (&mut scores[..], &mut extra[..]);
            for _ in 0..g {
                let src = if a.len() >= span { &mut a } else { &mut b };
                let (x, y) = core::mem::take(src).split_at_mut(span);
                *src = y;
                let _ = sc.push(x);
            }
            let qs: heapless::Vec<&[f32], MAX_GROUP> = (h..h + g)
                .map(|hh| &q[t * qd + hh * hd..t * qd + (hh + 1) * hd])
                .collect();
            // Rows `first..=pos` of this KV head: `hd` values every `kvd`.
            let off = (h / group) * hd;
            let len = (span - 1) * kvd + hd;
            let k = attn::KvRows::new(self.k.row(first, off, len), kvd, hd, span);
            attn::dots(&self.cpu, &k, &qs, &mut sc);
            for s in sc.iter_mut() {
                for v in s.iter_mut() {
                    *v *= self.kq_scale;
                }
                ops::softmax_skip_on(&self.cpu, s, skip);
            }
            // llama.cpp multiplies V^T by the scores with tinyBLAS: 16 lanes over the key
            // positions (position j in lane j % 16), fused multiply-adds, the
            // `_mm512_reduce_add_ps` tree per output. A zero weight adds exactly nothing,
            // so skipped keys cost no V read and change no bit.
            let ws: heapless::Vec<&[f32], MAX_GROUP> = sc.iter().map(|s| &**s).collect();
            let i0 = item - r.start;
            let mut outs: heapless::Vec<&mut [f32], MAX_GROUP> =
                out[i0 * hd..(i0 + g) * hd].chunks_mut(hd).collect();
            let v = attn::KvRows::new(self.v.row(first, off, len), kvd, hd, span);
            attn::weighted_sum(&self.cpu, &v, &ws, &mut outs);
            item += g;
        }
    }
}

/// Most query heads [`Attend::items`] takes together.
const MAX_GROUP: usize = 8;

/// Scores [`Attend::items`] keeps on the stack for a group that `scores` cannot hold.
const EXTRA_SCORES: usize = 4096;

/// ln(1e-4): keys whose score is this far below the best get weight 0.
const SKIP_LOG_RATIO: f32 = -9.210_34;
