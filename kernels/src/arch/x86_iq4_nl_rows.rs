//! IQ4_NL prompts on AVX2: tiles of 2 rows x 2 tokens, in llama.cpp's AVX2 float order of the one-row kernel
//! ([`super::x86_iq4::nl_avx2`], reference `crate::quant::iq4_nl::vec_dot_in` with
//! `Order::Lanes8`): per (row, token) pair, even and odd blocks feed two lane
//! accumulators (`fma(d_w * d_a, lane, acc)`), reduced as `hsum(acc_even + acc_odd)`,
//! and an odd last block is added as `fma(d, sumi, sum)`. The tile shares what depends
//! on one side only (a row's table values, a token's `|a|`), so each pair costs the
//! signed product, two widening sums, a conversion and the fused step; the pairs'
//! accumulators are independent chains. Same bits as the one-row kernel.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_f16::read_f16;
use super::x86_iq4::levels;
use super::x86_kquant::{hsum_f32, load32};
use super::Job;
use crate::blocks::cast;
use crate::quant::iq4_nl::BlockIq4Nl;
use crate::quant::q8_0::BlockQ8_0;

/// The 32 table values of a block's indices (low nibbles weights 0..16, high 16..32).
#[inline(always)]
unsafe fn values(levels: __m256i, x: &BlockIq4Nl) -> __m256i {
    // SAFETY: 16 readable bytes; unaligned load.
    let q = _mm_loadu_si128(x.qs.as_ptr() as *const __m128i);
    let idx = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(q), q),
        _mm256_set1_epi8(0x0f),
    );
    _mm256_shuffle_epi8(levels, idx)
}

/// The products of `RR` rows x `TT` tokens over blocks `0..nb` (result `[r][t]`).
#[inline(always)]
unsafe fn tile<const RR: usize, const TT: usize>(
    w: [&[BlockIq4Nl]; RR],
    a: [&[BlockQ8_0]; TT],
    nb: usize,
) -> [[f32; TT]; RR] {
    let levels = levels();
    let ones = _mm256_set1_epi16(1);
    // [even, odd] accumulators per pair.
    let mut acc = [[[_mm256_setzero_ps(); 2]; TT]; RR];
    let lanes = |wv: __m256i, av: __m256i, aabs: __m256i| {
        let p16 = _mm256_maddubs_epi16(aabs, _mm256_sign_epi8(wv, av));
        _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones))
    };
    let pairs = nb / 2;
    for k in 0..2 * pairs {
        let mut wv = [_mm256_setzero_si256(); RR];
        let mut dw = [0.0f32; RR];
        for r in 0..RR {
            // SAFETY: k < nb <= w[r].len().
            let b = w[r].get_unchecked(k);
            wv[r] = values(levels, b);
            dw[r] = read_f16(b.d);
        }
        for t in 0..TT {
            // SAFETY: k < nb <= a[t].len().
            let y = a[t].get_unchecked(k);
            let av = load32(&y.qs);
            let aabs = _mm256_sign_epi8(av, av);
            let da = y.scale();
            for r in 0..RR {
                let d = _mm256_set1_ps(dw[r] * da);
                let s = &mut acc[r][t][k % 2];
                *s = _mm256_fmadd_ps(d, lanes(wv[r], av, aabs), *s);
            }
        }
    }
    let mut out = [[0.0f32; TT]; RR];
    for r in 0..RR {
        for t in 0..TT {
            let mut sum = hsum_f32(_mm256_add_ps(acc[r][t][0], acc[r][t][1]));
            if nb % 2 == 1 {
                // SAFETY: nb - 1 < nb <= the slices' lengths.
                let (b, y) = (w[r].get_unchecked(nb - 1), a[t].get_unchecked(nb - 1));
                let av = load32(&y.qs);
                // Exact: integer lanes whose sum is below 2^24.
                let s = hsum_f32(lanes(values(levels, b), av, _mm256_sign_epi8(av, av)));
                sum = libm::fmaf(read_f16(b.d) * y.scale(), s, sum);
            }
            out[r][t] = sum;
        }
    }
    out
}

/// Every (row, token) of `job` in `RR x TT` tiles; the last tile of rows or tokens
/// repeats its last row or token in the unused pairs (computed, not written). The same
/// walk as `x86_q4_0_rows::tiles`: a shared walk taking the tile as a closure measured
/// about 8 % slower on Q4_0 prompts (pp256 -t 1, 328-349 against 363-381 t/s).
#[inline(always)]
unsafe fn tiles<const RR: usize, const TT: usize>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
    nb: usize,
) {
    let (n_tok, rb, arb) = (job.n_tok, job.row_bytes, job.act_row_bytes);
    let row = |r: usize| cast::<BlockIq4Nl>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
    let act = |t: usize| cast::<BlockQ8_0>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    let (start, nr) = (job.rows.start, job.rows.len());
    let mut i = 0;
    while i < nr {
        let ws: [&[BlockIq4Nl]; RR] = core::array::from_fn(|r| row(start + (i + r).min(nr - 1)));
        let mut t = 0;
        while t < n_tok {
            let ys: [&[BlockQ8_0]; TT] = core::array::from_fn(|j| act((t + j).min(n_tok - 1)));
            let res = tile::<RR, TT>(ws, ys, nb);
            for (r, rr) in res.iter().enumerate().take(RR.min(nr - i)) {
                for (j, v) in rr.iter().enumerate().take(TT.min(n_tok - t)) {
                    out[(i + r) * n_tok + t + j] = *v;
                }
            }
            t += TT;
        }
        i += RR;
    }
}

/// The row-range product of `job` for two or more tokens; `false` (nothing written) for
/// one token, which the one-row kernel streams faster (a 4-row tile without a prefetch
/// of its four interleaved row streams: Gemma 3 270M requantized to IQ4_XS, tg64 at
/// -t 1, 67-70 against 80-101 t/s), and for shapes that are not whole IQ4_NL rows against
/// whole Q8_0 rows.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `job` was checked against `w`, `acts` and `out`
/// (`Job::new`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn job_avx2(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
    let size = core::mem::size_of::<BlockIq4Nl>();
    let nb = job.row_bytes / size;
    if nb == 0
        || nb * size != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8_0>() != job.act_row_bytes
    {
        return false;
    }
    if job.n_tok == 1 {
        return false;
    }
    if job.rows.is_empty() {
        return true;
    }
    tiles::<2, 2>(job, w, acts, out, nb);
    true
}
