//! Q8_0: blocks of 32 int8 weights with one f16 scale. Both a weight format and the
//! activation format that every block-32 legacy type (and Q1_0, Q2_0) is dotted with.
//!
//! Activations are quantized with [`quantize_row_x86`], the arithmetic of llama.cpp's CPU
//! backend on the x86 hosts where our goldens were made (AVX2 `quantize_row_q8_0` and
//! the repack quantizer `ggml_quantize_mat_q8_0_4x8` agree bit for bit), on every ISA:
//! one set of goldens must hold on every device. [`quantize_row`] is the portable
//! reference `quantize_row_q8_0_ref` (what llama.cpp's ARM build effectively uses), kept
//! for comparison and tests.
//!
//! Dot products with Q8_0 and Q5_0 weights come in two float arithmetics ([`Order`]),
//! both with exact integer sums inside a block: llama.cpp's x86 one ([`lanes8_dot`]:
//! eight f32 lanes of four consecutive weights, fused multiply-add per block, one fixed
//! reduction tree), which the scalar path and AVX2/AVX-512 use, and one f32 accumulator
//! per row fed once per block ([`block_sum_dot`]), which NEON uses because it needs half
//! the conversions and fused steps on cores where every instruction counts. Each SIMD
//! kernel is bit-identical to the scalar code of its order.
use crate::blocks::{cast, cast_mut};
use crate::f16::{f32_to_f16, read_f16};

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 34;

/// Q8_0 block, 8.5 bits per weight: `x[j] = d * qs[j]` (`qs` are two's-complement i8).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Quants, i8 stored as bytes.
    pub qs: [u8; QK],
}
crate::pod_block!(BlockQ8_0);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ8_0>(), BLOCK_BYTES);

impl BlockQ8_0 {
    /// The scale as f32.
    #[inline]
    pub fn scale(&self) -> f32 {
        read_f16(self.d)
    }
    /// Quant `j` as a signed value.
    #[inline]
    pub fn q(&self, j: usize) -> i32 {
        self.qs[j] as i8 as i32
    }
    /// Integer dot product of the quants of two blocks.
    #[inline]
    pub fn int_dot(&self, other: &BlockQ8_0) -> i32 {
        (0..QK).map(|j| self.q(j) * other.q(j)).sum()
    }
    /// Sum of the quants (what llama.cpp's Q8_1 keeps as `s / d`).
    #[inline]
    pub fn q_sum(&self) -> i32 {
        (0..QK).map(|j| self.q(j)).sum()
    }
}

/// View a Q8_0 activation row as blocks; an empty slice when the length is not whole
/// blocks (callers check shapes once per call, so this only guards against misuse).
#[inline]
pub fn act_blocks(act: &[u8]) -> &[BlockQ8_0] {
    cast::<BlockQ8_0>(act).unwrap_or(&[])
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockQ8_0>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.scale();
        for (j, o) in out.iter_mut().enumerate() {
            *o = b.q(j) as f32 * d;
        }
    }
}

/// Quantize `x` (a whole number of blocks of 32) into Q8_0 blocks in `dst`, as
/// llama.cpp's `quantize_row_q8_0_ref`: `d = amax / 127` (stored as f16), `id = 1/d`
/// (from the f32 `d`, 0 when `d == 0`), `q = roundf(x * id)` (ties away from zero).
///
/// Extra input (a partial block) or a too-short `dst` is ignored: only whole blocks
/// that fit both are written.
pub fn quantize_row(x: &[f32], dst: &mut [u8]) {
    let n = (dst.len() / BLOCK_BYTES).min(x.len() / QK);
    let Some(blocks) = cast_mut::<BlockQ8_0>(&mut dst[..n * BLOCK_BYTES]) else {
        return;
    };
    for (b, xs) in blocks.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = xs.iter().fold(0.0f32, |m, v| {
            let a = v.abs();
            // C's MAX(a, b) is `a > b ? a : b`: keeps `m` when `a` is NaN.
            if a > m {
                a
            } else {
                m
            }
        });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d).to_le_bytes();
        for (q, v) in b.qs.iter_mut().zip(xs) {
            // roundf then a float-to-int8 conversion; |x * id| <= 127 by construction.
            *q = libm::roundf(v * id) as i8 as u8;
        }
    }
}

