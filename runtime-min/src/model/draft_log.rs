//! Taking a recurrent layer back to a position inside a draft-verifying pass.
//!
//! Speculative decoding feeds `[last, draft...]` in one pass and keeps a prefix of it.
//! Attention layers keep their rows and forget the rest by position; a recurrent state
//! holds only the latest position, so it would need the pass again. Instead, during
//! that pass ([`crate::model::Session::eval_draft`]) each recurrent layer logs what its
//! state update consumed per token: the conv inputs and, for Gated DeltaNet, the delta
//! rule's inputs (q/k/v after conv, SiLU and L2 norm, the gates). Going back
//! ([`crate::model::Session::rewind_draft`]) restores the copy taken before the pass and
//! runs only those updates for the kept tokens: no weight is read, and the arithmetic is
//! the pass's own, token by token, so the state is the one plain decoding reaches.
use pinch_kernels::recurrent::{self, DeltaDims};
use pinch_kernels::CpuFeatures;

use crate::arena::{Arena, ArenaError};
use crate::draft::MAX_DRAFT;
use crate::model::hybrid::{RecurrentState, StateMatrix};

/// Tokens a pass that verifies a draft feeds at most.
pub const LOGGED_TOKENS: usize = MAX_DRAFT + 1;

/// What one recurrent layer consumed in the latest logged pass.
pub struct DraftLog<'a> {
    /// Conv inputs, token-major (`ch` per token).
    conv_in: &'a mut [f32],
    /// Gated DeltaNet: `[q | k | v]` as the delta rule reads them (`rule_width` per
    /// token), log-decays and write strengths (`n_v` per token); empty for short conv.
    rule_in: &'a mut [f32],
    g: &'a mut [f32],
    beta: &'a mut [f32],
    ch: usize,
    rule_width: usize,
    n_v: usize,
    /// Whether the running pass is logged.
    pub on: bool,
    /// Tokens the latest logged pass fed (0: nothing usable).
    n: usize,
}

impl<'a> DraftLog<'a> {
    /// Room for [`LOGGED_TOKENS`] tokens of `ch` conv channels and, for Gated DeltaNet,
    /// `rule_width` rule inputs and `n_v` gates each.
    pub fn new(
        arena: &mut Arena<'a>,
        ch: usize,
        rule_width: usize,
        n_v: usize,
    ) -> Result<DraftLog<'a>, ArenaError> {
        let t = LOGGED_TOKENS;
        Ok(DraftLog {
            conv_in: arena.slice("draft log", t * ch)?,
            rule_in: arena.slice("draft log", t * rule_width)?,
            g: arena.slice("draft log", t * n_v)?,
            beta: arena.slice("draft log", t * n_v)?,
            ch,
            rule_width,
            n_v,
            on: false,
            n: 0,
        })
    }

    /// Bytes [`Self::new`] takes (for the plan).
    pub fn bytes_needed(ch: usize, rule_width: usize, n_v: usize) -> usize {
        4 * LOGGED_TOKENS * (ch + rule_width + 2 * n_v) + 4 * 64
    }

    /// Start a logged pass (nothing logged yet).
    pub fn start(&mut self) {
        self.on = true;
        self.n = 0;
    }

    /// Keep the conv inputs of the pass's `n` tokens (`x`: `n * ch` values). A pass
    /// longer than the log, or a shape that does not fit, leaves nothing usable.
    pub fn conv_inputs(&mut self, x: &[f32], n: usize) {
        let len = n * self.ch;
        match (self.conv_in.get_mut(..len), x.get(..len)) {
            (Some(d), Some(s)) if self.on => {
                d.copy_from_slice(s);
                self.n = n;
            }
            _ => self.n = 0,
        }
    }

    /// Keep the delta rule's inputs of the same `n` tokens (rows of `stride` values of
    /// which the first `rule_width` are read; `g` and `beta`: `n * n_v`).
    pub fn rule_inputs(&mut self, qkv: &[f32], stride: usize, g: &[f32], beta: &[f32], n: usize) {
        let (w, nv) = (self.rule_width, self.n_v);
        let fits = self.on
            && self.n == n
            && n <= LOGGED_TOKENS
            && stride >= w
            && qkv.len() >= n * stride
            && g.len() >= n * nv
            && beta.len() >= n * nv;
        if !fits {
            self.n = 0;
            return;
        }
        for (d, s) in self
            .rule_in
            .chunks_exact_mut(w)
            .zip(qkv.chunks(stride))
            .take(n)
        {
            d.copy_from_slice(&s[..w]);
        }
        self.g[..n * nv].copy_from_slice(&g[..n * nv]);
        self.beta[..n * nv].copy_from_slice(&beta[..n * nv]);
    }

    /// Tokens of the latest logged pass whose updates can be run again.
    pub fn logged(&self) -> usize {
        self.n
    }

    /// Forget the logged pass.
    pub fn clear(&mut self) {
        self.on = false;
        self.n = 0;
    }
}

/// Advance `st` (the state before the logged pass) by that pass's first `m` tokens, from
/// `log`: the conv tail takes the last inputs, and Gated DeltaNet (`delta`) runs its rule
/// over the logged inputs into `out` (scratch of `m * v_dim` floats). `false` when the
/// log does not hold `m` tokens, the scratch is short, or the matrices are f16 (whose
/// rounding is per pass: plain decoding would round after every token).
pub fn replay(
    st: &mut RecurrentState<'_>,
    log: &DraftLog<'_>,
    m: usize,
    delta: Option<DeltaDims>,
    cpu: &CpuFeatures,
    out: &mut [f32],
) -> bool {
    if m == 0 || m > log.n {
        return false;
    }
    let ch = log.ch;
    if ch == 0 || !st.conv.len().is_multiple_of(ch) {
        return false;
    }
    let kept = st.conv.len() / ch;
    // The tail is the last `kept` conv inputs, oldest first.
    if m >= kept {
        st.conv
            .copy_from_slice(&log.conv_in[(m - kept) * ch..m * ch]);
    } else {
        st.conv.copy_within(m * ch.., 0);
        let at = (kept - m) * ch;
        st.conv[at..].copy_from_slice(&log.conv_in[..m * ch]);
    }
    let Some(d) = delta else {
        return true;
    };
    let (nv, hd, vd) = (d.n_v_heads, d.head_dim, d.v_dim());
    let StateMatrix::F32(mat) = &mut st.matrix else {
        return false;
    };
    if log.rule_width != d.conv_dim() || out.len() < m * vd || mat.len() < nv * hd * hd {
        return false;
    }
    let (w, g, beta) = (log.rule_width, &log.g[..m * nv], &log.beta[..m * nv]);
    recurrent::delta_rule_on(
        cpu,
        d,
        0..nv,
        m,
        &log.rule_in[..m * w],
        w,
        g,
        beta,
        mat,
        &mut out[..m * vd],
        vd,
        hd,
    );
    true
}

/// The log shape of a layer with `mixer` in `c`: (conv channels, rule inputs per token,
/// value heads); `None` for layers without a recurrent state.
pub fn shape(
    c: &crate::model::config::Config,
    mixer: crate::model::config::MixerKind,
) -> Option<(usize, usize, usize)> {
    use crate::model::config::MixerKind;
    match mixer {
        MixerKind::GatedDeltaNet => c.delta.map(|d| {
            let cd = d.dims.conv_dim();
            (cd, cd, d.dims.n_v_heads)
        }),
        MixerKind::ShortConv => c.shortconv.map(|_| (c.n_embd, 0, 0)),
        MixerKind::Attention => None,
    }
}
