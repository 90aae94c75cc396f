//! The mixture-of-experts feed-forward block: a router picks `n_used` of `n_expert`
//! SwiGLU experts per token (see [`crate::model::moe_route`]), only those run, and their
//! outputs are added with the router's weights; an optional shared expert runs for
//! every token and is added on top (bailingmoe2).
//!
//! ```text
//! ids, w = route(xn · W_router)
//! out    = sum_j w_j · down_{ids_j}(silu(gate_{ids_j} · xn) * (up_{ids_j} · xn))
//!          [+ down_sh(silu(gate_sh · xn) * (up_sh · xn))]
//! ```
//!
//! The experts are GGUF 3-D tensors `[cols, rows, n_expert]`: expert `e`'s rows are one
//! contiguous byte range, so an expert is a 2-D [`Tensor`] view of it ([`expert`]).
//! A batch of prompt tokens is grouped by expert: one matrix product per expert over the
//! tokens that chose it, so every chosen expert's weights are read once per batch. Each
//! token's weighted expert outputs are then added in expert order; llama.cpp adds them
//! in the router's rank order, which gives the same bits for two experts per token and
//! may differ in the last bit for more.
use crate::arena::Arena;
use crate::model::config::Config;
use crate::model::layer::Cx;
use crate::model::matmul::MatMul;
use crate::model::moe_route::{self, MoeConfig};
use crate::model::weights::{name_buf, read_exact, Loader, Names, Tensor, Vector};
use crate::model::{ModelError, Op};
use crate::platform::Platform;

