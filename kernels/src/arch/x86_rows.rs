//! AVX2 row-range products (`matvec_rows` / `matmul_rows`) for the formats that carry
//! most of a model's bytes: Q8_0 and Q5_0 (llama.cpp's x86 eight-lane arithmetic) and
//! the K-quants.
//!
//! Why a separate layer over the one-row kernels of [`super::x86_legacy`] and
//! [`super::x86_kquant`]: the ISA is picked once per call (not once per row and token),
//! and the loops are tiled so one weight block, once loaded and unpacked, is dotted with
//! several activation rows (prompt tokens), and one activation block with several weight
//! rows. Every (row, token) pair keeps its own accumulators and sees its blocks in the
//! same order with the same fused steps as the scalar reference, so tiling changes no
//! bit.
//!
//! Integer sums:
//! - Q8_0 uses llama.cpp's sign trick: `maddubs(|w|, sign(a, w))`. It is exact for every
//!   weight byte (including -128, whose magnitude 128 is a valid unsigned byte) and every
//!   activation in -127..=127, and no i16 pair sum can saturate (at most 2 * 128 * 128
//!   in magnitude, and +32768 is unreachable because `sign` never yields +128). Q8_0
//!   activations come from `quantize_row_x86`, which only yields -128 for a degenerate
//!   block whose scale is 0 (then the lane is multiplied by 0 and the bits do not
//!   depend on it). For an activation of -128 against a negative weight the sign flip
//!   wraps, exactly as in llama.cpp's own x86 kernel.
//! - Q5_0 keeps its quants unsigned (0..32): `maddubs(u, a) - 16 * sum(a)`, exact for any
//!   activation byte; `16 * sum(a)` is computed once per activation block and tile.
//! - K-quants: as in [`super::x86_kquant`] (unsigned quants, exact); the per-block
//!   scale/minimum terms are split into a weight part (once per block and tile) and a
//!   token part (Q4_K/Q6_K: one `madd` over the activation's `bsums`).
//! - With AVX-512 VNNI (`CpuFeatures::avx512vnni`), Q8_0/Q5_0 use `vpdpbusd` for the same
//!   integers, and the 32 vector registers keep a 4 x 4 tile's accumulators unspilled.
//!
//! Tiles are 4 rows x 4 tokens (Q8_0/Q5_0; two or more tokens go to the row x token
//! tiles of [`super::x86_gemm_lanes`] unless a row has more than 128 blocks) or 1 row x
//! 8 tokens (K-quants; Q4_K and Q6_K with two or more tokens go to the row x token tiles
//! of [`super::x86_gemm`]); for one token the 4 rows are read as 4 interleaved streams,
//! which needs the software prefetch of `PF_TILES` (below) to stream at memory speed.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_f16::read_f16;

use super::x86_kquant::{self as kq, KBlock};
use super::x86_legacy::{bits_to_mask, load32, nibbles};
use super::x86_stream::fetch_ahead;
use super::Job;
use crate::blocks::{cast, Pod};
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q8_0::{hsum8, BlockQ8_0};
use crate::quant::q8_k::BlockQ8K;
use crate::quant::{q2_k, q3_k, q4_k, q5_k, q6_k};

/// Weight rows per tile.
const R: usize = 4;
/// Activation rows (tokens) per tile.
const T: usize = 4;
/// How many tiles ahead of the current one a tile prefetches its weight rows (about
/// 14 KB for Q8_0 rows of 640). Measured on the 262144 x 640 Q8_0 output matrix
/// (one token, 4 x 1 tiles, AMD EPYC): without prefetching, 4 interleaved row streams
/// ran at a quarter of one sequential stream's speed (the hardware prefetcher does not
/// follow them, nor across 4 KiB pages); prefetching 2 tiles ahead made them equal,
/// 3-7 tiles ahead gave ~1.8x the one-row kernel, 13-17 tiles ahead was slower again.
const PF_TILES: usize = 5;

/// Tokens from which Q4_K/Q6_K products go to the row x token tiles of
/// [`super::x86_gemm`] (fewer go to `kquant_job` below).
pub(super) const GEMM_MIN_TOK: usize = 2;

