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

use pinch_kernels::matvec::dequantize_row;
use pinch_kernels::ops::{self, rms_norm, rope_angles};
use pinch_kernels::CpuFeatures;

use crate::arena::Arena;
use crate::model::config::{Config, MixerKind};
use crate::model::draft_log::{self, shape as draft_log_shape, DraftLog};
use crate::model::hybrid::Checkpoint;
use crate::model::kv::KvType;
use crate::model::layer::{Clock, Cx, Layer, LayerState};
use crate::model::matmul::MatMul;
use crate::model::mtp::{Mtp, NoMtp};
use crate::model::scratch::Scratch;
use crate::model::stream::{Exchange, ReadFn, Schedule, Source, StreamStats, Zones};
use crate::model::weights::{Tensor, Weights, MAX_LAYERS};
use crate::model::ModelError;
use crate::platform::Platform;
use crate::residency::{EMBD_CACHE_ROWS, IO_ALIGN, STREAM_ZONES};

/// Largest head dimension the attention scratch holds (Gemma 3: 256).
pub const MAX_HEAD_DIM: usize = 256;

/// Most workers a matmul is split across.
pub const MAX_WORKERS: usize = 16;

/// Most sequences a session holds (`--parallel`).
pub const MAX_SEQS: usize = 16;

/// Where the rows of a pass go.
#[derive(Clone, Copy, Debug)]
pub enum Placement<'r> {
    /// Row t at position `pos0 + t` of the selected sequence.
    Run { pos0: usize },
    /// Row t is the token of sequence `rows[t].0` at its position `rows[t].1`.
    Seqs(&'r [(usize, usize)]),
}

impl Placement<'_> {
    /// Position of row `t`.
    #[inline]
    pub fn pos(&self, t: usize) -> usize {
        match self {
            Placement::Run { pos0 } => pos0 + t,
            Placement::Seqs(rows) => rows[t].1,
        }
    }

    /// Sequence of row `t`, when the rows name theirs.
    #[inline]
    pub fn seq(&self, t: usize) -> Option<usize> {
        match self {
            Placement::Run { .. } => None,
            Placement::Seqs(rows) => Some(rows[t].0),
        }
    }
}

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
    /// Positions `k..` of the call's tokens (perplexity scores only a window's second
    /// half, so the LM head, most of a small model's work per token when every position
    /// needs logits, skips the first).
    From(usize),
    None,
}

/// Sizes and modes of a session.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    pub n_ctx: usize,
    /// Most tokens processed per weight pass.
    pub n_batch: usize,
    /// Storage type of cached keys (`--cache-type-k`).
    pub kv: KvType,
    /// Storage type of cached values (`--cache-type-v`).
    pub kv_v: KvType,
    pub math: Math,
    pub threads: usize,
    /// Positions whose LM-head rows are computed together (when all logits are wanted).
    pub head_group: usize,
    pub cpu: CpuFeatures,
    /// Skip exp and V for keys whose score is below max + ln(1e-4) (their weight is
    /// under 1e-4 of the best key's).
    pub attn_skip: bool,
    /// Sliding-window layers keep only their window (a ring; same logits), not a row per
    /// position of the context.
    pub swa_ring: bool,
    /// Recurrent layers keep their delta-rule matrices in f16 (`--state-f16`: half the
    /// bytes; see [`crate::model::hybrid::StateMatrix`]).
    pub state_f16: bool,
    /// Sequences (conversations) the session holds, each with `n_ctx` positions of its
    /// own (`--parallel`; at most [`MAX_SEQS`]); [`Session::decode_seqs`] steps several
    /// in one weight pass.
    pub n_seq: usize,
}

impl SessionOptions {
    /// The options a session really runs with: at least one sequence, token per batch
    /// and head row, and a head group that holds one row per sequence (so one pass
    /// over the LM head serves every sequence of a [`Session::decode_seqs`]).
    pub fn clamped(&self) -> SessionOptions {
        let mut o = *self;
        o.n_seq = o.n_seq.clamp(1, MAX_SEQS);
        o.n_batch = o.n_batch.max(o.n_seq);
        o.head_group = o
            .head_group
            .max(1)
            .max(if o.n_seq > 1 { o.n_seq } else { 1 });
        o.threads = o.threads.clamp(1, MAX_WORKERS);
        o
    }
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
    /// Reading experts the pool did not hold (and guessing the next layer's).
    ExpertWait,
}

impl Op {
    pub const COUNT: usize = 12;
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
        Op::ExpertWait,
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
            Op::ExpertWait => "reading paged experts",
        }
    }
}

impl Profile {
    #[inline]
    pub(crate) fn add(&mut self, op: Op, t0: u64, t1: u64) {
        self.ns[op as usize] += t1.saturating_sub(t0);
    }
    pub fn total(&self) -> u64 {
        self.ns.iter().sum()
    }
}

