//! AVX-512 (F/BW/VL + VNNI) dot products of Q4_K and Q6_K rows with Q8_K: the
//! one-token products (generation) of Q4_K_M files on CPUs that have 512-bit vectors.
//!
//! The arithmetic is [`super::x86_kquant::dot_avx2`]'s, bit for bit: the eight exact int32
//! lanes of a block (lane `m` sums the scaled products of weights `32c + 4m..32c + 4m + 4`
//! over the eight 32-weight chunks `c`), the offset (Q6_K) taken off lane 0, one fused
//! multiply-add per lane and block with `d_w * d_a`, the minimums (Q4_K) summed apart as
//! `(dmin_w * d_a) * mins`, and the same final reduction. Only the vectors are wider: a
//! 64-byte register holds two 32-weight chunks (its 128-bit lanes are four 16-weight
//! groups, so one `vpermw` gives the four groups' scales), `vpmaddubsw` makes the i16
//! pair products and `vpdpwssd` scales and adds them into sixteen int32 lanes, whose
//! two 256-bit halves (the two chunks) are added at the end of the block. Integer sums
//! are exact (or wrap alike) in any order, so the lanes equal the AVX2 kernel's; about
//! a third of the AVX2 kernel's instructions per block (unpacking 64 weights per step,
//! no per-chunk scale broadcasts).
//!
//! Saturation: the unsigned quants are below 64 and the activations in -128..=127, so a
//! `vpmaddubsw` pair is at most 2 * 63 * 128 < 32768 in magnitude; `vpdpwssd` does not
//! saturate.
//!
//! # Safety (for every `unsafe fn` here)
//! Callers must run on a CPU with AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI
//! ([`crate::CpuFeatures::avx512vnni`]); memory is read only through slices whose
//! lengths the loads check or the callers' [`Job`] checked.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_f16::read_f16;
use super::x86_kquant::hsum_f32;
use super::x86_rows::hsum_i32;
use super::x86_stream::fetch_ahead;
use super::Job;
use crate::blocks::{cast, Pod};
use crate::quant::q4_k::{self, BlockQ4K};
use crate::quant::q6_k::BlockQ6K;
use crate::quant::q8_k::BlockQ8K;

/// 64 bytes at `p[at..]` (zero when out of range; never taken for whole blocks).
#[inline(always)]
unsafe fn load64(p: &[u8], at: usize) -> __m512i {
    match p.get(at..at + 64) {
        Some(s) => _mm512_loadu_si512(s.as_ptr() as *const _),
        None => _mm512_setzero_si512(),
    }
}

/// 32 bytes at `p[at..]` in both 256-bit halves.
#[inline(always)]
unsafe fn load32x2(p: &[u8], at: usize) -> __m512i {
    match p.get(at..at + 32) {
        Some(s) => _mm512_broadcast_i64x4(_mm256_loadu_si256(s.as_ptr() as *const __m256i)),
        None => _mm512_setzero_si512(),
    }
}

/// `vpermw` controls: word `i` of control `k` picks word `4k + i / 8` (four 16-weight
/// groups, one per 128-bit lane: Q6_K's group scales) or `2k + i / 16` (two 32-weight
/// sub-blocks, one per 256-bit half: Q4_K's sub-block scales).
static GROUP_IDX: [[u16; 32]; 4] = idx(8, 4);
static SUB_IDX: [[u16; 32]; 4] = idx(16, 2);

