//! ISA kernels: the only modules of this crate allowed `unsafe`.
//!
//! Each file instantiates the formats' dot products for one ISA. Entry points return
//! `None` when they have no kernel for the type or the CPU lacks the feature, and the
//! caller falls back to the scalar reference. Files are split by format family so the
//! legacy (block-32, ternary, 1/2-bit) and K-quant kernels evolve independently.
use crate::{CpuFeatures, GgmlType};

#[cfg(target_arch = "aarch64")]
pub mod neon_kquant;
#[cfg(target_arch = "aarch64")]
pub mod neon_legacy;
#[cfg(target_arch = "x86_64")]
pub mod x86_kquant;
#[cfg(target_arch = "x86_64")]
pub mod x86_legacy;

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
    let _ = (ty, feat, w, act);
    None
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
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (ty, feat);
        false
    }
}
