//! The attention token mixer: q, k, v projections (with optional biases and per-head
//! norms), rope, the layer's KV plane, softmax attention over it (full or sliding
//! window), and the output projection.
//!
//! ```text
//! q,k,v = xn·Wq,Wk,Wv [+b] ; [qk-norm] ; rope ; cache k,v
//! a = softmax(q·K / sqrt(d)) · V ; [a *= sigmoid(gate)] ; xn = a·Wo
//! ```
//!
//! Gated attention (qwen35): `Wq` has two rows per q row, `[q_h | gate_h]` per head.
use core::ops::Range;

use pinch_kernels::attn;
use pinch_kernels::attn_q8;
use pinch_kernels::ops::{self, rope_apply_with};
use pinch_kernels::quant::q8_0::{BLOCK_BYTES, QK};
use pinch_kernels::CpuFeatures;

use crate::model::config::Config;
use crate::model::forward::{Placement, MAX_WORKERS};
use crate::model::kv::{KvPlane, Rows};
use crate::model::layer::Cx;
use crate::model::weights::{Loader, Names, Tensor, Vector};
use crate::model::{ModelError, Op};
use crate::platform::Platform;

/// One attention layer's weights.
#[derive(Clone, Copy)]
pub struct Attention<'a> {
    pub wq: Tensor<'a>,
    pub wk: Tensor<'a>,
    pub wv: Tensor<'a>,
    pub wo: Tensor<'a>,
    pub bq: Option<Vector<'a>>,
    pub bk: Option<Vector<'a>>,
    pub bv: Option<Vector<'a>>,
    pub q_norm: Option<Vector<'a>>,
    pub k_norm: Option<Vector<'a>>,
    /// KV heads of this layer.
    pub n_head_kv: usize,
    /// Sliding-window layer (sees the last `n_swa` positions, its own rope base).
    pub swa: bool,
    /// A fused `attn_qkv` (rows `[q; k; v]`, bailingmoe2): then `wq`, `wk`, `wv` are its
    /// row ranges, taken again when the block runs (the stream zone or the repack
    /// cache may have changed its bytes or layout since load).
    pub fused_qkv: Option<Tensor<'a>>,
    /// `Wq` also projects an output gate per head (see the module doc).
    pub gated: bool,
}

/// One attention layer's state: its keys and values for every position (of every
/// sequence).
pub struct KvState<'a> {
    pub k: KvPlane<'a>,
    pub v: KvPlane<'a>,
}

impl KvState<'_> {
    /// Reads and writes go to sequence `seq`'s rows.
    pub fn select(&mut self, seq: usize) {
        self.k.select(seq);
        self.v.select(seq);
    }
}

impl<'a> Attention<'a> {
    /// The matrices' GGUF suffixes, in the order the block uses them (and
    /// [`Self::visit_matrices`] visits them).
    pub const MATRICES: [&'static str; 4] = [
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
    ];

