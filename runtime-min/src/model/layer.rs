//! A layer is its blocks: `norm → token mixer → [norm] → residual → norm → feed-forward
//! → [norm] → residual`, whatever the kinds.
//!
//! The kinds come from the model file (see [`crate::model::config::LayerKind`]); each
//! block lives in its own file with its weights, its `load` and its `run`:
//! - token mixers ([`Mixer`]): [`Attention`] (full or sliding-window, optionally gated),
//!   [`DeltaNet`] (Gated DeltaNet), [`ShortConv`] (short convolution);
//! - feed-forwards ([`Ffn`]): [`DenseFfn`], [`MoeFfn`] (routed experts).
//!
//! This file is the one place that knows which matrices a layer has: loading, streaming
//! views ([`Layer::in_zone`]) and the repack cache all go through
//! [`Layer::visit_matrices`]. Per-layer state (a KV plane for attention, a fixed-size
//! [`RecurrentState`] for DeltaNet and short conv) is made by
//! [`LayerState::new`] from the layer's kind, before any weight is read.
use crate::arena::{Arena, ArenaError};
use crate::model::attention::{Attention, KvState};
use crate::model::config::{Config, FfnKind, MixerKind};
use crate::model::deltanet::DeltaNet;
use crate::model::ffn_dense::DenseFfn;
use crate::model::ffn_moe::MoeFfn;
use crate::model::forward::{Placement, Profile, SessionOptions};
use crate::model::hybrid::{recurrent_floats, RecurrentState};
use crate::model::kv::{KvPlane, KvType};
use crate::model::matmul::MatMul;
use crate::model::scratch::Scratch;
use crate::model::shortconv::ShortConv;
use crate::model::weights::{Loader, Names, Tensor, Vector};
use crate::model::{ModelError, Op};
use crate::platform::Platform;
use crate::residency::Span;

/// The token mixer of a layer.
#[derive(Clone, Copy)]
pub enum Mixer<'a> {
    Attention(Attention<'a>),
    DeltaNet(DeltaNet<'a>),
    ShortConv(ShortConv<'a>),
}

/// The feed-forward block of a layer.
// No allocator to box the larger variant in; a layer table of 128 is ~60 KB either way.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy)]
pub enum Ffn<'a> {
    Dense(DenseFfn<'a>),
    Moe(MoeFfn<'a>),
}

/// One layer's weights.
#[derive(Clone, Copy)]
pub struct Layer<'a> {
    pub attn_norm: Vector<'a>,
    pub mixer: Mixer<'a>,
    /// Norm of the mixer's output before the residual add (gemma3).
    pub post_mixer_norm: Option<Vector<'a>>,
    pub ffn_norm: Vector<'a>,
    pub ffn: Ffn<'a>,
    /// Norm of the FFN's output before the residual add (gemma3).
    pub post_ffn_norm: Option<Vector<'a>>,
    /// Streamed layers: the matrices' data is empty until a stream zone holding
    /// `span` lends it (see [`Layer::in_zone`]).
    pub stream: Option<LayerStream>,
}

/// The aligned file span one read of a streamed layer fetches.
#[derive(Clone, Copy, Debug)]
pub struct LayerStream {
    pub span: Span,
}

impl<'a> Layer<'a> {
    /// Layer `il` of a model with config `c`; `stream` set: its matrices are described
    /// (where they are in the file), not read.
    pub fn load<P: Platform>(
        l: &mut Loader<'_, '_, 'a, P>,
        c: &Config,
        il: usize,
        stream: Option<LayerStream>,
        paged_experts: bool,
    ) -> Result<Layer<'a>, ModelError> {
        let kind = c.layer(il);
        let streamed = stream.is_some();
        let mut n = Names::new(il);
        let attn_norm = l.vector(n.get("attn_norm.weight"), c.n_embd)?;
        let mixer = match kind.mixer {
            MixerKind::Attention => Mixer::Attention(Attention::load(l, c, il, streamed)?),
            MixerKind::GatedDeltaNet => Mixer::DeltaNet(DeltaNet::load(l, c, il, streamed)?),
            MixerKind::ShortConv => Mixer::ShortConv(ShortConv::load(l, c, il, streamed)?),
        };
        // qwen35 names its pre-FFN norm `post_attention_norm`: a post-mixer norm only
        // where the config has post norms.
        let post_mixer_norm = match c.post_norms {
            true => l.opt_vector(n.get("post_attention_norm.weight"), c.n_embd)?,
            false => None,
        };
        let ffn_norm = l.vector(n.get(c.ffn_norm_name), c.n_embd)?;
        let ffn = match kind.ffn {
            FfnKind::Dense => Ffn::Dense(DenseFfn::load(l, c, il, streamed)?),
            FfnKind::Moe => Ffn::Moe(MoeFfn::load(l, c, il, streamed, paged_experts)?),
        };
        let post_ffn_norm = l.opt_vector(n.get("post_ffw_norm.weight"), c.n_embd)?;
        if c.post_norms && (post_mixer_norm.is_none() || post_ffn_norm.is_none()) {
            return Err(ModelError::MissingTensorNamed(
                crate::model::weights::name_buf(n.get("post_attention_norm.weight")),
            ));
        }
        Ok(Layer {
            attn_norm,
            mixer,
            post_mixer_norm,
            ffn_norm,
            ffn,
            post_ffn_norm,
            stream,
        })
    }

    /// Every matrix of the layer with its GGUF suffix (`attn_q.weight`, ...), mixer
    /// first, in the order the forward pass uses them.
    pub fn visit_matrices(&mut self, f: &mut dyn FnMut(&'static str, &mut Tensor<'a>)) {
        match &mut self.mixer {
            Mixer::Attention(a) => a.visit_matrices(f),
            Mixer::DeltaNet(d) => d.visit_matrices(f),
            Mixer::ShortConv(sc) => sc.visit_matrices(f),
        }
        match &mut self.ffn {
            Ffn::Dense(d) => d.visit_matrices(f),
            Ffn::Moe(m) => m.visit_matrices(f),
        }
    }

    /// This layer with its matrices viewed in `zone`, which holds `stream.span`.
    /// Resident layers are returned as they are.
    pub fn in_zone<'z>(&self, zone: &'z [u8]) -> Result<Layer<'z>, ModelError>
    where
        'a: 'z,
    {
        let mut lw: Layer<'z> = *self;
        let Some(st) = self.stream else {
            return Ok(lw);
        };
        let mut bad = false;
        lw.visit_matrices(&mut |_, t| {
            let at = t.file.offset.wrapping_sub(st.span.offset) as usize;
            match zone.get(at..at + t.file.len as usize) {
                Some(b) if t.file.offset >= st.span.offset => t.data = b,
                _ => bad = true,
            }
        });
        if bad {
            return Err(ModelError::BadShape("stream zone smaller than the layer"));
        }
        Ok(lw)
    }
}