/// The matrix products the block needs, lent by the caller with its workers, math mode
/// and scratch (the session's `MatMul`; a naive f32 product in the tests).
pub trait Products {
    /// `out[t * w.rows + r] = dot(w row r, x[t])` for `n` rows of `w.cols` values.
    fn linear(
        &mut self,
        w: &Tensor,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError>;
    /// Two matrices of the same input (gate and up); the session's implementation
    /// quantizes the input once.
    fn linear_pair(
        &mut self,
        a: &Tensor,
        b: &Tensor,
        x: &[f32],
        n: usize,
        out_a: &mut [f32],
        out_b: &mut [f32],
    ) -> Result<(), ModelError> {
        self.linear(a, x, n, out_a)?;
        self.linear(b, x, n, out_b)
    }
    /// One token through several matrices of the same input; the session's
    /// implementation runs them as one split across its workers.
    fn linear_many(
        &mut self,
        x: &[f32],
        jobs: &mut [(&Tensor, &mut [f32])],
    ) -> Result<(), ModelError> {
        for (w, out) in jobs.iter_mut() {
            self.linear(w, x, 1, out)?;
        }
        Ok(())
    }
    /// One token through several matrices, each `(w, x, out)` with its own input; the
    /// session's implementation runs them as one split across its workers.
    fn linear_each(
        &mut self,
        jobs: &mut [(&Tensor, &[f32], &mut [f32])],
    ) -> Result<(), ModelError> {
        for (w, x, out) in jobs.iter_mut() {
            self.linear(w, x, 1, out)?;
        }
        Ok(())
    }
    /// Charge the time since the last lap to `op` (the session's profile).
    fn lap(&mut self, _op: Op) {}
    /// The CPU features the activations may use (the scalar path unless told).
    fn cpu(&self) -> pinch_kernels::CpuFeatures {
        pinch_kernels::CpuFeatures::SCALAR
    }
}

/// [`Products`] of the session: its `MatMul`, work buffers and profile clock.
struct SessionProducts<'m, 'b, 'c, 'p, P: Platform> {
    mm: &'m MatMul<'p, P>,
    act_q: &'b mut [u8],
    tmp: &'b mut [f32],
    row: &'b mut [f32],
    clock: &'m mut crate::model::layer::Clock<'c, 'p, P>,
}

impl<P: Platform> Products for SessionProducts<'_, '_, '_, '_, P> {
    fn linear(
        &mut self,
        w: &Tensor,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.mm.linear(w, x, n, out, self.act_q, self.tmp, self.row)
    }
    fn linear_pair(
        &mut self,
        a: &Tensor,
        b: &Tensor,
        x: &[f32],
        n: usize,
        out_a: &mut [f32],
        out_b: &mut [f32],
    ) -> Result<(), ModelError> {
        let jobs = &mut [(a, out_a), (b, out_b)];
        self.mm
            .linear_many(x, n, jobs, self.act_q, self.tmp, self.row)
    }
    fn linear_many(
        &mut self,
        x: &[f32],
        jobs: &mut [(&Tensor, &mut [f32])],
    ) -> Result<(), ModelError> {
        self.mm
            .linear_many(x, 1, jobs, self.act_q, self.tmp, self.row)
    }
    fn linear_each(
        &mut self,
        jobs: &mut [(&Tensor, &[f32], &mut [f32])],
    ) -> Result<(), ModelError> {
        self.mm.linear_each(jobs, self.act_q, self.tmp, self.row)
    }
    fn lap(&mut self, op: Op) {
        self.clock.lap(op);
    }
    fn cpu(&self) -> pinch_kernels::CpuFeatures {
        self.mm.cpu
    }
}

/// Where the block's experts come from: the 3-D stacks in memory ([`Resident`]), or the
/// expert pager's slots (`crate::pager::paged`), which this trait keeps out of the block's
/// arithmetic. Each method's default is the all-resident behaviour.
pub trait Experts {
    /// The batch of `n` tokens routes to `want` (distinct, ascending), `uses[i]` of its
    /// tokens to `want[i]`: make them available.
    fn prepare(
        &mut self,
        _block: &MoeFfn<'_>,
        _want: &[u16],
        _uses: &[u16],
        _n: usize,
    ) -> Result<(), ModelError> {
        Ok(())
    }
    /// Run `f(e, expert e's matrices)` for every expert of the prepared batch `want`
    /// (after [`Self::prepare`] and [`Self::prefetch`]): in `want`'s order, or, when
    /// `any_order`, in the order the source has them ready (experts in memory first,
    /// then each as its read comes in).
    fn each(
        &mut self,
        block: &MoeFfn<'_>,
        want: &[u16],
        any_order: bool,
        f: &mut dyn FnMut(u16, SwiGlu<'_>) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let _ = any_order;
        block.each_resident(want, f)
    }
    /// Whether every expert of `block` is a view of its stacks in memory, with no read
    /// in flight (so a token's experts may all be handed to the products at once).
    fn in_stacks(&self, _block: &MoeFfn<'_>) -> bool {
        true
    }
    /// Runtime routing knobs (`--experts`, `--moe-bias`).
    fn routing(&self) -> crate::pager::Routing {
        crate::pager::Routing::default()
    }
    /// Whether expert `e` is in memory now (for `--moe-bias`).
    fn is_resident(&self, _block: &MoeFfn<'_>, _e: u16) -> bool {
        true
    }
    /// Token `t` of the batch picked `ids` (the routing trace).
    fn record(&mut self, _block: &MoeFfn<'_>, _t: usize, _ids: &[u32]) {}
    /// Guess the next MoE layer's picks from this layer's input and read them ahead.
    fn prefetch(
        &mut self,
        _mm: &mut dyn Products,
        _block: &MoeFfn<'_>,
        _xn: &[f32],
        _n: usize,
    ) -> Result<(), ModelError> {
        Ok(())
    }
}

/// Every expert in memory, in its layer's stacks.
pub struct Resident;
impl Experts for Resident {}

/// A SwiGLU feed-forward's three matrices (the shared expert).
#[derive(Clone, Copy)]
pub struct SwiGlu<'a> {
    pub gate: Tensor<'a>,
    pub up: Tensor<'a>,
    pub down: Tensor<'a>,
}

/// One MoE layer's weights.
#[derive(Clone, Copy)]
pub struct MoeFfn<'a> {
    /// `ffn_gate_inp`: one row per expert.
    pub router: Tensor<'a>,
    /// `exp_probs_b.bias`: added to the probabilities for the choice only.
    pub bias: Option<Vector<'a>>,
    /// `ffn_{gate,up,down}_exps` with the experts' rows one after another
    /// (`rows = n_expert * rows of one expert`).
    pub gate_exps: Tensor<'a>,
    pub up_exps: Tensor<'a>,
    pub down_exps: Tensor<'a>,
    pub shared: Option<SwiGlu<'a>>,
    pub cfg: MoeConfig,
    /// The layer's index (the expert pager keeps its pool by it).
    pub il: usize,
}

/// Expert `e` of `stack`, a 3-D tensor of `n_expert` experts viewed as 2-D.
pub fn expert<'a>(stack: &Tensor<'a>, e: usize, n_expert: usize) -> Result<Tensor<'a>, ModelError> {
    let rows = stack.rows / n_expert.max(1);
    stack.row_range(e * rows, rows)
}

