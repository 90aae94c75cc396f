//! `pinch inspect`: a human-readable summary of a GGUF file: the metadata that decides
//! how a model runs, every tensor, where the bytes go (so a user can see what a memory
//! budget has to hold), and which matrices would fall back to a slow kernel on this CPU.
//!
//! It formats straight into a `core::fmt::Write`, so it needs no buffer of its own.
use core::fmt::{self, Write};

use pinch_kernels::{arch::has_fast_kernel, CpuFeatures, GgmlType};

use crate::gguf::{Gguf, TensorInfo, Value, ValueType};
use crate::model::config::{Config, FfnKind, LayerKind, MixerKind};
use crate::model::moe_route::Gating;

/// Where a tensor's bytes are counted in the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Embedding,
    Output,
    Attention,
    Ffn,
    Experts,
    Norms,
    Other,
}

impl Group {
    pub const ALL: [Group; 7] = [
        Group::Embedding,
        Group::Output,
        Group::Attention,
        Group::Ffn,
        Group::Experts,
        Group::Norms,
        Group::Other,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Group::Embedding => "embedding",
            Group::Output => "output",
            Group::Attention => "attention",
            Group::Ffn => "ffn",
            Group::Experts => "experts",
            Group::Norms => "norms",
            Group::Other => "other",
        }
    }

    /// The group of a tensor, from llama.cpp's tensor naming. Norms are checked first
    /// because `attn_norm`/`ffn_norm` would otherwise count as attention/FFN weights,
    /// and experts before FFN because expert tensors are `ffn_*_exps`.
    pub fn of(name: &str) -> Group {
        let layer_part = name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .map(|(_, rest)| rest);
        if name.contains("norm") {
            Group::Norms
        } else if name.contains("_exps") || name.contains("_shexp") {
            Group::Experts
        } else if name.starts_with("token_embd") {
            Group::Embedding
        } else if name == "output.weight" {
            Group::Output
        } else if layer_part.is_some_and(|r| r.starts_with("attn_")) {
            Group::Attention
        } else if layer_part.is_some_and(|r| r.starts_with("ffn_")) {
            Group::Ffn
        } else {
            Group::Other
        }
    }
}

/// llama.cpp's name for a `general.file_type` value (`llama_ftype`).
fn file_type_name(ft: u32) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        40 => "Q1_0",
        41 => "Q2_0",
        _ => return None,
    })
}

/// Writes a value on one line; arrays are summarised, not listed.
fn write_value(out: &mut dyn Write, v: &Value<'_>) -> fmt::Result {
    match v {
        Value::Str(s) => {
            // Long strings (chat templates) would drown the summary.
            let mut end = s.len().min(80);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            write!(out, "{:?}", &s[..end])?;
            if end < s.len() {
                write!(out, "... ({} bytes)", s.len())?;
            }
            Ok(())
        }
        Value::Array(a) => {
            write!(out, "[{} x {}", a.len, a.elem.name())?;
            if a.elem != ValueType::Str && a.elem != ValueType::Array && a.len <= 8 {
                out.write_str(":")?;
                for e in a.iter() {
                    out.write_str(" ")?;
                    write_value(out, &e)?;
                }
            }
            out.write_str("]")
        }
        Value::U8(x) => write!(out, "{x}"),
        Value::I8(x) => write!(out, "{x}"),
        Value::U16(x) => write!(out, "{x}"),
        Value::I16(x) => write!(out, "{x}"),
        Value::U32(x) => write!(out, "{x}"),
        Value::I32(x) => write!(out, "{x}"),
        Value::U64(x) => write!(out, "{x}"),
        Value::I64(x) => write!(out, "{x}"),
        Value::F32(x) => write!(out, "{x}"),
        Value::F64(x) => write!(out, "{x}"),
        Value::Bool(x) => write!(out, "{x}"),
    }
}

fn write_shape(out: &mut dyn Write, t: &TensorInfo<'_>) -> fmt::Result {
    out.write_str("[")?;
    for (i, d) in t.shape().iter().enumerate() {
        if i > 0 {
            out.write_str(", ")?;
        }
        write!(out, "{d}")?;
    }
    out.write_str("]")
}

/// A tensor is multiplied by activations (and so needs a matvec kernel) when it is a
/// matrix; 1-D tensors (norm gains, biases) are applied element-wise.
fn is_matrix(t: &TensorInfo<'_>) -> bool {
    t.n_dims >= 2
}