/// A block-32 weight format dotted with Q8_0 in llama.cpp's x86 eight-lane arithmetic
/// (`crate::quant::q8_0::lanes8_dot`).
pub(super) trait Lanes8: Pod {
    /// Whether [`Lanes8::groups`] needs `16 * sum(a)` per group.
    const ASUM: bool;
    /// The f16 scale.
    fn d(&self) -> [u8; 2];
    /// The block's quants in the form [`Lanes8::groups`] takes (reused for every token).
    unsafe fn prep(&self) -> [__m256i; 2];
    /// [`Lanes8::prep`] where AVX-512 BW/VL may be used (the VNNI kernels).
    #[inline(always)]
    unsafe fn prep_vnni(&self) -> [__m256i; 2] {
        self.prep()
    }
    /// Exact `sum(w[j] * a[j])` per group of four consecutive weights, in natural order.
    unsafe fn groups(p: &[__m256i; 2], a: __m256i, asum16: __m256i) -> __m256i;
    /// The same integers with AVX-512 VNNI (`vpdpbusd`: u8 x i8 products summed by four
    /// straight into i32, no i16 step).
    unsafe fn groups_vnni(p: &[__m256i; 2], a: __m256i, asum16: __m256i) -> __m256i;
}

impl Lanes8 for BlockQ8_0 {
    const ASUM: bool = false;
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn prep(&self) -> [__m256i; 2] {
        let q = load32(&self.qs);
        [_mm256_abs_epi8(q), q]
    }
    #[inline(always)]
    unsafe fn groups(p: &[__m256i; 2], a: __m256i, _: __m256i) -> __m256i {
        let p16 = _mm256_maddubs_epi16(p[0], _mm256_sign_epi8(a, p[1]));
        _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn groups_vnni(p: &[__m256i; 2], a: __m256i, _: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), p[0], _mm256_sign_epi8(a, p[1]))
    }
}

impl Lanes8 for BlockQ5_0 {
    const ASUM: bool = true;
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn prep(&self) -> [__m256i; 2] {
        let high = _mm256_and_si256(
            bits_to_mask(u32::from_le_bytes(self.qh)),
            _mm256_set1_epi8(0x10),
        );
        [
            _mm256_or_si256(nibbles(&self.qs), high),
            _mm256_setzero_si256(),
        ]
    }
    #[inline(always)]
    unsafe fn prep_vnni(&self) -> [__m256i; 2] {
        // The fifth bits straight from a mask register: 16 added where bit j of `qh` is
        // set (two instructions where `bits_to_mask` takes five).
        let nib = nibbles(&self.qs);
        let k = u32::from_le_bytes(self.qh);
        [
            _mm256_mask_add_epi8(nib, k, nib, _mm256_set1_epi8(16)),
            _mm256_setzero_si256(),
        ]
    }
    #[inline(always)]
    unsafe fn groups(p: &[__m256i; 2], a: __m256i, asum16: __m256i) -> __m256i {
        // sum((u - 16) * a) = sum(u * a) - 16 * sum(a), u in 0..32: no saturation.
        let p16 = _mm256_maddubs_epi16(p[0], a);
        _mm256_sub_epi32(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)), asum16)
    }
    #[inline(always)]
    unsafe fn groups_vnni(p: &[__m256i; 2], a: __m256i, asum16: __m256i) -> __m256i {
        // sum(u * a) - 16 * sum(a) as one `vpdpbusd` starting from -16 * sum(a).
        _mm256_dpbusd_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), asum16), p[0], a)
    }
}

/// An f16 scale broadcast to eight f32 lanes (exact conversion).
#[inline(always)]
unsafe fn bcast_f16(h: [u8; 2]) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(h) as i16))
}

/// Eight f32 lanes in natural order reduced by the reference tree ([`hsum8`]).
#[inline(always)]
unsafe fn reduce(acc: __m256) -> f32 {
    let mut l = [0.0f32; 8];
    // SAFETY: 8 writable f32.
    _mm256_storeu_ps(l.as_mut_ptr(), acc);
    hsum8(l)
}

