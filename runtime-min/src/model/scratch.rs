//! The activations and work buffers one weight pass shares between its blocks, sized
//! once for the widest layer and the batch.
use pinch_kernels::ops;

use crate::arena::Arena;
use crate::model::config::{Config, FfnAct};
use crate::model::ffn_moe::MoeScratch;
use crate::model::forward::{SessionOptions, MAX_WORKERS};
use crate::model::ModelError;

pub struct Scratch<'a> {
    /// The residual stream, `n_batch` rows of `n_embd`.
    pub x: &'a mut [f32],
    /// A block's normed input, then its output.
    pub xn: &'a mut [f32],
    pub q: &'a mut [f32],
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub att: &'a mut [f32],
    pub gate: &'a mut [f32],
    pub up: &'a mut [f32],
    /// Attention scores, one row of `n_ctx` per worker.
    pub scores: &'a mut [f32],
    /// Quantized activations.
    pub act_q: &'a mut [u8],
    pub mm_tmp: &'a mut [f32],
    pub row: &'a mut [f32],
    pub logits: &'a mut [f32],
    /// Pruned-head logits before they are spread over the vocabulary (empty: full head).
    pub head_logits: &'a mut [f32],
    /// ggml's f16 GELU table (GELU models only; empty otherwise).
    pub gelu: &'a mut [f32],
    /// Rope (sin, cos) pairs per batch token: global base, then sliding-window base.
    pub rope: &'a mut [f32],
    /// The MoE block's routing and expert buffers (MoE models only).
    pub moe: Option<MoeScratch<'a>>,
    /// Work buffers of the recurrent mixers and the attention gate (see
    /// [`crate::model::hybrid::mixer_scratch_floats`]); empty for other models.
    pub mixer: &'a mut [f32],
}

impl<'a> Scratch<'a> {
    /// Bytes [`Self::new`] takes (for the budget plan).
    pub fn bytes_needed(cfg: &Config, o: &SessionOptions) -> usize {
        let (nb, g) = (o.n_batch.max(1), o.head_group.max(1));
        let maxd = cfg
            .n_embd
            .max(cfg.q_dim())
            .max(cfg.n_ff)
            .max(crate::model::hybrid::widest_matrix(cfg));
        let floats = nb * (3 * cfg.n_embd + 2 * cfg.q_dim() + 2 * cfg.max_kv_dim() + 2 * cfg.n_ff)
            + o.threads.clamp(1, MAX_WORKERS) * o.n_ctx
            + (nb * maxd).max(cfg.n_vocab * g)
            + maxd
            + cfg.n_vocab * g
            + nb * 2 * cfg.n_rot;
        let moe = cfg
            .moe
            .map_or(0, |m| MoeScratch::bytes_needed(&m, cfg.n_embd, nb));
        let gated_q = if cfg.gated_attn { nb * cfg.q_dim() } else { 0 };
        let mixer = crate::model::hybrid::mixer_scratch_floats(cfg, nb);
        (floats + gated_q + mixer) * 4
            + nb.max(g) * maxd * 4
            + 64 * 21
            + 4 * ops::GELU_TABLE_LEN
            + moe
    }

    /// The buffers for `opts` (already clamped); `head_rows` is the pruned head's row
    /// count (`None`: the full head).
    pub fn new(
        arena: &mut Arena<'a>,
        cfg: &Config,
        opts: &SessionOptions,
        head_rows: Option<usize>,
    ) -> Result<Scratch<'a>, ModelError> {
        let (nb, g) = (opts.n_batch, opts.head_group);
        let maxd = cfg
            .n_embd
            .max(cfg.q_dim())
            .max(cfg.n_ff)
            .max(crate::model::hybrid::widest_matrix(cfg));
        let kvd = cfg.max_kv_dim();
        let a = "activations";
        let s = Scratch {
            x: arena.slice(a, nb * cfg.n_embd)?,
            xn: arena.slice(a, nb.max(g) * cfg.n_embd.max(cfg.q_dim()))?,
            // Gated attention projects q and its gate together (2 q_dim per token).
            q: arena.slice(a, nb * cfg.q_dim() * (1 + cfg.gated_attn as usize))?,
            k: arena.slice(a, nb * kvd)?,
            v: arena.slice(a, nb * kvd)?,
            att: arena.slice(a, nb * cfg.q_dim())?,
            gate: arena.slice(a, nb * cfg.n_ff)?,
            up: arena.slice(a, nb * cfg.n_ff)?,
            scores: arena.slice(a, opts.threads * opts.n_ctx)?,
            // f32 activations are the widest format (4 bytes per value).
            act_q: arena.bytes(a, nb.max(g) * maxd * 4)?,
            mm_tmp: arena.slice(a, (nb * maxd).max(cfg.n_vocab * g))?,
            row: arena.slice(a, maxd)?,
            logits: arena.slice("logits", cfg.n_vocab * g)?,
            head_logits: arena.slice("logits", head_rows.map_or(0, |k| k * g))?,
            gelu: arena.slice(
                a,
                if cfg.ffn_act == FfnAct::GeluTanh {
                    ops::GELU_TABLE_LEN
                } else {
                    0
                },
            )?,
            rope: arena.slice(a, nb * 2 * cfg.n_rot)?,
            moe: match &cfg.moe {
                Some(m) => Some(MoeScratch::new(arena, m, cfg.n_embd, nb)?),
                None => None,
            },
            mixer: arena.slice(a, crate::model::hybrid::mixer_scratch_floats(cfg, nb))?,
        };
        ops::gelu_table_fill(s.gelu);
        Ok(s)
    }
}
