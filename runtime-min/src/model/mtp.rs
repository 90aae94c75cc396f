//! Qwen3.5's multi-token-prediction block (`nextn`): a draft source the model carries.
//!
//! A Qwen3.5 GGUF may hold one block past its layers (`block_count` counts it,
//! `nextn_predict_layers` = 1) trained to guess the token after next. As llama.cpp
//! 0c1e570 runs it (`llama_model_qwen35::graph_mtp`):
//!
//! ```text
//! at position p+1, from the trunk's final hidden state h_p (after output_norm) and the
//! token x_{p+1}:
//!   y = eh_proj · [enorm(embed(x_{p+1})) | hnorm(h_p)]
//!   y = a full gated-attention layer (its own KV cache) and SwiGLU FFN, as the trunk's
//!   h' = shared_head_norm(y)   (output_norm when the file has none)
//!   logits(x_{p+2}) = h' · Wout (the model's LM head)
//! ```
//!
//! Drafting ([`crate::model::Session::mtp_draft`]) feeds the newest token with the
//! trunk's last hidden state, then each guess with the block's own `h'`. Its KV cache
//! must hold a row for every earlier position, so every pass of the trunk also runs
//! the block over its tokens (the "catch-up", pairing token `t` with the trunk's `h`
//! of position `t - 1`; the zero vector at position 0), as llama.cpp's
//! `common_speculative_impl_draft_mtp::process` does.
use core::fmt::Write;

use crate::arena::Arena;
use crate::gguf::Gguf;
use crate::model::config::{Config, FfnKind, LayerKind, MixerKind, MAX_LAYERS};
use crate::model::forward::SessionOptions;
use crate::model::layer::{Layer, LayerState};
use crate::model::weights::{Loader, Names, Tensor, Vector};
use crate::model::{Arch, ModelError};
use crate::platform::Platform;

/// Why a model's MTP block cannot draft (said once, then prompt lookup drafts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoMtp {
    /// The file has no `nextn` block.
    Absent,
    /// Not a qwen35 model (llama.cpp's MTP graphs of other architectures differ).
    Arch,
    /// The block has its own embedding or head (`nextn.embed_tokens`,
    /// `nextn.shared_head_head`), which pinch does not load.
    OwnHead,
    /// The LM head is streamed: each drafted token would read it again.
    HeadStreamed,
    /// Several sequences (`--parallel`): the block keeps one KV cache.
    Parallel,
}

impl NoMtp {
    pub fn says(self) -> &'static str {
        match self {
            NoMtp::Absent => "the model has no MTP (nextn) block",
            NoMtp::Arch => "MTP drafts are implemented for qwen35 only",
            NoMtp::OwnHead => {
                "its MTP block has its own embedding or head (nextn.embed_tokens / shared_head_head), which pinch does not load"
            }
            NoMtp::HeadStreamed => {
                "the budget cannot keep the whole LM head resident beside the block, and every drafted token would read a streamed head again"
            }
            NoMtp::Parallel => "--parallel above 1 (the MTP block keeps one KV cache)",
        }
    }
}

/// Index of the MTP block (`blk.{n_layer}`), if the file has one pinch can run.
pub fn block_index(g: &Gguf, cfg: &Config) -> Result<usize, NoMtp> {
    let il = cfg.n_layer;
    let mut n = Names::new(il);
    if g.tensor(n.get("nextn.eh_proj.weight")).is_none() {
        return Err(NoMtp::Absent);
    }
    if cfg.arch != Arch::Qwen35 || il >= MAX_LAYERS {
        return Err(NoMtp::Arch);
    }
    if g.tensor(n.get("nextn.embed_tokens.weight")).is_some()
        || g.tensor(n.get("nextn.shared_head_head.weight")).is_some()
    {
        return Err(NoMtp::OwnHead);
    }
    Ok(il)
}

/// `cfg` with the MTP block described as one more layer: full attention (all KV heads)
/// and a dense FFN, so the trunk's loaders and blocks serve it.
pub fn block_config(cfg: &Config) -> Config {
    let mut c = *cfg;
    if let Some(k) = c.layers.get_mut(cfg.n_layer) {
        *k = LayerKind {
            mixer: MixerKind::Attention,
            ffn: FfnKind::Dense,
            n_head_kv: cfg.n_head_kv,
        };
    }
    c
}

/// Bytes the block's tensors take in the arena (all resident; each allocation aligned).
pub fn weight_bytes(g: &Gguf, il: usize) -> u64 {
    let mut prefix = heapless::String::<24>::new();
    let _ = write!(prefix, "blk.{il}.");
    g.tensors()
        .filter(|t| t.name.starts_with(prefix.as_str()))
        .map(|t| t.bytes + 64)
        .sum()
}

