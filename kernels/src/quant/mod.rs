//! Quant formats, one module each, bit-compatible with llama.cpp's GGUF blocks.
//!
//! Every module has the same shape:
//! - a `#[repr(C)]` block struct (`BlockQ4K`, ...) made of `u8` arrays, with a
//!   compile-time size assertion and its bits per weight and formula in the doc;
//! - `QK` (weights per block) and `BLOCK_BYTES`;
//! - `dequantize_row(src, dst)`: scalar reference, whole blocks
//!   (`dst.len() == src.len() / BLOCK_BYTES * QK`);
//! - `vec_dot(w, act) -> f32`: scalar reference dot product of one weight row with one
//!   activation row in the format llama.cpp pairs it with ([`crate::ActFormat`]).
//!
//! These references are what every SIMD kernel in [`crate::arch`] is tested against.
//!
//! [`QuantBlock`] and [`WeightBlock`] state those facts once per format as a type (block
//! size, bytes, the activation block it is dotted with, the scalar references), and
//! [`quant_formats!`] implements them for every format from one list, checking at compile
//! time that the struct has the module's size and that `GgmlType::act_format` names
//! the same pairing (`GgmlType::block_geometry` reads the module's constants). The run-time dispatch by [`GgmlType`] ([`scalar_kernels`]) is
//! generated from the same list, so a format is added in one place.
use crate::blocks::Pod;
use crate::{ActFormat, GgmlType};

pub mod float;
pub mod iq2_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod lut8;
pub mod q1_0;
pub mod q2_0;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
pub mod tq1_0;
pub mod tq2_0;

/// A quant block type: `QK` weights in `BYTES` bytes, with a scalar dequantization.
pub trait QuantBlock: Pod {
    /// The GGUF type of tensors made of these blocks.
    const TYPE: GgmlType;
    /// Weights per block.
    const QK: usize;
    /// Bytes per block (`size_of::<Self>()`, asserted at compile time).
    const BYTES: usize;
    /// Scalar reference: dequantize whole blocks (`dst.len() == src.len() / BYTES * QK`).
    fn dequantize_row(src: &[u8], dst: &mut [f32]);
}

/// A weight block and the activation block llama.cpp dots it with.
pub trait WeightBlock: QuantBlock {
    /// The activation block (`BlockQ8_0` for the block-32 formats, `BlockQ8_1` for Q4_1/Q5_1, `BlockQ8K` for the
    /// K-quants and ternary formats).
    type Act: QuantBlock;
    /// The activation format, as [`GgmlType::act_format`] reports it.
    const ACT: ActFormat;
    /// Scalar reference dot product of one weight row with one activation row.
    fn vec_dot(w: &[u8], act: &[u8]) -> f32;
}

/// A scalar reference dot product: one weight row with one activation row.
pub type ScalarDot = fn(&[u8], &[u8]) -> f32;

/// The scalar references of one type, as function pointers (for dispatch by type).
#[derive(Clone, Copy, Debug)]
pub struct ScalarKernels {
    /// Weights per block and bytes per block.
    pub geometry: (usize, usize),
    /// Whole-block dequantization.
    pub dequantize_row: fn(&[u8], &mut [f32]),
    /// Dot product with one activation row (`None` for a type that is never a weight
    /// here, Q8_K).
    pub vec_dot: Option<ScalarDot>,
}

