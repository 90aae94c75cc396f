//! Matrix-matrix tiles for the K-quants of Q4_K_M files (Q4_K and Q6_K) on AVX2, and
//! on AVX-512 VNNI where the CPU has it: the prompt-processing products.
//!
//! [`super::x86_rows`] dots one weight row with 8 tokens at a time; here a tile is
//! `R` weight rows x `T` tokens, so each 32-byte chunk of activation quants is loaded
//! once for `R` rows and each unpacked weight chunk (and its scale vector) is used for
//! `T` tokens. The token-side terms of a block (the activation scale and the `bsums`
//! products that give Q4_K's minimums and Q6_K's offset) are computed for four tokens
//! in one vector: the four tokens' `bsums` are transposed once per block and tile and
//! multiplied with each row's 16 factors by four `vpmaddwd`.
//!
//! Bits: every (row, token) pair computes the numbers of [`super::x86_kquant`] (and of
//! `crate::quant::q8_k::kquant_dot`): the same eight exact int32 lanes per block (integer
//! sums are exact, or wrap alike, in any order; the `vpdpwssd` of the VNNI path is
//! `vpmaddwd` + `vpaddd` in one instruction, without saturation), the same f32 products
//! `d_w * d_a` and `dmin_w * d_a`, the same per-lane fused multiply-add per block, the
//! same separate minimum sum and the same final reduction. Only loads and unpacking are
//! shared.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_f16::read_f16;

use super::x86_kquant::{self as kq, load32};
use super::x86_kquant512::{self as k5, K512};
use super::Job;
use crate::blocks::{cast, Pod};
use crate::quant::q8_k::BlockQ8K;
use crate::quant::{q4_k, q6_k};

/// Tokens per tile: the token-side terms of a block fill one 4-lane vector.
const T: usize = 4;

/// How many row tiles ahead a tile prefetches its weight rows (as
/// `x86_rows::PF_TILES`). A tile reads its `RR` rows side by side, which the hardware
/// prefetcher does not follow: with few tokens (several sequences decoded together, 2
/// to 4 rows) the tiles waited on memory, Gemma 3 270M's Q4_K and Q6_K products ran 4 to
/// 6 times slower per token than the one-token kernel (AMD EPYC, VNNI).
const PF_TILES: usize = 5;

/// A K-quant block as the tiles see it.
pub(super) trait Gemm: Pod {
    /// Whether the format has minimums (Q4_K) rather than an offset (Q6_K).
    const MINS: bool;
    /// Quants `32c..32c + 32` as unsigned bytes, as `x86_kquant`'s `unpack()[c]`.
    unsafe fn chunk(&self, c: usize) -> __m256i;
    /// The i16 group scales arranged so that `vpshufb` with [`CHUNK_SCALE`]`[c]` gives
    /// chunk `c`'s `vpmaddwd` factors: group `2c` in the low 128 bits, `2c + 1` in the
    /// high 128 bits.
    unsafe fn scale_words(&self) -> __m256i;
    /// The 16 i16 factors of the activation's `bsums` (Q4_K: the minimum of each group's
    /// sub-block; Q6_K: each group's scale).
    unsafe fn bsum_factors(&self) -> __m256i;
    unsafe fn d(&self) -> f32;
    unsafe fn dmin(&self) -> f32;
}

/// `vpshufb` controls picking i16 word `c` of each 128-bit half.
static CHUNK_SCALE: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut c = 0;
    while c < 8 {
        let mut i = 0;
        while i < 32 {
            t[c][i] = (2 * c + i % 2) as u8;
            i += 1;
        }
        c += 1;
    }
    t
};

impl Gemm for q4_k::BlockQ4K {
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> __m256i {
        let m4 = _mm256_set1_epi8(0x0F);
        let q = load32(&self.qs[32 * (c / 2)..]);
        if c.is_multiple_of(2) {
            _mm256_and_si256(q, m4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)
        }
    }
    #[inline(always)]
    unsafe fn scale_words(&self) -> __m256i {
        // Both groups of a 32-weight chunk have the chunk's sub-block scale: word c of
        // both halves is scale c.
        let (sc, _) = q4_k::scales_mins_k4_packed(&self.scales);
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)))
    }
    #[inline(always)]
    unsafe fn bsum_factors(&self) -> __m256i {
        let (_, mn) = q4_k::scales_mins_k4_packed(&self.scales);
        let mn = _mm_cvtsi64_si128(mn as i64);
        // mn[g / 2] for g = 0..16.
        _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn))
    }
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        read_f16(self.d)
    }
    #[inline(always)]
    unsafe fn dmin(&self) -> f32 {
        read_f16(self.dmin)
    }
}