impl<'a> MoeFfn<'a> {
    /// Expert `e`'s matrices as views of the stacks (resident stacks only).
    pub fn expert(&self, e: usize) -> Result<SwiGlu<'a>, ModelError> {
        let ne = self.cfg.n_expert;
        Ok(SwiGlu {
            gate: expert(&self.gate_exps, e, ne)?,
            up: expert(&self.up_exps, e, ne)?,
            down: expert(&self.down_exps, e, ne)?,
        })
    }

    /// `f(e, expert e)` for each of `want`, from the stacks (resident stacks only).
    pub fn each_resident(
        &self,
        want: &[u16],
        f: &mut dyn FnMut(u16, SwiGlu<'_>) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        for &e in want {
            f(e, self.expert(e as usize)?)?;
        }
        Ok(())
    }

    /// The matrices' GGUF suffixes (router, experts, then the shared expert's).
    pub const MATRICES: [&'static str; 7] = [
        "ffn_gate_inp.weight",
        "ffn_gate_exps.weight",
        "ffn_up_exps.weight",
        "ffn_down_exps.weight",
        "ffn_gate_shexp.weight",
        "ffn_up_shexp.weight",
        "ffn_down_shexp.weight",
    ];

    /// Every matrix with its GGUF suffix, in [`Self::MATRICES`] order (the shared
    /// expert's only when the layer has one).
    pub fn visit_matrices(&mut self, f: &mut dyn FnMut(&'static str, &mut Tensor<'a>)) {
        let m = Self::MATRICES;
        f(m[0], &mut self.router);
        f(m[1], &mut self.gate_exps);
        f(m[2], &mut self.up_exps);
        f(m[3], &mut self.down_exps);
        if let Some(sh) = &mut self.shared {
            f(m[4], &mut sh.gate);
            f(m[5], &mut sh.up);
            f(m[6], &mut sh.down);
        }
    }

    /// Layer `il`'s experts (config `c.moe`); a streamed layer's matrices are described,
    /// not read, and so are a paged layer's expert stacks (`paged`: the expert pager
    /// reads experts into its pool as they are picked).
    pub fn load<P: Platform>(
        l: &mut Loader<'_, '_, 'a, P>,
        c: &Config,
        il: usize,
        streamed: bool,
        paged: bool,
    ) -> Result<MoeFfn<'a>, ModelError> {
        let m = c.moe.ok_or(ModelError::BadShape(
            "MoE layer without MoE hyper-parameters",
        ))?;
        let (e, ne, f) = (c.n_embd, m.n_expert, m.n_ff_exp);
        let mut n = Names::new(il);
        let [r, g, u, d, sg, su, sd] = Self::MATRICES;
        let router = l.layer_matrix(n.get(r), e, ne, streamed)?;
        let bias = l.opt_vector(n.get("exp_probs_b.bias"), ne)?;
        let described = streamed || paged;
        let gate_exps = load_stack(l, n.get(g), e, f, ne, described)?;
        let up_exps = load_stack(l, n.get(u), e, f, ne, described)?;
        let down_exps = load_stack(l, n.get(d), f, e, ne, described)?;
        let shared = if m.n_ff_shexp > 0 {
            let fs = m.n_ff_shexp;
            Some(SwiGlu {
                gate: l.layer_matrix(n.get(sg), e, fs, streamed)?,
                up: l.layer_matrix(n.get(su), e, fs, streamed)?,
                down: l.layer_matrix(n.get(sd), fs, e, streamed)?,
            })
        } else {
            None
        };
        Ok(MoeFfn {
            router,
            bias,
            gate_exps,
            up_exps,
            down_exps,
            shared,
            cfg: m,
            il,
        })
    }

    /// `cx.s.xn` (the normed input of `n` tokens) → `cx.s.xn` (the block's output).
    pub fn run_in<P: Platform>(
        &self,
        cx: &mut Cx<'_, '_, '_, P>,
        n: usize,
    ) -> Result<(), ModelError> {
        let e = cx.cfg.n_embd;
        let s = &mut *cx.s;
        let ms = s
            .moe
            .as_mut()
            .ok_or(ModelError::BadShape("MoE layer without MoE scratch"))?;
        let mut pr = SessionProducts {
            mm: &cx.mm,
            act_q: s.act_q,
            tmp: s.mm_tmp,
            row: s.row,
            clock: &mut cx.clock,
        };
        let out = core::mem::take(&mut ms.out);
        let r = match cx.experts.as_deref_mut() {
            Some(pager) => {
                let p = cx.p;
                let no_read = |_: u64, _: &mut [u8], _: bool| {
                    Err(crate::platform::PlatformError::Unsupported(
                        "expert reads without a reader",
                    ))
                };
                let read = cx.read.unwrap_or(&no_read);
                crate::pager::paged::with_io(p, read, cx.opts.threads, |io| {
                    let mut src = crate::pager::paged::Paged { pager, io };
                    self.run(&mut pr, &s.xn[..n * e], n, &mut out[..n * e], ms, &mut src)
                })
            }
            None => self.run(
                &mut pr,
                &s.xn[..n * e],
                n,
                &mut out[..n * e],
                ms,
                &mut Resident,
            ),
        };
        s.xn[..n * e].copy_from_slice(&out[..n * e]);
        ms.out = out;
        r
    }

    /// `out[..n * n_embd]` = this block applied to the `n` rows of `xn`, its experts
    /// from `experts`.
    pub fn run(
        &self,
        mm: &mut dyn Products,
        xn: &[f32],
        n: usize,
        out: &mut [f32],
        s: &mut MoeScratch<'_>,
        experts: &mut dyn Experts,
    ) -> Result<(), ModelError> {
        let knobs = experts.routing();
        let mut m = self.cfg;
        m.n_used = knobs.n_used.map_or(m.n_used, |k| k.clamp(1, m.n_used));
        let (ne, k) = (m.n_expert, m.n_used);
        let e = self.router.cols;
        if n > s.n_batch {
            return Err(ModelError::BadShape("MoE batch larger than its scratch"));
        }
        mm.linear(&self.router, &xn[..n * e], n, &mut s.logits[..n * ne])?;
        mm.lap(Op::FfnGateUp);
        // `--moe-bias X`: resident experts' selection scores get X (choice only).
        let mut biased = [0.0f32; crate::pager::MAX_EXPERTS];
        let bias = if knobs.resident_bias != 0.0 {
            for (i, b) in biased[..ne].iter_mut().enumerate() {
                *b = self.bias.map_or(0.0, |v| v[i]);
                if experts.is_resident(self, i as u16) {
                    *b += knobs.resident_bias;
                }
            }
            Some(&biased[..ne])
        } else {
            self.bias
        };
        let mut used = [0u16; crate::pager::MAX_EXPERTS];
        for t in 0..n {
            let ids = &mut s.ids[t * k..(t + 1) * k];
            moe_route::route(
                &m,
                &s.logits[t * ne..(t + 1) * ne],
                bias,
                ids,
                &mut s.weights[t * k..(t + 1) * k],
            );
            for &id in ids.iter() {
                used[id as usize] = used[id as usize].saturating_add(1);
            }
            experts.record(self, t, ids);
        }
        // The batch's experts, each once (one read per expert per batch).
        let mut want = [0u16; crate::pager::MAX_EXPERTS];
        let mut uses = [0u16; crate::pager::MAX_EXPERTS];
        let mut n_want = 0;
        for (ex, &u) in used[..ne].iter().enumerate().filter(|(_, &u)| u > 0) {
            want[n_want] = ex as u16;
            uses[n_want] = u;
            n_want += 1;
        }
        experts.prepare(self, &want[..n_want], &uses[..n_want], n)?;
        experts.prefetch(mm, self, &xn[..n * e], n)?;
        mm.lap(Op::ExpertWait);
        if n == 1 && experts.in_stacks(self) && self.one_token(mm, &xn[..e], &mut out[..e], s, k)? {
            return Ok(());
        }
        let MoeScratch {
            ids,
            weights,
            tokens,
            token_w,
            xg,
            gate,
            up,
            down,
            ys,
            ..
        } = s;
        let mut b = Bufs { gate, up, down };
        let out = &mut out[..n * e];
        out.fill(0.0);
        // Small batches keep each pick's weighted output apart (`ys`) and add them up
        // in expert order at the end, so the experts may be computed in any order (the
        // ones in memory while the others are read) with the same bits.
        let any_order = n * k * e <= ys.len();
        let ids = &ids[..n * k];
        let mut one = |ex: u16, sw: SwiGlu<'_>| -> Result<(), ModelError> {
            let ex = ex as u32;
            // The tokens that chose expert `ex`, with its weight for each.
            let mut m_tok = 0;
            for t in 0..n {
                let slots = &ids[t * k..(t + 1) * k];
                if let Some(j) = slots.iter().position(|&id| id == ex) {
                    tokens[m_tok] = (t * k + j) as u32;
                    token_w[m_tok] = weights[t * k + j];
                    m_tok += 1;
                }
            }
            if m_tok == 0 {
                return Ok(());
            }
            let x: &[f32] = if m_tok == n {
                &xn[..n * e]
            } else {
                for (i, &tj) in tokens[..m_tok].iter().enumerate() {
                    let t = tj as usize / k;
                    xg[i * e..(i + 1) * e].copy_from_slice(&xn[t * e..(t + 1) * e]);
                }
                &xg[..m_tok * e]
            };
            mm.lap(Op::ExpertWait);
            swiglu_ffn(mm, &sw.gate, &sw.up, &sw.down, x, m_tok, &mut b)?;
            // llama.cpp multiplies each expert's output by its weight, then adds the
            // products (the sum starts from 0, and 0 + a = a exactly).
            for (i, &tj) in tokens[..m_tok].iter().enumerate() {
                let (w, tj) = (token_w[i], tj as usize);
                let d = &b.down[i * e..(i + 1) * e];
                if any_order {
                    for (y, d) in ys[tj * e..(tj + 1) * e].iter_mut().zip(d) {
                        *y = d * w;
                    }
                } else {
                    let t = tj / k;
                    for (o, d) in out[t * e..(t + 1) * e].iter_mut().zip(d) {
                        *o += d * w;
                    }
                }
            }
            Ok(())
        };
        experts.each(self, &want[..n_want], any_order, &mut one)?;
        if any_order {
            // Each token's picks in expert order, as the in-order sum adds them.
            for t in 0..n {
                let mut order = [0u32; crate::pager::MAX_EXPERTS];
                let order = &mut order[..k];
                for (j, o) in order.iter_mut().enumerate() {
                    *o = j as u32;
                }
                order.sort_unstable_by_key(|&j| ids[t * k + j as usize]);
                let o = &mut out[t * e..(t + 1) * e];
                for &j in order.iter() {
                    let y = &ys[(t * k + j as usize) * e..][..e];
                    for (o, y) in o.iter_mut().zip(y) {
                        *o += y;
                    }
                }
            }
        }
        if let Some(sh) = &self.shared {
            swiglu_ffn(mm, &sh.gate, &sh.up, &sh.down, &xn[..n * e], n, &mut b)?;
            for (o, d) in out.iter_mut().zip(&b.down[..n * e]) {
                *o += d;
            }
        }
        Ok(())
    }

    /// One token whose experts are all views of the stacks: the picked experts' and the
    /// shared expert's gate and up products as one split across the workers, then all
    /// their down products as another (two joins per layer instead of two per expert
    /// and two for the shared one; at two threads a small MoE's decode step is mostly
    /// such joins). Every product and the sum's order are the per-expert path's (picks
    /// in expert order, the shared expert last): same bits. `Ok(false)`, with nothing
    /// done, when the scratch cannot hold every expert's rows at once.
    fn one_token(
        &self,
        mm: &mut dyn Products,
        xn: &[f32],
        out: &mut [f32],
        s: &mut MoeScratch<'_>,
        k: usize,
    ) -> Result<bool, ModelError> {
        const MAX_FFNS: usize = moe_route::MAX_EXPERTS_USED + 1;
        let e = xn.len();
        // The picks in expert order, with their router weights.
        let mut picks = [(0u32, 0.0f32); moe_route::MAX_EXPERTS_USED];
        let picks = &mut picks[..k];
        for (p, (&id, &w)) in picks.iter_mut().zip(s.ids.iter().zip(s.weights.iter())) {
            *p = (id, w);
        }
        picks.sort_unstable_by_key(|p| p.0);
        let mut ffns = heapless::Vec::<SwiGlu<'_>, MAX_FFNS>::new();
        for &(id, _) in picks.iter() {
            let _ = ffns.push(self.expert(id as usize)?);
        }
        if let Some(sh) = self.shared {
            let _ = ffns.push(sh);
        }
        let width: usize = ffns.iter().map(|f| f.gate.rows).sum();
        if width > s.gate.len().min(s.up.len()) || ffns.len() * e > s.down.len() {
            return Ok(false);
        }
        let (gate, up) = (&mut s.gate[..width], &mut s.up[..width]);
        {
            let mut jobs = heapless::Vec::<(&Tensor, &mut [f32]), { 2 * MAX_FFNS }>::new();
            let (mut g_rest, mut u_rest) = (&mut gate[..], &mut up[..]);
            for f in &ffns {
                let (g, gt) = core::mem::take(&mut g_rest).split_at_mut(f.gate.rows);
                let (u, ut) = core::mem::take(&mut u_rest).split_at_mut(f.up.rows);
                (g_rest, u_rest) = (gt, ut);
                let _ = jobs.push((&f.gate, g));
                let _ = jobs.push((&f.up, u));
            }
            mm.linear_many(xn, &mut jobs)?;
        }
        mm.lap(Op::FfnGateUp);
        pinch_kernels::ops::swiglu_on(&mm.cpu(), gate, up);
        mm.lap(Op::FfnAct);
        let down = &mut s.down[..ffns.len() * e];
        {
            let mut jobs = heapless::Vec::<(&Tensor, &[f32], &mut [f32]), MAX_FFNS>::new();
            let (mut g_rest, mut d_rest): (&[f32], &mut [f32]) = (gate, &mut down[..]);
            for f in &ffns {
                let (g, gt) = g_rest.split_at(f.gate.rows);
                let (d, dt) = core::mem::take(&mut d_rest).split_at_mut(e);
                (g_rest, d_rest) = (gt, dt);
                let _ = jobs.push((&f.down, g, d));
            }
            mm.linear_each(&mut jobs)?;
        }
        mm.lap(Op::FfnDown);
        out.fill(0.0);
        for (i, &(_, w)) in picks.iter().enumerate() {
            for (o, d) in out.iter_mut().zip(&down[i * e..(i + 1) * e]) {
                *o += d * w;
            }
        }
        if self.shared.is_some() {
            for (o, d) in out.iter_mut().zip(&down[k * e..(k + 1) * e]) {
                *o += d;
            }
        }
        Ok(true)
    }
}