/// Writes the summary of `g` for a CPU with features `feat`.
pub fn inspect(g: &Gguf<'_>, feat: &CpuFeatures, out: &mut dyn Write) -> fmt::Result {
    let arch = g.architecture();
    writeln!(out, "architecture: {}", arch.unwrap_or("(missing)"))?;
    writeln!(
        out,
        "GGUF v{}: {} metadata keys, {} tensors, data at offset {} (alignment {}), file {} bytes",
        g.version,
        g.kv_count(),
        g.tensor_count(),
        g.data_offset,
        g.alignment,
        g.file_len
    )?;

    writeln!(out, "metadata:")?;
    if let Some(v) = g.get("general.name") {
        out.write_str("  name: ")?;
        write_value(out, &v)?;
        out.write_str("\n")?;
    }
    const ARCH_KEYS: [(&str, &str); 16] = [
        ("context length", "context_length"),
        ("embedding length", "embedding_length"),
        ("block count", "block_count"),
        ("feed forward length", "feed_forward_length"),
        ("heads", "attention.head_count"),
        ("kv heads", "attention.head_count_kv"),
        ("key length", "attention.key_length"),
        ("value length", "attention.value_length"),
        ("rms norm eps", "attention.layer_norm_rms_epsilon"),
        ("rope dims", "rope.dimension_count"),
        ("rope base", "rope.freq_base"),
        ("sliding window", "attention.sliding_window"),
        ("experts", "expert_count"),
        ("experts used", "expert_used_count"),
        ("expert ffn length", "expert_feed_forward_length"),
        ("vocab size", "vocab_size"),
    ];
    for (label, suffix) in ARCH_KEYS {
        if let Some(v) = g.arch_get(suffix) {
            write!(out, "  {label}: ")?;
            write_value(out, &v)?;
            out.write_str("\n")?;
        }
    }
    if g.arch_get("vocab_size").is_none() {
        if let Some(tokens) = g.get_array("tokenizer.ggml.tokens") {
            writeln!(out, "  vocab size: {} (tokenizer.ggml.tokens)", tokens.len)?;
        }
    }
    if let Some(m) = g.get_str("tokenizer.ggml.model") {
        writeln!(out, "  tokenizer: {m}")?;
    }
    if let Some(ft) = g.get_u32("general.file_type") {
        writeln!(
            out,
            "  file type: {ft} ({})",
            file_type_name(ft).unwrap_or("unknown")
        )?;
    }
    if let Some(q) = g.get_u32("general.quantization_version") {
        writeln!(out, "  quantization version: {q}")?;
    }

    write_layers(g, out)?;

    writeln!(out, "tensors:")?;
    writeln!(
        out,
        "  {:<40} {:<8} {:<24} {:>12}",
        "name", "type", "shape", "bytes"
    )?;
    for t in g.tensors() {
        write!(out, "  {:<40} {:<8} ", t.name, t.ty.name())?;
        // Pad the shape column by formatting it into a fixed stack buffer first.
        let mut shape = ShapeBuf::default();
        write_shape(&mut shape, &t)?;
        writeln!(out, "{:<24} {:>12}", shape.as_str(), t.bytes)?;
    }

    let total = g.tensor_bytes_total();
    writeln!(out, "bytes by group (total {total}):")?;
    for group in Group::ALL {
        let (n, bytes) = g
            .tensors()
            .filter(|t| Group::of(t.name) == group)
            .fold((0u64, 0u64), |(n, b), t| (n + 1, b + t.bytes));
        if n == 0 {
            continue;
        }
        let pct = if total == 0 {
            0.0
        } else {
            bytes as f64 * 100.0 / total as f64
        };
        writeln!(
            out,
            "  {}: {} bytes ({:.1}%, {} tensors)",
            group.name(),
            bytes,
            pct,
            n
        )?;
    }

    if g.tensor("output.weight").is_none() && g.tensor("token_embd.weight").is_some() {
        writeln!(
            out,
            "  (no output.weight: the LM head is token_embd.weight, tied)"
        )?;
    }

    writeln!(
        out,
        "matrices without a fast kernel on this CPU ({}):",
        feat.describe()
    )?;
    let mut any = false;
    for ty in GgmlType::ALL {
        let slow = |t: &TensorInfo<'_>| t.ty == ty && is_matrix(t) && !has_fast_kernel(ty, feat);
        let (n, bytes) = g
            .tensors()
            .filter(slow)
            .fold((0u64, 0u64), |(n, b), t| (n + 1, b + t.bytes));
        if n == 0 {
            continue;
        }
        any = true;
        write!(out, "  {}: {} tensors, {} bytes:", ty.name(), n, bytes)?;
        for t in g.tensors().filter(slow).take(4) {
            write!(out, " {}", t.name)?;
        }
        if n > 4 {
            out.write_str(" ...")?;
        }
        out.write_str("\n")?;
    }
    if !any {
        writeln!(out, "  none")?;
    }
    Ok(())
}

