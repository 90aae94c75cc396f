//! Hyper-parameters of the hybrid (recurrent + attention) architectures, read from GGUF
//! metadata as llama.cpp 0c1e570 reads them (`load_arch_hparams` of `qwen35` and
//! `lfm2`):
//!
//! - `qwen35`: Gated DeltaNet layers (`ssm.conv_kernel`, `ssm.state_size` = head dim,
//!   `ssm.group_count` = key heads, `ssm.time_step_rank` = value heads,
//!   `ssm.inner_size` = value width) with a gated full-attention layer every
//!   `full_attention_interval`-th layer (default 4: layer `il` is recurrent when
//!   `(il + 1) % interval != 0`); `rope.dimension_sections` (4 integers) for IMROPE.
//! - `lfm2`: short-conv layers (`shortconv.l_cache` taps) wherever the per-layer
//!   `attention.head_count_kv` array says 0.
//!
//! `attention.head_count_kv` may be one integer (every layer) or an array with one
//! entry per layer; [`head_count_kv_per_layer`] reads either.
use pinch_kernels::recurrent::DeltaDims;

use crate::gguf::Gguf;
use crate::model::config::{Arch, MixerKind};
use crate::model::weights::MAX_LAYERS;
use crate::model::ModelError;

/// Most taps of a causal conv (llama.cpp's models use 3 and 4).
pub const MAX_CONV_KERNEL: usize = pinch_kernels::recurrent::MAX_CONV_TAPS;

/// Per-layer KV head counts (0 = a layer without attention).
pub type PerLayer = heapless::Vec<usize, MAX_LAYERS>;

/// The shapes of a Gated DeltaNet layer (`qwen35`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetHparams {
    pub dims: DeltaDims,
    /// Taps of the conv1d over `[q | k | v]` (`ssm.conv_kernel`).
    pub conv_kernel: usize,
}

impl DeltaNetHparams {
    /// Floats of one layer's recurrent state: the conv tail and the delta-rule matrices.
    pub fn state_floats(&self) -> usize {
        self.dims.conv_dim() * (self.conv_kernel - 1) + self.dims.state_len()
    }

    /// Read the `ssm.*` keys of `arch`; errors name the missing or inconsistent key.
    pub fn from_gguf(g: &Gguf, arch: &str) -> Result<DeltaNetHparams, ModelError> {
        let u = |suffix: &'static str| {
            arch_usize(g, arch, suffix).ok_or(ModelError::MissingKey(suffix))
        };
        let conv_kernel = u("ssm.conv_kernel")?;
        let head_dim = u("ssm.state_size")?;
        let n_k_heads = u("ssm.group_count")?;
        let n_v_heads = u("ssm.time_step_rank")?;
        let inner = u("ssm.inner_size")?;
        if conv_kernel == 0 || conv_kernel > MAX_CONV_KERNEL {
            return Err(ModelError::BadShape("ssm.conv_kernel (1..=16)"));
        }
        if head_dim == 0 || n_k_heads == 0 || n_v_heads == 0 || !n_v_heads.is_multiple_of(n_k_heads)
        {
            return Err(ModelError::BadShape(
                "ssm.group_count must divide ssm.time_step_rank, both non-zero",
            ));
        }
        // llama.cpp: head_v_dim = inner / n_v_heads and asserts it equals state_size.
        if inner != n_v_heads * head_dim {
            return Err(ModelError::BadShape(
                "ssm.inner_size must be ssm.time_step_rank * ssm.state_size",
            ));
        }
        Ok(DeltaNetHparams {
            dims: DeltaDims {
                n_k_heads,
                n_v_heads,
                head_dim,
            },
            conv_kernel,
        })
    }
}

/// The shape of a short-conv layer (`lfm2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortConvHparams {
    /// Taps of the depthwise conv (`shortconv.l_cache`); the state keeps `l_cache - 1`.
    pub l_cache: usize,
}

impl ShortConvHparams {
    /// Floats of one layer's state (`n_embd` channels of `l_cache - 1` inputs).
    pub fn state_floats(&self, n_embd: usize) -> usize {
        n_embd * (self.l_cache - 1)
    }