/// `b.down = W_down · (silu(W_gate · x) * (W_up · x))` for `n` rows of `x`.
fn swiglu_ffn(
    mm: &mut dyn Products,
    gate: &Tensor,
    up: &Tensor,
    down: &Tensor,
    x: &[f32],
    n: usize,
    b: &mut Bufs<'_>,
) -> Result<(), ModelError> {
    let f = gate.rows;
    let (g, u) = (&mut b.gate[..n * f], &mut b.up[..n * f]);
    mm.linear_pair(gate, up, x, n, g, u)?;
    mm.lap(Op::FfnGateUp);
    pinch_kernels::ops::swiglu_on(&mm.cpu(), g, u);
    mm.lap(Op::FfnAct);
    mm.linear(down, g, n, &mut b.down[..n * down.rows])?;
    mm.lap(Op::FfnDown);
    Ok(())
}

struct Bufs<'s> {
    gate: &'s mut [f32],
    up: &'s mut [f32],
    down: &'s mut [f32],
}

/// The block's scratch for batches of up to `n_batch` tokens.
pub struct MoeScratch<'a> {
    n_batch: usize,
    logits: &'a mut [f32],
    ids: &'a mut [u32],
    weights: &'a mut [f32],
    tokens: &'a mut [u32],
    token_w: &'a mut [f32],
    xg: &'a mut [f32],
    gate: &'a mut [f32],
    up: &'a mut [f32],
    down: &'a mut [f32],
    /// The block's output before it replaces its input.
    out: &'a mut [f32],
    /// Each pick's weighted expert output, for batches of up to [`ANY_ORDER_TOKENS`].
    ys: &'a mut [f32],
}