/// The layer kinds pinch would run, runs of equal layers on one line each (or why it
/// would not run the file).
fn write_layers(g: &Gguf<'_>, out: &mut dyn Write) -> fmt::Result {
    let c = match Config::from_gguf(g) {
        Ok(c) => c,
        Err(e) => return writeln!(out, "layers: pinch cannot run this file: {e}"),
    };
    writeln!(out, "layers:")?;
    let mut il = 0;
    while il < c.n_layer {
        let k = c.layer(il);
        let end = (il..c.n_layer)
            .find(|&j| c.layer(j) != k)
            .unwrap_or(c.n_layer);
        if end - il > 1 {
            write!(out, "  {}-{}: ", il, end - 1)?;
        } else {
            write!(out, "  {il}: ")?;
        }
        write_kind(&c, &k, out)?;
        il = end;
    }
    Ok(())
}

/// One layer kind: its token mixer and its feed-forward.
fn write_kind(c: &Config, k: &LayerKind, out: &mut dyn Write) -> fmt::Result {
    match k.mixer {
        MixerKind::Attention => write!(
            out,
            "attention {}/{} heads x {}, rope on {} dims{}",
            c.n_head,
            k.n_head_kv,
            c.head_dim,
            c.n_rot,
            if c.gated_attn { ", output gate" } else { "" }
        )?,
        MixerKind::GatedDeltaNet => match c.delta {
            Some(d) => write!(
                out,
                "gated deltanet {} key / {} value heads x {}, conv {}",
                d.dims.n_k_heads, d.dims.n_v_heads, d.dims.head_dim, d.conv_kernel
            )?,
            None => out.write_str("gated deltanet")?,
        },
        MixerKind::ShortConv => match c.shortconv {
            Some(h) => write!(out, "short conv of {} taps", h.l_cache)?,
            None => out.write_str("short conv")?,
        },
    }
    out.write_str("; ")?;
    match (k.ffn, c.moe) {
        (FfnKind::Moe, Some(m)) => {
            write!(
                out,
                "{} experts x {}, top {}, {} router",
                m.n_expert,
                m.n_ff_exp,
                m.n_used,
                match m.gating {
                    Gating::Softmax => "softmax",
                    Gating::Sigmoid => "sigmoid",
                }
            )?;
            if m.n_group > 1 {
                write!(out, ", best {} of {} groups", m.n_group_used, m.n_group)?;
            }
            if m.norm_weights {
                out.write_str(", weights renormalised")?;
            }
            if m.weights_scale != 1.0 {
                write!(out, " x {}", m.weights_scale)?;
            }
            if m.n_ff_shexp > 0 {
                write!(out, ", shared expert {}", m.n_ff_shexp)?;
            }
            out.write_str("\n")
        }
        _ => writeln!(out, "dense ffn {}", c.n_ff),
    }
}

/// A small stack buffer for one formatted shape (at most 4 × 20 digits + separators).
struct ShapeBuf {
    buf: [u8; 96],
    len: usize,
}

impl Default for ShapeBuf {
    fn default() -> ShapeBuf {
        ShapeBuf {
            buf: [0; 96],
            len: 0,
        }
    }
}

impl ShapeBuf {
    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("?")
    }
}

impl Write for ShapeBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(fmt::Error)?;
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_follow_llama_cpp_names() {
        assert_eq!(Group::of("token_embd.weight"), Group::Embedding);
        assert_eq!(Group::of("output.weight"), Group::Output);
        assert_eq!(Group::of("output_norm.weight"), Group::Norms);
        assert_eq!(Group::of("token_embd_norm.weight"), Group::Norms);
        assert_eq!(Group::of("blk.0.attn_q.weight"), Group::Attention);
        assert_eq!(Group::of("blk.12.attn_norm.weight"), Group::Norms);
        assert_eq!(Group::of("blk.0.ffn_up.weight"), Group::Ffn);
        assert_eq!(Group::of("blk.0.ffn_gate_inp.weight"), Group::Ffn);
        assert_eq!(Group::of("blk.0.ffn_down_exps.weight"), Group::Experts);
        assert_eq!(Group::of("blk.0.ffn_up_shexp.weight"), Group::Experts);
        assert_eq!(Group::of("blk.0.ssm_a"), Group::Other);
        assert_eq!(Group::of("rope_freqs.weight"), Group::Other);
    }
}
