//! The Gated DeltaNet token mixer (Qwen3.5's linear-attention layers), as llama.cpp
//! 0c1e570 computes it (`llama_model_qwen35::graph::build_layer_attn_linear`):
//!
//! ```text
//! qkv = xn·Wqkv ; z = xn·Wgate ; β = sigmoid(xn·Wβ) ; g = softplus(xn·Wα + dt_bias) · a
//! qkv = silu(causal_conv(qkv))            conv state: the previous k-1 rows of qkv
//! q, k, v = split(qkv) ; q, k = l2_norm(q), l2_norm(k)   (per head)
//! o = gated_delta_rule(q, k, v, g, β)     state: one d×d matrix per value head
//! xn = (rms_norm(o, Wnorm) per head · silu(z)) · Wout
//! ```
//!
//! Value head `h` reads key head `h % n_k_heads`. The arithmetic is in
//! [`pinch_kernels::recurrent`]; the state lives in a [`RecurrentState`], updated in
//! place, zeroed when a pass starts at position 0; with `--state-f16` its matrices are
//! stored in f16 and widened per head for the call.
use pinch_kernels::f16;
use pinch_kernels::ops::{self, SiluMode};
use pinch_kernels::recurrent::{self, DeltaDims};

use crate::model::config::Config;
use crate::model::hybrid::{DeltaNetHparams, RecurrentState, StateMatrix};
use crate::model::layer::Cx;
use crate::model::matmul::par_chunks_pair;
use crate::model::weights::{Loader, Names, Tensor, Vector};
use crate::model::{ModelError, Op};
use crate::platform::Platform;

/// One Gated DeltaNet layer's weights.
#[derive(Clone, Copy)]
pub struct DeltaNet<'a> {
    /// `attn_qkv`: n_embd → `[q | k | v]` (conv_dim).
    pub w_qkv: Tensor<'a>,
    /// `attn_gate`: n_embd → z (v_dim), the output gate.
    pub w_gate: Tensor<'a>,
    /// `ssm_beta`: n_embd → one write strength per value head.
    pub w_beta: Tensor<'a>,
    /// `ssm_alpha`: n_embd → one decay input per value head.
    pub w_alpha: Tensor<'a>,
    /// `ssm_out`: v_dim → n_embd.
    pub w_out: Tensor<'a>,
    /// `ssm_conv1d`: per channel of `[q | k | v]`, `conv_kernel` taps (F32 in GGUF files;
    /// decoded per pass, it may sit in a stream zone).
    pub conv: Tensor<'a>,
    /// `ssm_dt.bias`, per value head.
    pub dt_bias: Vector<'a>,
    /// `ssm_a` (= -exp(A_log)), per value head.
    pub a: Vector<'a>,
    /// `ssm_norm`: the per-head RMSNorm gain of the output (head_dim).
    pub norm: Vector<'a>,
    pub hp: DeltaNetHparams,
}

impl<'a> DeltaNet<'a> {
    /// The matrices' GGUF suffixes, in the order the block uses them.
    pub const MATRICES: [&'static str; 6] = [
        "attn_qkv.weight",
        "attn_gate.weight",
        "ssm_beta.weight",
        "ssm_alpha.weight",
        "ssm_conv1d.weight",
        "ssm_out.weight",
    ];

