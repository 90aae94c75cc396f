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

pub mod float;
pub mod iq4_nl;
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
pub mod q8_k;
pub mod tq1_0;
pub mod tq2_0;