/// The block's weights.
#[derive(Clone, Copy)]
pub struct MtpWeights<'a> {
    pub eh_proj: Tensor<'a>,
    pub enorm: Vector<'a>,
    pub hnorm: Vector<'a>,
    /// `nextn.shared_head_norm`; `None`: the model's output_norm.
    pub head_norm: Option<Vector<'a>>,
    /// Attention and FFN, loaded as layer `il` of [`block_config`].
    pub layer: Layer<'a>,
}

impl<'a> MtpWeights<'a> {
    /// Read block `il` (from [`block_index`]) of a model with config `cfg`.
    pub fn load<P: Platform>(
        l: &mut Loader<'_, '_, 'a, P>,
        cfg: &Config,
        il: usize,
    ) -> Result<MtpWeights<'a>, ModelError> {
        let c = block_config(cfg);
        let e = c.n_embd;
        let mut n = Names::new(il);
        Ok(MtpWeights {
            eh_proj: l.matrix(n.get("nextn.eh_proj.weight"), 2 * e, Some(e))?,
            enorm: l.vector(n.get("nextn.enorm.weight"), e)?,
            hnorm: l.vector(n.get("nextn.hnorm.weight"), e)?,
            head_norm: l.opt_vector(n.get("nextn.shared_head_norm.weight"), e)?,
            layer: Layer::load(l, &c, il, None, false)?,
        })
    }
}

/// The block, its KV cache and the hidden states it pairs with tokens.
pub struct Mtp<'a> {
    pub w: MtpWeights<'a>,
    /// The trunk's config with the block as layer `il`.
    pub cfg: Config,
    pub il: usize,
    pub state: LayerState<'a>,
    /// The trunk's final hidden states (after output_norm) of the latest pass, one row
    /// per token, and the position of the first.
    pub h_rows: &'a mut [f32],
    pub rows_pos0: usize,
    pub rows_n: usize,
    /// The hidden state the block's next token pairs with: the trunk's of the position
    /// before ([`Self::pair_with_trunk`]), or, while drafting, the block's own `h'` of
    /// its latest guess.
    pub h_in: &'a mut [f32],
    /// `[enorm(embed) | hnorm(h)]` per token, and eh_proj's matmul buffers (its rows
    /// are twice as wide as any the session's scratch is sized for).
    pub concat: &'a mut [f32],
    pub act_q: &'a mut [u8],
    pub tmp: &'a mut [f32],
    pub row: &'a mut [f32],
}

impl<'a> Mtp<'a> {
    /// Bytes [`Self::new`] takes from the arena for a session with `o` (KV cache and
    /// buffers; the weights are counted by [`weight_bytes`]).
    pub fn bytes_needed(cfg: &Config, il: usize, o: &SessionOptions) -> usize {
        let c = block_config(cfg);
        let o = o.clamped();
        let (e, nb) = (c.n_embd, o.n_batch);
        LayerState::bytes_needed(&c, il, &o) + 4 * (nb * e + e + 3 * nb * 2 * e + 2 * e) + 64 * 7
    }

    pub fn new(
        arena: &mut Arena<'a>,
        w: MtpWeights<'a>,
        cfg: &Config,
        il: usize,
        o: &SessionOptions,
    ) -> Result<Mtp<'a>, ModelError> {
        let c = block_config(cfg);
        let o = o.clamped();
        let (e, nb) = (c.n_embd, o.n_batch);
        let a = "mtp";
        Ok(Mtp {
            w,
            state: LayerState::new(arena, &c, il, &o)?,
            cfg: c,
            il,
            h_rows: arena.slice(a, nb * e)?,
            rows_pos0: 0,
            rows_n: 0,
            h_in: arena.slice(a, e)?,
            concat: arena.slice(a, nb * 2 * e)?,
            // f32 activations are the widest format (4 bytes per value).
            act_q: arena.bytes(a, nb * 2 * e * 4)?,
            tmp: arena.slice(a, nb * 2 * e)?,
            row: arena.slice(a, 2 * e)?,
        })
    }

    /// `h_in` = the trunk's hidden state at position `pos - 1` if the latest pass
    /// computed it, else the zero vector (position 0; after a truncation only the
    /// guesses suffer).
    pub fn pair_with_trunk(&mut self, pos: usize) {
        let e = self.cfg.n_embd;
        let row = pos
            .checked_sub(1)
            .and_then(|q| q.checked_sub(self.rows_pos0))
            .filter(|&i| i < self.rows_n);
        match row {
            Some(i) => self.h_in.copy_from_slice(&self.h_rows[i * e..(i + 1) * e]),
            None => self.h_in.fill(0.0),
        }
    }
}