/// `RR` weight rows against `TT` activation rows, all of `nb` blocks.
///
/// # Safety
/// AVX2/FMA/F16C; every slice in `w` and `a` has at least `nb` blocks.
#[inline(always)]
unsafe fn lanes_tile<B: Lanes8, const VNNI: bool, const RR: usize, const TT: usize>(
    w: [&[B]; RR],
    a: [&[BlockQ8_0]; TT],
    nb: usize,
    prefetch: *const u8,
) -> [[f32; TT]; RR] {
    let mut acc = [[_mm256_setzero_ps(); TT]; RR];
    // Bytes of the prefetched tile's rows to fetch per block step (two or three lines),
    // so that the whole tile is requested over the `nb` steps.
    let pf_step = RR * core::mem::size_of::<B>();
    for k in 0..nb {
        if !prefetch.is_null() {
            let p = prefetch.wrapping_add(k * pf_step);
            // A prefetch never faults, even past the end of the weights.
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64) as *const i8);
            if pf_step > 128 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128) as *const i8);
            }
        }
        let mut p = [[_mm256_setzero_si256(); 2]; RR];
        let mut dw = [_mm256_setzero_ps(); RR];
        for r in 0..RR {
            // SAFETY: k < nb <= w[r].len().
            let b = w[r].get_unchecked(k);
            p[r] = if VNNI { b.prep_vnni() } else { b.prep() };
            dw[r] = bcast_f16(b.d());
        }
        for t in 0..TT {
            // SAFETY: k < nb <= a[t].len().
            let y = a[t].get_unchecked(k);
            let av = load32(&y.qs);
            let da = bcast_f16(y.d);
            let asum16 = if B::ASUM {
                let s = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_set1_epi8(1), av),
                    _mm256_set1_epi16(1),
                );
                _mm256_slli_epi32::<4>(s)
            } else {
                _mm256_setzero_si256()
            };
            for r in 0..RR {
                let g = if VNNI {
                    B::groups_vnni(&p[r], av, asum16)
                } else {
                    B::groups(&p[r], av, asum16)
                };
                // d_w * d_a is exact in f32 (two f16 significands), as in the reference.
                let d = _mm256_mul_ps(dw[r], da);
                acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(g), acc[r][t]);
            }
        }
    }
    let mut out = [[0.0f32; TT]; RR];
    for r in 0..RR {
        for t in 0..TT {
            out[r][t] = reduce(acc[r][t]);
        }
    }
    out
}

/// The tiled loop over a [`Job`] for one [`Lanes8`] format.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn lanes_job<B: Lanes8>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    lanes_body::<B, false>(job, w, acts, out)
}

/// [`lanes_job`] compiled for AVX-512 VNNI: `vpdpbusd`, and 32 vector registers so a
/// 4 x 4 tile's accumulators are not spilled.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn lanes_job_vnni<B: Lanes8>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    lanes_body::<B, true>(job, w, acts, out)
}

#[inline(always)]
unsafe fn lanes_body<B: Lanes8, const VNNI: bool>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let nb = job.row_bytes / core::mem::size_of::<B>();
    if nb * core::mem::size_of::<B>() != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8_0>() != job.act_row_bytes
    {
        return false;
    }
    let n_tok = job.n_tok;
    let rb = job.row_bytes;
    let arb = job.act_row_bytes;
    let row = |r: usize| cast::<B>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
    let act = |t: usize| cast::<BlockQ8_0>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    let mut put = |i: usize, t: usize, v: f32| out[i * n_tok + t] = v;
    let start = job.rows.start;
    let nr = job.rows.len();
    let mut i = 0;
    while i < nr {
        if i + R <= nr {
            let ws: [&[B]; R] = core::array::from_fn(|j| row(start + i + j));
            let next = w.as_ptr().wrapping_add((start + i + PF_TILES * R) * rb);
            let mut t = 0;
            while t + T <= n_tok {
                let res =
                    lanes_tile::<B, VNNI, R, T>(ws, core::array::from_fn(|j| act(t + j)), nb, next);
                for (r, rr) in res.iter().enumerate() {
                    for (j, v) in rr.iter().enumerate() {
                        put(i + r, t + j, *v);
                    }
                }
                t += T;
            }
            while t < n_tok {
                let res = lanes_tile::<B, VNNI, R, 1>(ws, [act(t)], nb, next);
                for (r, rr) in res.iter().enumerate() {
                    put(i + r, t, rr[0]);
                }
                t += 1;
            }
            i += R;
        } else {
            let ws = [row(start + i)];
            let mut t = 0;
            while t + T <= n_tok {
                let res = lanes_tile::<B, VNNI, 1, T>(
                    ws,
                    core::array::from_fn(|j| act(t + j)),
                    nb,
                    core::ptr::null(),
                );
                for (j, v) in res[0].iter().enumerate() {
                    put(i, t + j, *v);
                }
                t += T;
            }
            while t < n_tok {
                put(
                    i,
                    t,
                    lanes_tile::<B, VNNI, 1, 1>(ws, [act(t)], nb, core::ptr::null())[0][0],
                );
                t += 1;
            }
            i += 1;
        }
    }
    true
}

