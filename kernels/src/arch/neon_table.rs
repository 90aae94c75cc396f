//! The NEON kernel tables: baseline Advanced SIMD (Cortex-A53, Apple A7) and NEON +
//! dotprod (`sdot`: Cortex-A55 and later).
//!
//! Each entry names the kernels of one (type, layout); the kernels live in the
//! format-family files (`neon_legacy`, `neon_kquant`: one row; `neon_rows`: row x token
//! tiles; `neon_min`: Q4_1/Q5_1, one row and row ranges; `neon_repack`: repacked
//! layouts), each compiled once per level so that `sdot` only ever appears in the
//! dotprod table's functions.
//!
//! Every function here is `unsafe` with the table's contract (the CPU has the table's
//! ISA, see [`super::table`]).
#![allow(unsafe_code)]

use super::neon_iq2 as iq2;
use super::neon_iq4 as iq4;
use super::neon_kq_pack as kp;
use super::neon_legacy::{self as lg, base, dot};
use super::neon_min as mn;
use super::neon_pair_lut as pair_lut;
use super::neon_q1_lut::Neon as Q1Lut;
use super::neon_q1_lut8::{NeonQ1Lut8 as Q1Lut8, NeonQ2Lut8 as Q2Lut8};
use super::neon_q2k_pack as q2k_pack;
use super::neon_repack as rp;
use super::neon_rows::{kquant, lanes};
use super::neon_ternary_pack as tern;
use super::q1_lut;
use super::table::{block_dot, float_dot, kquant_dot, KernelTable, Kernels};
use super::{neon_kquant as kq, Job};
use crate::quant::iq2_xxs::BlockIq2Xxs;
use crate::quant::iq4_nl::BlockIq4Nl;
use crate::quant::iq4_xs::BlockIq4Xs;
use crate::quant::q1_0::BlockQ1_0;
use crate::quant::q2_0::BlockQ2_0;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::tq2_0::BlockTq2_0;
use crate::quant::{
    q2_k::BlockQ2K, q3_k::BlockQ3K, q4_k::BlockQ4K, q5_k::BlockQ5K, q6_k::BlockQ6K,
};
use crate::repack::Layout;
use crate::{CpuFeatures, GgmlType as T};

/// The table for `feat`, if it has Advanced SIMD.
pub(super) fn for_features(feat: &CpuFeatures) -> Option<&'static KernelTable> {
    if feat.neon_dot_token().is_some() {
        Some(&NEON_DOT)
    } else if feat.neon_token().is_some() {
        Some(&NEON)
    } else {
        None
    }
}

block_dot!(q8_0_base, BlockQ8_0, base::q8_0);
block_dot!(q4_0_base, BlockQ4_0, base::q4_0);
block_dot!(q5_0_base, BlockQ5_0, base::q5_0);
block_dot!(q1_0_base, BlockQ1_0, base::q1_0);
block_dot!(q2_0_base, BlockQ2_0, base::q2_0);
block_dot!(tq2_0_base, BlockTq2_0, base::tq2_0);
block_dot!(q4_1_base, BlockQ4_1, mn::base::dot_row::<BlockQ4_1>);
block_dot!(q5_1_base, BlockQ5_1, mn::base::dot_row::<BlockQ5_1>);
block_dot!(q8_0_dot, BlockQ8_0, dot::q8_0);
block_dot!(q4_1_dot, BlockQ4_1, mn::dot::dot_row::<BlockQ4_1>);
block_dot!(q5_1_dot, BlockQ5_1, mn::dot::dot_row::<BlockQ5_1>);
block_dot!(q4_0_dot, BlockQ4_0, dot::q4_0);
block_dot!(q5_0_dot, BlockQ5_0, dot::q5_0);
block_dot!(q1_0_dot, BlockQ1_0, dot::q1_0);
block_dot!(q2_0_dot, BlockQ2_0, dot::q2_0);
block_dot!(tq2_0_dot, BlockTq2_0, dot::tq2_0);

float_dot!(f32_dot, lg::f32_row, 4);
float_dot!(f16_dot, lg::f16_row, 2);

kquant_dot!(iq2_xxs_base, BlockIq2Xxs, iq2::base);
kquant_dot!(iq2_xxs_dot, BlockIq2Xxs, iq2::dot);
kquant_dot!(iq4_xs_base, BlockIq4Xs, iq4::base);
kquant_dot!(iq4_xs_dot, BlockIq4Xs, iq4::dot);
block_dot!(iq4_nl_base, BlockIq4Nl, iq4::nl_base);
block_dot!(iq4_nl_dot, BlockIq4Nl, iq4::nl_dot);
kquant_dot!(q2_k_base, BlockQ2K, kq::dot_neon);
kquant_dot!(q3_k_base, BlockQ3K, kq::dot_neon);
kquant_dot!(q4_k_base, BlockQ4K, kq::dot_neon);
kquant_dot!(q5_k_base, BlockQ5K, kq::dot_neon);
kquant_dot!(q6_k_base, BlockQ6K, kq::dot_neon);
kquant_dot!(q2_k_dot, BlockQ2K, kq::dot_sdot);
kquant_dot!(q3_k_dot, BlockQ3K, kq::dot_sdot);
kquant_dot!(q4_k_dot, BlockQ4K, kq::dot_sdot);
kquant_dot!(q5_k_dot, BlockQ5K, kq::dot_sdot);
kquant_dot!(q6_k_dot, BlockQ6K, kq::dot_sdot);