impl Gemm for q6_k::BlockQ6K {
    const MINS: bool = false;
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> __m256i {
        // As `x86_kquant::unpack_q6k`: chunk 4h + k takes low (k < 2) or high nibbles of
        // ql[64h + 32 (k % 2)..] and bits 2k..2k+2 of qh[32h..].
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let (h, k) = (c / 4, c % 4);
        let ql = load32(&self.ql[64 * h + 32 * (k % 2)..]);
        let qh = load32(&self.qh[32 * h..]);
        let lo = if k < 2 {
            _mm256_and_si256(ql, m4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4)
        };
        let hb = match k {
            0 => qh,
            1 => _mm256_srli_epi16(qh, 2),
            2 => _mm256_srli_epi16(qh, 4),
            _ => _mm256_srli_epi16(qh, 6),
        };
        // Masked before the shift by 4 so no bit crosses into the next byte.
        _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4))
    }
    #[inline(always)]
    unsafe fn scale_words(&self) -> __m256i {
        // Even groups' scales to the low half, odd groups' to the high half, as i16.
        let s = _mm_loadu_si128(self.scales.as_ptr() as *const __m128i);
        let even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, even_odd))
    }
    #[inline(always)]
    unsafe fn bsum_factors(&self) -> __m256i {
        _mm256_cvtepi8_epi16(_mm_loadu_si128(self.scales.as_ptr() as *const __m128i))
    }
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        read_f16(self.d)
    }
    #[inline(always)]
    unsafe fn dmin(&self) -> f32 {
        0.0
    }
}

/// `RR` weight rows against `TT <= 4` activation rows, all of `nb` blocks.
///
/// # Safety
/// AVX2/FMA (and AVX-512 VNNI/VL when `VNNI`); every slice in `w` and `a` has at least
/// `nb` blocks.
#[inline(always)]
unsafe fn tile<B: Gemm + K512, const VNNI: bool, const RR: usize, const TT: usize>(
    w: [&[B]; RR],
    a: [&[BlockQ8K]; TT],
    nb: usize,
    prefetch: *const u8,
) -> [[f32; TT]; RR] {
    let mut acc = [[_mm256_setzero_ps(); TT]; RR];
    let mut mins = [_mm_setzero_ps(); RR];
    // The prefetched tile's rows are `RR` adjacent rows: walk them at the rate this
    // tile consumes its own (`RR` blocks per block step).
    let pf_step = RR * core::mem::size_of::<B>();
    for k in 0..nb {
        if !prefetch.is_null() {
            let p = prefetch.wrapping_add(k * pf_step);
            let mut off = 0;
            while off < pf_step {
                // A prefetch never faults, even past the end of the weights.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
                off += 64;
            }
        }
        // SAFETY: k < nb <= a[t].len() and <= w[r].len().
        let y: [&BlockQ8K; TT] = core::array::from_fn(|t| a[t].get_unchecked(k));
        let x: [&B; RR] = core::array::from_fn(|r| w[r].get_unchecked(k));

        // Token side, four lanes (tokens past TT repeat the last one and are unused).
        let yt = |t: usize| y[t.min(TT - 1)];
        let ys = _mm_setr_ps(yt(0).scale(), yt(1).scale(), yt(2).scale(), yt(3).scale());
        // bsums as eight i32 words (group pairs) per token, transposed so that vector
        // j holds word j of the four tokens in its low half and word j + 4 in its high.
        let b: [__m256i; 4] = core::array::from_fn(|t| load32(&yt(t).bsums));
        let t0 = _mm256_unpacklo_epi32(b[0], b[1]);
        let t1 = _mm256_unpackhi_epi32(b[0], b[1]);
        let t2 = _mm256_unpacklo_epi32(b[2], b[3]);
        let t3 = _mm256_unpackhi_epi32(b[2], b[3]);
        let tb = [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ];

        // Exact integer lanes of every (row, token) pair.
        let mut isum = [[_mm256_setzero_si256(); TT]; RR];
        if VNNI {
            // Two chunks per 64-byte vector (`x86_kquant512`); the halves are added after
            // the block (the same exact lanes).
            let src: [__m512i; RR] = core::array::from_fn(|r| x[r].scale_src());
            let mut wide = [[_mm512_setzero_si512(); TT]; RR];
            for k in 0..4 {
                let u: [__m512i; RR] = core::array::from_fn(|r| x[r].pair(k));
                let s: [__m512i; RR] = core::array::from_fn(|r| k5::step_scales::<B>(src[r], k));
                for t in 0..TT {
                    for r in 0..RR {
                        wide[r][t] = k5::step(wide[r][t], u[r], s[r], y[t], k);
                    }
                }
            }
            for r in 0..RR {
                for t in 0..TT {
                    isum[r][t] = k5::fold(wide[r][t]);
                }
            }
        }
        let sw: [__m256i; RR] = core::array::from_fn(|r| x[r].scale_words());
        for (c, ctrl) in CHUNK_SCALE.iter().enumerate().filter(|_| !VNNI) {
            let ctrl = _mm256_loadu_si256(ctrl.as_ptr() as *const __m256i);
            let u: [__m256i; RR] = core::array::from_fn(|r| x[r].chunk(c));
            let s: [__m256i; RR] = core::array::from_fn(|r| _mm256_shuffle_epi8(sw[r], ctrl));
            for t in 0..TT {
                let q = load32(&y[t].qs[32 * c..]);
                for r in 0..RR {
                    let p16 = _mm256_maddubs_epi16(u[r], q);
                    isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(p16, s[r]));
                }
            }
        }

        for r in 0..RR {
            // sum_g factor[g] * bsums[g] for the four tokens (i16 x i16 products summed
            // in pairs into i32: exact; the sum wraps like `hsum_i32`).
            let f = x[r].bsum_factors();
            let m = _mm256_add_epi32(
                _mm256_add_epi32(
                    _mm256_madd_epi16(tb[0], _mm256_shuffle_epi32::<0x00>(f)),
                    _mm256_madd_epi16(tb[1], _mm256_shuffle_epi32::<0x55>(f)),
                ),
                _mm256_add_epi32(
                    _mm256_madd_epi16(tb[2], _mm256_shuffle_epi32::<0xAA>(f)),
                    _mm256_madd_epi16(tb[3], _mm256_shuffle_epi32::<0xFF>(f)),
                ),
            );
            let m = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
            let mut ds = [0f32; 4];
            // SAFETY: four writable f32.
            _mm_storeu_ps(ds.as_mut_ptr(), _mm_mul_ps(_mm_set1_ps(x[r].d()), ys));
            let mut off = [0i32; 4];
            if !B::MINS {
                // Q6_K: the offset 32 * sum_g scale[g] * bsums[g], wrapping.
                // SAFETY: four writable i32.
                _mm_storeu_si128(off.as_mut_ptr() as *mut __m128i, _mm_slli_epi32::<5>(m));
            }
            for t in 0..TT {
                let mut is = isum[r][t];
                if !B::MINS {
                    is = _mm256_sub_epi32(is, _mm256_setr_epi32(off[t], 0, 0, 0, 0, 0, 0, 0));
                }
                acc[r][t] =
                    _mm256_fmadd_ps(_mm256_set1_ps(ds[t]), _mm256_cvtepi32_ps(is), acc[r][t]);
            }
            if B::MINS {
                // mins += (dmin_w * d_a) * mins_int, not fused (as the reference).
                let dmin = _mm_mul_ps(_mm_set1_ps(x[r].dmin()), ys);
                mins[r] = _mm_add_ps(mins[r], _mm_mul_ps(dmin, _mm_cvtepi32_ps(m)));
            }
        }
    }
    let mut out = [[0f32; TT]; RR];
    for r in 0..RR {
        let mut m = [0f32; 4];
        // SAFETY: four writable f32.
        _mm_storeu_ps(m.as_mut_ptr(), mins[r]);
        for t in 0..TT {
            out[r][t] = kq::hsum_f32(acc[r][t]) - m[t];
        }
    }
    out
}