/// Tokens per K-quant tile: the unpacked weight block (eight vectors) and its scale
/// vectors are reused this many times.
const TK: usize = 8;

/// The per-block factors of a K-quant dot product ([`crate::quant::q8_k::KTerms`]) split
/// into a weight part (computed once per weight block and tile) and a token part. Q4_K
/// and Q6_K, the formats of Q4_K_M files, compute the token part with SIMD; the others
/// call `terms`. The numbers are `terms`' either way: the same f32 products, and
/// integer sums that are exact (or wrap alike) in any order.
pub(super) trait KRow: KBlock {
    unsafe fn weight_part(&self, y0: &BlockQ8K) -> WPart;
    /// `(d, offset, dmin, mins)` for one token.
    unsafe fn token_part(&self, w: &WPart, y: &BlockQ8K) -> (f32, i32, f32, i32);
}

pub(super) struct WPart {
    /// Group scales per 32-weight chunk: groups 2c (low 128 bits) and 2c + 1 (high).
    sv: [__m256i; 8],
    d: f32,
    dmin: f32,
    /// Q4_K: minimum of each group's sub-block; Q6_K: each group's scale (16 x i16).
    extra: __m256i,
    first: (f32, i32, f32, i32),
}

#[inline(always)]
unsafe fn scale_vectors(scales: &[i16; 16]) -> [__m256i; 8] {
    core::array::from_fn(|c| {
        _mm256_set_m128i(
            _mm_set1_epi16(scales[2 * c + 1]),
            _mm_set1_epi16(scales[2 * c]),
        )
    })
}

/// Wrapping sum of eight i32 lanes.
#[inline(always)]
pub(super) unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

macro_rules! generic_krow {
    ($t:ty) => {
        impl KRow for $t {
            #[inline(always)]
            unsafe fn weight_part(&self, y0: &BlockQ8K) -> WPart {
                let t = self.terms(y0);
                WPart {
                    sv: scale_vectors(&t.scales),
                    d: 0.0,
                    dmin: 0.0,
                    extra: _mm256_setzero_si256(),
                    first: (t.d, t.offset, t.dmin, t.mins),
                }
            }
            #[inline(always)]
            unsafe fn token_part(&self, _: &WPart, y: &BlockQ8K) -> (f32, i32, f32, i32) {
                let t = self.terms(y);
                (t.d, t.offset, t.dmin, t.mins)
            }
        }
    };
}
generic_krow!(q2_k::BlockQ2K);
generic_krow!(q3_k::BlockQ3K);
generic_krow!(q5_k::BlockQ5K);

impl KRow for q4_k::BlockQ4K {
    #[inline(always)]
    unsafe fn weight_part(&self, y0: &BlockQ8K) -> WPart {
        let (sc, mn) = q4_k::scales_mins_k4_packed(&self.scales);
        let mn = _mm_cvtsi64_si128(mn as i64);
        let mut w = WPart {
            // Both groups of a 32-weight chunk have the chunk's sub-block scale.
            sv: core::array::from_fn(|c| _mm256_set1_epi16((sc >> (8 * c)) as u8 as i16)),
            d: read_f16(self.d),
            dmin: read_f16(self.dmin),
            // mn[g / 2] for g = 0..16 as i16.
            extra: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn)),
            first: (0.0, 0, 0.0, 0),
        };
        w.first = self.token_part(&w, y0);
        w
    }
    #[inline(always)]
    unsafe fn token_part(&self, w: &WPart, y: &BlockQ8K) -> (f32, i32, f32, i32) {
        // sum_g bsums[g] * mn[g / 2]: i16 x i16 products summed in pairs into i32 (exact).
        let b = kq::load32(&y.bsums);
        let mins = hsum_i32(_mm256_madd_epi16(b, w.extra));
        let ys = y.scale();
        (w.d * ys, 0, w.dmin * ys, mins)
    }
}