/// A model plus its per-layer state and scratch: everything one conversation needs.
pub struct Session<'w, 'a> {
    pub cfg: Config,
    w: &'w Weights<'a>,
    /// Per layer: what it keeps from token to token (an attention layer's KV plane).
    state: heapless::Vec<LayerState<'a>, MAX_LAYERS>,
    pub opts: SessionOptions,
    /// Positions already in the cache of the selected sequence: changed only by
    /// `eval`, `reset`, `truncate` and `decode_seqs`.
    n_past: usize,
    /// The selected sequence (the one `eval`, `truncate`, `reset` act on).
    seq: usize,
    /// Per sequence, its positions in the cache (the selected one's is `n_past`).
    positions: heapless::Vec<usize, MAX_SEQS>,
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
    /// Recurrent models: the state before the last token of the latest prompt (see
    /// [`Self::keep_checkpoint`]).
    checkpoint: Option<Checkpoint<'a>>,
    /// Speculative decoding on a recurrent model: the state before the latest
    /// draft-verifying pass (see [`Self::eval_draft`]).
    draft_point: Option<Checkpoint<'a>>,
    /// MoE models: the expert pager (pools for paged layers, routing knobs, trace).
    experts: Option<crate::pager::ExpertPager<'a>>,
    /// The model's multi-token-prediction block, when it drafts (see `model::mtp`).
    mtp: Option<Mtp<'a>>,
}

impl<'w, 'a> Session<'w, 'a> {
    /// Bytes of the per-layer state (KV planes, recurrent state) a session with `o`
    /// keeps.
    pub fn state_bytes_needed(cfg: &Config, o: &SessionOptions) -> usize {
        let o = &o.clamped();
        (0..cfg.n_layer)
            .map(|il| LayerState::bytes_needed(cfg, il, o))
            .sum()
    }

    /// Bytes of scratch and per-layer state a session with `o` needs (for the budget
    /// plan).
    pub fn bytes_needed(cfg: &Config, o: &SessionOptions) -> usize {
        let state = Self::state_bytes_needed(cfg, o);
        Scratch::bytes_needed(cfg, &o.clamped()) + state
    }

    pub fn new(
        cfg: Config,
        w: &'w Weights<'a>,
        arena: &mut Arena<'a>,
        opts: SessionOptions,
    ) -> Result<Session<'w, 'a>, ModelError> {
        let opts = opts.clamped();
        if opts.n_seq > 1 && (0..cfg.n_layer).any(|il| cfg.layer(il).mixer != MixerKind::Attention)
        {
            return Err(ModelError::ParallelRecurrent);
        }
        if cfg.head_dim > MAX_HEAD_DIM {
            return Err(ModelError::BadShape(
                "head_dim above 256 (attention scratch)",
            ));
        }
        let q8 = |t: KvType| t == KvType::Q8_0;
        if (q8(opts.kv) || q8(opts.kv_v)) && !cfg.head_dim.is_multiple_of(32) {
            return Err(ModelError::BadShape(
                "head_dim not a multiple of 32 (q8_0 KV cache)",
            ));
        }
        let mut state = heapless::Vec::new();
        for il in 0..cfg.n_layer.min(MAX_LAYERS) {
            let _ = state.push(LayerState::new(arena, &cfg, il, &opts)?);
        }
        let head_rows = w.head_ids.map(|_| w.head_rows());
        let s = Scratch::new(arena, &cfg, &opts, head_rows)?;
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
        let experts = match cfg.moe {
            Some(_) => Some(crate::pager::ExpertPager::new(
                arena,
                &w.layers,
                w.plan.experts.slots,
                w.plan.experts.slot_bytes_max,
                crate::pager::paged::staging_slots(w.plan.experts.n_expert, w.plan.experts.n_used),
                crate::pager::Policy::LFU,
            )?),
            None => None,
        };
        Ok(Session {
            cfg,
            w,
            state,
            opts,
            n_past: 0,
            seq: 0,
            positions: (0..opts.n_seq).map(|_| 0).collect(),
            profile: Profile::default(),
            stream: StreamStats::default(),
            s,
            read: None,
            zones,
            verify: None,
            embd_cache,
            embd_tags: [u32::MAX; EMBD_CACHE_ROWS],
            checkpoint: None,
            draft_point: None,
            experts,
            mtp: None,
        })
    }