/// A row-range `RowsFn` running one tiled kernel.
macro_rules! rows_fn {
    ($name:ident, $kernel:expr) => {
        unsafe fn $name(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
            // SAFETY: the table's contract; `Job::new` checked every slice indexed.
            unsafe { $kernel(job, w, acts, out) }
        }
    };
}
rows_fn!(q8_0_rows_base, lanes::base::<BlockQ8_0>);
rows_fn!(q5_0_rows_base, lanes::base::<BlockQ5_0>);
rows_fn!(q4_1_rows_base, mn::base::job::<BlockQ4_1>);
rows_fn!(q5_1_rows_base, mn::base::job::<BlockQ5_1>);
rows_fn!(q4_1_rows_dot, mn::dot::job::<BlockQ4_1>);
rows_fn!(q5_1_rows_dot, mn::dot::job::<BlockQ5_1>);
rows_fn!(q2_k_rows_base, kquant::base::<BlockQ2K>);
rows_fn!(q3_k_rows_base, kquant::base::<BlockQ3K>);
rows_fn!(q4_k_rows_base, kquant::base::<BlockQ4K>);
rows_fn!(q5_k_rows_base, kquant::base::<BlockQ5K>);
rows_fn!(q6_k_rows_base, kquant::base::<BlockQ6K>);
rows_fn!(q8_0_rows_dot, lanes::dot::<BlockQ8_0>);
rows_fn!(q5_0_rows_dot, lanes::dot::<BlockQ5_0>);
rows_fn!(q2_k_rows_dot, kquant::dot::<BlockQ2K>);
rows_fn!(q3_k_rows_dot, kquant::dot::<BlockQ3K>);
rows_fn!(q4_k_rows_dot, kquant::dot::<BlockQ4K>);
rows_fn!(q5_k_rows_dot, kquant::dot::<BlockQ5K>);
rows_fn!(q6_k_rows_dot, kquant::dot::<BlockQ6K>);

/// Baseline Advanced SIMD.
pub(super) static NEON: KernelTable = KernelTable {
    name: "neon",
    entries: &[
        Kernels::plain(T::Q8_0, Some(q8_0_base), Some(q8_0_rows_base)),
        Kernels::plain(T::Q5_0, Some(q5_0_base), Some(q5_0_rows_base)),
        Kernels::plain(T::Q4_0, Some(q4_0_base), None),
        Kernels::plain(T::Q4_1, Some(q4_1_base), Some(q4_1_rows_base)),
        Kernels::plain(T::Q5_1, Some(q5_1_base), Some(q5_1_rows_base)),
        Kernels::plain(T::Q1_0, Some(q1_0_base), None),
        Kernels::plain(T::Q2_0, Some(q2_0_base), None),
        Kernels::plain(T::TQ2_0, Some(tq2_0_base), None),
        Kernels::plain(T::F32, Some(f32_dot), None),
        Kernels::plain(T::F16, Some(f16_dot), None),
        Kernels::plain(T::Q2_K, Some(q2_k_base), Some(q2_k_rows_base)),
        Kernels::plain(T::Q3_K, Some(q3_k_base), Some(q3_k_rows_base)),
        Kernels::plain(T::Q4_K, Some(q4_k_base), Some(q4_k_rows_base)),
        Kernels::plain(T::Q5_K, Some(q5_k_base), Some(q5_k_rows_base)),
        Kernels::plain(T::Q6_K, Some(q6_k_base), Some(q6_k_rows_base)),
        Kernels::plain(T::IQ2_XXS, Some(iq2_xxs_base), None),
        Kernels::plain(T::IQ4_XS, Some(iq4_xs_base), None),
        Kernels::plain(T::IQ4_NL, Some(iq4_nl_base), None),
        Kernels::packed(T::Q8_0, Layout::Q8_0x4, rp::q8_0x4_base),
        Kernels::packed(T::Q5_0, Layout::Q5_0x4s, rp::q5_0x4s_base),
        Kernels::packed(T::Q4_0, Layout::Q4_0x4s, rp::q4_0x4s_base),
        Kernels::packed(T::Q1_0, Layout::Q1_0x16, q1_lut::matmul::<Q1Lut>),
        // Inexact, on request only (`--lut8`; `Layout::preferred` takes the entry above).
        Kernels::packed(T::Q1_0, Layout::Q1_0x16Lut8, q1_lut::matmul::<Q1Lut8>),
        Kernels::packed(T::Q2_0, Layout::Q2_0x16Lut8, q1_lut::matmul::<Q2Lut8>),
        Kernels::packed(T::Q2_K, Layout::Q2Kx8, q2k_pack::base),
        // Preferred first: the pair tables count fewer instructions than `smlal`.
        Kernels::packed(T::TQ2_0, Layout::Tq2_0x16, pair_lut::tq2_0x16_base),
        Kernels::packed(T::Q2_0, Layout::Q2_0x16, pair_lut::q2_0x16_base),
        Kernels::packed(T::TQ2_0, Layout::Tq2_0x4, tern::tq2_0x4_base),
        Kernels::packed(T::Q2_0, Layout::Q2_0x4, tern::q2_0x4_base),
        Kernels::packed(T::TQ1_0, Layout::Tq1_0x4, tern::tq1_0x4_base),
        Kernels::packed(T::Q4_K, Layout::Q4Kx4, kp::q4_kx4_base),
        Kernels::packed(T::Q6_K, Layout::Q6Kx4, kp::q6_kx4_base),
    ],
};