/// Batches of up to this many tokens may compute their experts in any order (the
/// draft's verify batches included).
pub const ANY_ORDER_TOKENS: usize = 16;

impl<'a> MoeScratch<'a> {
    /// Values (4 bytes each) of the scratch for `m`, embedding width `n_embd`, batches
    /// of `n_batch`.
    fn sizes(m: &MoeConfig, n_embd: usize, n_batch: usize) -> [usize; 11] {
        let f = m.n_ff_exp.max(m.n_ff_shexp);
        let nb = n_batch.max(1);
        // Gate, up and down rows for a batch, or for one token's picks and shared
        // expert side by side ([`MoeFfn::one_token`]).
        let ffns = nb.max(m.n_used + 1);
        [
            nb * m.n_expert,
            nb * m.n_used,
            nb * m.n_used,
            nb,
            nb,
            nb * n_embd,
            ffns * f,
            ffns * f,
            ffns * n_embd,
            nb * n_embd,
            nb.min(ANY_ORDER_TOKENS) * m.n_used * n_embd,
        ]
    }

    /// Bytes [`Self::new`] takes from the arena (with the arena's per-slice alignment).
    pub fn bytes_needed(m: &MoeConfig, n_embd: usize, n_batch: usize) -> usize {
        Self::sizes(m, n_embd, n_batch)
            .iter()
            .map(|v| v * 4 + 64)
            .sum()
    }

