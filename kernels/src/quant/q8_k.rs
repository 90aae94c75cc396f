//! Q8_K: the activation format every K-quant weight (Q2_K..Q6_K) is dotted with.
//!
//! A block holds 256 int8 quants, an f32 scale and the sums of each 16-quant group
//! (`bsums`), which the K-quant dot products use to apply per-group minimums and offsets
//! without touching the quants again.
//!
//! [`quantize_row`] reproduces llama.cpp's `quantize_row_q8_K_ref` bit for bit:
//! `max` is the *signed* value of largest magnitude (the first one if several tie),
//! `iscale = -127 / max`, `q = min(127, nearest_int(iscale * x))` with round-half-to-even
//! (llama.cpp's `nearest_int` adds 1.5 * 2^23, which rounds ties to even under the default
//! FP mode), `d = 1 / iscale`. An all-zero block gets `d = 0` and zero quants; its bsums
//! are written as zeros here (llama.cpp leaves them unwritten, which is harmless there
//! because `d = 0` multiplies them).
//!
//! Rust never contracts `iscale * x + 1.5 * 2^23` into an FMA. A GCC build of llama.cpp
//! for aarch64 (FMA in the baseline, `-ffp-contract=fast` by default in GNU C) may, which
//! changes the rounding of rare near-ties; x86 builds of ggml-base have no FMA to fuse with.
//!
//! # Which quantizer llama.cpp really runs (commit 0c1e570)
//! - x86 and ARM: `ggml-cpu/arch/{x86,arm}/quants.c` define `quantize_row_q8_K` as a
//!   plain call to `quantize_row_q8_K_ref` ("placeholder implementation for Apple
//!   targets"); there is no SIMD Q8_K quantizer for the ordinary `vec_dot` path. The ref
//!   lives in `ggml-quants.c` (ggml-base, built without `-march=native`), so its product
//!   `iscale * x` is not fused with the rounding add into an FMA.
//! - BUT when llama.cpp repacks eligible K-quant weights (Q4_K on AVX2 at least) into
//!   interleaved layouts (the CPU "REPACK" buffer type, on by default, so probably also
//!   on the AVX-512 machine the goldens came from), activations go through
//!   `ggml_quantize_mat_q8_K_4x8` (x86 AVX2 code in `arch/x86/repack.cpp`). It rounds with
//!   `_mm256_round_ps(_MM_ROUND_NEAREST)` (also ties-to-even, no clamp needed), but picks
//!   the sign of `iscale` differently: it uses `-127/amax` whenever *any* element equals
//!   `+amax`, where the ref uses the sign of the *first* element of largest magnitude. The
//!   two differ only when both `+amax` and `-amax` occur in one 256-block with `-amax`
//!   first. The gemv kernels of the repacked path also accumulate floats in another order,
//!   so logits from those goldens match our scalar path only within tolerance.
use crate::blocks::{cast, cast_mut};

/// Weights per block.
pub const QK: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 292;

/// Q8_K block, 9.125 bits per value: `x[j] = d * qs[j]`.
///
/// `d` is a little-endian f32; `bsums[g]` (little-endian i16) is `sum(qs[16g..16g+16])`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    /// Scale, f32 little-endian.
    pub d: [u8; 4],
    /// Quants, i8 stored as bytes.
    pub qs: [u8; QK],
    /// Sums of 16-quant groups, i16 little-endian.
    pub bsums: [u8; 32],
}
crate::pod_block!(BlockQ8K);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ8K>(), BLOCK_BYTES);

impl BlockQ8K {
    /// The scale.
    #[inline]
    pub fn scale(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }
    /// Quant `j` as a signed value.
    #[inline]
    pub fn q(&self, j: usize) -> i32 {
        self.qs[j] as i8 as i32
    }
    /// Sum of the quants of group `g` (0..16), as stored.
    #[inline]
    pub fn bsum(&self, g: usize) -> i32 {
        i16::from_le_bytes([self.bsums[2 * g], self.bsums[2 * g + 1]]) as i32
    }
    /// The quants as signed bytes.
    #[inline]
    pub fn quants(&self) -> [i8; QK] {
        let mut out = [0i8; QK];
        for (o, &b) in out.iter_mut().zip(self.qs.iter()) {
            *o = b as i8;
        }
        out
    }
}

