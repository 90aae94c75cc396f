//! ISA kernels: the only modules of this crate allowed `unsafe`.
//!
//! [`table`] is the one dispatch: per ISA level a `static` [`KernelTable`] of (weight
//! type, layout) → one-row kernel, row-range tile kernel, repacked-layout kernel,
//! picked from a [`CpuFeatures`] value that only detection can make
//! ([`x86_table`]: AVX2, AVX2 + AVX-512 VNNI; [`neon_table`]: NEON, NEON + dotprod).
//! A type without an entry takes the scalar reference in [`crate::quant`].
//!
//! The kernels live in files split by format family (legacy block-32 and 1/2-bit,
//! K-quants, tiles, repacked layouts, attention), so each evolves on its own; the
//! attention and activation entry points that are not in the table take a feature token
//! ([`crate::cpu::Avx2`], [`crate::cpu::Neon`]).
use core::ops::Range;

use crate::{CpuFeatures, GgmlType};

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod act_quant;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod q1_lut;
pub mod table;
pub use table::{table, KernelTable};

#[cfg(target_arch = "arm")]
mod arm32_neon;
#[cfg(target_arch = "arm")]
mod arm32_table;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod min_rows;
#[cfg(target_arch = "aarch64")]
pub mod neon_attn;
#[cfg(target_arch = "aarch64")]
mod neon_iq2;
#[cfg(target_arch = "aarch64")]
mod neon_iq4;
#[cfg(target_arch = "aarch64")]
mod neon_kq_pack;
#[cfg(target_arch = "aarch64")]
mod neon_kquant;
#[cfg(target_arch = "aarch64")]
mod neon_legacy;
#[cfg(target_arch = "aarch64")]
mod neon_min;
#[cfg(target_arch = "aarch64")]
mod neon_pair_lut;
#[cfg(target_arch = "aarch64")]
mod neon_q1_lut;
#[cfg(target_arch = "aarch64")]
mod neon_q1_lut8;
#[cfg(target_arch = "aarch64")]
mod neon_q2k_pack;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon_q2k_repack;
#[cfg(target_arch = "aarch64")]
mod neon_quant;
#[cfg(target_arch = "aarch64")]
mod neon_repack;
#[cfg(target_arch = "aarch64")]
mod neon_rows;
#[cfg(target_arch = "aarch64")]
mod neon_table;
#[cfg(target_arch = "aarch64")]
mod neon_ternary_pack;
#[cfg(target_arch = "x86_64")]
pub mod x86_act;
#[cfg(target_arch = "x86_64")]
pub mod x86_attn;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_delta;
#[cfg(target_arch = "x86_64")]
pub mod x86_f16;
#[cfg(target_arch = "x86_64")]
mod x86_gemm;
#[cfg(target_arch = "x86_64")]
mod x86_gemm_lanes;
#[cfg(target_arch = "x86_64")]
mod x86_iq4;
#[cfg(target_arch = "x86_64")]
mod x86_iq4_nl_rows;
#[cfg(target_arch = "x86_64")]
mod x86_kquant;
#[cfg(target_arch = "x86_64")]
mod x86_kquant512;
#[cfg(target_arch = "x86_64")]
mod x86_legacy;
#[cfg(target_arch = "x86_64")]
mod x86_min;
#[cfg(target_arch = "x86_64")]
mod x86_q1_lut;
#[cfg(target_arch = "x86_64")]
mod x86_q1_lut512;
#[cfg(target_arch = "x86_64")]
mod x86_q4_0_rows;
#[cfg(target_arch = "x86_64")]
mod x86_q5_0x4s;
#[cfg(target_arch = "x86_64")]
mod x86_quant;
#[cfg(target_arch = "x86_64")]
mod x86_repack;
#[cfg(target_arch = "x86_64")]
mod x86_rows;
#[cfg(target_arch = "x86_64")]
mod x86_stream;
#[cfg(target_arch = "x86_64")]
mod x86_table;

/// Dot product of one weight row with one activation row on the best ISA path that
/// `feat` allows, or `None` if there is none for `ty` (or the shapes do not fit it).
#[inline]
pub fn vec_dot(ty: GgmlType, feat: &CpuFeatures, w: &[u8], act: &[u8]) -> Option<f32> {
    table(feat).dot_kernel(ty)?.call(w, act)
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
    table(feat).rows(ty, w, row_bytes, rows, acts, act_row_bytes, out)
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
    table(feat).packed(layout, w, row_bytes, rows, acts, out)
}

/// Shapes of one row-range call, checked once: every row and activation slice the
/// kernels index lies inside the buffers, and `out` has one value per (row, token).
/// (Built everywhere: the table's entry types name it; armv7 has no row-range kernels.)
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct Job {
    pub(crate) row_bytes: usize,
    pub(crate) rows: Range<usize>,
    pub(crate) act_row_bytes: usize,
    pub(crate) n_tok: usize,
}

#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
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
    table(feat).has_dot(ty)
}
