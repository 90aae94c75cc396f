//! Matrix-vector and matrix-matrix products over a range of weight rows.
//!
//! The engine quantizes an activation row once ([`quantize_activation`]) into the
//! format the weight type pairs with, then calls [`matvec_rows`] on row ranges (one per
//! worker). [`matmul_rows`] does the same for several activation rows (prompt tokens) so
//! a weight row is read once and reused while it is in cache.
//!
//! Both go first to [`crate::arch::matmul_rows`], which picks the ISA once per call and
//! runs tiled row x token loops (Q8_0, Q5_0 and the K-quants on AVX2/AVX-512 VNNI and
//! NEON/dotprod); other types, and CPUs without those, loop over [`vec_dot`] per (row,
//! token). Both paths give the scalar reference's bits for every (row, token).
use core::ops::Range;

use crate::quant::{q5_0, q8_0, q8_1, q8_k};
use crate::{ActFormat, CpuFeatures, GgmlType};

/// What went wrong in a kernel call. Shapes are checked once per call, not per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelError {
    /// pinch has no kernel for this type.
    Unsupported(GgmlType),
    /// A buffer has the wrong length for the shape.
    BadLength {
        what: &'static str,
        expected: usize,
        found: usize,
    },
}

impl core::fmt::Display for KernelError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KernelError::Unsupported(t) => write!(f, "no kernel for tensor type {}", t.name()),
            KernelError::BadLength {
                what,
                expected,
                found,
            } => {
                write!(f, "{what}: expected {expected} bytes, found {found}")
            }
        }
    }
}

impl core::error::Error for KernelError {}

fn check(what: &'static str, expected: usize, found: usize) -> Result<(), KernelError> {
    if expected == found {
        Ok(())
    } else {
        Err(KernelError::BadLength {
            what,
            expected,
            found,
        })
    }
}

/// Scalar dequantization of a whole row (or several rows back to back) of type `ty`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let (qk, bytes) = ty.block_geometry();
    if crate::quant::scalar_kernels(ty).is_none() {
        return Err(KernelError::Unsupported(ty));
    }
    if !dst.len().is_multiple_of(qk) {
        return Err(KernelError::BadLength {
            what: "dequantize output",
            expected: dst.len() / qk * qk,
            found: dst.len(),
        });
    }
    check("dequantize input", dst.len() / qk * bytes, src.len())?;
    let k = crate::quant::scalar_kernels(ty).ok_or(KernelError::Unsupported(ty))?;
    (k.dequantize_row)(src, dst);
    Ok(())
}

/// Convert an f32 activation row into `fmt` (bytes). For the float formats `dst`
/// receives little-endian f32 values (rounded through f16/bf16 where `fmt` says so).
///
/// Q8_0 uses llama.cpp's x86 quantizer ([`q8_0::quantize_row_x86`]: `127 / amax`, ties
/// to even), not the portable reference, on every ISA: the goldens come from an x86
/// build, and an int8 that rounds the other way is amplified by every later layer.
pub fn quantize_activation(fmt: ActFormat, x: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    let need = fmt.row_bytes(x.len()).ok_or(KernelError::BadLength {
        what: "activation length (not a whole number of blocks)",
        expected: 0,
        found: x.len(),
    })?;
    check("activation buffer", need, dst.len())?;
    match fmt {
        ActFormat::F32 | ActFormat::F16 | ActFormat::BF16 => {
            for (v, out) in x.iter().zip(dst.chunks_exact_mut(4)) {
                let r = match fmt {
                    ActFormat::F16 => crate::f16::f16_to_f32(crate::f16::f32_to_f16(*v)),
                    ActFormat::BF16 => crate::f16::bf16_to_f32(crate::f16::f32_to_bf16(*v)),
                    _ => *v,
                };
                out.copy_from_slice(&r.to_le_bytes());
            }
        }
        ActFormat::Q8_0 => q8_0::quantize_row_x86(x, dst),
        ActFormat::Q8_1 => q8_1::quantize_row_x86(x, dst),
        ActFormat::Q8_K => q8_k::quantize_row(x, dst),
    }
    Ok(())
}

/// [`quantize_activation`] on the SIMD quantizers `feat` allows (AVX2 or NEON for Q8_0,
/// Q8_1 and Q8_K): the same bytes, faster; the engine quantizes every matrix input with
/// it.
///
/// # Errors
/// As [`quantize_activation`].
pub fn quantize_activation_on(
    feat: &crate::CpuFeatures,
    fmt: ActFormat,
    x: &[f32],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = feat.avx2_token() {
        if quantize_simd(t, fmt, x, dst) {
            return Ok(());
        }
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(t) = feat.neon_token() {
        if quantize_simd(t, fmt, x, dst) {
            return Ok(());
        }
    }
    let _ = feat;
    quantize_activation(fmt, x, dst)
}

/// [`quantize_activation_on`] on one ISA's quantizer; `false` (the scalar code then runs
/// and reports any shape error) for other formats and shapes, or a block it leaves to
/// the scalar code.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn quantize_simd<Q: crate::arch::act_quant::Quantizer>(
    isa: Q,
    fmt: ActFormat,
    x: &[f32],
    dst: &mut [u8],
) -> bool {
    use crate::arch::act_quant as aq;
    if fmt.row_bytes(x.len()) != Some(dst.len()) {
        return false;
    }
    match fmt {
        ActFormat::Q8_0 => aq::q8_0_row(isa, x, dst),
        ActFormat::Q8_1 => aq::q8_1_row(isa, x, dst),
        ActFormat::Q8_K => return aq::q8_k_row(isa, x, dst),
        _ => return false,
    }
    true
}

