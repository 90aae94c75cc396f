//! STUB: SIMD kernels to be written.
#![allow(unsafe_code)]
use crate::{CpuFeatures, GgmlType};

/// SIMD dot product for `ty`, or `None` when there is no kernel here.
pub fn vec_dot(_ty: GgmlType, _feat: &CpuFeatures, _w: &[u8], _act: &[u8]) -> Option<f32> {
    None
}

/// Whether this file has a kernel for `ty` on `feat`.
pub fn supports(_ty: GgmlType, _feat: &CpuFeatures) -> bool {
    false
}