    /// The expert pager (MoE models): its counts, policy, knobs and trace.
    pub fn experts(&self) -> Option<&crate::pager::ExpertPager<'a>> {
        self.experts.as_ref()
    }
    pub fn experts_mut(&mut self) -> Option<&mut crate::pager::ExpertPager<'a>> {
        self.experts.as_mut()
    }

    /// Run `f` with the expert pager and the I/O it reads through (warm starts).
    pub fn with_expert_io<P: Platform, R>(
        &mut self,
        p: &P,
        f: impl FnOnce(&mut crate::pager::ExpertPager<'a>, &crate::pager::Io<'_>) -> R,
    ) -> Option<R> {
        let read = self.read?;
        let x = self.experts.as_mut()?;
        let threads = self.opts.threads;
        Some(crate::pager::paged::with_io(p, read, threads, |io| {
            f(x, &io)
        }))
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
        self.state.iter_mut().map(|st| st.give_back(p, n)).sum()
    }

    /// The loaded weights.
    pub fn weights(&self) -> &'w Weights<'a> {
        self.w
    }

    /// Sequences the session holds.
    pub fn n_seq(&self) -> usize {
        self.positions.len()
    }

    /// The selected sequence.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Make sequence `seq` the selected one: `eval`, `truncate`, `reset`, `n_past` and
    /// `give_back` act on it from now on.
    pub fn select_seq(&mut self, seq: usize) -> Result<(), ModelError> {
        let n_seq = self.n_seq();
        if seq >= n_seq {
            return Err(ModelError::BadSeq { seq, n_seq });
        }
        self.positions[self.seq] = self.n_past;
        self.n_past = self.positions[seq];
        self.seq = seq;
        for st in self.state.iter_mut() {
            st.select(seq);
        }
        Ok(())
    }

    /// Positions in the cache of sequence `seq` (0 for a sequence the session lacks).
    pub fn n_past_of(&self, seq: usize) -> usize {
        if seq == self.seq {
            self.n_past
        } else {
            self.positions.get(seq).copied().unwrap_or(0)
        }
    }

    /// One token for each of several sequences in one weight pass: `rows[i]` is
    /// (sequence, token), the token going to the sequence's next position. Every matrix
    /// is read once for all rows; each row attends over its own sequence's cache, so its
    /// logits are those it gets alone. `on_logits(i, logits)` for each row `i`.
    pub fn decode_seqs<P: Platform>(
        &mut self,
        p: &P,
        rows: &[(usize, u32)],
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        let n_seq = self.n_seq();
        self.positions[self.seq] = self.n_past;
        let mut places: heapless::Vec<(usize, usize), MAX_SEQS> = heapless::Vec::new();
        let mut tokens: heapless::Vec<u32, MAX_SEQS> = heapless::Vec::new();
        for &(seq, t) in rows {
            let twice = places.iter().any(|&(s, _)| s == seq);
            if seq >= n_seq || twice {
                return Err(ModelError::BadSeq { seq, n_seq });
            }
            if t as usize >= self.cfg.n_vocab {
                return Err(ModelError::BadToken {
                    id: t,
                    n_vocab: self.cfg.n_vocab,
                });
            }
            let pos = self.positions[seq];
            if pos + 1 > self.opts.n_ctx {
                return Err(ModelError::ContextFull {
                    n_ctx: self.opts.n_ctx,
                    needed: pos + 1,
                });
            }
            // Fits: rows are distinct sequences, at most MAX_SEQS.
            let _ = places.push((seq, pos));
            let _ = tokens.push(t);
        }
        if places.is_empty() {
            return Ok(());
        }
        let n = places.len();
        let res = self.pass(p, &tokens, Placement::Seqs(&places), 0..n, 0, on_logits);
        // The pass left the planes on the last row's sequence.
        for st in self.state.iter_mut() {
            st.select(self.seq);
        }
        res?;
        for &(seq, pos) in &places {
            self.positions[seq] = pos + 1;
        }
        self.n_past = self.positions[self.seq];
        Ok(())
    }

    /// Forget the conversation (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        if let Some(c) = &mut self.checkpoint {
            c.at = None;
        }
        self.n_past = 0;
    }

    /// Whether some layer keeps a recurrent state (which holds only the latest position,
    /// so [`Self::truncate`] cannot go back to an arbitrary one).
    pub fn has_recurrent(&self) -> bool {
        self.state.iter().any(|s| s.is_recurrent())
    }

    /// Positions already evaluated (the next token goes to this position).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Keep the first `n` positions and forget the rest, so the next `eval` continues at
    /// position `n`. Attention layers keep their KV rows (rows past `n` are overwritten).
    /// A recurrent layer's state holds only the latest position: such a model goes to
    /// `n = n_past` (nothing to forget), `n = 0` (the state restarts) or the position of
    /// its checkpoint ([`Self::keep_checkpoint`]), no other `n`.
    ///
    /// # Errors
    /// `n` beyond the positions evaluated: [`ModelError::Truncate`]; a recurrent model
    /// and `0 < n < n_past` other than its checkpoint: [`ModelError::TruncateRecurrent`].
    pub fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        if n > self.n_past {
            return Err(ModelError::Truncate {
                to: n,
                n_past: self.n_past,
            });
        }
        if n > 0 && n < self.n_past && self.state.iter().any(|s| s.is_recurrent()) {
            let back = self
                .checkpoint
                .as_ref()
                .is_some_and(|c| c.restore(&mut self.state, n));
            if !back {
                return Err(ModelError::TruncateRecurrent {
                    to: n,
                    n_past: self.n_past,
                });
            }
        }
        // A checkpoint past the new end no longer holds a prefix of what comes next.
        if let Some(c) = &mut self.checkpoint {
            if c.at.is_some_and(|at| at > n) {
                c.at = None;
            }
        }
        self.n_past = n;
        Ok(())
    }

    /// For a model with recurrent layers: keep a copy of their state (from `arena`,
    /// [`Checkpoint::bytes_needed`] bytes) taken before the last token of every
    /// multi-token `eval`, so that [`Self::truncate`] can return to that position (a
    /// repeated prompt then re-runs only its last token). That last token is then
    /// evaluated in a pass of its own. Nothing to do for other models.
    pub fn keep_checkpoint(&mut self, arena: &mut Arena<'a>) -> Result<(), ModelError> {
        if self.checkpoint.is_none() && self.state.iter().any(|s| s.is_recurrent()) {
            self.checkpoint = Some(Checkpoint::new(arena, &self.cfg, self.opts.state_f16)?);
        }
        Ok(())
    }

    /// Bytes [`Self::keep_draft_point`] takes for `cfg` (0 without recurrent layers).
    pub fn draft_point_bytes(cfg: &Config, state_f16: bool) -> usize {
        let logs: usize = (0..cfg.n_layer)
            .filter_map(|il| draft_log_shape(cfg, cfg.layer(il).mixer))
            .map(|(ch, w, nv)| DraftLog::bytes_needed(ch, w, nv))
            .sum();
        if logs == 0 {
            return 0;
        }
        Checkpoint::bytes_needed(cfg, state_f16) + logs
    }

    /// For a model with recurrent layers: room (from `arena`, [`Self::draft_point_bytes`])
    /// to take the recurrent state back to any position of a draft-verifying pass
    /// ([`Self::eval_draft`], [`Self::rewind_draft`]). Nothing to do for other models.
    pub fn keep_draft_point(&mut self, arena: &mut Arena<'a>) -> Result<(), ModelError> {
        if self.draft_point.is_some() || !self.has_recurrent() {
            return Ok(());
        }
        for (il, st) in self.state.iter_mut().enumerate() {
            let shape = draft_log_shape(&self.cfg, self.cfg.layer(il).mixer);
            if let (Some(r), Some((ch, w, nv))) = (st.recurrent_mut(), shape) {
                r.log = Some(DraftLog::new(arena, ch, w, nv)?);
            }
        }
        self.draft_point = Some(Checkpoint::new(arena, &self.cfg, self.opts.state_f16)?);
        Ok(())
    }

    /// Whether drafts can be verified: a model without recurrent layers, or one whose
    /// session keeps a draft point with f32 delta-rule matrices (f16 ones round once per
    /// pass, so a pass of several tokens would not give plain decoding's state).
    pub fn can_verify_drafts(&self) -> bool {
        !self.has_recurrent() || (self.draft_point.is_some() && !self.opts.state_f16)
    }

    /// Run `tokens` (the newest token and a draft) in one pass at positions `n_past..`,
    /// `on_logits` for every position, so that [`Self::rewind_draft`] can keep any
    /// prefix of them: a recurrent model saves its state first and logs what the pass
    /// feeds each recurrent layer. A single token (an empty draft) is a plain pass.
    ///
    /// # Errors
    /// As [`Self::eval`]; [`ModelError::TruncateRecurrent`] for a recurrent model that
    /// cannot verify drafts ([`Self::can_verify_drafts`]).
    pub fn eval_draft<P: Platform>(
        &mut self,
        p: &P,
        tokens: &[u32],
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        // No draft: nothing to take back, so a plain pass (no copy, no log).
        if tokens.len() <= 1 {
            return self.eval(p, tokens, Logits::All, on_logits);
        }
        let start = self.n_past;
        if self.has_recurrent() {
            let Some(dp) = self.draft_point.as_mut().filter(|_| !self.opts.state_f16) else {
                return Err(ModelError::TruncateRecurrent {
                    to: start,
                    n_past: start,
                });
            };
            dp.save(&self.state, start);
            for r in self.state.iter_mut().filter_map(|s| s.recurrent_mut()) {
                if let Some(l) = &mut r.log {
                    l.start();
                }
            }
        }
        // One pass: the prompt checkpoint would cut it before its last token.
        let prompt_point = self.checkpoint.take();
        let res = self.eval(p, tokens, Logits::All, on_logits);
        self.checkpoint = prompt_point;
        for r in self.state.iter_mut().filter_map(|s| s.recurrent_mut()) {
            if let Some(l) = &mut r.log {
                l.on = false;
            }
        }
        res
    }

    /// Keep the first `n` positions after an [`Self::eval_draft`] pass (`n` between
    /// its first position + 1 and `n_past`). Attention layers forget the rest by
    /// position; recurrent layers get the state from before the pass back and run the
    /// logged updates of the kept tokens again (no weight is read).
    ///
    /// # Errors
    /// `n` outside the pass, or a recurrent state the pass did not log:
    /// [`ModelError::TruncateRecurrent`] (the session is then unchanged).
    pub fn rewind_draft(&mut self, n: usize) -> Result<(), ModelError> {
        if n == self.n_past || !self.has_recurrent() {
            return self.truncate(n);
        }
        let refuse = ModelError::TruncateRecurrent {
            to: n,
            n_past: self.n_past,
        };
        let Some(dp) = self.draft_point.as_ref() else {
            return Err(refuse);
        };
        let Some(start) = dp.at.filter(|&a| a < n && n < self.n_past) else {
            return Err(refuse);
        };
        let m = n - start;
        let logged = self.state.iter().filter_map(|s| s.recurrent()).all(|r| {
            r.log
                .as_ref()
                .is_some_and(|l| l.logged() == self.n_past - start)
        });
        if !logged || !dp.restore(&mut self.state, start) {
            return Err(refuse);
        }
        let cpu = self.opts.cpu;
        let out = &mut self.s.mixer[..];
        let mut ok = true;
        for (il, st) in self.state.iter_mut().enumerate() {
            let delta = match self.cfg.layer(il).mixer {
                MixerKind::GatedDeltaNet => self.cfg.delta.map(|d| d.dims),
                _ => None,
            };
            if let Some(r) = st.recurrent_mut() {
                let Some(log) = r.log.take() else {
                    ok = false;
                    continue;
                };
                ok &= draft_log::replay(r, &log, m, delta, &cpu, out);
                r.log = Some(log);
            }
        }
        for r in self.state.iter_mut().filter_map(|s| s.recurrent_mut()) {
            if let Some(l) = &mut r.log {
                l.clear();
            }
        }
        if !ok {
            // The states are past repair: start the conversation over rather than
            // continue from a wrong one.
            self.reset();
            return Err(refuse);
        }
        self.n_past = n;
        if let Some(c) = &mut self.checkpoint {
            if c.at.is_some_and(|at| at > n) {
                c.at = None;
            }
        }
        Ok(())
    }

    /// Let the model's MTP block draft (`model::mtp`): from now on every pass also runs
    /// the block over its tokens, and [`Self::mtp_draft`] guesses from it. The session
    /// must be at position 0 (the block's KV cache starts empty).
    ///
    /// # Errors
    /// [`NoMtp::Parallel`] for a session of several sequences.
    pub fn attach_mtp(&mut self, mtp: Mtp<'a>) -> Result<(), NoMtp> {
        if self.n_seq() > 1 {
            return Err(NoMtp::Parallel);
        }
        self.mtp = Some(mtp);
        self.reset();
        Ok(())
    }

    /// Whether the MTP block drafts ([`Self::attach_mtp`]).
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// The MTP block over the tokens of the pass that just ran at `pos0..`: token `t`
    /// paired with the trunk's hidden state of position `t - 1` (the zero vector at
    /// position 0; also where an earlier position's state is not at hand, after a
    /// truncation: only the guesses suffer). Fills the block's KV cache; no logits.
    fn mtp_catch_up<P: Platform>(
        &mut self,
        p: &P,
        chunk: &[u32],
        pos0: usize,
    ) -> Result<(), ModelError> {
        let Some(mut m) = self.mtp.take() else {
            return Ok(());
        };
        let (e, n) = (self.cfg.n_embd, chunk.len());
        // The state before this pass's first token, before its rows are overwritten.
        m.pair_with_trunk(pos0);
        for t in 0..n {
            rms_norm(
                &self.s.x[t * e..(t + 1) * e],
                self.w.output_norm,
                self.cfg.rms_eps,
                &mut m.h_rows[t * e..(t + 1) * e],
            );
        }
        m.rows_pos0 = pos0;
        m.rows_n = n;
        let res = (|| {
            for (t, &id) in chunk.iter().enumerate() {
                let h = match t {
                    0 => &*m.h_in,
                    _ => &m.h_rows[(t - 1) * e..t * e],
                };
                let cat = &mut m.concat[t * 2 * e..(t + 1) * 2 * e];
                self.mtp_input(id, h, (m.w.enorm, m.w.hnorm), cat)?;
            }
            self.mtp_block(p, &mut m, n, pos0)
        })();
        self.mtp = Some(m);
        res
    }

    /// `[enorm(embed(id)) | hnorm(h)]` into `cat` (uses `s.xn`'s first row).
    fn mtp_input(
        &mut self,
        id: u32,
        h: &[f32],
        (enorm, hnorm): (&[f32], &[f32]),
        cat: &mut [f32],
    ) -> Result<(), ModelError> {
        let e = self.cfg.n_embd;
        let xt = core::mem::take(&mut self.s.xn);
        let r = self.embed_row(id as usize, &mut xt[..e]);
        let (ce, ch) = cat.split_at_mut(e);
        if r.is_ok() {
            rms_norm(&xt[..e], enorm, self.cfg.rms_eps, ce);
            rms_norm(h, hnorm, self.cfg.rms_eps, ch);
        }
        self.s.xn = xt;
        r
    }

    /// The block on `m.concat`'s `n` rows at positions `pos0..`: eh_proj, then its
    /// attention and FFN like a trunk layer; leaves its output rows in `s.x`.
    fn mtp_block<P: Platform>(
        &mut self,
        p: &P,
        m: &mut Mtp<'a>,
        n: usize,
        pos0: usize,
    ) -> Result<(), ModelError> {
        let c = m.cfg;
        let e = c.n_embd;
        let at = Placement::Run { pos0 };
        let mm = MatMul {
            p,
            math: self.opts.math,
            threads: self.opts.threads,
            cpu: self.opts.cpu,
        };
        let t0 = p.now_ns();
        mm.linear(
            &m.w.eh_proj,
            &m.concat[..n * 2 * e],
            n,
            &mut self.s.x[..n * e],
            m.act_q,
            m.tmp,
            m.row,
        )?;
        rope_rows(&c, at, n, self.s.rope);
        let mut cx = Cx {
            p,
            mm,
            cfg: &c,
            opts: &self.opts,
            s: &mut self.s,
            clock: Clock {
                p,
                t0,
                prof: &mut self.profile,
            },
            experts: None,
            read: self.read,
        };
        cx.clock.lap(Op::QkvProj);
        run_layer(&mut cx, &m.w.layer, &mut m.state, n, at)
    }

    /// Draft up to `out.len()` tokens after `last` (the newest token, not yet evaluated,
    /// at position `n_past`) with the MTP block, greedily: `last` with the trunk's
    /// hidden state of position `n_past - 1`, then each guess with the block's own.
    /// Stops early where the guess's probability is below `p_min` or at the context's
    /// end. Returns how many were written (0 without an MTP block).
    ///
    /// # Errors
    /// As [`Self::eval`] (a token outside the vocabulary, a failing kernel).
    pub fn mtp_draft<P: Platform>(
        &mut self,
        p: &P,
        last: u32,
        p_min: f32,
        out: &mut [u32],
    ) -> Result<usize, ModelError> {
        self.mtp_draft_logits(p, last, p_min, out, &mut |_, _| {})
    }

    /// [`Self::mtp_draft`], calling `on_logits(i, logits)` with the block's logits for
    /// the `i`-th guess.
    pub fn mtp_draft_logits<P: Platform>(
        &mut self,
        p: &P,
        last: u32,
        p_min: f32,
        out: &mut [u32],
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<usize, ModelError> {
        let Some(mut m) = self.mtp.take() else {
            return Ok(0);
        };
        let res = self.mtp_draft_with(p, &mut m, last, p_min, out, on_logits);
        self.mtp = Some(m);
        res
    }

    /// The MTP block's logits for every token of the latest pass (`on_logits(i, ..)`,
    /// `i` indexing that pass's tokens): valid only right after a pass, before anything
    /// else runs; for checking the block against llama.cpp.
    pub fn mtp_pass_logits<P: Platform>(
        &mut self,
        p: &P,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        let Some(m) = self.mtp.as_ref() else {
            return Ok(());
        };
        let norm = m.w.head_norm.unwrap_or(self.w.output_norm);
        let n = m.rows_n;
        self.head(p, 0..n, 0, norm, on_logits, &mut Source::<P>::None)
    }

    #[allow(clippy::too_many_arguments)]
    fn mtp_draft_with<P: Platform>(
        &mut self,
        p: &P,
        m: &mut Mtp<'a>,
        last: u32,
        p_min: f32,
        out: &mut [u32],
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<usize, ModelError> {
        let e = self.cfg.n_embd;
        let pos = self.n_past;
        if last as usize >= self.cfg.n_vocab {
            return Err(ModelError::BadToken {
                id: last,
                n_vocab: self.cfg.n_vocab,
            });
        }
        // The hidden state `last` pairs with: the trunk's at `pos - 1`.
        m.pair_with_trunk(pos);
        let head_norm = m.w.head_norm.unwrap_or(self.w.output_norm);
        let mut made = 0;
        let mut tok = last;
        while made < out.len() && pos + made < self.opts.n_ctx {
            let cat = core::mem::take(&mut m.concat);
            let r = self.mtp_input(tok, m.h_in, (m.w.enorm, m.w.hnorm), &mut cat[..2 * e]);
            m.concat = cat;
            r?;
            self.mtp_block(p, m, 1, pos + made)?;
            rms_norm(&self.s.x[..e], head_norm, self.cfg.rms_eps, m.h_in);
            let mut best = (0u32, f32::NEG_INFINITY, 0.0f32);
            let mut pick = |_, l: &[f32]| {
                best = argmax_p(l, p_min > 0.0);
                on_logits(made, l);
            };
            self.head(p, 0..1, 0, head_norm, &mut pick, &mut Source::<P>::None)?;
            if best.1 == f32::NEG_INFINITY || best.2 < p_min {
                break;
            }
            out[made] = best.0;
            tok = best.0;
            made += 1;
        }
        Ok(made)
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
        // With a checkpoint, a pass ends before the last token and the state is saved.
        let cut = match &self.checkpoint {
            Some(_) if tokens.len() >= 2 => tokens.len() - 1,
            _ => tokens.len(),
        };
        let mut start = 0;
        while start < tokens.len() {
            let stop = if start < cut { cut } else { tokens.len() };
            let end = (start + nb).min(stop);
            let chunk = &tokens[start..end];
            let last_chunk = end == tokens.len();
            let sel: Range<usize> = match which {
                Logits::All => 0..chunk.len(),
                Logits::From(k) => k.saturating_sub(start).min(chunk.len())..chunk.len(),
                Logits::Last if last_chunk => chunk.len() - 1..chunk.len(),
                _ => 0..0,
            };
            let at = Placement::Run { pos0: self.n_past };
            self.pass(p, chunk, at, sel, start, on_logits)?;
            self.n_past += chunk.len();
            if end == cut && cut < tokens.len() {
                if let Some(c) = &mut self.checkpoint {
                    c.save(&self.state, self.n_past);
                }
            }
            start = end;
        }
        Ok(())
    }

    /// One weight pass ([`Self::pass_trunk`]), then, when the MTP block drafts, the
    /// block over the same tokens so that its KV cache keeps up (see `model::mtp`).
    fn pass<P: Platform>(
        &mut self,
        p: &P,
        chunk: &[u32],
        at: Placement<'_>,
        sel: Range<usize>,
        base: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        self.pass_trunk(p, chunk, at, sel, base, on_logits)?;
        match at {
            Placement::Run { pos0 } if self.mtp.is_some() => self.mtp_catch_up(p, chunk, pos0),
            _ => Ok(()),
        }
    }

    /// One weight pass: the layers for `chunk`, then the head for positions `sel`,
    /// with streamed weights read alongside (see `crate::model::stream`).
    fn pass_trunk<P: Platform>(
        &mut self,
        p: &P,
        chunk: &[u32],
        at: Placement<'_>,
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
            self.layers(p, chunk, at, &mut src)?;
            return self.head(p, sel, base, self.w.output_norm, on_logits, &mut src);
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
                    res = self.layers(p, chunk, at, &mut src).and_then(|()| {
                        let norm = self.w.output_norm;
                        self.head(p, sel.clone(), base, norm, on_logits, &mut src)
                    });
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
                .layers(p, chunk, at, &mut src)
                .and_then(|()| self.head(p, sel, base, self.w.output_norm, on_logits, &mut src));
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

    /// All layers for one batch; leaves the residual stream in `s.x`.
    ///
    /// ```text
    /// per layer: xn = norm(x); xn = mixer(xn) [; xn = norm(xn)]; x += xn
    ///            xn = norm(x); xn = ffn(xn)   [; xn = norm(xn)]; x += xn
    /// ```
    fn layers<P: Platform>(
        &mut self,
        p: &P,
        tokens: &[u32],
        at: Placement<'_>,
        src: &mut Source<'_, 'a, '_, '_, P>,
    ) -> Result<(), ModelError> {
        let c = self.cfg;
        let n = tokens.len();
        let e = c.n_embd;
        let t0 = p.now_ns();

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

        rope_rows(&c, at, n, self.s.rope);

        let mut cx = Cx {
            p,
            mm: MatMul {
                p,
                math: self.opts.math,
                threads: self.opts.threads,
                cpu: self.opts.cpu,
            },
            cfg: &c,
            opts: &self.opts,
            s: &mut self.s,
            clock: Clock {
                p,
                t0,
                prof: &mut self.profile,
            },
            experts: self.experts.as_mut(),
            read: self.read,
        };
        if let Some(x) = cx.experts.as_deref_mut() {
            x.begin_pass(n);
        }
        cx.clock.lap(Op::Embed);
        let w = self.w;
        for (il, state) in self.state.iter_mut().enumerate() {
            let stored = &w.layers[il];
            let mut zone = None;
            if stored.stream.is_some() {
                zone = Some(src.fetch()?.0);
                cx.clock.lap(Op::StreamWait);
            }
            let layer = &match &zone {
                Some(z) => stored.in_zone(z)?,
                None => *stored,
            };
            run_layer(&mut cx, layer, state, n, at)?;
            if let Some(z) = zone {
                src.release(z);
            }
        }
        Ok(())
    }

    /// Final norm (`norm`: output_norm, or the MTP block's) and LM head for batch
    /// positions `sel`; `base` is the index of the batch's first token in the caller's
    /// token list. Resident head rows first, then the streamed chunks, each into its
    /// columns of the logits.
    fn head<P: Platform>(
        &mut self,
        p: &P,
        sel: Range<usize>,
        base: usize,
        norm: &[f32],
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
                    norm,
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
                    file: crate::residency::Span::default(),
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

/// One layer on the residual stream's first `n` rows (`s.x`):
///
/// ```text
/// xn = norm(x); xn = mixer(xn) [; xn = norm(xn)]; x += xn
/// xn = norm(x); xn = ffn(xn)   [; xn = norm(xn)]; x += xn
/// ```
fn run_layer<P: Platform>(
    cx: &mut Cx<'_, '_, '_, P>,
    layer: &Layer<'_>,
    state: &mut LayerState<'_>,
    n: usize,
    at: Placement<'_>,
) -> Result<(), ModelError> {
    let (e, eps) = (cx.cfg.n_embd, cx.cfg.rms_eps);
    // Token mixer.
    let s = &mut *cx.s;
    ops::rms_norm_rows(&s.x[..n * e], layer.attn_norm, eps, &mut s.xn[..n * e], e);
    cx.clock.lap(Op::NormsAndAdds);
    layer.run_mixer(cx, state, n, at)?;
    residual_add(cx.s, layer.post_mixer_norm, eps, n * e, e);

    // Feed-forward.
    let s = &mut *cx.s;
    ops::rms_norm_rows(&s.x[..n * e], layer.ffn_norm, eps, &mut s.xn[..n * e], e);
    cx.clock.lap(Op::NormsAndAdds);
    layer.run_ffn(cx, n)?;
    residual_add(cx.s, layer.post_ffn_norm, eps, n * e, e);
    cx.clock.lap(Op::NormsAndAdds);
    Ok(())
}

/// The most likely token of `logits`, its logit and, when `want_p`, its probability
/// (1 otherwise: a pass of `expf` over the vocabulary saved when no `p_min` asks).
fn argmax_p(logits: &[f32], want_p: bool) -> (u32, f32, f32) {
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, &l) in logits.iter().enumerate() {
        if l > best.1 {
            best = (i as u32, l);
        }
    }
    if !want_p {
        return (best.0, best.1, 1.0);
    }
    let sum: f32 = logits.iter().map(|&l| libm::expf(l - best.1)).sum();
    (best.0, best.1, 1.0 / sum)
}

/// Rope angles per token into `rope`, for the global and the sliding-window base: every
/// head of every layer of a kind rotates by the same ones.
fn rope_rows(c: &Config, at: Placement<'_>, n: usize, rope: &mut [f32]) {
    let nr = c.n_rot;
    for t in 0..n {
        let row = 2 * t * nr;
        let (rope_global, rope_local) = rope[row..row + 2 * nr].split_at_mut(nr);
        rope_angles(at.pos(t), nr, c.rope_base, c.rope_freq_scale, rope_global);
        if let Some(still) = &c.rope_still {
            for (sc, _) in rope_global
                .chunks_exact_mut(2)
                .zip(still)
                .filter(|(_, &s)| s)
            {
                sc[0] = 0.0;
                sc[1] = 1.0;
            }
        }
        rope_angles(at.pos(t), nr, c.rope_base_swa, 1.0, rope_local);
    }
}

/// `x += [norm(xn)]` over the first `len` values (rows of `e`).
fn residual_add(s: &mut Scratch<'_>, post_norm: Option<&[f32]>, eps: f32, len: usize, e: usize) {
    if let Some(g) = post_norm {
        ops::rms_norm_rows_inplace(&mut s.xn[..len], g, eps, e);
    }
    ops::add_inplace(&mut s.x[..len], &s.xn[..len]);
}