/// Implement [`QuantBlock`] / [`WeightBlock`] for each listed format and generate
/// [`scalar_kernels`]. Each line: `TYPE => module::Block, activation format, activation
/// block`, or `TYPE => module::Block` for a block that is only an activation.
macro_rules! quant_formats {
    (
        weights { $($ty:ident => $m:ident :: $b:ident, $act:ident, $ab:ty;)* }
        activations { $($aty:ident => $am:ident :: $abk:ident;)* }
    ) => {
        $(
            quant_formats!(@block $ty, $m, $b);
            impl WeightBlock for $m::$b {
                type Act = $ab;
                const ACT: ActFormat = ActFormat::$act;
                #[inline]
                fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
                    $m::vec_dot(w, act)
                }
            }
            static_assertions::const_assert!(matches!(
                GgmlType::$ty.act_format(),
                Some(ActFormat::$act)
            ));
        )*
        $(quant_formats!(@block $aty, $am, $abk);)*

        /// The scalar references of `ty`, `None` when pinch has none.
        pub fn scalar_kernels(ty: GgmlType) -> Option<ScalarKernels> {
            fn of<B: WeightBlock>() -> ScalarKernels {
                ScalarKernels {
                    geometry: (B::QK, B::BYTES),
                    dequantize_row: B::dequantize_row,
                    vec_dot: Some(B::vec_dot),
                }
            }
            fn act<B: QuantBlock>() -> ScalarKernels {
                ScalarKernels {
                    geometry: (B::QK, B::BYTES),
                    dequantize_row: B::dequantize_row,
                    vec_dot: None,
                }
            }
            let float = |dequantize_row, vec_dot| ScalarKernels {
                geometry: ty.block_geometry(),
                dequantize_row,
                vec_dot: Some(vec_dot),
            };
            Some(match ty {
                GgmlType::F32 => float(float::dequantize_row_f32, float::vec_dot_f32),
                GgmlType::F16 => float(float::dequantize_row_f16, float::vec_dot_f16),
                GgmlType::BF16 => float(float::dequantize_row_bf16, float::vec_dot_bf16),
                $(GgmlType::$ty => of::<$m::$b>(),)*
                $(GgmlType::$aty => act::<$am::$abk>(),)*
                _ => return None,
            })
        }
    };
    (@block $ty:ident, $m:ident, $b:ident) => {
        impl QuantBlock for $m::$b {
            const TYPE: GgmlType = GgmlType::$ty;
            const QK: usize = $m::QK;
            const BYTES: usize = $m::BLOCK_BYTES;
            #[inline]
            fn dequantize_row(src: &[u8], dst: &mut [f32]) {
                $m::dequantize_row(src, dst)
            }
        }
        static_assertions::const_assert_eq!(core::mem::size_of::<$m::$b>(), $m::BLOCK_BYTES);
    };
}

quant_formats! {
    weights {
        Q4_0 => q4_0::BlockQ4_0, Q8_0, q8_0::BlockQ8_0;
        Q4_1 => q4_1::BlockQ4_1, Q8_1, q8_1::BlockQ8_1;
        Q5_0 => q5_0::BlockQ5_0, Q8_0, q8_0::BlockQ8_0;
        Q5_1 => q5_1::BlockQ5_1, Q8_1, q8_1::BlockQ8_1;
        Q8_0 => q8_0::BlockQ8_0, Q8_0, q8_0::BlockQ8_0;
        IQ4_NL => iq4_nl::BlockIq4Nl, Q8_0, q8_0::BlockQ8_0;
        IQ2_XXS => iq2_xxs::BlockIq2Xxs, Q8_K, q8_k::BlockQ8K;
        IQ4_XS => iq4_xs::BlockIq4Xs, Q8_K, q8_k::BlockQ8K;
        Q1_0 => q1_0::BlockQ1_0, Q8_0, q8_0::BlockQ8_0;
        Q2_0 => q2_0::BlockQ2_0, Q8_0, q8_0::BlockQ8_0;
        TQ1_0 => tq1_0::BlockTq1_0, Q8_K, q8_k::BlockQ8K;
        TQ2_0 => tq2_0::BlockTq2_0, Q8_K, q8_k::BlockQ8K;
        Q2_K => q2_k::BlockQ2K, Q8_K, q8_k::BlockQ8K;
        Q3_K => q3_k::BlockQ3K, Q8_K, q8_k::BlockQ8K;
        Q4_K => q4_k::BlockQ4K, Q8_K, q8_k::BlockQ8K;
        Q5_K => q5_k::BlockQ5K, Q8_K, q8_k::BlockQ8K;
        Q6_K => q6_k::BlockQ6K, Q8_K, q8_k::BlockQ8K;
    }
    activations {
        Q8_1 => q8_1::BlockQ8_1;
        Q8_K => q8_k::BlockQ8K;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_with_an_activation_format_has_scalar_kernels() {
        for ty in GgmlType::ALL {
            let k = scalar_kernels(ty);
            assert_eq!(
                k.and_then(|k| k.vec_dot).is_some(),
                ty.act_format().is_some(),
                "{ty:?}"
            );
            if let Some(k) = k {
                assert_eq!(k.geometry, ty.block_geometry(), "{ty:?}");
            }
        }
    }
}