const fn idx(per: usize, step: usize) -> [[u16; 32]; 4] {
    let mut t = [[0u16; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut i = 0;
        while i < 32 {
            t[k][i] = (step * k + i / per) as u16;
            i += 1;
        }
        k += 1;
    }
    t
}

#[inline(always)]
unsafe fn ctrl(t: &[u16; 32]) -> __m512i {
    _mm512_loadu_si512(t.as_ptr() as *const _)
}

/// The two 256-bit halves of sixteen int32 lanes added: the block's eight lanes.
#[inline(always)]
pub(super) unsafe fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// A block of a K-quant format as the 512-bit kernels see it (also the prompt tiles of
/// [`super::x86_gemm`] on this ISA).
pub(super) trait K512: Pod {
    /// `vpermw` controls: control `k` picks the scales of chunks `2k`, `2k + 1` (each
    /// 128-bit lane one 16-weight group) from [`K512::scale_src`].
    const SCALE_IDX: &'static [[u16; 32]; 4];
    /// The i16 scale words the controls index.
    unsafe fn scale_src(&self) -> __m512i;
    /// The unsigned quants of chunks `2k` (low half) and `2k + 1` (high half), i.e.
    /// `x86_kquant`'s `unpack()[2k]` and `[2k + 1]`; their activations are the 64 bytes
    /// `y.qs[64k..64k + 64]`.
    unsafe fn pair(&self, k: usize) -> __m512i;
    /// `(offset, d_w * d_a, dmin_w * d_a, mins)` of the block against `y` (zeros where
    /// the format has no offset or minimums); `src` is [`K512::scale_src`].
    unsafe fn terms(&self, src: __m512i, y: &BlockQ8K) -> (i32, f32, f32, i32);
}

impl K512 for BlockQ6K {
    const SCALE_IDX: &'static [[u16; 32]; 4] = &GROUP_IDX;
    #[inline(always)]
    unsafe fn scale_src(&self) -> __m512i {
        _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(
            self.scales.as_ptr() as *const __m128i
        )))
    }
    #[inline(always)]
    unsafe fn pair(&self, k: usize) -> __m512i {
        // Chunks 4h, 4h + 1 (k = 2h): low nibbles of ql[64h..64h + 64]; chunks 4h + 2,
        // 4h + 3 (k = 2h + 1): their high nibbles. The top bits of chunk 4h + i are bits
        // 2i..2i + 2 of qh[32h..], moved to bits 4..6 per 256-bit half (words: shift
        // left 4 / 2 for i = 0 / 1, right 0 / 2 for i = 2 / 3); the mask keeps every
        // byte's own bits (what a 16-bit shift moves across a byte boundary lands outside
        // 0x30).
        let h = k / 2;
        let ql = load64(&self.ql, 64 * h);
        let qh = load32x2(&self.qh, 32 * h);
        let (lo, hi) = if k.is_multiple_of(2) {
            let sl = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
            (ql, _mm512_sllv_epi16(qh, sl))
        } else {
            let sr = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
            (_mm512_srli_epi16::<4>(ql), _mm512_srlv_epi16(qh, sr))
        };
        _mm512_or_si512(
            _mm512_and_si512(lo, _mm512_set1_epi8(0x0F)),
            _mm512_and_si512(hi, _mm512_set1_epi8(0x30)),
        )
    }
    #[inline(always)]
    unsafe fn terms(&self, src: __m512i, y: &BlockQ8K) -> (i32, f32, f32, i32) {
        // The offset 32 * sum_g scale[g] * bsums[g] (wrapping, as `q6_k::terms`).
        let b = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        let off = hsum_i32(_mm256_madd_epi16(b, _mm512_castsi512_si256(src)));
        (off.wrapping_mul(32), read_f16(self.d) * y.scale(), 0.0, 0)
    }
}