impl KRow for q6_k::BlockQ6K {
    #[inline(always)]
    unsafe fn weight_part(&self, y0: &BlockQ8K) -> WPart {
        let s = _mm_loadu_si128(self.scales.as_ptr() as *const __m128i);
        let mut scales = [0i16; 16];
        for (o, &b) in scales.iter_mut().zip(&self.scales) {
            *o = b as i8 as i16;
        }
        let mut w = WPart {
            sv: scale_vectors(&scales),
            d: read_f16(self.d),
            dmin: 0.0,
            extra: _mm256_cvtepi8_epi16(s),
            first: (0.0, 0, 0.0, 0),
        };
        w.first = self.token_part(&w, y0);
        w
    }
    #[inline(always)]
    unsafe fn token_part(&self, w: &WPart, y: &BlockQ8K) -> (f32, i32, f32, i32) {
        // 32 * sum_g scale[g] * bsums[g], wrapping like `q6_k::terms`.
        let b = kq::load32(&y.bsums);
        let off = hsum_i32(_mm256_madd_epi16(b, w.extra));
        (w.d * y.scale(), off.wrapping_mul(32), 0.0, 0)
    }
}

/// One K-quant weight row against `TT` activation rows, all of `nb` blocks; the
/// arithmetic of [`super::x86_kquant`] (and `crate::quant::q8_k::kquant_dot`) per token.
///
/// # Safety
/// AVX2/FMA; `w` and every slice in `a` have at least `nb` blocks.
#[inline(always)]
unsafe fn kquant_tile<B: KRow, const TT: usize>(
    w: &[B],
    a: [&[BlockQ8K]; TT],
    nb: usize,
) -> [f32; TT] {
    let mut acc = [_mm256_setzero_ps(); TT];
    let mut mins = [0f32; TT];
    for k in 0..nb {
        // SAFETY: k < nb <= w.len() and <= a[t].len().
        let x = w.get_unchecked(k);
        // The job reads its rows once, in order: one stream, fetched ahead.
        fetch_ahead(x);
        let u = x.unpack();
        let wp = x.weight_part(a[0].get_unchecked(k));
        for t in 0..TT {
            let y = a[t].get_unchecked(k);
            let (d, offset, dmin, mins_i) = if t == 0 {
                wp.first
            } else {
                x.token_part(&wp, y)
            };
            let mut isum = _mm256_setzero_si256();
            for (c, (&uc, &sc)) in u.iter().zip(&wp.sv).enumerate() {
                let p16 = _mm256_maddubs_epi16(uc, kq::load32(&y.qs[32 * c..]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, sc));
            }
            isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(offset, 0, 0, 0, 0, 0, 0, 0));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc[t]);
            mins[t] += dmin * mins_i as f32;
        }
    }
    core::array::from_fn(|t| kq::hsum_f32(acc[t]) - mins[t])
}

/// The tiled loop over a [`Job`] for one K-quant format.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn kquant_job<B: KRow + Pod>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    kquant_body::<B>(job, w, acts, out)
}

#[inline(always)]
unsafe fn kquant_body<B: KRow + Pod>(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) -> bool {
    let nb = job.row_bytes / core::mem::size_of::<B>();
    if nb * core::mem::size_of::<B>() != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8K>() != job.act_row_bytes
    {
        return false;
    }
    let n_tok = job.n_tok;
    let rb = job.row_bytes;
    let arb = job.act_row_bytes;
    let act = |t: usize| cast::<BlockQ8K>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    for (i, r) in job.rows.clone().enumerate() {
        let wr = cast::<B>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
        let o = &mut out[i * n_tok..(i + 1) * n_tok];
        let mut t = 0;
        while t + TK <= n_tok {
            let res = kquant_tile::<B, TK>(wr, core::array::from_fn(|j| act(t + j)), nb);
            o[t..t + TK].copy_from_slice(&res);
            t += TK;
        }
        while t < n_tok {
            o[t] = kquant_tile::<B, 1>(wr, [act(t)], nb)[0];
            t += 1;
        }
    }
    true
}