    pub fn from_gguf(g: &Gguf, arch: &str) -> Result<ShortConvHparams, ModelError> {
        let l_cache = arch_usize(g, arch, "shortconv.l_cache")
            .ok_or(ModelError::MissingKey("shortconv.l_cache"))?;
        // llama.cpp asserts l_cache > 1.
        if !(2..=MAX_CONV_KERNEL).contains(&l_cache) {
            return Err(ModelError::BadShape("shortconv.l_cache (2..=16)"));
        }
        Ok(ShortConvHparams { l_cache })
    }
}

/// The per-layer mixers and KV heads of a hybrid model, and the recurrent shapes.
#[derive(Clone, Debug)]
pub struct Hybrid {
    pub delta: Option<DeltaNetHparams>,
    pub shortconv: Option<ShortConvHparams>,
    /// Per layer: its token mixer and (attention layers) its KV heads.
    pub layers: heapless::Vec<(MixerKind, usize), MAX_LAYERS>,
}

impl Hybrid {
    /// The hybrid facts of `arch` (`None` for an architecture with attention in every
    /// layer); attention layers take their KV heads from `attention.head_count_kv` (one
    /// integer or one per layer).
    pub fn from_gguf(
        g: &Gguf,
        arch: Arch,
        n_layer: usize,
        n_head: usize,
    ) -> Result<Option<Hybrid>, ModelError> {
        let p = arch.name();
        let mut layers = heapless::Vec::new();
        let too_many = |_| ModelError::BadShape("more layers than pinch holds (128)");
        let (delta, shortconv) = match arch {
            Arch::Qwen35 => {
                let rec = qwen35_recurrent_layers(g, p, n_layer)?;
                let kv = head_count_kv_per_layer(g, p, n_layer, n_head)?;
                for (r, kv) in rec.into_iter().zip(kv) {
                    let k = if r == 1 {
                        (MixerKind::GatedDeltaNet, 0)
                    } else {
                        (MixerKind::Attention, kv)
                    };
                    layers.push(k).map_err(too_many)?;
                }
                (Some(DeltaNetHparams::from_gguf(g, p)?), None)
            }
            Arch::Lfm2 => {
                for h in head_count_kv_per_layer(g, p, n_layer, n_head)? {
                    let k = if h == 0 {
                        (MixerKind::ShortConv, 0)
                    } else {
                        (MixerKind::Attention, h)
                    };
                    layers.push(k).map_err(too_many)?;
                }
                (None, Some(ShortConvHparams::from_gguf(g, p)?))
            }
            _ => return Ok(None),
        };
        for &(m, h) in &layers {
            if m == MixerKind::Attention && (h == 0 || !n_head.is_multiple_of(h)) {
                return Err(ModelError::BadShape(
                    "attention.head_count_kv must divide attention.head_count",
                ));
            }
        }
        Ok(Some(Hybrid {
            delta,
            shortconv,
            layers,
        }))
    }
}

/// Which layers of a `qwen35` model are Gated DeltaNet (the others gated attention):
/// `(il + 1) % full_attention_interval != 0`, the interval 4 when the key is absent.
pub fn qwen35_recurrent_layers(
    g: &Gguf,
    arch: &str,
    n_layer: usize,
) -> Result<PerLayer, ModelError> {
    let interval = arch_usize(g, arch, "full_attention_interval").unwrap_or(4);
    if interval == 0 {
        return Err(ModelError::BadShape("full_attention_interval is 0"));
    }
    let mut v = PerLayer::new();
    for il in 0..n_layer {
        v.push(usize::from(!(il + 1).is_multiple_of(interval)))
            .map_err(|_| ModelError::BadShape("more layers than pinch holds (128)"))?;
    }
    Ok(v)
}

/// `attention.head_count_kv` per layer: one integer for all, or an array of `n_layer`
/// integers; absent = `n_head` everywhere.
pub fn head_count_kv_per_layer(
    g: &Gguf,
    arch: &str,
    n_layer: usize,
    n_head: usize,
) -> Result<PerLayer, ModelError> {
    const KEY: &str = "attention.head_count_kv";
    let mut v = PerLayer::new();
    let too_many = |_| ModelError::BadShape("more layers than pinch holds (128)");
    match arch_value(g, arch, KEY) {
        None => {
            for _ in 0..n_layer {
                v.push(n_head).map_err(too_many)?;
            }
        }
        Some(val) => match val.as_array() {
            Some(a) => {
                if a.len() != n_layer {
                    return Err(ModelError::BadShape(
                        "attention.head_count_kv array length is not block_count",
                    ));
                }
                for il in 0..n_layer {
                    let h = a
                        .u32_at(il)
                        .ok_or(ModelError::BadShape("attention.head_count_kv entry"))?;
                    v.push(h as usize).map_err(too_many)?;
                }
            }
            None => {
                let h = val
                    .as_u32()
                    .ok_or(ModelError::BadShape("attention.head_count_kv"))?;
                for _ in 0..n_layer {
                    v.push(h as usize).map_err(too_many)?;
                }
            }
        },
    }
    Ok(v)
}