/// View a Q8_K activation row as blocks; empty when the length is not whole blocks
/// (shapes are checked once per call by `matvec`, so this only guards against misuse).
#[inline]
pub fn act_blocks(act: &[u8]) -> &[BlockQ8K] {
    cast::<BlockQ8K>(act).unwrap_or(&[])
}

/// llama.cpp's `nearest_int`: round half to even, as `x + 1.5 * 2^23` does in f32.
/// Valid for `|x| < 2^22`, which holds here (`|x| <= 127` up to rounding).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Quantize f32 activations to Q8_K blocks exactly as llama.cpp's `quantize_row_q8_K_ref`.
///
/// # Preconditions
/// `x.len()` is a multiple of 256 and `dst.len() == x.len() / 256 * 292` (checked by
/// `matvec::quantize_activation`); extra input or output is ignored.
pub fn quantize_row(x: &[f32], dst: &mut [u8]) {
    let blocks = cast_mut::<BlockQ8K>(dst).unwrap_or(&mut []);
    for (xb, b) in x.chunks_exact(QK).zip(blocks.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            let a = v.abs();
            if a > amax {
                amax = a;
                max = v;
            }
        }
        if amax == 0.0 {
            b.d = 0.0f32.to_le_bytes();
            b.qs = [0; QK];
            b.bsums = [0; 32];
            continue;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for g in 0..QK / 16 {
            let s: i32 = b.qs[16 * g..16 * g + 16]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            b.bsums[2 * g..2 * g + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b.d = (1.0f32 / iscale).to_le_bytes();
    }
}

/// Dequantize Q8_K blocks (`x = d * q`, as llama.cpp's `dequantize_row_q8_K`).
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (b, out) in act_blocks(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.scale();
        for (j, o) in out.iter_mut().enumerate() {
            *o = d * b.q(j) as f32;
        }
    }
}

/// The K-quant dot product arithmetic of every pinch path (this scalar reference, the
/// AVX2 kernel and both NEON kernels compute the same bits): per super-block, eight
/// int32 lanes, lane `l` summing `scales[g] * u[i] * q8[i]` over the bytes
/// `i = 32c + 4l .. 32c + 4l + 4` of each 32-weight chunk `c` (`g = i / 16`, so lanes
/// 0..4 see even groups and lanes 4..8 odd ones; this is what `vpmaddubsw` +
/// `vpmaddwd` leave), the block's `offset` taken from lane 0, then per lane
/// `acc[l] = fma(d, lane, acc[l])`; the minimums go to a separate f32 sum
/// `mins += dmin * mins_int`; the result is `hsum8(acc) - mins` with the x86 reduction
/// tree ([`crate::quant::q8_0::hsum8`]). It is the shape of llama.cpp's AVX2 K-quant
/// dot products, so the goldens made on x86 hold on every device.
///
/// `blocks` yields each block's [`KTerms`], its 256 quants as unsigned bytes (Q3_K and
/// Q6_K shifted up by 4 and 32) in weight order, and its activation block. Integer sums
/// wrap like the SIMD lanes (only reachable with bytes that are not real blocks).
pub fn kquant_dot<'a>(blocks: impl Iterator<Item = (KTerms, [u8; QK], &'a BlockQ8K)>) -> f32 {
    let mut acc = [0f32; 8];
    let mut mins = 0f32;
    for (t, u, y) in blocks {
        let mut lanes = [0i32; 8];
        for c in 0..QK / 32 {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let base = 32 * c + 4 * l;
                let s: i32 = (base..base + 4).map(|i| u[i] as i32 * y.q(i)).sum();
                let g = 2 * c + l / 4;
                *lane = lane.wrapping_add(s.wrapping_mul(t.scales[g] as i32));
            }
        }
        lanes[0] = lanes[0].wrapping_sub(t.offset);
        for (a, lane) in acc.iter_mut().zip(lanes) {
            *a = libm::fmaf(t.d, lane as f32, *a);
        }
        mins += t.dmin * t.mins as f32;
    }
    crate::quant::q8_0::hsum8(acc) - mins
}