/// AVX2 without VNNI: 16 vector registers hold a 2 x 4 tile's integer sums.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn job_avx2<B: Gemm + K512>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    body::<B, false, 2>(job, w, acts, out)
}

/// AVX-512 VNNI: two chunks per 64-byte vector (`vpmaddubsw` + `vpdpwssd`, see
/// [`super::x86_kquant512`]); 32 registers hold a 4 x 4 tile's sums.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn job_vnni<B: Gemm + K512>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    body::<B, true, 4>(job, w, acts, out)
}

#[inline(always)]
unsafe fn body<B: Gemm + K512, const VNNI: bool, const R: usize>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let nb = job.row_bytes / core::mem::size_of::<B>();
    if nb * core::mem::size_of::<B>() != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8K>() != job.act_row_bytes
    {
        return false;
    }
    let n_tok = job.n_tok;
    let rb = job.row_bytes;
    let arb = job.act_row_bytes;
    let row = |r: usize| cast::<B>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
    let act = |t: usize| cast::<BlockQ8K>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    let start = job.rows.start;
    let nr = job.rows.len();
    let mut i = 0;
    while i < nr {
        let rr = if i + R <= nr { R } else { 1 };
        let mut t = 0;
        while t < n_tok {
            let tt = (n_tok - t).min(T);
            // The first token tile of a row tile fetches the rows of a later one (the
            // other token tiles find this tile's rows in cache).
            let next = if t == 0 && rr == R {
                w.as_ptr().wrapping_add((start + i + PF_TILES * R) * rb)
            } else {
                core::ptr::null()
            };
            macro_rules! run {
                ($r:expr, $t:expr) => {{
                    let res = tile::<B, VNNI, $r, $t>(
                        core::array::from_fn(|j| row(start + i + j)),
                        core::array::from_fn(|j| act(t + j)),
                        nb,
                        next,
                    );
                    for (r, v) in res.iter().enumerate() {
                        out[(i + r) * n_tok + t..][..$t].copy_from_slice(v);
                    }
                }};
            }
            match (rr == R, tt) {
                (true, 4) => run!(R, 4),
                (true, 3) => run!(R, 3),
                (true, 2) => run!(R, 2),
                (true, _) => run!(R, 1),
                (false, 4) => run!(1, 4),
                (false, 3) => run!(1, 3),
                (false, 2) => run!(1, 2),
                (false, _) => run!(1, 1),
            }
            t += tt;
        }
        i += rr;
    }
    true
}
