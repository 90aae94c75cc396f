//! Q4_0 row ranges on AVX2 and AVX-512 VNNI: tiles of eight (row, token) pairs, 8 rows
//! x 1 token for generation and 4 rows x 2 tokens for prompts (Gemma 3 270M in Q4_0,
//! pp256 at -t 1, three alternating runs: 4 x 2 388-402 t/s, 2 x 4 348-381, 1 x 8
//! 352-361).
//!
//! Q4_0's reference (`crate::quant::q4_0::vec_dot`, llama.cpp's generic and x86 order)
//! rounds per block: `sum += (sumi * d_w) * d_a` with the block's exact integer sum, so
//! each pair needs a whole-block integer before any float step; a one-row kernel pays a
//! horizontal sum per block and pair. Here the eight pairs' lane sums (i32 lanes of four
//! products, `maddubs` + `madd` or one `vpdpbusd`, minus `8 * sum(a)` per lane: the
//! quants stay unsigned, `sum((u - 8) a) = sum(u a) - 8 sum(a)`, exact) are reduced
//! together, eight vectors into one vector of eight block sums ([`block_sums8`]), and the
//! float steps run on the eight pairs at once, lane `p` doing exactly the reference's
//! `(f32(sumi) * d_w) * d_a` and `sum + that` in block order. Same bits as the
//! reference, for any activation bytes (`u <= 15`, so no i16 pair sum saturates).
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_legacy::{load32, nibbles};
use super::Job;
use crate::blocks::cast;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q8_0::BlockQ8_0;

/// Row tiles ahead a one-token tile prefetches (as `x86_rows::PF_TILES`).
const PF_TILES: usize = 5;

/// Eight vectors of eight i32 lanes into one vector of their eight totals (vector `p`'s
/// total in lane `p`); integer sums, exact in any order.
#[inline(always)]
unsafe fn block_sums8(v: [__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // Per 128-bit half: [v0 v1 v2 v3] of that half's four lanes.
    let a = _mm256_hadd_epi32(h01, h23);
    let b = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(a, b),
        _mm256_permute2x128_si256::<0x31>(a, b),
    )
}

/// Eight f16 values (little-endian bytes) as f32 lanes.
#[inline(always)]
unsafe fn f16x8(h: [u16; 8]) -> __m256 {
    // SAFETY: 16 readable bytes; unaligned load.
    _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
}

/// The products of `RR` rows x `TT` tokens (`RR * TT == 8`; pair `r * TT + t` in lane
/// `r * TT + t` of the result) over blocks `0..nb`.
#[inline(always)]
unsafe fn tile<const VNNI: bool, const RR: usize, const TT: usize>(
    w: [&[BlockQ4_0]; RR],
    a: [&[BlockQ8_0]; TT],
    nb: usize,
    prefetch: *const u8,
) -> [f32; 8] {
    const { assert!(RR * TT == 8) };
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let pf_step = RR * core::mem::size_of::<BlockQ4_0>();
    for k in 0..nb {
        if !prefetch.is_null() {
            let p = prefetch.wrapping_add(k * pf_step);
            // A prefetch never faults, even past the end of the weights.
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128) as *const i8);
        }
        let mut u = [_mm256_setzero_si256(); RR];
        let mut dw = [0u16; 8];
        for r in 0..RR {
            // SAFETY: k < nb <= w[r].len().
            let b = w[r].get_unchecked(k);
            u[r] = nibbles(&b.qs);
            for t in 0..TT {
                dw[r * TT + t] = u16::from_le_bytes(b.d);
            }
        }
        let mut av = [_mm256_setzero_si256(); TT];
        let mut neg8 = [_mm256_setzero_si256(); TT];
        let mut da = [0u16; 8];
        for t in 0..TT {
            // SAFETY: k < nb <= a[t].len().
            let y = a[t].get_unchecked(k);
            av[t] = load32(&y.qs);
            let s = if VNNI {
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones8, av[t])
            } else {
                _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, av[t]), ones16)
            };
            neg8[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<3>(s));
            for r in 0..RR {
                da[r * TT + t] = u16::from_le_bytes(y.d);
            }
        }
        let mut lanes = [_mm256_setzero_si256(); 8];
        for r in 0..RR {
            for t in 0..TT {
                lanes[r * TT + t] = if VNNI {
                    _mm256_dpbusd_epi32(neg8[t], u[r], av[t])
                } else {
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u[r], av[t]), ones16);
                    _mm256_add_epi32(p, neg8[t])
                };
            }
        }
        let sumi = _mm256_cvtepi32_ps(block_sums8(lanes));
        // The reference's two roundings, then its add: `sum += sumi * d_w * d_a`.
        let term = _mm256_mul_ps(_mm256_mul_ps(sumi, f16x8(dw)), f16x8(da));
        acc = _mm256_add_ps(acc, term);
    }
    let mut out = [0.0f32; 8];
    // SAFETY: 8 writable f32.
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// Every (row, token) of `job` in `RR x TT` tiles; the last tile of rows or tokens
/// repeats its last row or token in the unused pairs (computed, not written).
#[inline(always)]
unsafe fn tiles<const VNNI: bool, const RR: usize, const TT: usize>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
    nb: usize,
) {
    let (n_tok, rb, arb) = (job.n_tok, job.row_bytes, job.act_row_bytes);
    let row = |r: usize| cast::<BlockQ4_0>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
    let act = |t: usize| cast::<BlockQ8_0>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    let (start, nr) = (job.rows.start, job.rows.len());
    let mut i = 0;
    while i < nr {
        let ws: [&[BlockQ4_0]; RR] = core::array::from_fn(|r| row(start + (i + r).min(nr - 1)));
        let next = if n_tok == 1 {
            w.as_ptr().wrapping_add((start + i + PF_TILES * RR) * rb)
        } else {
            core::ptr::null()
        };
        let mut t = 0;
        while t < n_tok {
            let ys: [&[BlockQ8_0]; TT] = core::array::from_fn(|j| act((t + j).min(n_tok - 1)));
            let res = tile::<VNNI, RR, TT>(ws, ys, nb, next);
            for r in 0..RR.min(nr - i) {
                for j in 0..TT.min(n_tok - t) {
                    out[(i + r) * n_tok + t + j] = res[r * TT + j];
                }
            }
            t += TT;
        }
        i += RR;
    }
}

#[inline(always)]
unsafe fn body<const VNNI: bool>(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
    let size = core::mem::size_of::<BlockQ4_0>();
    let nb = job.row_bytes / size;
    if nb == 0
        || nb * size != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8_0>() != job.act_row_bytes
    {
        return false;
    }
    if job.rows.is_empty() || job.n_tok == 0 {
        return true;
    }
    if job.n_tok == 1 {
        tiles::<VNNI, 8, 1>(job, w, acts, out, nb);
    } else {
        tiles::<VNNI, 4, 2>(job, w, acts, out, nb);
    }
    true
}

/// The row-range product of `job` on AVX2; `false` (nothing written) for shapes that are
/// not whole Q4_0 rows against whole Q8_0 rows.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `job` was checked against `w`, `acts` and `out`
/// (`Job::new`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn job_avx2(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
    body::<false>(job, w, acts, out)
}

/// [`job_avx2`] with AVX-512 VNNI (`vpdpbusd`: the lane sums in one instruction).
///
/// # Safety
/// As [`job_avx2`], and the CPU has AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn job_vnni(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
    body::<true>(job, w, acts, out)
}
