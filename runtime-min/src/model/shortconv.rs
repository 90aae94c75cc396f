//! The short-convolution token mixer (LFM2's conv layers), as llama.cpp 0c1e570 computes
//! it (`llama_model_lfm2::graph::build_shortconv_block`):
//!
//! ```text
//! b, c, x = split(xn·Win)           three n_embd-wide parts, in that order
//! y = causal_conv(b * x)            depthwise, l_cache taps; state: the previous l_cache-1 rows of b*x
//! xn = (c * y)·Wout
//! ```

use crate::model::config::Config;
use crate::model::deltanet::conv_type_ok;
use crate::model::hybrid::{RecurrentState, ShortConvHparams};
use crate::model::layer::Cx;
use crate::model::weights::{Loader, Names, Tensor};
use crate::model::{ModelError, Op};
use crate::platform::Platform;

/// One short-conv layer's weights.
#[derive(Clone, Copy)]
pub struct ShortConv<'a> {
    /// `shortconv.in_proj`: n_embd → `[b | c | x]` (3 n_embd).
    pub w_in: Tensor<'a>,
    /// `shortconv.conv`: per channel, `l_cache` taps (F32 in GGUF files).
    pub conv: Tensor<'a>,
    /// `shortconv.out_proj`: n_embd → n_embd.
    pub w_out: Tensor<'a>,
    pub hp: ShortConvHparams,
}

impl<'a> ShortConv<'a> {
    /// The matrices' GGUF suffixes, in the order the block uses them.
    pub const MATRICES: [&'static str; 3] = [
        "shortconv.in_proj.weight",
        "shortconv.conv.weight",
        "shortconv.out_proj.weight",
    ];

    /// Layer `il`'s short conv; a streamed layer's matrices are described, not read.
    pub fn load<P: Platform>(
        l: &mut Loader<'_, '_, 'a, P>,
        c: &Config,
        il: usize,
        streamed: bool,
    ) -> Result<ShortConv<'a>, ModelError> {
        let hp = c.shortconv.ok_or(ModelError::BadShape(
            "a short-conv layer without shortconv.l_cache",
        ))?;
        let e = c.n_embd;
        let mut n = Names::new(il);
        let [win, conv, wout] = Self::MATRICES;
        let sc = ShortConv {
            w_in: l.layer_matrix(n.get(win), e, 3 * e, streamed)?,
            conv: l.layer_matrix(n.get(conv), hp.l_cache, e, streamed)?,
            w_out: l.layer_matrix(n.get(wout), e, e, streamed)?,
            hp,
        };
        conv_type_ok(&sc.conv, n.get(conv))?;
        Ok(sc)
    }

    /// Every matrix with its GGUF suffix, in [`Self::MATRICES`] order.
    pub fn visit_matrices(&mut self, f: &mut dyn FnMut(&'static str, &mut Tensor<'a>)) {
        let [win, conv, wout] = Self::MATRICES;
        f(win, &mut self.w_in);
        f(conv, &mut self.conv);
        f(wout, &mut self.w_out);
    }

    /// Scratch floats a pass of `nb` tokens needs (see [`Self::run`]).
    pub fn scratch_floats(hp: &ShortConvHparams, n_embd: usize, nb: usize) -> usize {
        nb * 4 * n_embd + 2 * n_embd * hp.l_cache
    }

    /// `cx.s.xn` (the normed input of `n` tokens at positions `pos0..`) → `cx.s.xn`,
    /// advancing the conv tail `st` by the `n` tokens.
    pub fn run<P: Platform>(
        &self,
        cx: &mut Cx<'_, '_, '_, P>,
        st: &mut RecurrentState<'_>,
        n: usize,
        pos0: usize,
    ) -> Result<(), ModelError> {
        let e = cx.cfg.n_embd;
        let k = self.hp.l_cache;
        let s = &mut *cx.s;
        let (bcx, rest) = s.mixer.split_at_mut(n * 3 * e);
        let (y, rest) = rest.split_at_mut(n * e);
        let wconv = &mut rest[..2 * e * k];
        cx.mm
            .linear(&self.w_in, &s.xn[..n * e], n, bcx, s.act_q, s.mm_tmp, s.row)?;
        cx.clock.lap(Op::QkvProj);
        for (row, yt) in bcx.chunks_exact(3 * e).zip(y.chunks_exact_mut(e)) {
            let (b, x) = (&row[..e], &row[2 * e..]);
            for ((o, b), x) in yt.iter_mut().zip(b).zip(x) {
                *o = b * x;
            }
        }
        if let Some(l) = st.log.as_mut().filter(|l| l.on) {
            l.conv_inputs(y, n);
        }
        st.conv_inplace(&self.conv, wconv, y, n, e, pos0)?;
        for (row, yt) in bcx.chunks_exact(3 * e).zip(y.chunks_exact_mut(e)) {
            for (o, c) in yt.iter_mut().zip(&row[e..2 * e]) {
                *o *= c;
            }
        }
        cx.clock.lap(Op::Attention);
        cx.mm.linear(
            &self.w_out,
            y,
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