/// `rope.dimension_sections` (IMROPE): 4 integers; absent = none.
pub fn rope_sections(g: &Gguf, arch: &str) -> Result<Option<[u32; 4]>, ModelError> {
    let Some(val) = arch_value(g, arch, "rope.dimension_sections") else {
        return Ok(None);
    };
    let a = val.as_array().ok_or(ModelError::BadShape(
        "rope.dimension_sections is not an array",
    ))?;
    // llama.cpp reads up to 4 entries (get_key_or_arr with n = 4).
    if a.is_empty() || a.len() > 4 {
        return Err(ModelError::BadShape(
            "rope.dimension_sections needs 1..=4 entries",
        ));
    }
    let mut s = [0u32; 4];
    for (i, v) in s.iter_mut().enumerate().take(a.len()) {
        *v = a
            .u32_at(i)
            .ok_or(ModelError::BadShape("rope.dimension_sections entry"))?;
    }
    Ok(Some(s))
}

/// Which rotated pairs of an IMROPE head turn with the token's position: for text all
/// of llama.cpp's position ids but the fourth ("extra", always 0 for text) equal the
/// token position, so pair `i` rotates like NEOX rope unless its sector (`i % sum`)
/// belongs to the extra id, when it stays put.
/// Entry `i` is true for pairs that rotate (`n_rot / 2 <= 128` pairs).
pub fn imrope_text_pairs(sections: [u32; 4], n_rot: usize) -> [bool; 128] {
    let mut on = [false; 128];
    let [s0, s1, s2, s3] = sections.map(|s| s as usize);
    let total = s0 + s1 + s2 + s3;
    for (i, o) in on.iter_mut().enumerate().take((n_rot / 2).min(128)) {
        if total == 0 {
            *o = true;
            continue;
        }
        let sector = i % total;
        // ggml_mrope_cache_init, interleaved: t, h, w by sector % 3 while inside their
        // section counts, else the extra id.
        let extra = !((sector % 3 == 0 && sector < 3 * s0)
            || (sector % 3 == 1 && sector < 3 * s1)
            || (sector % 3 == 2 && sector < 3 * s2));
        *o = !extra;
    }
    on
}

/// The delta-rule matrices of a recurrent layer: f32, or f16 with `--state-f16` (half
/// the bytes; rounded to f16 at the end of every `eval`, see
/// [`crate::model::deltanet::DeltaNet::run`]).
pub enum StateMatrix<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [u16]),
}

impl StateMatrix<'_> {
    /// Copy `src` (of the same type and length) into `self`; false when they differ.
    fn copy_from(&mut self, src: &StateMatrix<'_>) -> bool {
        match (self, src) {
            (StateMatrix::F32(d), StateMatrix::F32(s)) if d.len() == s.len() => {
                d.copy_from_slice(s)
            }
            (StateMatrix::F16(d), StateMatrix::F16(s)) if d.len() == s.len() => {
                d.copy_from_slice(s)
            }
            _ => return false,
        }
        true
    }

    /// Values held (f32 or f16).
    pub fn len(&self) -> usize {
        match self {
            StateMatrix::F32(m) => m.len(),
            StateMatrix::F16(m) => m.len(),
        }
    }

    /// Whether it holds nothing (a short-conv layer's).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A recurrent layer's state, fixed in size whatever the context length: the conv tail
/// (the last `k - 1` conv inputs, token-major, f32 always: under 4 % of a Qwen3.5
/// layer's state) and, for Gated DeltaNet, one `d × d` matrix per value head (empty
/// for short-conv layers), f32 or f16.
pub struct RecurrentState<'a> {
    pub conv: &'a mut [f32],
    pub matrix: StateMatrix<'a>,
    /// With speculative decoding: what the latest draft-verifying pass fed the state
    /// (see [`crate::model::draft_log`]).
    pub log: Option<crate::model::draft_log::DraftLog<'a>>,
}