/// Scalar reference dot product of one weight row with one activation row
/// ([`crate::quant::WeightBlock::vec_dot`] of `ty`'s block).
///
/// # Errors
/// [`KernelError::Unsupported`] when pinch has no kernel for `ty`.
pub fn vec_dot_scalar(ty: GgmlType, w: &[u8], act: &[u8]) -> Result<f32, KernelError> {
    let dot = crate::quant::scalar_kernels(ty)
        .and_then(|k| k.vec_dot)
        .ok_or(KernelError::Unsupported(ty))?;
    Ok(dot(w, act))
}

/// Scalar reference of the arithmetic the SIMD kernels for `feat` compute: what
/// [`vec_dot`] returns bit for bit. The same as [`vec_dot_scalar`] except Q8_0/Q5_0 on
/// NEON and the K-quants on aarch64 NEON, which sum per block ([`q8_0::Order::BlockSum`],
/// [`crate::quant::q8_k::kquant_dot_blocksum`]).
///
/// # Errors
/// [`KernelError::Unsupported`] when pinch has no kernel for `ty`.
pub fn vec_dot_reference(
    ty: GgmlType,
    feat: &CpuFeatures,
    w: &[u8],
    act: &[u8],
) -> Result<f32, KernelError> {
    let order = q8_0::Order::of(feat);
    let k = crate::quant::q8_k::order_of(feat);
    use crate::quant::{q2_k, q3_k, q4_k, q5_k, q6_k};
    match ty {
        GgmlType::Q8_0 => Ok(q8_0::vec_dot_in(order, w, act)),
        GgmlType::Q5_0 => Ok(q5_0::vec_dot_in(order, w, act)),
        GgmlType::Q2_K => Ok(q2_k::vec_dot_in(k, w, act)),
        GgmlType::Q3_K => Ok(q3_k::vec_dot_in(k, w, act)),
        GgmlType::Q4_K => Ok(q4_k::vec_dot_in(k, w, act)),
        GgmlType::Q5_K => Ok(q5_k::vec_dot_in(k, w, act)),
        GgmlType::Q6_K => Ok(q6_k::vec_dot_in(k, w, act)),
        _ => vec_dot_scalar(ty, w, act),
    }
}

/// Dot product on the fastest path `feat` allows.
///
/// # Errors
/// [`KernelError::Unsupported`] when pinch has no kernel for `ty`.
#[inline]
pub fn vec_dot(ty: GgmlType, feat: &CpuFeatures, w: &[u8], act: &[u8]) -> Result<f32, KernelError> {
    match crate::arch::vec_dot(ty, feat, w, act) {
        Some(v) => Ok(v),
        None => vec_dot_reference(ty, feat, w, act),
    }
}

/// `out[i] = dot(row rows.start + i of w, act)`.
///
/// # Preconditions (checked, error on violation)
/// `w` holds whole rows of `row_bytes`; `rows` lies inside it; `act` is one activation
/// row of the pairing format; `out.len() == rows.len()`.
pub fn matvec_rows(
    ty: GgmlType,
    feat: &CpuFeatures,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    act: &[u8],
    out: &mut [f32],
) -> Result<(), KernelError> {
    matmul_rows(ty, feat, w, row_bytes, rows, act, act.len(), out)
}

/// Several activation rows at once: `acts` holds `n_tok` rows of `act_row_bytes`;
/// `out` is row-major over weight rows: `out[i * n_tok + t] = dot(row rows.start+i, act t)`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows(
    ty: GgmlType,
    feat: &CpuFeatures,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_row_bytes: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let fmt = ty.act_format().ok_or(KernelError::Unsupported(ty))?;
    if act_row_bytes == 0 || !acts.len().is_multiple_of(act_row_bytes) {
        return Err(KernelError::BadLength {
            what: "activation rows",
            expected: act_row_bytes,
            found: acts.len(),
        });
    }
    let n_tok = acts.len() / act_row_bytes;
    let (qk, bytes) = ty.block_geometry();
    let n = row_bytes / bytes * qk;
    check(
        "weight row bytes",
        ty.row_bytes(n as u64).unwrap_or(0) as usize,
        row_bytes,
    )?;
    check(
        "activation row bytes",
        fmt.row_bytes(n).unwrap_or(0),
        act_row_bytes,
    )?;
    if rows.end > w.len() / row_bytes.max(1) || rows.start > rows.end {
        return Err(KernelError::BadLength {
            what: "weight rows",
            expected: rows.end * row_bytes,
            found: w.len(),
        });
    }
    check("output", rows.len() * n_tok, out.len())?;
    if crate::arch::matmul_rows(
        ty,
        feat,
        w,
        row_bytes,
        rows.clone(),
        acts,
        act_row_bytes,
        out,
    ) {
        return Ok(());
    }
    // The one-row kernel, looked up once; the reference where it has no answer.
    let fast = crate::arch::table(feat).dot_kernel(ty);
    for (i, r) in rows.enumerate() {
        let wr = &w[r * row_bytes..(r + 1) * row_bytes];
        for t in 0..n_tok {
            let act = &acts[t * act_row_bytes..(t + 1) * act_row_bytes];
            out[i * n_tok + t] = match fast.and_then(|k| k.call(wr, act)) {
                Some(v) => v,
                None => vec_dot_reference(ty, feat, wr, act)?,
            };
        }
    }
    Ok(())
}