/// The K-quant order of the aarch64 NEON kernels (plain and repacked): per block the
/// exact (wrapping) integer `I = sum_i scales[i / 16] u[i] q8[i] - offset`, then
/// `acc = fma(d, I, acc)` and `accm = fma(dmin, mins, accm)`, the result `acc - accm`.
/// The four-row lanes of the repacked layouts hold one row each, not one of
/// [`kquant_dot`]'s eight lanes; the sums differ from that order by float rounding only.
/// `blocks` yields what [`kquant_dot`] takes.
pub fn kquant_dot_blocksum<'a>(
    blocks: impl Iterator<Item = (KTerms, [u8; QK], &'a BlockQ8K)>,
) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (t, u, y) in blocks {
        let mut i = 0i32;
        for (j, &uj) in u.iter().enumerate() {
            let p = (uj as i32 * y.q(j)).wrapping_mul(t.scales[j / 16] as i32);
            i = i.wrapping_add(p);
        }
        i = i.wrapping_sub(t.offset);
        acc = libm::fmaf(t.d, i as f32, acc);
        accm = libm::fmaf(t.dmin, t.mins as f32, accm);
    }
    acc - accm
}

/// [`kquant_dot`] (`Order::Lanes8`) or [`kquant_dot_blocksum`] (`Order::BlockSum`).
pub fn kquant_dot_in<'a>(
    order: crate::quant::q8_0::Order,
    blocks: impl Iterator<Item = (KTerms, [u8; QK], &'a BlockQ8K)>,
) -> f32 {
    match order {
        crate::quant::q8_0::Order::Lanes8 => kquant_dot(blocks),
        crate::quant::q8_0::Order::BlockSum => kquant_dot_blocksum(blocks),
    }
}

/// The K-quant order the fastest kernels for `feat` compute: `BlockSum` on aarch64 NEON,
/// llama.cpp's x86 eight lanes elsewhere (x86, the scalar path, armv7 NEON).
pub fn order_of(feat: &crate::CpuFeatures) -> crate::quant::q8_0::Order {
    if cfg!(target_arch = "aarch64") && feat.neon() {
        crate::quant::q8_0::Order::BlockSum
    } else {
        crate::quant::q8_0::Order::Lanes8
    }
}

/// What one K-quant super-block contributes to a dot product apart from its quants, in
/// the form every SIMD kernel uses: with `u` the block's quants as *unsigned* bytes
/// (0..64; Q3_K and Q6_K shifted up by 4 and 32),
/// `block = d * (sum_g scales[g] * sum_{i in g} u[i] * q8[i] - offset) - dmin * mins`
/// where `g = i / 16`. The integer parts are exact; the offsets and minimums come from the
/// activation's `bsums`, so the kernels never touch the quants twice.
#[derive(Clone, Copy, Debug)]
pub struct KTerms {
    /// Weight super-block scale times activation scale.
    pub d: f32,
    /// Integer scale per 16-quant group.
    pub scales: [i16; 16],
    /// Integer to subtract from the scaled quant sum (the unsigned shift of Q3_K/Q6_K).
    pub offset: i32,
    /// Weight minimum scale times activation scale (0 for formats without minimums).
    pub dmin: f32,
    /// Integer sum of minimums times group sums.
    pub mins: i32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-126.6), -127);
        assert_eq!(nearest_int(127.0), 127);
    }

    #[test]
    fn largest_magnitude_maps_to_minus_127_and_bsums_match() {
        let mut rng = Rng(7);
        let mut x = [0f32; 512];
        rng.fill_f32(&mut x, 3.0);
        x[300] = 5.0; // largest magnitude, positive: quantizes to -127 (iscale < 0)
        let mut q = [0u8; 2 * BLOCK_BYTES];
        quantize_row(&x, &mut q);
        let b = act_blocks(&q);
        assert_eq!(b[1].q(300 - 256), -127);
        assert!(b[1].scale() < 0.0);
        for blk in b {
            for g in 0..16 {
                let s: i32 = (16 * g..16 * g + 16).map(|j| blk.q(j)).sum();
                assert_eq!(blk.bsum(g), s);
            }
        }
        let mut y = [0f32; 512];
        dequantize_row(&q, &mut y);
        for (a, b) in x.iter().zip(y.iter()) {
            // half a quantization step of the block whose scale is 5/127 (or 3/127)
            assert!((a - b).abs() <= 0.5 * 5.0 / 127.0 * 1.0001, "{a} vs {b}");
        }
    }

    #[test]
    fn zero_block_is_all_zero() {
        let x = [0f32; 256];
        let mut q = [0xAAu8; BLOCK_BYTES];
        quantize_row(&x, &mut q);
        assert!(q.iter().all(|&b| b == 0));
    }
}