impl<'a> RecurrentState<'a> {
    /// A zeroed state of `conv` + `matrix` values from `arena`, the matrices in f16
    /// when `f16`.
    pub fn new(
        arena: &mut crate::arena::Arena<'a>,
        conv: usize,
        matrix: usize,
        f16: bool,
    ) -> Result<RecurrentState<'a>, crate::arena::ArenaError> {
        let conv = arena.slice("recurrent state", conv)?;
        let matrix = if f16 {
            StateMatrix::F16(arena.slice("recurrent state", matrix)?)
        } else {
            StateMatrix::F32(arena.slice("recurrent state", matrix)?)
        };
        let mut st = RecurrentState {
            conv,
            matrix,
            log: None,
        };
        st.clear();
        Ok(st)
    }

    /// Back to the state before any token (a pass at position 0 starts from it).
    pub fn clear(&mut self) {
        self.conv.fill(0.0);
        match &mut self.matrix {
            StateMatrix::F32(m) => m.fill(0.0),
            // f16 +0.0 is all zero bits.
            StateMatrix::F16(m) => m.fill(0),
        }
    }

    /// The causal conv of `n` tokens of `ch` channels in `x` (in place) with the taps of
    /// `conv` (decoded into `taps`, `2 * ch * k` floats), advancing the conv tail. A pass
    /// at position 0 first clears the whole state: the conv is every recurrent mixer's
    /// first step.
    pub fn conv_inplace(
        &mut self,
        conv: &crate::model::weights::Tensor,
        taps: &mut [f32],
        x: &mut [f32],
        n: usize,
        ch: usize,
        pos0: usize,
    ) -> Result<(), ModelError> {
        if pos0 == 0 {
            self.clear();
        }
        let k = conv.cols;
        let (stored, tap_major) = taps.split_at_mut(ch * k);
        pinch_kernels::matvec::dequantize_row(conv.ty, conv.data, stored)?;
        pinch_kernels::recurrent::taps_tap_major(stored, ch, k, tap_major);
        pinch_kernels::recurrent::conv_causal_inplace(x, n, ch, tap_major, k, self.conv)?;
        Ok(())
    }

    /// Bytes of a state of `conv` + `matrix` values (for the plan).
    pub fn bytes_needed(conv: usize, matrix: usize, f16: bool) -> usize {
        4 * conv + if f16 { 2 } else { 4 } * matrix + 2 * 64
    }
}

/// Floats of a recurrent layer's state: (conv tail, delta-rule matrices).
pub fn recurrent_floats(c: &crate::model::config::Config, mixer: MixerKind) -> (usize, usize) {
    match mixer {
        MixerKind::GatedDeltaNet => c.delta.map_or((0, 0), |d| {
            (d.dims.conv_dim() * (d.conv_kernel - 1), d.dims.state_len())
        }),
        MixerKind::ShortConv => c
            .shortconv
            .map_or((0, 0), |sc| (sc.state_floats(c.n_embd), 0)),
        MixerKind::Attention => (0, 0),
    }
}

/// A copy of every recurrent layer's state at one position, so that
/// `Session::truncate` can return there (a recurrent state cannot be cut back). The
/// session saves it before the last token of every multi-token `eval` (a prompt): a
/// request that repeats a prompt reuses all of it but its last token.
pub struct Checkpoint<'a> {
    /// The position the copies hold (`None`: nothing saved, or no longer a prefix of
    /// the session's tokens).
    pub at: Option<usize>,
    saved: heapless::Vec<RecurrentState<'a>, MAX_LAYERS>,
}

