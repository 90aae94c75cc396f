//! Model hyper-parameters read from GGUF metadata, and the per-architecture facts that
//! make one forward pass serve llama, qwen2, qwen3, gemma3 and the MoE qwen3moe and
//! bailingmoe2.
//!
//! Per-layer facts (which token mixer and feed-forward a layer has, its KV heads) are
//! in [`LayerKind`], one per layer, read from the file before any weight is.
use core::fmt::Write;

use pinch_kernels::ops::RopeKind;

use crate::gguf::Gguf;
use crate::model::moe_route::MoeConfig;
use crate::model::hybrid::{self, DeltaNetHparams, Hybrid, ShortConvHparams};
use crate::model::ModelError;

/// The architectures this forward pass implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Qwen3Moe,
    BailingMoe2,
    /// Qwen3.5: Gated DeltaNet layers and gated full attention (see `model::hybrid`).
    Qwen35,
    /// LFM2: short-conv layers and attention (see `model::hybrid`).
    Lfm2,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "gemma3" => Some(Arch::Gemma3),
            "qwen3moe" => Some(Arch::Qwen3Moe),
            "bailingmoe2" => Some(Arch::BailingMoe2),
            "qwen35" => Some(Arch::Qwen35),
            "lfm2" => Some(Arch::Lfm2),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::BailingMoe2 => "bailingmoe2",
            Arch::Qwen35 => "qwen35",
            Arch::Lfm2 => "lfm2",
        }
    }
}

/// Most layers pinch loads (a fixed table keeps runtime-min allocation-free).
pub const MAX_LAYERS: usize = 128;

/// A layer's token mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MixerKind {
    #[default]
    Attention,
    /// Gated DeltaNet (`model::deltanet`).
    GatedDeltaNet,
    /// Short convolution (`model::shortconv`).
    ShortConv,
}

/// A layer's feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FfnKind {
    #[default]
    Dense,
    /// Routed experts (and a shared expert), see [`crate::model::ffn_moe`].
    Moe,
}

/// What layer `il` is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LayerKind {
    pub mixer: MixerKind,
    pub ffn: FfnKind,
    /// KV heads of an attention layer (0 for other mixers).
    pub n_head_kv: usize,
}

/// The FFN's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    Silu,
    GeluTanh,
}

/// Everything the forward pass needs to know about the shapes and the arithmetic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_kind: RopeKind,
    pub n_rot: usize,
    pub rope_base: f32,
    /// Rope base of sliding-window layers (gemma3).
    pub rope_base_swa: f32,
    /// 1 / linear rope scaling factor for full-attention layers.
    pub rope_freq_scale: f32,
    /// Sliding window size; 0 = none.
    pub n_swa: usize,
    /// Layer `il` uses the sliding window when `(il + 1) % swa_period != 0`; 0 = never.
    pub swa_period: usize,
    /// Multiply input embeddings by this (gemma: sqrt(n_embd)).
    pub embd_scale: Option<f32>,
    /// Per-head RMSNorm of q and k before rope (qwen3, gemma3).
    pub qk_norm: bool,
    /// Norms after attention and FFN, before the residual add (gemma3).
    pub post_norms: bool,
    /// Q scaled by 1/sqrt(head_dim) before attention, attention scale 1 (gemma3); else
    /// the scale is applied to KQ.
    pub scale_q: bool,
    pub ffn_act: FfnAct,
    /// q, k and v have biases (qwen2).
    pub qkv_bias: bool,
    /// Per-layer kinds: `layers[..n_layer]`.
    pub layers: [LayerKind; MAX_LAYERS],
    /// The experts' hyper-parameters (MoE architectures).
    pub moe: Option<MoeConfig>,
    /// Shapes of the Gated DeltaNet layers (qwen35).
    pub delta: Option<DeltaNetHparams>,
    /// Shape of the short-conv layers (lfm2).
    pub shortconv: Option<ShortConvHparams>,
    /// Attention output × sigmoid(gate), the gate rows interleaved with q's per head
    /// (qwen35).
    pub gated_attn: bool,
    /// The norm before the FFN (`post_attention_norm.weight` in qwen35).
    pub ffn_norm_name: &'static str,
    /// The final norm (`token_embd_norm.weight` in lfm2).
    pub output_norm_name: &'static str,
}

impl Config {
    /// Whether layer `il` is a sliding-window layer.
    pub fn is_swa(&self, il: usize) -> bool {
        self.n_swa > 0 && self.swa_period > 0 && !(il + 1).is_multiple_of(self.swa_period)
    }
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
    /// What layer `il` is made of.
    pub fn layer(&self, il: usize) -> LayerKind {
        self.layers[il.min(MAX_LAYERS - 1)]
    }
    /// The widest K (or V) row of any attention layer.
    pub fn max_kv_dim(&self) -> usize {
        self.layers[..self.n_layer.min(MAX_LAYERS)]
            .iter()
            .map(|k| k.n_head_kv * self.head_dim)
            .max()
            .unwrap_or(0)
    }