/// What one layer keeps from token to token.
pub enum LayerState<'a> {
    /// An attention layer's keys and values.
    Kv(KvState<'a>),
    /// A DeltaNet or short-conv layer's conv tail (and delta-rule matrices).
    Recurrent(RecurrentState<'a>),
}

impl<'a> LayerState<'a> {
    /// The state of layer `il` for a session with `o` (context, batch, KV type,
    /// whether sliding-window layers keep only their window).
    pub fn new(
        arena: &mut Arena<'a>,
        c: &Config,
        il: usize,
        o: &SessionOptions,
    ) -> Result<LayerState<'a>, ArenaError> {
        let kind = c.layer(il);
        match kind.mixer {
            MixerKind::Attention => {
                let dim = kind.n_head_kv * c.head_dim;
                let plane = |arena: &mut Arena<'a>, ty| match Self::kv_rows(c, il, o) {
                    (_, 0) => KvPlane::new(arena, ty, o.n_ctx, dim, o.n_seq),
                    (_, ring) => KvPlane::new_ring(arena, ty, ring, dim, o.n_seq),
                };
                Ok(LayerState::Kv(KvState {
                    k: plane(arena, o.kv)?,
                    v: plane(arena, o.kv_v)?,
                }))
            }
            MixerKind::GatedDeltaNet | MixerKind::ShortConv => {
                let (conv, matrix) = recurrent_floats(c, kind.mixer);
                Ok(LayerState::Recurrent(RecurrentState::new(
                    arena,
                    conv,
                    matrix,
                    o.state_f16,
                )?))
            }
        }
    }

    /// (rows, ring) of layer `il`'s KV planes (see [`KvPlane::rows_needed`]).
    fn kv_rows(c: &Config, il: usize, o: &SessionOptions) -> (usize, usize) {
        let window = if o.swa_ring && c.is_swa(il) {
            c.n_swa
        } else {
            0
        };
        KvPlane::rows_needed(o.n_ctx, window, o.n_batch.max(1))
    }

    /// Bytes [`Self::new`] takes (for the plan, before anything is allocated).
    pub fn bytes_needed(c: &Config, il: usize, o: &SessionOptions) -> usize {
        let kind = c.layer(il);
        match kind.mixer {
            MixerKind::Attention => {
                let (rows, _) = Self::kv_rows(c, il, o);
                let row = |t: KvType| t.row_bytes(kind.n_head_kv * c.head_dim).unwrap_or(0);
                o.n_seq.max(1) * rows * (row(o.kv) + row(o.kv_v))
            }
            MixerKind::GatedDeltaNet | MixerKind::ShortConv => {
                let (conv, matrix) = recurrent_floats(c, kind.mixer);
                RecurrentState::bytes_needed(conv, matrix, o.state_f16)
            }
        }
    }

    /// Give the OS back the pages of positions `from..` (unused once the session holds
    /// `from` positions); returns the bytes given back.
    pub fn give_back<P: Platform>(&mut self, p: &P, from: usize) -> u64 {
        match self {
            LayerState::Kv(kv) => {
                p.discard(kv.k.tail_bytes_mut(from)) + p.discard(kv.v.tail_bytes_mut(from))
            }
            // Fixed size, all of it in use.
            LayerState::Recurrent(_) => 0,
        }
    }

    /// Reads and writes of an attention layer go to sequence `seq`'s rows.
    pub fn select(&mut self, seq: usize) {
        if let LayerState::Kv(kv) = self {
            kv.select(seq);
        }
    }

    /// Whether the state can only move forward (a recurrent state cannot be cut back to
    /// an earlier position; a KV plane can).
    pub fn is_recurrent(&self) -> bool {
        matches!(self, LayerState::Recurrent(_))
    }

    /// The recurrent state, if this is one.
    pub fn recurrent(&self) -> Option<&RecurrentState<'a>> {
        match self {
            LayerState::Recurrent(r) => Some(r),
            LayerState::Kv(_) => None,
        }
    }

    /// The recurrent state, if this is one, to update.
    pub fn recurrent_mut(&mut self) -> Option<&mut RecurrentState<'a>> {
        match self {
            LayerState::Recurrent(r) => Some(r),
            LayerState::Kv(_) => None,
        }
    }
}

