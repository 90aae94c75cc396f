//! ISA kernels: the only modules of this crate allowed `unsafe`.
//!
//! Each file instantiates the formats' dot products for one ISA. Entry points return
//! `None` when they have no kernel for the type or the CPU lacks the feature, and the
//! caller falls back to the scalar reference. Files are split by format family so the
//! legacy (block-32, ternary, 1/2-bit) and K-quant kernels evolve independently.
use core::ops::Range;

use crate::{CpuFeatures, GgmlType};

#[cfg(target_arch = "arm")]
pub mod arm32_neon;
#[cfg(target_arch = "aarch64")]
pub mod neon_attn;
#[cfg(target_arch = "aarch64")]
pub mod neon_kquant;
#[cfg(target_arch = "aarch64")]
pub mod neon_legacy;
#[cfg(target_arch = "aarch64")]
pub mod neon_repack;
#[cfg(target_arch = "aarch64")]
pub mod neon_rows;
#[cfg(target_arch = "x86_64")]
pub mod x86_act;
#[cfg(target_arch = "x86_64")]
pub mod x86_attn;
#[cfg(target_arch = "x86_64")]
mod x86_gemm;
#[cfg(target_arch = "x86_64")]
mod x86_gemm_lanes;
#[cfg(target_arch = "x86_64")]
pub mod x86_kquant;
#[cfg(target_arch = "x86_64")]
pub mod x86_legacy;
#[cfg(target_arch = "x86_64")]
pub mod x86_repack;
#[cfg(target_arch = "x86_64")]
pub mod x86_rows;

/// Dot product of one weight row with one activation row on the best ISA path that
/// `feat` allows, or `None` if there is none for `ty`.
#[inline]
pub fn vec_dot(ty: GgmlType, feat: &CpuFeatures, w: &[u8], act: &[u8]) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(v) = x86_legacy::vec_dot(ty, feat, w, act) {
            return Some(v);
        }
        if let Some(v) = x86_kquant::vec_dot(ty, feat, w, act) {
            return Some(v);
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if let Some(v) = neon_legacy::vec_dot(ty, feat, w, act) {
            return Some(v);
        }
        if let Some(v) = neon_kquant::vec_dot(ty, feat, w, act) {
            return Some(v);
        }
    }
    #[cfg(target_arch = "arm")]
    {
        if let Some(v) = arm32_neon::vec_dot(ty, feat, w, act) {
            return Some(v);
        }
    }
    let _ = (ty, feat, w, act);
    None
}

/// Row-range product (`crate::matvec::matmul_rows`) on the best ISA path `feat` allows,
/// with the ISA picked once for the whole call. `false` (nothing written) when there is
/// no such kernel for `ty` here; the caller then loops over [`vec_dot`].
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn matmul_rows(
    ty: GgmlType,
    feat: &CpuFeatures,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_row_bytes: usize,
    out: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86_rows::matmul(ty, feat, w, row_bytes, rows, acts, act_row_bytes, out)
    }
    #[cfg(target_arch = "aarch64")]
    {
        neon_rows::matmul(ty, feat, w, row_bytes, rows, acts, act_row_bytes, out)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (ty, feat, w, row_bytes, rows, acts, act_row_bytes, out);
        false
    }
}

/// Row-range product over a repacked tensor (`crate::repack::matmul_rows`; `w` holds all
/// of its rows) on the best ISA path `feat` allows; `false` (nothing written) when there
/// is none here.
#[inline]
pub fn repack_matmul_rows(
    layout: crate::repack::Layout,
    feat: &CpuFeatures,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86_repack::matmul(layout, feat, w, row_bytes, rows, acts, out)
    }
    #[cfg(target_arch = "aarch64")]
    {
        neon_repack::matmul(layout, feat, w, row_bytes, rows, acts, out)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (layout, feat, w, row_bytes, rows, acts, out);
        false
    }
}

/// Shapes of one row-range call, checked once: every row and activation slice the
/// kernels index lies inside the buffers, and `out` has one value per (row, token).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) struct Job {
    pub(crate) row_bytes: usize,
    pub(crate) rows: Range<usize>,
    pub(crate) act_row_bytes: usize,
    pub(crate) n_tok: usize,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl Job {
    pub(crate) fn new(
        w: &[u8],
        row_bytes: usize,
        rows: Range<usize>,
        acts: &[u8],
        act_row_bytes: usize,
        out_len: usize,
    ) -> Option<Job> {
        if row_bytes == 0 || act_row_bytes == 0 || rows.start > rows.end {
            return None;
        }
        if !acts.len().is_multiple_of(act_row_bytes) {
            return None;
        }
        let n_tok = acts.len() / act_row_bytes;
        let w_end = rows.end.checked_mul(row_bytes)?;
        if w_end > w.len() || rows.len().checked_mul(n_tok)? != out_len {
            return None;
        }
        Some(Job {
            row_bytes,
            rows,
            act_row_bytes,
            n_tok,
        })
    }
}

/// Whether [`vec_dot`] has a SIMD kernel for `ty` on this CPU.
pub fn has_fast_kernel(ty: GgmlType, feat: &CpuFeatures) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86_legacy::supports(ty, feat) || x86_kquant::supports(ty, feat)
    }
    #[cfg(target_arch = "aarch64")]
    {
        neon_legacy::supports(ty, feat) || neon_kquant::supports(ty, feat)
    }
    #[cfg(target_arch = "arm")]
    {
        arm32_neon::supports(ty, feat)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "arm")))]
    {
        let _ = (ty, feat);
        false
    }
}