impl<'a> Checkpoint<'a> {
    /// Room for the recurrent layers' states of `c` (matrices in f16 when `f16`).
    pub fn new(
        arena: &mut crate::arena::Arena<'a>,
        c: &crate::model::config::Config,
        f16: bool,
    ) -> Result<Checkpoint<'a>, ModelError> {
        let mut saved = heapless::Vec::new();
        for il in 0..c.n_layer {
            let (conv, matrix) = recurrent_floats(c, c.layer(il).mixer);
            if conv + matrix > 0 {
                let st = RecurrentState::new(arena, conv, matrix, f16)?;
                saved
                    .push(st)
                    .map_err(|_| ModelError::BadShape("more layers than pinch holds (128)"))?;
            }
        }
        Ok(Checkpoint { at: None, saved })
    }

    /// Bytes [`Self::new`] takes (for the plan).
    pub fn bytes_needed(c: &crate::model::config::Config, f16: bool) -> usize {
        (0..c.n_layer)
            .map(|il| recurrent_floats(c, c.layer(il).mixer))
            .filter(|(a, b)| a + b > 0)
            .map(|(a, b)| RecurrentState::bytes_needed(a, b, f16))
            .sum()
    }

    /// Copy the recurrent layers' states (which hold position `at`).
    pub fn save(&mut self, states: &[crate::model::layer::LayerState<'_>], at: usize) {
        let live = states.iter().filter_map(|s| s.recurrent());
        let mut same = true;
        for (dst, src) in self.saved.iter_mut().zip(live) {
            dst.conv.copy_from_slice(src.conv);
            same &= dst.matrix.copy_from(&src.matrix);
        }
        // Made with the session's state type, so the copies always match.
        self.at = same.then_some(at);
    }

    /// Put the saved states back if they hold position `to`; whether they did.
    pub fn restore(&self, states: &mut [crate::model::layer::LayerState<'_>], to: usize) -> bool {
        if self.at != Some(to) {
            return false;
        }
        let live = states.iter_mut().filter_map(|s| s.recurrent_mut());
        let mut same = true;
        for (src, dst) in self.saved.iter().zip(live) {
            dst.conv.copy_from_slice(src.conv);
            same &= dst.matrix.copy_from(&src.matrix);
        }
        same
    }
}

/// Bytes `--state-f16` saves on the recurrent layers' states of `c` (0 without them).
pub fn state_f16_saving(c: &crate::model::config::Config) -> usize {
    (0..c.n_layer)
        .map(|il| recurrent_floats(c, c.layer(il).mixer).1 * 2)
        .sum()
}

/// Floats of [`crate::model::scratch::Scratch::mixer`] for batches of `nb` tokens: the
/// widest need of the model's recurrent mixers and of the attention gate.
pub fn mixer_scratch_floats(c: &crate::model::config::Config, nb: usize) -> usize {
    let delta = c.delta.map_or(0, |d| {
        crate::model::deltanet::DeltaNet::scratch_floats(&d, nb)
    });
    let conv = c.shortconv.map_or(0, |sc| {
        crate::model::shortconv::ShortConv::scratch_floats(&sc, c.n_embd, nb)
    });
    let gate = if c.gated_attn { nb * c.q_dim() } else { 0 };
    delta.max(conv).max(gate)
}

/// The widest input or output of a hybrid model's mixer matrices (the shared matmul
/// buffers are sized for it); 0 for other models.
pub fn widest_matrix(c: &crate::model::config::Config) -> usize {
    let delta = c.delta.map_or(0, |d| d.dims.conv_dim().max(d.dims.v_dim()));
    let conv = if c.shortconv.is_some() {
        3 * c.n_embd
    } else {
        0
    };
    let gate = if c.gated_attn { 2 * c.q_dim() } else { 0 };
    delta.max(conv).max(gate)
}

fn arch_value<'a>(g: &Gguf<'a>, arch: &str, suffix: &str) -> Option<crate::gguf::Value<'a>> {
    g.find_kv(|k| {
        k.strip_prefix(arch)
            .and_then(|r| r.strip_prefix('.'))
            .is_some_and(|r| r == suffix)
    })
}

fn arch_usize(g: &Gguf, arch: &str, suffix: &str) -> Option<usize> {
    arch_value(g, arch, suffix)?
        .as_u64()
        .and_then(|v| usize::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imrope_of_the_qwen35_sections_rotates_every_pair() {
        // [3, 3, 2, 0] on 16 dims (the fixture) and [11, 11, 10, 0] on 64 (Qwen3.5).
        assert!(imrope_text_pairs([3, 3, 2, 0], 16)[..8].iter().all(|&b| b));
        assert!(imrope_text_pairs([11, 11, 10, 0], 64)[..32]
            .iter()
            .all(|&b| b));
        // A section of the extra id: sectors past 3 * s2 with sector % 3 == 2 stay put.
        let p = imrope_text_pairs([2, 2, 1, 1], 12);
        // sectors 0..6: 0 t, 1 h, 2 w, 3 t, 4 h, 5 -> %3 == 2 but 5 >= 3 -> extra.
        assert_eq!(&p[..6], &[true, true, true, true, true, false]);
    }
}