    /// Layer `il`'s DeltaNet; a streamed layer's matrices are described, not read.
    pub fn load<P: Platform>(
        l: &mut Loader<'_, '_, 'a, P>,
        c: &Config,
        il: usize,
        streamed: bool,
    ) -> Result<DeltaNet<'a>, ModelError> {
        let hp = c.delta.ok_or(ModelError::BadShape(
            "a DeltaNet layer without ssm.* hyper-parameters",
        ))?;
        let d = hp.dims;
        let (e, cd, vd, nv) = (c.n_embd, d.conv_dim(), d.v_dim(), d.n_v_heads);
        let mut n = Names::new(il);
        let [qkv, gate, beta, alpha, conv, out] = Self::MATRICES;
        let dn = DeltaNet {
            w_qkv: l.layer_matrix(n.get(qkv), e, cd, streamed)?,
            w_gate: l.layer_matrix(n.get(gate), e, vd, streamed)?,
            w_beta: l.layer_matrix(n.get(beta), e, nv, streamed)?,
            w_alpha: l.layer_matrix(n.get(alpha), e, nv, streamed)?,
            conv: l.layer_matrix(n.get(conv), hp.conv_kernel, cd, streamed)?,
            w_out: l.layer_matrix(n.get(out), vd, e, streamed)?,
            dt_bias: l.vector(n.get("ssm_dt.bias"), nv)?,
            a: l.vector(n.get("ssm_a"), nv)?,
            norm: l.vector(n.get("ssm_norm.weight"), d.head_dim)?,
            hp,
        };
        conv_type_ok(&dn.conv, n.get(conv))?;
        Ok(dn)
    }

    /// Every matrix with its GGUF suffix, in [`Self::MATRICES`] order.
    pub fn visit_matrices(&mut self, f: &mut dyn FnMut(&'static str, &mut Tensor<'a>)) {
        let [qkv, gate, beta, alpha, conv, out] = Self::MATRICES;
        f(qkv, &mut self.w_qkv);
        f(gate, &mut self.w_gate);
        f(beta, &mut self.w_beta);
        f(alpha, &mut self.w_alpha);
        f(conv, &mut self.conv);
        f(out, &mut self.w_out);
    }

    /// Scratch floats a pass of `nb` tokens needs (see [`Self::run`]; the outputs
    /// head-major and one head's matrix widened from f16 included).
    pub fn scratch_floats(hp: &DeltaNetHparams, nb: usize) -> usize {
        let d = hp.dims;
        nb * (d.conv_dim() + 3 * d.v_dim() + 2 * d.n_v_heads)
            + 2 * d.conv_dim() * hp.conv_kernel
            + d.head_dim * d.head_dim
    }

    /// `cx.s.xn` (the normed input of `n` tokens at positions `pos0..`) → `cx.s.xn`,
    /// advancing `st` by the `n` tokens.
    pub fn run<P: Platform>(
        &self,
        cx: &mut Cx<'_, '_, '_, P>,
        st: &mut RecurrentState<'_>,
        n: usize,
        pos0: usize,
    ) -> Result<(), ModelError> {
        let c = cx.cfg;
        let d: DeltaDims = self.hp.dims;
        let (e, cd, vd, nv, hd) = (c.n_embd, d.conv_dim(), d.v_dim(), d.n_v_heads, d.head_dim);
        let k = self.hp.conv_kernel;
        let s = &mut *cx.s;
        let (qkv, rest) = s.mixer.split_at_mut(n * cd);
        let (z, rest) = rest.split_at_mut(n * vd);
        let (beta, rest) = rest.split_at_mut(n * nv);
        let (g, rest) = rest.split_at_mut(n * nv);
        let (o, rest) = rest.split_at_mut(n * vd);
        let (o_heads, rest) = rest.split_at_mut(n * vd);
        let (wconv, rest) = rest.split_at_mut(2 * cd * k);
        let wide = &mut rest[..hd * hd];
        cx.mm.linear_many(
            &s.xn[..n * e],
            n,
            &mut [
                (&self.w_qkv, &mut *qkv),
                (&self.w_gate, &mut *z),
                (&self.w_beta, &mut *beta),
                (&self.w_alpha, &mut *g),
            ],
            s.act_q,
            s.mm_tmp,
            s.row,
        )?;
        cx.clock.lap(Op::QkvProj);
        if let Some(l) = st.log.as_mut().filter(|l| l.on) {
            l.conv_inputs(qkv, n);
        }
        st.conv_inplace(&self.conv, wconv, qkv, n, cd, pos0)?;
        let cpu = cx.opts.cpu;
        ops::silu_on(&cpu, SiluMode::Alone, qkv, &[]);
        let eps = c.rms_eps;
        for row in qkv.chunks_exact_mut(cd) {
            for head in row[..2 * d.qk_dim()].chunks_exact_mut(hd) {
                recurrent::l2_norm_inplace(head, eps);
            }
        }
        for t in 0..n {
            let (gt, bt) = (
                &mut g[t * nv..(t + 1) * nv],
                &mut beta[t * nv..(t + 1) * nv],
            );
            recurrent::delta_gates(gt, self.dt_bias, self.a, bt);
        }
        if let Some(l) = st.log.as_mut().filter(|l| l.on) {
            l.rule_inputs(qkv, cd, g, beta, n);
        }
        cx.clock.lap(Op::RopeAndCache);
        match &mut st.matrix {
            // Heads split across the workers (each head's tokens stay on one worker,
            // its state in that core's cache), outputs head-major: for one token that
            // is the token-major layout itself, for more it is transposed after.
            StateMatrix::F32(m) => {
                let m = m.get_mut(..nv * hd * hd).ok_or(ModelError::BadShape(
                    "DeltaNet state shorter than its heads",
                ))?;
                let by_head = if n == 1 { &mut *o } else { &mut *o_heads };
                let (qkv, g, beta) = (&*qkv, &*g, &*beta);
                let step = |heads: core::ops::Range<usize>, mh: &mut [f32], oh: &mut [f32]| {
                    recurrent::delta_rule_on(
                        &cpu,
                        d,
                        heads,
                        n,
                        qkv,
                        cd,
                        g,
                        beta,
                        mh,
                        oh,
                        hd,
                        n * hd,
                    );
                };
                par_chunks_pair(
                    cx.p,
                    cx.opts.threads,
                    nv,
                    (m, hd * hd),
                    (by_head, n * hd),
                    &step,
                );
                if n > 1 {
                    for (h, head) in o_heads.chunks_exact(n * hd).enumerate() {
                        for (t, src) in head.chunks_exact(hd).enumerate() {
                            o[t * vd + h * hd..][..hd].copy_from_slice(src);
                        }
                    }
                }
            }
            // f16 state: each head's matrix is widened, run over the call's tokens in
            // f32 and rounded back once (a prompt rounds once, not once per token).
            StateMatrix::F16(m) => {
                for (h, mh) in m.chunks_exact_mut(hd * hd).enumerate().take(nv) {
                    f16::widen_slice(&cpu, mh, wide);
                    let oh = &mut o[h * hd..];
                    let hs = h..h + 1;
                    recurrent::delta_rule_on(&cpu, d, hs, n, qkv, cd, g, beta, wide, oh, vd, hd);
                    f16::narrow_slice(&cpu, wide, mh);
                }
            }
        }
        ops::rms_norm_rows_inplace(o, self.norm, eps, hd);
        recurrent::mul_silu_on(&cpu, o, z);
        cx.clock.lap(Op::Attention);
        cx.mm.linear(
            &self.w_out,
            o,
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

/// The conv taps are small f32 vectors per channel: a type that is not a plain float
/// (a quantized conv) is refused at load, naming the tensor.
pub(crate) fn conv_type_ok(t: &Tensor, name: &str) -> Result<(), ModelError> {
    use pinch_kernels::GgmlType;
    match t.ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Ok(()),
        ty => Err(ModelError::UnsupportedType {
            name: crate::model::weights::name_buf(name),
            ty,
        }),
    }
}