    pub fn new(
        arena: &mut Arena<'a>,
        m: &MoeConfig,
        n_embd: usize,
        n_batch: usize,
    ) -> Result<MoeScratch<'a>, ModelError> {
        let [lg, ids, w, tk, tw, xg, g, u, d, o, y] = Self::sizes(m, n_embd, n_batch);
        let a = "activations";
        Ok(MoeScratch {
            n_batch: n_batch.max(1),
            logits: arena.slice(a, lg)?,
            ids: arena.slice(a, ids)?,
            weights: arena.slice(a, w)?,
            tokens: arena.slice(a, tk)?,
            token_w: arena.slice(a, tw)?,
            xg: arena.slice(a, xg)?,
            gate: arena.slice(a, g)?,
            up: arena.slice(a, u)?,
            down: arena.slice(a, d)?,
            out: arena.slice(a, o)?,
            ys: arena.slice(a, y)?,
        })
    }
}

/// Read (or, `streamed`, only describe: empty data) the 3-D tensor `name` holding
/// `n_expert` experts of `rows` x `cols`, as one 2-D tensor of `n_expert * rows` rows.
///
/// # Errors
/// Missing tensor, another shape ([`ModelError::TensorShape`] with the first two dims
/// and, when those match, the expert count as the second), or a type pinch cannot
/// compute with.
pub fn load_stack<'a, P: Platform>(
    l: &mut Loader<'_, '_, 'a, P>,
    name: &str,
    cols: usize,
    rows: usize,
    n_expert: usize,
    streamed: bool,
) -> Result<Tensor<'a>, ModelError> {
    let info = l
        .gguf
        .tensor(name)
        .ok_or(ModelError::MissingTensorNamed(name_buf(name)))?;
    let d = info.dims;
    if d[0] != cols as u64 || d[1] != rows as u64 {
        return Err(ModelError::TensorShape {
            name: name_buf(name),
            expected: [cols as u64, rows as u64],
            found: [d[0], d[1]],
        });
    }
    if d[2] != n_expert as u64 || d[3] != 1 {
        return Err(ModelError::TensorShape {
            name: name_buf(name),
            expected: [rows as u64, n_expert as u64],
            found: [d[1], d[2] * d[3]],
        });
    }
    if !info.ty.can_dequantize() {
        return Err(ModelError::UnsupportedType {
            name: name_buf(name),
            ty: info.ty,
        });
    }
    let data: &'a [u8] = if streamed {
        &[]
    } else {
        let buf = l.arena.bytes("weights", info.bytes as usize)?;
        read_exact(l.platform, l.file, info.offset, buf)?;
        buf
    };
    Ok(Tensor {
        ty: info.ty,
        cols,
        rows: rows * n_expert,
        data,
        layout: pinch_kernels::repack::Layout::Plain,
        file: crate::residency::Span {
            offset: info.offset,
            len: info.bytes,
        },
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::model::moe_route::Gating;
    use pinch_kernels::GgmlType;
    use std::vec;
    use std::vec::Vec;

    /// f32 products straight from the tensors' bytes.
    struct Naive;

    fn val(t: &Tensor, r: usize, c: usize) -> f32 {
        let o = (r * t.cols + c) * 4;
        f32::from_le_bytes(t.data[o..o + 4].try_into().unwrap())
    }

    impl Products for Naive {
        fn linear(
            &mut self,
            w: &Tensor,
            x: &[f32],
            n: usize,
            out: &mut [f32],
        ) -> Result<(), ModelError> {
            for t in 0..n {
                for r in 0..w.rows {
                    out[t * w.rows + r] =
                        (0..w.cols).map(|c| val(w, r, c) * x[t * w.cols + c]).sum();
                }
            }
            Ok(())
        }
    }

    /// Deterministic pseudo-random values in [-1, 1).
    fn noise(seed: u32, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn tensor(data: &[u8], cols: usize, rows: usize) -> Tensor<'_> {
        Tensor {
            ty: GgmlType::F32,
            cols,
            rows,
            data,
            layout: pinch_kernels::repack::Layout::Plain,
            file: crate::residency::Span::default(),
        }
    }

    const E: usize = 8;
    const F: usize = 5;

    fn config(shared: bool) -> MoeConfig {
        MoeConfig {
            n_expert: 6,
            n_used: 3,
            n_ff_exp: F,
            n_ff_shexp: if shared { 4 } else { 0 },
            gating: Gating::Sigmoid,
            norm_weights: true,
            weights_scale: 2.5,
            n_group: 3,
            n_group_used: 2,
            n_dense_lead: 0,
        }
    }

    /// One token through the block the slow way: route, then each chosen expert in
    /// slot order.
    fn one_token<'a>(b: &MoeFfn<'a>, x: &[f32]) -> Vec<f32> {
        let m = &b.cfg;
        let mut logits = vec![0.0; m.n_expert];
        Naive.linear(&b.router, x, 1, &mut logits).unwrap();
        let (mut ids, mut w) = (vec![0u32; m.n_used], vec![0.0; m.n_used]);
        moe_route::route(m, &logits, b.bias, &mut ids, &mut w);
        let mut out = vec![0.0f32; E];
        let ffn = |g: &Tensor, u: &Tensor, d: &Tensor| {
            let f = g.rows;
            let (mut gv, mut uv, mut dv) = (vec![0.0; f], vec![0.0; f], vec![0.0; E]);
            Naive.linear(g, x, 1, &mut gv).unwrap();
            Naive.linear(u, x, 1, &mut uv).unwrap();
            pinch_kernels::ops::swiglu(&mut gv, &uv);
            Naive.linear(d, &gv, 1, &mut dv).unwrap();
            dv
        };
        for (j, &id) in ids.iter().enumerate() {
            let (id, ne) = (id as usize, m.n_expert);
            let ex = |t: &Tensor<'a>| expert(t, id, ne).unwrap();
            let d = ffn(&ex(&b.gate_exps), &ex(&b.up_exps), &ex(&b.down_exps));
            for (o, d) in out.iter_mut().zip(&d) {
                *o += d * w[j];
            }
        }
        if let Some(sh) = &b.shared {
            let d = ffn(&sh.gate, &sh.up, &sh.down);
            for (o, d) in out.iter_mut().zip(&d) {
                *o += d;
            }
        }
        out
    }

    fn check_batch_matches_tokens(shared: bool) {
        let m = config(shared);
        let ne = m.n_expert;
        let router = bytes(&noise(1, ne * E).iter().map(|v| v * 2.0).collect::<Vec<_>>());
        let gate = bytes(&noise(2, ne * F * E));
        let up = bytes(&noise(3, ne * F * E));
        let down = bytes(&noise(4, ne * E * F));
        let (sg, su, sd) = (
            bytes(&noise(5, 4 * E)),
            bytes(&noise(6, 4 * E)),
            bytes(&noise(7, E * 4)),
        );
        let bias: Vec<f32> = noise(8, ne).iter().map(|v| v * 0.05).collect();
        let block = MoeFfn {
            router: tensor(&router, E, ne),
            bias: Some(&bias),
            gate_exps: tensor(&gate, E, ne * F),
            up_exps: tensor(&up, E, ne * F),
            down_exps: tensor(&down, F, ne * E),
            shared: shared.then(|| SwiGlu {
                gate: tensor(&sg, E, 4),
                up: tensor(&su, E, 4),
                down: tensor(&sd, 4, E),
            }),
            cfg: m,
            il: 0,
        };
        let n = 7;
        let xn = noise(9, n * E);
        let mut region = vec![0u8; MoeScratch::bytes_needed(&m, E, n) + 64];
        let mut arena = Arena::new(&mut region);
        let mut s = MoeScratch::new(&mut arena, &m, E, n).unwrap();
        let mut out = vec![0.0f32; n * E];
        block
            .run(&mut Naive, &xn, n, &mut out, &mut s, &mut Resident)
            .unwrap();
        let mut used = [false; 6];
        for t in 0..n {
            let want = one_token(&block, &xn[t * E..(t + 1) * E]);
            for (g, w) in out[t * E..(t + 1) * E].iter().zip(&want) {
                // n_used = 3: the batch adds experts in index order, the slow way in
                // slot order, so the last bit may differ.
                assert!(
                    (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                    "token {t}: {g} vs {w}"
                );
            }
            for &id in &s.ids[t * 3..t * 3 + 3] {
                used[id as usize] = true;
            }
        }
        // The batch is not degenerate: several experts ran, and not every token chose
        // the same ones.
        assert!(used.iter().filter(|&&u| u).count() >= 4, "{used:?}");
        // One token alone gives the same as within the batch.
        let mut one = vec![0.0f32; E];
        block
            .run(
                &mut Naive,
                &xn[2 * E..3 * E],
                1,
                &mut one,
                &mut s,
                &mut Resident,
            )
            .unwrap();
        assert_eq!(&one[..], &out[2 * E..3 * E]);
    }

    #[test]
    fn batch_grouped_by_expert_equals_each_token_alone() {
        check_batch_matches_tokens(false);
    }

    #[test]
    fn shared_expert_is_added_for_every_token() {
        check_batch_matches_tokens(true);
    }

    #[test]
    fn expert_views_are_the_experts_rows() {
        let v: Vec<f32> = (0..3 * 2 * 4).map(|i| i as f32).collect();
        let b = bytes(&v);
        let stack = tensor(&b, 4, 6);
        let e1 = expert(&stack, 1, 3).unwrap();
        assert_eq!((e1.rows, e1.cols), (2, 4));
        assert_eq!(val(&e1, 0, 0), 8.0);
        assert_eq!(val(&e1, 1, 3), 15.0);
    }

    #[test]
    fn batch_beyond_the_scratch_is_an_error() {
        let m = config(false);
        let mut region = vec![0u8; MoeScratch::bytes_needed(&m, E, 2) + 64];
        let mut arena = Arena::new(&mut region);
        let mut s = MoeScratch::new(&mut arena, &m, E, 2).unwrap();
        let z = [0u8; 4];
        let t = tensor(&z, E, 0);
        let block = MoeFfn {
            router: t,
            bias: None,
            gate_exps: t,
            up_exps: t,
            down_exps: t,
            shared: None,
            cfg: m,
            il: 0,
        };
        let mut out = vec![0.0; 3 * E];
        let r = block.run(
            &mut Naive,
            &[0.0; 3 * E],
            3,
            &mut out,
            &mut s,
            &mut Resident,
        );
        assert!(matches!(r, Err(ModelError::BadShape(_))));
    }
}