    /// Read the config of `g`; errors name the missing or bad key.
    pub fn from_gguf(g: &Gguf) -> Result<Config, ModelError> {
        let arch_name = g
            .get_str("general.architecture")
            .ok_or(ModelError::MissingKey("general.architecture"))?;
        let arch = Arch::from_name(arch_name).ok_or(ModelError::UnsupportedArch)?;
        let p = arch.name();
        let mut key = heapless::String::<96>::new();
        let mut u = |suffix: &str| -> Option<u64> {
            key.clear();
            let _ = write!(key, "{p}.{suffix}");
            g.get_u64(&key)
        };
        let n_layer = u("block_count").ok_or(ModelError::MissingKey("block_count"))? as usize;
        // Multi-token-prediction layers at the end of the file are not run (llama.cpp
        // loads them and skips them).
        let n_layer = n_layer.saturating_sub(u("nextn_predict_layers").unwrap_or(0) as usize);
        if n_layer > MAX_LAYERS {
            return Err(ModelError::BadShape(
                "more layers than pinch supports (128)",
            ));
        }
        let n_embd =
            u("embedding_length").ok_or(ModelError::MissingKey("embedding_length"))? as usize;
        let n_ff =
            u("feed_forward_length").ok_or(ModelError::MissingKey("feed_forward_length"))? as usize;
        let n_head = u("attention.head_count")
            .ok_or(ModelError::MissingKey("attention.head_count"))? as usize;
        let n_head_kv = u("attention.head_count_kv").unwrap_or(n_head as u64) as usize;
        let n_ctx_train = u("context_length").unwrap_or(2048) as usize;
        if n_head == 0
            || n_head_kv == 0
            || !n_head.is_multiple_of(n_head_kv)
            || n_layer == 0
            || n_embd == 0
        {
            return Err(ModelError::BadShape(
                "head counts, layer count or embedding length",
            ));
        }
        let head_dim = u("attention.key_length").unwrap_or((n_embd / n_head) as u64) as usize;
        let n_rot = u("rope.dimension_count").unwrap_or(head_dim as u64) as usize;
        let n_swa = u("attention.sliding_window").unwrap_or(0) as usize;
        let pattern = u("attention.sliding_window_pattern");
        let mut f = |suffix: &str| -> Option<f32> {
            key.clear();
            let _ = write!(key, "{p}.{suffix}");
            g.get_f32(&key)
        };
        let rms_eps = f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6);
        let rope_base = f("rope.freq_base").unwrap_or(10000.0);
        let rope_base_swa = f("rope.freq_base_swa").unwrap_or(10000.0);
        let rope_scale = f("rope.scaling.factor").unwrap_or(1.0);
        let rope_freq_scale = if rope_scale > 0.0 {
            1.0 / rope_scale
        } else {
            1.0
        };
        let n_vocab = g
            .tensor("token_embd.weight")
            .map(|t| t.dims[1] as usize)
            .ok_or(ModelError::MissingTensor("token_embd.weight"))?;
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(ModelError::BadShape("rope.dimension_count"));
        }
        let gemma = arch == Arch::Gemma3;
        let moe = MoeConfig::from_gguf(g, p, n_ff)?;
        let mut layers = [LayerKind::default(); MAX_LAYERS];
        for (il, k) in layers.iter_mut().take(n_layer).enumerate() {
            *k = LayerKind {
                mixer: MixerKind::Attention,
                ffn: match moe {
                    Some(m) if m.is_moe_layer(il) => FfnKind::Moe,
                    _ => FfnKind::Dense,
                },
                n_head_kv,
            };
        }
        let hybrid = Hybrid::from_gguf(g, arch, n_layer, n_head, n_head_kv)?;
        let mut n_head_kv = n_head_kv;
        if let Some(h) = &hybrid {
            for (k, &(mixer, kv)) in layers.iter_mut().zip(&h.layers) {
                k.mixer = mixer;
                k.n_head_kv = kv;
            }
            n_head_kv = h.layers.iter().map(|l| l.1).max().unwrap_or(0).max(1);
        }
        if arch == Arch::Qwen35 {
            // IMROPE for text is NEOX rope unless a section uses the 4th (always 0) id.
            if let Some(sec) = hybrid::rope_sections(g, p)? {
                if !hybrid::imrope_text_pairs(sec, n_rot)[..n_rot / 2]
                    .iter()
                    .all(|&r| r)
                {
                    return Err(ModelError::BadShape(
                        "rope.dimension_sections with a section at the extra position id",
                    ));
                }
            }
        }
        Ok(Config {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rms_eps,
            rope_kind: if arch == Arch::Llama {
                RopeKind::Norm
            } else {
                RopeKind::Neox
            },
            n_rot,
            rope_base,
            rope_base_swa,
            rope_freq_scale,
            n_swa: if gemma { n_swa } else { 0 },
            swa_period: if gemma {
                pattern.unwrap_or(6) as usize
            } else {
                0
            },
            embd_scale: if gemma {
                Some(libm::sqrtf(n_embd as f32))
            } else {
                None
            },
            qk_norm: matches!(
                arch,
                Arch::Qwen3
                    | Arch::Gemma3
                    | Arch::Qwen3Moe
                    | Arch::BailingMoe2
                    | Arch::Qwen35
                    | Arch::Lfm2
            ),
            post_norms: gemma,
            scale_q: gemma,
            ffn_act: if gemma {
                FfnAct::GeluTanh
            } else {
                FfnAct::Silu
            },
            qkv_bias: arch == Arch::Qwen2,
            layers,
            moe,
            delta: hybrid.as_ref().and_then(|h| h.delta),
            shortconv: hybrid.as_ref().and_then(|h| h.shortconv),
            gated_attn: arch == Arch::Qwen35,
            ffn_norm_name: if arch == Arch::Qwen35 {
                "post_attention_norm.weight"
            } else {
                "ffn_norm.weight"
            },
            output_norm_name: if arch == Arch::Lfm2 {
                "token_embd_norm.weight"
            } else {
                "output_norm.weight"
            },
        })
    }
}