/// Quantize like llama.cpp's x86 CPU backend (`quantize_row_q8_0` under AVX2, and the
/// repack path's `ggml_quantize_mat_q8_0_4x8`), which is not the reference:
/// `id = 127 / amax` (not `1 / (amax / 127)`) and rounding to nearest with ties to even
/// (`_mm256_round_ps(_MM_ROUND_NEAREST)`), not away from zero. `d = amax / 127` is stored
/// the same way. Same shape rules as [`quantize_row`].
///
/// For finite input with a normal `amax`, `|x * id|` rounds to at most 127, so the
/// conversion to i8 is exact; degenerate blocks (NaN, or `127 / amax` overflowing)
/// saturate instead of panicking.
pub fn quantize_row_x86(x: &[f32], dst: &mut [u8]) {
    let n = (dst.len() / BLOCK_BYTES).min(x.len() / QK);
    let Some(blocks) = cast_mut::<BlockQ8_0>(&mut dst[..n * BLOCK_BYTES]) else {
        return;
    };
    for (b, xs) in blocks.iter_mut().zip(x.chunks_exact(QK)) {
        b.d = f32_to_f16(quantize_block_x86(xs, &mut b.qs)).to_le_bytes();
    }
}

/// One block of [`quantize_row_x86`]: writes the 32 quants of `xs` (32 values) and
/// returns the unrounded f32 scale `d = amax / 127` (Q8_0 stores it as f16; Q8_1 also
/// multiplies it into its `s`).
#[inline]
pub(crate) fn quantize_block_x86(xs: &[f32], qs: &mut [u8; QK]) -> f32 {
    let amax = xs
        .iter()
        .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, v) in qs.iter_mut().zip(xs) {
        *q = libm::rintf(v * id) as i8 as u8;
    }
    amax / 127.0
}

/// Reduce eight f32 lanes in the order of llama.cpp's x86 `hsum_float_8` (and
/// tinyBLAS's `hsum(__m256)`): halves added lane-wise, then again, then the last pair:
/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
#[inline]
pub fn hsum8(a: [f32; 8]) -> f32 {
    let v = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (v[0] + v[2]) + (v[1] + v[3])
}

/// The float arithmetic of llama.cpp's x86 block-32 integer dot products
/// (`ggml_vec_dot_q8_0_q8_0` / `_q5_0_q8_0` for one row, tinyBLAS `tinyBLAS_Q0_AVX`
/// for a batch; both give the same bits): each block's products are summed exactly in
/// eight integer lanes of four consecutive weights, lane `l` is accumulated in f32 as
/// `acc[l] = fma(d_w * d_a, lane_sum, acc[l])`, and the eight lanes are reduced by
/// [`hsum8`] at the end of the row.
///
/// `blocks` yields, per block, the scale product `d_w * d_a` (an exact f32: both are
/// f16) and the 32 integer products' lane sums ([`lane_sums`]). The fused step matters:
/// `d * lane` has up to 39 significant bits, so a separate multiply would round twice.
#[inline]
pub fn lanes8_dot(blocks: impl Iterator<Item = (f32, [i32; 8])>) -> f32 {
    let mut acc = [0.0f32; 8];
    for (d, lanes) in blocks {
        for (a, s) in acc.iter_mut().zip(lanes) {
            *a = libm::fmaf(d, s as f32, *a);
        }
    }
    hsum8(acc)
}

/// The float arithmetic of a Q8_0/Q5_0 dot product (the integer sums inside a block are
/// exact in both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// llama.cpp's x86 lanes ([`lanes8_dot`]): the scalar reference, AVX2, AVX-512.
    Lanes8,
    /// One exact sum per block, `acc = fma(d_w * d_a, sum, acc)` block after block
    /// ([`block_sum_dot`]): the NEON kernels.
    BlockSum,
}

impl Order {
    /// The order the fastest kernels for `feat` compute (NEON: [`Order::BlockSum`]).
    pub fn of(feat: &crate::CpuFeatures) -> Order {
        if feat.neon() {
            Order::BlockSum
        } else {
            Order::Lanes8
        }
    }
}

/// One f32 accumulator fed once per block: `acc = fma(d_w * d_a, sum, acc)`, where `sum`
/// is the block's exact integer dot product (|sum| <= 32 * 128 * 128 < 2^24, so its
/// conversion is exact too). Blocks in row order; no reduction at the end.
#[inline]
pub fn block_sum_dot(blocks: impl Iterator<Item = (f32, i32)>) -> f32 {
    blocks.fold(0.0f32, |acc, (d, s)| libm::fmaf(d, s as f32, acc))
}

/// A dot product in `order` from per-block `(d_w * d_a, weight quants, activation block)`.
#[inline]
pub fn dot_in<'a>(
    order: Order,
    blocks: impl Iterator<Item = (f32, [i32; QK], &'a BlockQ8_0)>,
) -> f32 {
    match order {
        Order::Lanes8 => lanes8_dot(blocks.map(|(d, q, y)| (d, lane_sums(&q, y)))),
        Order::BlockSum => {
            block_sum_dot(blocks.map(|(d, q, y)| (d, lane_sums(&q, y).iter().sum())))
        }
    }
}

