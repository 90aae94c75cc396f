//! F32, F16 and BF16 weight rows: conversion to f32 and dot products with f32
//! activations (stored as little-endian f32 bytes, already rounded through f16/bf16 by
//! [`crate::matvec::quantize_activation`] where the weight type asks for it).
//!
//! F32 and BF16 dot products follow llama.cpp's scalar `ggml_vec_dot_f32/bf16`: each
//! product is formed in f32 and accumulated in f64 (`ggml_float`), rounded to f32 at the
//! end. F16 follows what llama.cpp's x86 build really runs for a prompt (llamafile's
//! tinyBLAS, sixteen f32 lanes, see [`vec_dot_f16`]): with activations rounded to f16
//! every upstream ulp can flip a rounding, so the order of the sum is part of the result.
use crate::f16::{bf16_to_f32, f16_to_f32};

/// Little-endian f32 at each 4-byte chunk.
#[inline]
fn f32s(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Little-endian u16 at each 2-byte chunk.
#[inline]
fn u16s(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))
}

/// F32 bytes to f32 (whole values only).
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    for (o, v) in dst.iter_mut().zip(f32s(src)) {
        *o = v;
    }
}

/// F16 bytes to f32 (exact).
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    for (o, h) in dst.iter_mut().zip(u16s(src)) {
        *o = f16_to_f32(h);
    }
}

/// BF16 bytes to f32 (exact).
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    for (o, h) in dst.iter_mut().zip(u16s(src)) {
        *o = bf16_to_f32(h);
    }
}

/// Dot of an F32 weight row with f32 activations: f32 products, f64 sum.
pub fn vec_dot_f32(w: &[u8], act: &[u8]) -> f32 {
    f32s(w)
        .zip(f32s(act))
        .fold(0.0f64, |s, (x, y)| s + (x * y) as f64) as f32
}

/// Reduce sixteen f32 lanes in the order of `_mm512_reduce_add_ps` (GCC and clang both
/// halve: 16 -> 8 -> 4 -> 2 -> 1, adding the upper half to the lower one).
#[inline]
pub fn hsum16(a: [f32; 16]) -> f32 {
    let t8: [f32; 8] = core::array::from_fn(|i| a[i] + a[i + 8]);
    let t4: [f32; 4] = core::array::from_fn(|i| t8[i] + t8[i + 4]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// Dot of an F16 weight row with f16-rounded activations, with the arithmetic of
/// llama.cpp's prompt path on an AVX-512 host (llamafile `tinyBLAS<16, __m512, ...>`
/// over F16 weights and F16 activations): lane `l` of sixteen sums the products of
/// elements `l, l + 16, l + 32, ...` in f32 with fused multiply-adds (each product of
/// two f16 values is exact in f32, so fusing only matters for activations that were not
/// rounded to f16), and [`hsum16`] reduces the lanes.
///
/// A row whose length is not a multiple of 16 (tinyBLAS declines those) adds the
/// leftover products to the reduced sum in f64, as `ggml_vec_dot_f16` does.
pub fn vec_dot_f16(w: &[u8], act: &[u8]) -> f32 {
    let n = (w.len() / 2).min(act.len() / 4);
    let body = n / 16 * 16;
    let mut acc = [0.0f32; 16];
    for (wc, ac) in w[..2 * body].chunks_exact(32).zip(act.chunks_exact(64)) {
        for ((a, h), y) in acc.iter_mut().zip(u16s(wc)).zip(f32s(ac)) {
            // Fused like the SIMD kernels, so they agree even on activations that were
            // not rounded to f16 (for f16 ones the product is exact either way).
            *a = libm::fmaf(f16_to_f32(h), y, *a);
        }
    }
    let mut s = hsum16(acc) as f64;
    for (h, y) in u16s(&w[2 * body..2 * n]).zip(f32s(&act[4 * body..4 * n])) {
        s += (f16_to_f32(h) * y) as f64;
    }
    s as f32
}

/// Dot of a BF16 weight row with f32 activations (bf16-rounded): f32 products, f64 sum.
pub fn vec_dot_bf16(w: &[u8], act: &[u8]) -> f32 {
    u16s(w)
        .zip(f32s(act))
        .fold(0.0f64, |s, (h, y)| s + (bf16_to_f32(h) * y) as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::f16::{f32_to_bf16, f32_to_f16};

    #[test]
    fn f16_and_bf16_rows_decode_known_values() {
        let vals = [1.0f32, -2.5, 0.0, 65504.0];
        let mut h = [0u8; 8];
        let mut b = [0u8; 8];
        for (i, v) in vals.iter().enumerate() {
            h[2 * i..2 * i + 2].copy_from_slice(&f32_to_f16(*v).to_le_bytes());
            b[2 * i..2 * i + 2].copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
        }
        let mut out = [0.0f32; 4];
        dequantize_row_f16(&h, &mut out);
        assert_eq!(out, vals);
        dequantize_row_bf16(&b, &mut out);
        assert_eq!(out, [1.0, -2.5, 0.0, 65536.0]); // 65504 rounds to 2^16 in bf16
    }

    #[test]
    fn f32_dot_accumulates_in_f64() {
        // In f32, 1e8 + 1 - 1e8 loses the 1; llama.cpp's f64 accumulator keeps it.
        let w: [f32; 3] = [1e8, 1.0, -1e8];
        let a = [1.0f32; 3];
        let wb: [u8; 12] = bytemuck_f32(&w);
        let ab: [u8; 12] = bytemuck_f32(&a);
        assert_eq!(vec_dot_f32(&wb, &ab), 1.0);
    }

    fn bytemuck_f32(x: &[f32; 3]) -> [u8; 12] {
        let mut out = [0u8; 12];
        for (o, v) in out.chunks_mut(4).zip(x) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        out
    }
}
