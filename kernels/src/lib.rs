//! pinch-kernels: the arithmetic of pinch.
//!
//! Everything here is a pure function over slices: no allocation, no I/O, no threads,
//! `#![no_std]`. The engine (`pinch-runtime-min`) decides *what* to compute; this crate
//! only knows *how*.
//!
//! Layers, bottom up:
//! - [`f16`]: IEEE half and bfloat16 conversions in software (the A7 has no fp16 ALU).
//! - [`ggml_type`]: the GGUF tensor type ids, their block sizes and the activation
//!   format each weight type is dotted with.
//! - [`quant`]: one module per quant format: a `#[repr(C)]` block struct with a size
//!   assertion, a scalar `dequantize_row` and a scalar `vec_dot` against its activation
//!   format. The scalar code is the reference that every SIMD kernel is tested against.
//! - [`arch`]: ISA kernels (AVX2, NEON, NEON+dotprod). The only modules with `unsafe`.
//! - [`matvec`]: row-range matrix-vector and matrix-matrix products, dispatched by
//!   [`GgmlType`] and a run-time [`CpuFeatures`] value, ready to be split across workers.
//! - [`ops`]: norms, rope, softmax, activations.
//! - [`recurrent`]: causal short convolutions and the gated delta rule over a carried
//!   state (LFM2, Qwen3.5).
//! - [`repack`]: row-interleaved weight layouts and the products over them.
//!
//! CPU features are values handed in by the platform, never assumed at build time, so a
//! Cortex-A53 or Apple A7 never meets an illegal instruction.
#![no_std]
#![deny(unsafe_code)]

#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod arch;
pub mod attn;
pub mod attn_q8;
pub mod blocks;
pub mod cpu;
pub mod f16;
pub mod ggml_type;
pub mod matvec;
pub mod ops;
pub mod quant;
pub mod recurrent;
pub mod repack;
mod repack_lowbit;

pub use cpu::CpuFeatures;
pub use ggml_type::{ActFormat, GgmlType};

#[cfg(test)]
pub(crate) mod testutil;