/// What a block's `run` borrows from the session: the matmul helper, the config and
/// options, the shared scratch and the profile clock. Blocks read their input from
/// `s.xn` and leave their output there.
pub struct Cx<'c, 's, 'p, P: Platform> {
    pub p: &'p P,
    pub mm: MatMul<'p, P>,
    pub cfg: &'c Config,
    pub opts: &'c SessionOptions,
    pub s: &'c mut Scratch<'s>,
    pub clock: Clock<'c, 'p, P>,
    /// The expert pager (MoE models), behind the MoE block's expert access.
    pub experts: Option<&'c mut crate::pager::ExpertPager<'s>>,
    /// The model file's reader (for paged experts).
    pub read: Option<&'c crate::model::stream::ReadFn<'c>>,
}

/// Charges the time since the last lap to an [`Op`] of the profile.
pub struct Clock<'c, 'p, P: Platform> {
    pub p: &'p P,
    pub t0: u64,
    pub prof: &'c mut Profile,
}

impl<P: Platform> Clock<'_, '_, P> {
    pub fn lap(&mut self, op: Op) {
        let t1 = self.p.now_ns();
        self.prof.add(op, self.t0, t1);
        self.t0 = t1;
    }
}

impl Layer<'_> {
    /// The mixer on `cx.s.xn` (`n` tokens at positions `pos0..`) with this layer's state.
    pub fn run_mixer<P: Platform>(
        &self,
        cx: &mut Cx<'_, '_, '_, P>,
        state: &mut LayerState<'_>,
        n: usize,
        at: Placement<'_>,
    ) -> Result<(), ModelError> {
        // A recurrent state holds one sequence (Session::new refuses several).
        let recurrent_at = match at {
            Placement::Run { pos0 } => Ok(pos0),
            Placement::Seqs(_) => Err(ModelError::ParallelRecurrent),
        };
        match (&self.mixer, state) {
            (Mixer::Attention(a), LayerState::Kv(kv)) => a.run(cx, kv, n, at),
            (Mixer::DeltaNet(d), LayerState::Recurrent(st)) => d.run(cx, st, n, recurrent_at?),
            (Mixer::ShortConv(sc), LayerState::Recurrent(st)) => sc.run(cx, st, n, recurrent_at?),
            _ => Err(ModelError::BadShape("layer state does not match its mixer")),
        }
    }

    /// The feed-forward block on `cx.s.xn` (`n` tokens).
    pub fn run_ffn<P: Platform>(
        &self,
        cx: &mut Cx<'_, '_, '_, P>,
        n: usize,
    ) -> Result<(), ModelError> {
        match &self.ffn {
            Ffn::Dense(d) => d.run(cx, n),
            Ffn::Moe(m) => m.run_in(cx, n),
        }
    }
}