    /// Layer `il`'s attention; a streamed layer's matrices are described, not read.
    pub fn load<P: Platform>(
        l: &mut Loader<'_, '_, 'a, P>,
        c: &Config,
        il: usize,
        streamed: bool,
    ) -> Result<Attention<'a>, ModelError> {
        let n_head_kv = c.layer(il).n_head_kv;
        let (qd, kvd) = (c.q_dim(), n_head_kv * c.head_dim);
        let mut n = Names::new(il);
        let [q, k, v, o] = Self::MATRICES;
        let fused_qkv = if l.gguf.tensor(n.get(FUSED_QKV)).is_some() {
            Some(l.layer_matrix(n.get(FUSED_QKV), c.n_embd, qd + 2 * kvd, streamed)?)
        } else {
            None
        };
        let [wq, wk, wv] = match &fused_qkv {
            Some(t) => split_qkv(t, qd, kvd)?,
            None => [
                l.layer_matrix(
                    n.get(q),
                    c.n_embd,
                    qd * (1 + c.gated_attn as usize),
                    streamed,
                )?,
                l.layer_matrix(n.get(k), c.n_embd, kvd, streamed)?,
                l.layer_matrix(n.get(v), c.n_embd, kvd, streamed)?,
            ],
        };
        let at = Attention {
            wq,
            wk,
            wv,
            fused_qkv,
            wo: l.layer_matrix(n.get(o), qd, c.n_embd, streamed)?,
            bq: l.opt_vector(n.get("attn_q.bias"), qd)?,
            bk: l.opt_vector(n.get("attn_k.bias"), kvd)?,
            bv: l.opt_vector(n.get("attn_v.bias"), kvd)?,
            q_norm: l.opt_vector(n.get("attn_q_norm.weight"), c.head_dim)?,
            k_norm: l.opt_vector(n.get("attn_k_norm.weight"), c.head_dim)?,
            n_head_kv,
            swa: c.is_swa(il),
            gated: c.gated_attn,
        };
        if c.qk_norm && (at.q_norm.is_none() || at.k_norm.is_none()) {
            return Err(ModelError::MissingTensorNamed(
                crate::model::weights::name_buf(n.get("attn_q_norm.weight")),
            ));
        }
        if c.qkv_bias && at.bq.is_none() {
            return Err(ModelError::MissingTensorNamed(
                crate::model::weights::name_buf(n.get("attn_q.bias")),
            ));
        }
        Ok(at)
    }

    /// Every matrix with its GGUF suffix, in [`Self::MATRICES`] order (a fused
    /// `attn_qkv.weight` in place of the three).
    pub fn visit_matrices(&mut self, f: &mut dyn FnMut(&'static str, &mut Tensor<'a>)) {
        let [q, k, v, o] = Self::MATRICES;
        match &mut self.fused_qkv {
            Some(t) => f(FUSED_QKV, t),
            None => {
                f(q, &mut self.wq);
                f(k, &mut self.wk);
                f(v, &mut self.wv);
            }
        }
        f(o, &mut self.wo);
    }

    /// `cx.s.xn` (the normed input of `n` tokens placed by `at`) → `cx.s.xn` (the
    /// attention output), writing this layer's keys and values into `kv`. The
    /// projections take all rows at once; with one row per sequence, each row's keys go
    /// to its sequence's region and its queries attend over that region alone.
    pub fn run<P: Platform>(
        &self,
        cx: &mut Cx<'_, '_, '_, P>,
        kv: &mut KvState<'_>,
        n: usize,
        at: Placement<'_>,
    ) -> Result<(), ModelError> {
        let c = cx.cfg;
        let hd = c.head_dim;
        let (e, qd, kvd) = (c.n_embd, c.q_dim(), self.n_head_kv * hd);
        let s = &mut *cx.s;
        let [wq, wk, wv] = match &self.fused_qkv {
            Some(t) => split_qkv(t, qd, kvd)?,
            None => [self.wq, self.wk, self.wv],
        };
        let wq_rows = wq.rows;
        cx.mm.linear_many(
            &s.xn[..n * e],
            n,
            &mut [
                (&wq, &mut s.q[..n * wq_rows]),
                (&wk, &mut s.k[..n * kvd]),
                (&wv, &mut s.v[..n * kvd]),
            ],
            s.act_q,
            s.mm_tmp,
            s.row,
        )?;
        cx.clock.lap(Op::QkvProj);
        if self.gated {
            split_q_gate(&mut s.q[..2 * n * qd], &mut s.mixer[..n * qd], hd);
        }
        for t in 0..n {
            add_bias(&mut s.q[t * qd..(t + 1) * qd], self.bq);
            add_bias(&mut s.k[t * kvd..(t + 1) * kvd], self.bk);
            add_bias(&mut s.v[t * kvd..(t + 1) * kvd], self.bv);
        }
        let q_scale = 1.0 / libm::sqrtf(hd as f32);
        let nr = c.n_rot;
        // Per-head norms of all tokens first (side by side), then rope.
        if let Some(g) = self.q_norm {
            ops::rms_norm_rows_inplace(&mut s.q[..n * qd], g, c.rms_eps, hd);
        }
        if let Some(g) = self.k_norm {
            ops::rms_norm_rows_inplace(&mut s.k[..n * kvd], g, c.rms_eps, hd);
        }
        for t in 0..n {
            let pos = at.pos(t);
            if let Some(seq) = at.seq(t) {
                kv.select(seq);
            }
            let table = (2 * t + self.swa as usize) * nr;
            let angles = &s.rope[table..table + nr];
            for h in s.q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                rope_apply_with(&cx.mm.cpu, h, angles, c.rope_kind);
                if c.scale_q {
                    ops::scale_inplace(h, q_scale);
                }
            }
            for h in s.k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                rope_apply_with(&cx.mm.cpu, h, angles, c.rope_kind);
            }
            kv.k.write(&cx.mm.cpu, pos, &s.k[t * kvd..(t + 1) * kvd]);
            kv.v.write(&cx.mm.cpu, pos, &s.v[t * kvd..(t + 1) * kvd]);
        }
        cx.clock.lap(Op::RopeAndCache);
        // Consecutive positions attend together; rows of different sequences one by one,
        // each over its own region.
        let (runs, per_run) = match at {
            Placement::Run { .. } => (1, n),
            Placement::Seqs(_) => (n, 1),
        };
        for r in 0..runs {
            let t0 = r * per_run;
            if let Some(seq) = at.seq(t0) {
                kv.select(seq);
            }
            let attend = Attend {
                n_head: c.n_head,
                n_head_kv: self.n_head_kv,
                head_dim: hd,
                window: if self.swa { c.n_swa } else { 0 },
                k: &kv.k,
                v: &kv.v,
                pos0: at.pos(t0),
                kq_scale: if c.scale_q { 1.0 } else { q_scale },
                skip: cx.opts.attn_skip,
                cpu: cx.opts.cpu,
            };
            let rows = t0 * qd..(t0 + per_run) * qd;
            attend.run(
                cx.p,
                cx.opts.threads,
                &s.q[rows.clone()],
                &mut s.att[rows],
                s.scores,
            );
        }
        if self.gated {
            pinch_kernels::recurrent::mul_sigmoid(&mut s.att[..n * qd], &s.mixer[..n * qd]);
        }
        cx.clock.lap(Op::Attention);
        cx.mm.linear(
            &self.wo,
            &s.att[..n * qd],
            n,
            &mut s.xn[..n * e],
            s.act_q,
            s.mm_tmp,
            s.row,
        )?;
        cx.clock.lap(Op::OutProj);
        Ok(())
    }
}