impl K512 for BlockQ4K {
    const SCALE_IDX: &'static [[u16; 32]; 4] = &SUB_IDX;
    #[inline(always)]
    unsafe fn scale_src(&self) -> __m512i {
        let (sc, _) = q4_k::scales_mins_k4_packed(&self.scales);
        _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)))
    }
    #[inline(always)]
    unsafe fn pair(&self, k: usize) -> __m512i {
        // Chunks 2k, 2k + 1 are the low and high nibbles of qs[32k..32k + 32]: the bytes
        // in both halves, the high half shifted right by 4.
        let sr = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
        let q = load32x2(&self.qs, 32 * k);
        _mm512_and_si512(_mm512_srlv_epi16(q, sr), _mm512_set1_epi8(0x0F))
    }
    #[inline(always)]
    unsafe fn terms(&self, _: __m512i, y: &BlockQ8K) -> (i32, f32, f32, i32) {
        // sum_g bsums[g] * mn[g / 2]: i16 products summed in pairs into i32 (exact).
        let (_, mn) = q4_k::scales_mins_k4_packed(&self.scales);
        let mn = _mm_cvtsi64_si128(mn as i64);
        let f = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
        let b = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        let mins = hsum_i32(_mm256_madd_epi16(b, f));
        let ys = y.scale();
        (0, read_f16(self.d) * ys, read_f16(self.dmin) * ys, mins)
    }
}

/// Step `k` of a block's integer lanes: `acc + sum over chunks 2k, 2k + 1 of
/// scale * u * q8` (sixteen int32 lanes, chunk 2k in the low half).
#[inline(always)]
pub(super) unsafe fn step(acc: __m512i, u: __m512i, s: __m512i, y: &BlockQ8K, k: usize) -> __m512i {
    _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, load64(&y.qs, 64 * k)), s)
}

/// The scale words of step `k` (from [`K512::scale_src`]).
#[inline(always)]
pub(super) unsafe fn step_scales<B: K512>(src: __m512i, k: usize) -> __m512i {
    permute_scales(B::SCALE_IDX, src, k)
}

/// [`step_scales`] with the controls given.
#[inline(always)]
pub(super) unsafe fn permute_scales(idx: &[[u16; 32]; 4], src: __m512i, k: usize) -> __m512i {
    _mm512_permutexvar_epi16(ctrl(&idx[k]), src)
}

/// The block's eight int32 lanes against `y` (offset off lane 0), `d_w * d_a`, and
/// `(dmin_w * d_a, mins)`.
#[inline(always)]
unsafe fn lanes<B: K512>(x: &B, y: &BlockQ8K) -> (__m256i, f32, f32, i32) {
    let src = x.scale_src();
    let mut acc = _mm512_setzero_si512();
    for k in 0..4 {
        acc = step(acc, x.pair(k), step_scales::<B>(src, k), y, k);
    }
    let (off, d, dmin, mins) = x.terms(src, y);
    let lanes = _mm256_sub_epi32(fold(acc), _mm256_zextsi128_si256(_mm_cvtsi32_si128(off)));
    (lanes, d, dmin, mins)
}

/// One row against one activation row: `dot_avx2`'s numbers; `FETCH`: the row is a
/// stream read once, fetched ahead ([`super::x86_stream`]).
#[inline(always)]
unsafe fn dot_body<B: K512, const FETCH: bool>(w: &[B], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (x, y) in w.iter().zip(a) {
        if FETCH {
            fetch_ahead(x);
        }
        let (lanes, d, dmin, m) = lanes(x, y);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
        mins += dmin * m as f32;
    }
    hsum_f32(acc) - mins
}

/// [`dot_body`] compiled for AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_vnni<B: K512>(w: &[B], a: &[BlockQ8K]) -> f32 {
    dot_body::<B, false>(w, a)
}

/// Rows `job.rows` against every token, one (row, token) dot at a time (the rows are
/// read once each, in order: one sequential stream, fetched ahead by the first token).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn job_vnni<B: K512>(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
    let nb = job.row_bytes / core::mem::size_of::<B>();
    if nb * core::mem::size_of::<B>() != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8K>() != job.act_row_bytes
    {
        return false;
    }
    let (n_tok, rb, arb) = (job.n_tok, job.row_bytes, job.act_row_bytes);
    for (i, r) in job.rows.clone().enumerate() {
        let wr = cast::<B>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
        for t in 0..n_tok {
            let a = cast::<BlockQ8K>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
            out[i * n_tok + t] = if t == 0 {
                dot_body::<B, true>(wr, a)
            } else {
                dot_body::<B, false>(wr, a)
            };
        }
    }
    true
}