/// Lane sums of a block's products with a Q8_0 activation block: lane `l` is the exact
/// integer `sum(w[j] * a[j])` over `j` in `4l..4l+4` (what `maddubs`/`vpdpbusd` + `madd`
/// and `sdot` produce).
#[inline]
pub fn lane_sums(w: &[i32; QK], a: &BlockQ8_0) -> [i32; 8] {
    lane_sums_of(w, &a.qs)
}

/// [`lane_sums`] against any 32 activation quants (i8 as bytes; Q8_0's or Q8_1's).
#[inline]
pub(crate) fn lane_sums_of(w: &[i32; QK], qs: &[u8; QK]) -> [i32; 8] {
    let mut s = [0i32; 8];
    for (l, sl) in s.iter_mut().enumerate() {
        *sl = (4 * l..4 * l + 4).map(|j| w[j] * qs[j] as i8 as i32).sum();
    }
    s
}

/// Scalar reference dot product of one Q8_0 weight row with one Q8_0 activation row,
/// with llama.cpp's x86 arithmetic ([`lanes8_dot`]): the AVX2 `ggml_vec_dot_q8_0_q8_0`
/// for one token and llamafile's `tinyBLAS_Q0_AVX` for a prompt give the same bits.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    vec_dot_in(Order::Lanes8, w, act)
}

/// [`vec_dot`] in either [`Order`].
pub fn vec_dot_in(order: Order, w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockQ8_0>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    dot_in(
        order,
        w.iter().zip(a).map(|(x, y)| {
            let q: [i32; QK] = core::array::from_fn(|j| x.q(j));
            (x.scale() * y.scale(), q, y)
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn quantize_round_trip_error_is_within_half_a_step() {
        let mut rng = Rng(7);
        let mut x = [0.0f32; 4 * QK];
        rng.fill_f32(&mut x, 3.0);
        let mut q = [0u8; 4 * BLOCK_BYTES];
        quantize_row(&x, &mut q);
        let mut y = [0.0f32; 4 * QK];
        dequantize_row(&q, &mut y);
        for (bx, by) in x.chunks(QK).zip(y.chunks(QK)) {
            let amax = bx.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            // Half a quant step, plus the relative error of storing d as f16 (2^-11)
            // applied to the largest value.
            let bound = amax / 127.0 * 0.5 + amax * (1.0 / 2048.0) + 1e-6;
            for (a, b) in bx.iter().zip(by) {
                assert!((a - b).abs() <= bound, "{a} vs {b}, bound {bound}");
            }
        }
    }

    #[test]
    fn quantize_rounds_ties_away_from_zero_and_maps_amax_to_127() {
        // amax = 127 gives d = 1 and id = 1: x = 2.5 must become 3 (roundf), not 2.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = -127.0;
        let mut q = [0u8; BLOCK_BYTES];
        quantize_row(&x, &mut q);
        let b = &cast::<BlockQ8_0>(&q).unwrap()[0];
        assert_eq!(b.scale(), 1.0);
        assert_eq!((b.q(0), b.q(1), b.q(2), b.q(3)), (127, 3, -3, -127));
    }

    #[test]
    fn x86_quantizer_rounds_ties_to_even() {
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        let mut q = [0u8; BLOCK_BYTES];
        quantize_row_x86(&x, &mut q);
        let b = &cast::<BlockQ8_0>(&q).unwrap()[0];
        assert_eq!((b.q(0), b.q(1), b.q(2)), (127, 2, -4));
    }

    #[test]
    fn all_zero_block_has_zero_scale_and_quants() {
        let x = [0.0f32; QK];
        let mut q = [0xffu8; BLOCK_BYTES];
        quantize_row(&x, &mut q);
        assert!(q.iter().all(|&v| v == 0));
    }

    #[test]
    fn vec_dot_equals_dot_of_dequantized_for_exact_scales() {
        // Scales that are powers of two make every product exact in f32.
        let mut rng = Rng(3);
        let mut w = [0u8; 2 * BLOCK_BYTES];
        let mut a = [0u8; 2 * BLOCK_BYTES];
        rng.fill_bytes(&mut w);
        rng.fill_bytes(&mut a);
        for blk in w.chunks_mut(BLOCK_BYTES).chain(a.chunks_mut(BLOCK_BYTES)) {
            blk[..2].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
        }
        let mut wf = [0.0f32; 2 * QK];
        let mut af = [0.0f32; 2 * QK];
        dequantize_row(&w, &mut wf);
        dequantize_row(&a, &mut af);
        let expect: f32 = wf.iter().zip(&af).map(|(x, y)| x * y).sum();
        assert_eq!(vec_dot(&w, &a), expect);
    }
}
