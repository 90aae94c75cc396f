//! AVX2 kernels for the block-32 formats with a minimum, Q4_1 and Q5_1, dotted with Q8_1
//! activations: one row ([`dot`]) and row ranges ([`job_avx2`]). (No AVX-512 VNNI
//! variant: this host lacks AVX-512 VL, so one could not be tested; the VNNI table uses
//! these.)
//!
//! The arithmetic is llama.cpp's x86 `ggml_vec_dot_q4_1_q8_1` / `_q5_1_q8_1`, which the
//! scalar reference states ([`crate::quant::q8_1::min_lanes8_dot`]): the unsigned quants
//! `u` (0..16, or 0..32 with the fifth bit) against the activation bytes give eight
//! exact i32 lanes of four consecutive products (`madd(maddubs(u, a), 1)`: no i16 pair
//! sum saturates, `2 * 31 * 128 < 32767`), each lane is fused into its f32 accumulator with `d_w * d_a` (exact), the eight lanes
//! are reduced by [`hsum8`]'s tree, and `m_w * s_a` (exact) is summed in block order in
//! a separate f32 and added last. Every (row, token) pair keeps its own accumulators, so
//! tiling changes no bit.
//!
//! Row ranges ([`super::min_rows`]): token tiles of up to 8 tokens share a table of the
//! activation scales and sums as f32, so one block step of a row needs one multiply for
//! the eight tokens' scale products and one multiply and add for their minimum terms.
//! One token runs 4 rows at once (4 interleaved streams, prefetched as in `x86_rows`);
//! two or more run 1 row x 8 tokens (16 registers).
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::min_rows::{body, MinBlock, MinTile, TokTable};
use super::x86_f16::read_f16;
use super::x86_legacy::{bits_to_mask, load32, nibbles};
use super::Job;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::hsum8;
use crate::quant::q8_1::BlockQ8_1;

/// Q4_1 / Q5_1 quants as AVX2 sees them.
pub(super) trait Quants: MinBlock {
    /// The 32 unsigned quants in weight order.
    unsafe fn quants(&self) -> __m256i;
}

impl Quants for BlockQ4_1 {
    #[inline(always)]
    unsafe fn quants(&self) -> __m256i {
        nibbles(&self.qs)
    }
}

impl Quants for BlockQ5_1 {
    #[inline(always)]
    unsafe fn quants(&self) -> __m256i {
        // Byte j holds weight j; bit j of `qh` sets its bit 4.
        let high = bits_to_mask(u32::from_le_bytes(self.qh));
        _mm256_or_si256(
            nibbles(&self.qs),
            _mm256_and_si256(high, _mm256_set1_epi8(0x10)),
        )
    }
}

/// An f16 broadcast to eight f32 lanes (exact conversion).
#[inline(always)]
unsafe fn bcast_f16(h: [u8; 2]) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(h) as i16))
}

/// The eight exact lane sums of `u * a` (u unsigned 0..32).
#[inline(always)]
unsafe fn groups(u: __m256i, a: __m256i) -> __m256 {
    let g = _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
    _mm256_cvtepi32_ps(g)
}

/// Eight f32 lanes in natural order reduced by the reference tree.
#[inline(always)]
unsafe fn reduce(acc: __m256) -> f32 {
    let mut l = [0.0f32; 8];
    // SAFETY: 8 writable f32.
    _mm256_storeu_ps(l.as_mut_ptr(), acc);
    hsum8(l)
}

/// One row with one activation row.
///
/// # Safety
/// AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot<B: Quants>(x: &[B], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        summs += read_f16(bx.m()) * read_f16(by.s);
        let dd = _mm256_mul_ps(bcast_f16(bx.d()), bcast_f16(by.d));
        let g = groups(bx.quants(), load32(&by.qs));
        acc = _mm256_fmadd_ps(dd, g, acc);
    }
    reduce(acc) + summs
}

/// The AVX2 tile.
struct Avx2;

impl<B: Quants> MinTile<B> for Avx2 {
    const TOKENS: usize = 8;
    const ROWS: usize = 1;

    #[inline(always)]
    unsafe fn tile<const RR: usize, const TT: usize>(
        w: [&[B]; RR],
        a: [&[BlockQ8_1]; TT],
        tab: &TokTable,
        nb: usize,
        prefetch: *const u8,
    ) -> [[f32; TT]; RR] {
        let mut acc = [[_mm256_setzero_ps(); TT]; RR];
        let mut summs = [_mm256_setzero_ps(); RR];
        let pf_step = RR * core::mem::size_of::<B>();
        for k in 0..nb {
            // The prefetched tile's bytes for this step (80 or 96: two lines); a
            // prefetch never faults, even past the end of the weights.
            if !prefetch.is_null() {
                let p = prefetch.wrapping_add(k * pf_step);
                for off in (0..pf_step).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
                }
            }
            // SAFETY (loads below): k < nb <= MAX_NB, w[r].len() and a[t].len(); the
            // table's rows are 32-byte aligned.
            let da = _mm256_load_ps(tab.da.get_unchecked(k).as_ptr());
            let sa = _mm256_load_ps(tab.sa.get_unchecked(k).as_ptr());
            for r in 0..RR {
                let b = w[r].get_unchecked(k);
                let u = b.quants();
                // m_w * s_a is exact (two f16), so the add is the reference's rounding.
                summs[r] = _mm256_add_ps(summs[r], _mm256_mul_ps(bcast_f16(b.m()), sa));
                let mut dd = [0.0f32; 8];
                _mm256_storeu_ps(dd.as_mut_ptr(), _mm256_mul_ps(bcast_f16(b.d()), da));
                for t in 0..TT {
                    let g = groups(u, load32(&a[t].get_unchecked(k).qs));
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dd[t]), g, acc[r][t]);
                }
            }
        }
        let mut out = [[0.0f32; TT]; RR];
        for r in 0..RR {
            let mut s = [0.0f32; 8];
            // SAFETY: 8 writable f32.
            _mm256_storeu_ps(s.as_mut_ptr(), summs[r]);
            for t in 0..TT {
                out[r][t] = reduce(acc[r][t]) + s[t];
            }
        }
        out
    }
}

/// AVX2 row ranges: 4 rows x 1 token, or 1 row x up to 8 tokens.
///
/// # Safety
/// AVX2/FMA/F16C; `job` was checked against `w`, `acts` and `out` by `Job::new`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn job_avx2<B: Quants>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    // SAFETY: this function runs only with F16C (its contract), which the closure
    // inherits.
    body::<B, Avx2>(job, w, acts, out, |h| unsafe { read_f16(h) })
}