/// Advanced SIMD + dotprod.
pub(super) static NEON_DOT: KernelTable = KernelTable {
    name: "neon+dotprod",
    entries: &[
        Kernels::plain(T::Q8_0, Some(q8_0_dot), Some(q8_0_rows_dot)),
        Kernels::plain(T::Q5_0, Some(q5_0_dot), Some(q5_0_rows_dot)),
        Kernels::plain(T::Q4_0, Some(q4_0_dot), None),
        Kernels::plain(T::Q4_1, Some(q4_1_dot), Some(q4_1_rows_dot)),
        Kernels::plain(T::Q5_1, Some(q5_1_dot), Some(q5_1_rows_dot)),
        Kernels::plain(T::Q1_0, Some(q1_0_dot), None),
        Kernels::plain(T::Q2_0, Some(q2_0_dot), None),
        Kernels::plain(T::TQ2_0, Some(tq2_0_dot), None),
        Kernels::plain(T::F32, Some(f32_dot), None),
        Kernels::plain(T::F16, Some(f16_dot), None),
        Kernels::plain(T::Q2_K, Some(q2_k_dot), Some(q2_k_rows_dot)),
        Kernels::plain(T::Q3_K, Some(q3_k_dot), Some(q3_k_rows_dot)),
        Kernels::plain(T::Q4_K, Some(q4_k_dot), Some(q4_k_rows_dot)),
        Kernels::plain(T::Q5_K, Some(q5_k_dot), Some(q5_k_rows_dot)),
        Kernels::plain(T::Q6_K, Some(q6_k_dot), Some(q6_k_rows_dot)),
        Kernels::plain(T::IQ2_XXS, Some(iq2_xxs_dot), None),
        Kernels::plain(T::IQ4_XS, Some(iq4_xs_dot), None),
        Kernels::plain(T::IQ4_NL, Some(iq4_nl_dot), None),
        // Preferred first: `sdot` by element needs no reduction.
        Kernels::packed(T::Q8_0, Layout::Q8_0x4s, rp::q8_0x4s_dot),
        Kernels::packed(T::Q8_0, Layout::Q8_0x4, rp::q8_0x4_dot),
        // Preferred first: no fifth-bit merge, no `- 16` term.
        Kernels::packed(T::Q5_0, Layout::Q5_0x4d, rp::q5_0x4d_dot),
        Kernels::packed(T::Q5_0, Layout::Q5_0x4s, rp::q5_0x4s_dot),
        Kernels::packed(T::Q4_0, Layout::Q4_0x4s, rp::q4_0x4s_dot),
        Kernels::packed(T::Q4_K, Layout::Q4Kx4, kp::q4_kx4_dot),
        Kernels::packed(T::Q6_K, Layout::Q6Kx4, kp::q6_kx4_dot),
        // The lookup-table kernel needs no `sdot` (and counts fewer instructions).
        Kernels::packed(T::Q1_0, Layout::Q1_0x16, q1_lut::matmul::<Q1Lut>),
        // Inexact, on request only (`--lut8`; `Layout::preferred` takes the entry above).
        Kernels::packed(T::Q1_0, Layout::Q1_0x16Lut8, q1_lut::matmul::<Q1Lut8>),
        Kernels::packed(T::Q2_0, Layout::Q2_0x16Lut8, q1_lut::matmul::<Q2Lut8>),
        Kernels::packed(T::Q2_K, Layout::Q2Kx8, q2k_pack::dot),
        // Preferred first: 16 rows per vector, no accumulator merges (both).
        Kernels::packed(T::TQ2_0, Layout::Tq2_0x16d, pair_lut::tq2_0x16d_dot),
        Kernels::packed(T::TQ2_0, Layout::Tq2_0x4, tern::tq2_0x4_dot),
        Kernels::packed(T::Q2_0, Layout::Q2_0x16d, pair_lut::q2_0x16d_dot),
        Kernels::packed(T::Q2_0, Layout::Q2_0x4, tern::q2_0x4_dot),
        Kernels::packed(T::TQ1_0, Layout::Tq1_0x4, tern::tq1_0x4_dot),
    ],
};
