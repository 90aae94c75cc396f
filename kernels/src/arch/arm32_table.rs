//! The 32-bit ARM kernel table: Advanced SIMD on armv7-a (Cortex-A7/A9/A15 routers and
//! TV boxes with a 32-bit userland), one-row dot products of the formats such devices run
//! most (Q8_0, Q4_0, Q5_0, Q1_0, Q4_K); every other format takes the scalar reference.
//!
//! The kernels are [`super::arm32_neon`]'s; every function here is `unsafe` with the
//! table's contract (the CPU has NEON, see [`super::table`]).
#![allow(unsafe_code)]

use super::arm32_neon as a32;
use super::table::{block_dot, kquant_dot, KernelTable, Kernels};
use crate::quant::q1_0::BlockQ1_0;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_k::BlockQ4K;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q8_0::BlockQ8_0;
use crate::{CpuFeatures, GgmlType as T};

/// The table for `feat`, if it has Advanced SIMD.
pub(super) fn for_features(feat: &CpuFeatures) -> Option<&'static KernelTable> {
    feat.neon().then_some(&NEON32)
}

block_dot!(q8_0_dot, BlockQ8_0, a32::q8_0);
block_dot!(q4_0_dot, BlockQ4_0, a32::q4_0);
block_dot!(q5_0_dot, BlockQ5_0, a32::q5_0);
block_dot!(q1_0_dot, BlockQ1_0, a32::q1_0);
kquant_dot!(q4_k_dot, BlockQ4K, a32::q4_k);

/// armv7-a Advanced SIMD.
static NEON32: KernelTable = KernelTable {
    name: "neon (armv7)",
    entries: &[
        Kernels::plain(T::Q8_0, Some(q8_0_dot), None),
        Kernels::plain(T::Q4_0, Some(q4_0_dot), None),
        Kernels::plain(T::Q5_0, Some(q5_0_dot), None),
        Kernels::plain(T::Q1_0, Some(q1_0_dot), None),
        Kernels::plain(T::Q4_K, Some(q4_k_dot), None),
    ],
};
