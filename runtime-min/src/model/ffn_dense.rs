//! The dense feed-forward block: `xn = down(act(xn·Wgate) * (xn·Wup))`, with SiLU
//! (llama, qwen) or GELU-tanh through ggml's f16 table (gemma).
use core::ops::Range;

use pinch_kernels::ops;

use crate::model::config::{Config, FfnAct};
use crate::model::layer::Cx;
use crate::model::matmul::par_chunks;
use crate::model::weights::{Loader, Names, Tensor};
use crate::model::{ModelError, Op};
use crate::platform::Platform;

/// One dense FFN's weights.
#[derive(Clone, Copy)]
pub struct DenseFfn<'a> {
    pub w_gate: Tensor<'a>,
    pub w_up: Tensor<'a>,
    pub w_down: Tensor<'a>,
}

impl<'a> DenseFfn<'a> {
    /// The matrices' GGUF suffixes, in the order the block uses them.
    pub const MATRICES: [&'static str; 3] = ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"];

    /// Layer `il`'s FFN of width `n_ff`; a streamed layer's matrices are described, not read.
    pub fn load<P: Platform>(
        l: &mut Loader<'_, '_, 'a, P>,
        c: &Config,
        il: usize,
        streamed: bool,
    ) -> Result<DenseFfn<'a>, ModelError> {
        let mut n = Names::new(il);
        let [g, u, d] = Self::MATRICES;
        Ok(DenseFfn {
            w_gate: l.layer_matrix(n.get(g), c.n_embd, c.n_ff, streamed)?,
            w_up: l.layer_matrix(n.get(u), c.n_embd, c.n_ff, streamed)?,
            w_down: l.layer_matrix(n.get(d), c.n_ff, c.n_embd, streamed)?,
        })
    }

    /// Every matrix with its GGUF suffix, in [`Self::MATRICES`] order.
    pub fn visit_matrices(&mut self, f: &mut dyn FnMut(&'static str, &mut Tensor<'a>)) {
        let [g, u, d] = Self::MATRICES;
        f(g, &mut self.w_gate);
        f(u, &mut self.w_up);
        f(d, &mut self.w_down);
    }

    /// `cx.s.xn` (the normed input of `n` tokens) → `cx.s.xn` (the FFN output).
    pub fn run<P: Platform>(&self, cx: &mut Cx<'_, '_, '_, P>, n: usize) -> Result<(), ModelError> {
        let c = cx.cfg;
        let (e, f) = (c.n_embd, self.w_gate.rows);
        let s = &mut *cx.s;
        cx.mm.linear_many(
            &s.xn[..n * e],
            n,
            &mut [
                (&self.w_gate, &mut s.gate[..n * f]),
                (&self.w_up, &mut s.up[..n * f]),
            ],
            s.act_q,
            s.mm_tmp,
            s.row,
        )?;
        cx.clock.lap(Op::FfnGateUp);
        // Elementwise, so split across the workers by tokens (one token's 2048
        // values are not worth waking them for).
        let (up, gelu, cpu) = (&s.up[..n * f], &*s.gelu, cx.opts.cpu);
        let act = |ts: Range<usize>, g: &mut [f32]| {
            let u = &up[ts.start * f..ts.end * f];
            match c.ffn_act {
                FfnAct::Silu => ops::swiglu_on(&cpu, g, u),
                FfnAct::GeluTanh => ops::geglu_with_table(&cpu, g, u, gelu),
            }
        };
        par_chunks(cx.p, cx.opts.threads, n, &mut s.gate[..n * f], f, &act);
        cx.clock.lap(Op::FfnAct);
        cx.mm.linear(
            &self.w_down,
            &s.gate[..n * f],
            n,
            &mut s.xn[..n * e],
            s.act_q,
            s.mm_tmp,
            s.row,
        )?;
        cx.clock.lap(Op::FfnDown);
        Ok(())
    }
}