/// The GGUF suffix of a fused q/k/v matrix.
const FUSED_QKV: &str = "attn_qkv.weight";

/// The q, k and v row ranges of a fused `[q; k; v]` matrix.
fn split_qkv<'a>(t: &Tensor<'a>, qd: usize, kvd: usize) -> Result<[Tensor<'a>; 3], ModelError> {
    Ok([
        t.row_range(0, qd)?,
        t.row_range(qd, kvd)?,
        t.row_range(qd + kvd, kvd)?,
    ])
}

/// Rows of `[q_h | gate_h]` pairs (`hd` each) → q compacted in place at the front of
/// `q` (token-major, `n_head * hd` per token) and the gates into `gate`.
fn split_q_gate(q: &mut [f32], gate: &mut [f32], hd: usize) {
    // Item i (token t, head h) reads at 2 i hd and writes q at i hd <= 2 i hd: going
    // forward never overwrites an unread value.
    for (i, g) in gate.chunks_exact_mut(hd).enumerate() {
        g.copy_from_slice(&q[(2 * i + 1) * hd..(2 * i + 2) * hd]);
        q.copy_within(2 * i * hd..(2 * i + 1) * hd, i * hd);
    }
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        ops::add_inplace(x, b);
    }
}

/// One layer's attention over the cache for a batch of queries.
struct Attend<'k> {
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    /// Sliding window (positions seen); 0 = all.
    window: usize,
    k: &'k KvPlane<'k>,
    v: &'k KvPlane<'k>,
    pos0: usize,
    kq_scale: f32,
    skip: bool,
    cpu: CpuFeatures,
}

type AttnChunk<'o> = spin::Mutex<(Range<usize>, &'o mut [f32], &'o mut [f32])>;

impl Attend<'_> {
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
        let hd = self.head_dim;
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
        let (n_head, hd) = (self.n_head, self.head_dim);
        let qd = n_head * hd;
        let group = n_head / self.n_head_kv;
        let skip = if self.skip {
            SKIP_LOG_RATIO
        } else {
            f32::NEG_INFINITY
        };
        let mut extra = [0.0f32; EXTRA_SCORES];
        let mut item = r.start;
        while item < r.end {
            let (t, h) = (item / n_head, item % n_head);
            let pos = self.pos0 + t;
            let first = if self.window > 0 {
                (pos + 1).saturating_sub(self.window)
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
            match self.k.rows(first, span, off, hd) {
                Rows::Float(k) => attn::dots(&self.cpu, &k, &qs, &mut sc),
                Rows::Q8(k) => {
                    // The queries in K's dot format (llama.cpp's flash attention does
                    // the same for a Q8_0 K).
                    let mut q8 = [[0u8; Q8_QUERY]; MAX_GROUP];
                    let rb = hd / QK * BLOCK_BYTES;
                    for (b, q) in q8.iter_mut().zip(&qs) {
                        attn_q8::quantize(q, &mut b[..rb]);
                    }
                    let q8s: heapless::Vec<&[u8], MAX_GROUP> =
                        q8[..g].iter().map(|b| &b[..rb]).collect();
                    attn_q8::dots(&self.cpu, &k, &q8s, &mut sc);
                }
            }
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
            match self.v.rows(first, span, off, hd) {
                Rows::Float(v) => attn::weighted_sum(&self.cpu, &v, &ws, &mut outs),
                Rows::Q8(v) => attn_q8::weighted_sum(&v, &ws, &mut outs),
            }
            item += g;
        }
    }
}

/// Most query heads [`Attend::items`] takes together.
const MAX_GROUP: usize = 8;

/// Bytes of one query head quantized to Q8_0 (for a Q8_0 K).
const Q8_QUERY: usize = crate::model::forward::MAX_HEAD_DIM / QK * BLOCK_BYTES;

/// Scores [`Attend::items`] keeps on the stack for a group that `scores` cannot hold.
const EXTRA_SCORES: usize = 4096;

/// ln(1e-4): keys whose score is this far below the best get weight 0.
const SKIP_LOG_RATIO: f32 = -9.210_34;
