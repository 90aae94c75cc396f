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
//! A row tile's blocks are unpacked once ([`Unpacked`]: the quants as unsigned bytes,
//! each step's scale words, the `bsums` factors and both f16 scales as f32) into a stack
//! table that every token tile of the row tile then reads, instead of unpacking every
//! block again for each four tokens; rows longer than [`MAX_NB`] blocks, and jobs of at
//! most one token tile, unpack per token tile as before. With VNNI the epilogue of a block (fold, offset, conversion,
//! multiply-add) runs on two tokens per 512-bit vector. Qwen3.5-0.8B's shapes, 64 tokens
//! (`tests/matvec_perf.rs`, Intel Xeon VM, noisy: +-15 %), VNNI: Q6_K 6144x1024 10.3 ->
//! 7.3-8.9 ms, Q4_K 3584x1024 6.4 -> 3.5, Q6_K 1024x3584 5.5 -> 3.7; AVX2: Q6_K 6144x1024
//! 12.8-18.2 -> 8.8-9.8, Q4_K 7.2 -> 5.2-6.3, Q6_K 1024x3584 7.3-7.7 -> 5.1-6.6.
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
use core::marker::PhantomData;
use core::mem::MaybeUninit;

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

/// Most blocks per row the unpacked row tile holds (8192 columns; 4 rows take 88 KiB of
/// stack). Longer rows unpack per token tile.
const MAX_NB: usize = 32;

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

/// What a tile reads of one block of one weight row: the block itself (unpacked as it
/// is read) or its [`Unpacked`] copy.
trait TileBlock {
    /// Whether the format has minimums (Q4_K) rather than an offset (Q6_K).
    const MINS: bool;
    /// [`Gemm::chunk`] (AVX2).
    unsafe fn chunk(&self, c: usize) -> __m256i;
    /// [`K512::pair`] (VNNI).
    unsafe fn pair(&self, k: usize) -> __m512i;
    /// [`K512::scale_src`] (VNNI), which [`TileBlock::step_scales`] takes.
    unsafe fn scale_src(&self) -> __m512i;
    /// Step `k`'s scale words ([`k5::permute_scales`] of `src`, [`TileBlock::scale_src`]).
    unsafe fn step_scales(&self, src: __m512i, k: usize) -> __m512i;
    /// [`Gemm::scale_words`] (AVX2), which [`TileBlock::chunk_scales`] takes.
    unsafe fn scale_words(&self) -> __m256i;
    /// Chunk `c`'s `vpmaddwd` factors (`sw`, [`TileBlock::scale_words`], under
    /// [`CHUNK_SCALE`]`[c]`).
    unsafe fn chunk_scales(&self, sw: __m256i, c: usize) -> __m256i;
    /// [`Gemm::bsum_factors`] with i32 word `j` of each 128-bit half broadcast over
    /// its half (vector `j`): the factors of the transposed `bsums` word `j`.
    unsafe fn bsum_quads(&self) -> [__m256i; 4];
    unsafe fn d(&self) -> f32;
    unsafe fn dmin(&self) -> f32;
}

impl<B: Gemm + K512> TileBlock for B {
    const MINS: bool = <B as Gemm>::MINS;
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> __m256i {
        Gemm::chunk(self, c)
    }
    #[inline(always)]
    unsafe fn pair(&self, k: usize) -> __m512i {
        K512::pair(self, k)
    }
    #[inline(always)]
    unsafe fn scale_src(&self) -> __m512i {
        K512::scale_src(self)
    }
    #[inline(always)]
    unsafe fn step_scales(&self, src: __m512i, k: usize) -> __m512i {
        k5::permute_scales(B::SCALE_IDX, src, k)
    }
    #[inline(always)]
    unsafe fn scale_words(&self) -> __m256i {
        Gemm::scale_words(self)
    }
    #[inline(always)]
    unsafe fn chunk_scales(&self, sw: __m256i, c: usize) -> __m256i {
        _mm256_shuffle_epi8(sw, load32(&CHUNK_SCALE[c]))
    }
    #[inline(always)]
    unsafe fn bsum_quads(&self) -> [__m256i; 4] {
        let f = Gemm::bsum_factors(self);
        [
            _mm256_shuffle_epi32::<0x00>(f),
            _mm256_shuffle_epi32::<0x55>(f),
            _mm256_shuffle_epi32::<0xAA>(f),
            _mm256_shuffle_epi32::<0xFF>(f),
        ]
    }
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        Gemm::d(self)
    }
    #[inline(always)]
    unsafe fn dmin(&self) -> f32 {
        Gemm::dmin(self)
    }
}

/// One block of a `B` row as the tiles read it, unpacked once per row tile: every
/// method returns what `B`'s own gives (the bytes are `B`'s results, stored).
#[repr(C, align(64))]
struct Unpacked<B> {
    /// The quants as unsigned bytes, chunk `c` at `32c..32c + 32` (so pair `k` is the
    /// 64 bytes at `64k`).
    u: [u8; 256],
    /// VNNI: step `k`'s scale words at `64k`; AVX2: chunk `c`'s at `32c`.
    scales: [u8; 256],
    /// [`TileBlock::bsum_quads`], 32 bytes each.
    bsum_quads: [u8; 128],
    d: f32,
    dmin: f32,
    _format: PhantomData<B>,
}

impl<B: Gemm + K512> Unpacked<B> {
    /// Writes every field of `*out` from `x` (AVX-512 BW/VL allowed when `VNNI`).
    ///
    /// # Safety
    /// The tiles' CPU features; `out` is valid for writes and 64-byte aligned.
    #[inline(always)]
    unsafe fn write<const VNNI: bool>(x: &B, out: *mut Self) {
        let u = core::ptr::addr_of_mut!((*out).u) as *mut u8;
        let sc = core::ptr::addr_of_mut!((*out).scales) as *mut u8;
        if VNNI {
            let src = K512::scale_src(x);
            for k in 0..4 {
                _mm512_store_si512(u.add(64 * k) as *mut _, K512::pair(x, k));
                _mm512_store_si512(sc.add(64 * k) as *mut _, x.step_scales(src, k));
            }
        } else {
            let sw = Gemm::scale_words(x);
            for c in 0..8 {
                _mm256_store_si256(u.add(32 * c) as *mut __m256i, Gemm::chunk(x, c));
                _mm256_store_si256(sc.add(32 * c) as *mut __m256i, x.chunk_scales(sw, c));
            }
        }
        let f = core::ptr::addr_of_mut!((*out).bsum_quads) as *mut __m256i;
        for (j, q) in x.bsum_quads().into_iter().enumerate() {
            _mm256_store_si256(f.add(j), q);
        }
        core::ptr::addr_of_mut!((*out).d).write(Gemm::d(x));
        core::ptr::addr_of_mut!((*out).dmin).write(Gemm::dmin(x));
    }
}

impl<B: Gemm + K512> TileBlock for Unpacked<B> {
    const MINS: bool = <B as Gemm>::MINS;
    #[inline(always)]
    unsafe fn chunk(&self, c: usize) -> __m256i {
        _mm256_load_si256(self.u.as_ptr().add(32 * c) as *const __m256i)
    }
    #[inline(always)]
    unsafe fn pair(&self, k: usize) -> __m512i {
        _mm512_load_si512(self.u.as_ptr().add(64 * k) as *const _)
    }
    /// Unused: the step scales are stored.
    #[inline(always)]
    unsafe fn scale_src(&self) -> __m512i {
        core::mem::zeroed()
    }
    #[inline(always)]
    unsafe fn step_scales(&self, _: __m512i, k: usize) -> __m512i {
        _mm512_load_si512(self.scales.as_ptr().add(64 * k) as *const _)
    }
    /// Unused: the chunk scales are stored.
    #[inline(always)]
    unsafe fn scale_words(&self) -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn chunk_scales(&self, _: __m256i, c: usize) -> __m256i {
        _mm256_load_si256(self.scales.as_ptr().add(32 * c) as *const __m256i)
    }
    #[inline(always)]
    unsafe fn bsum_quads(&self) -> [__m256i; 4] {
        let p = self.bsum_quads.as_ptr() as *const __m256i;
        core::array::from_fn(|j| _mm256_load_si256(p.add(j)))
    }
    #[inline(always)]
    unsafe fn d(&self) -> f32 {
        self.d
    }
    #[inline(always)]
    unsafe fn dmin(&self) -> f32 {
        self.dmin
    }
}

/// `RR` weight rows against `TT <= 4` activation rows, all of `nb` blocks.
///
/// # Safety
/// AVX2/FMA (and AVX-512 VNNI/VL when `VNNI`); every slice in `w` and `a` has at least
/// `nb` blocks.
#[inline(always)]
unsafe fn tile<B: TileBlock, const VNNI: bool, const RR: usize, const TT: usize>(
    w: [&[B]; RR],
    a: [&[BlockQ8K]; TT],
    nb: usize,
    prefetch: *const u8,
) -> [[f32; TT]; RR] {
    let mut acc = [[_mm256_setzero_ps(); TT]; RR];
    // VNNI: tokens 2p, 2p + 1 in one vector (entries p < TT / 2 used).
    // (`zeroed`, not `_mm512_setzero_ps`: the AVX2 instance must not call AVX-512 code.)
    let mut acc2: [[__m512; TT]; RR] = core::mem::zeroed();
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

        // Exact integer lanes of every (row, token) pair: eight i32 per pair (AVX2), or
        // (VNNI) sixteen, one 256-bit half per chunk of a pair of chunks.
        let mut isum = [[_mm256_setzero_si256(); TT]; RR];
        let mut wide: [[__m512i; TT]; RR] = core::mem::zeroed();
        if VNNI {
            let src: [__m512i; RR] = core::array::from_fn(|r| x[r].scale_src());
            for k in 0..4 {
                let u: [__m512i; RR] = core::array::from_fn(|r| x[r].pair(k));
                let s: [__m512i; RR] = core::array::from_fn(|r| x[r].step_scales(src[r], k));
                for t in 0..TT {
                    for r in 0..RR {
                        wide[r][t] = k5::step(wide[r][t], u[r], s[r], y[t], k);
                    }
                }
            }
        }
        let sw: [__m256i; RR] = core::array::from_fn(|r| x[r].scale_words());
        for c in (0..8).filter(|_| !VNNI) {
            let u: [__m256i; RR] = core::array::from_fn(|r| x[r].chunk(c));
            let s: [__m256i; RR] = core::array::from_fn(|r| x[r].chunk_scales(sw[r], c));
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
            let f = x[r].bsum_quads();
            let m = _mm256_add_epi32(
                _mm256_add_epi32(
                    _mm256_madd_epi16(tb[0], f[0]),
                    _mm256_madd_epi16(tb[1], f[1]),
                ),
                _mm256_add_epi32(
                    _mm256_madd_epi16(tb[2], f[2]),
                    _mm256_madd_epi16(tb[3], f[3]),
                ),
            );
            let m = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
            let ds = _mm_mul_ps(_mm_set1_ps(x[r].d()), ys);
            // Q6_K: the offset 32 * sum_g scale[g] * bsums[g] (wrapping), off lane 0.
            let off = if B::MINS {
                _mm_setzero_si128()
            } else {
                _mm_slli_epi32::<5>(m)
            };
            // VNNI: tokens 2p, 2p + 1 side by side, one per 256-bit half (the folded
            // lanes of token 2p in the low half), so that the offset, the conversion
            // and the multiply-add take one instruction for two tokens.
            let paired = if VNNI { TT / 2 } else { 0 };
            for p in 0..paired {
                let (a, b) = (wide[r][2 * p], wide[r][2 * p + 1]);
                let mut l = _mm512_add_epi32(
                    _mm512_shuffle_i64x2::<0x44>(a, b),
                    _mm512_shuffle_i64x2::<0xEE>(a, b),
                );
                // Token 2p in lanes 0..8, 2p + 1 in 8..16.
                let pick = _mm512_inserti64x4::<1>(
                    _mm512_set1_epi32(2 * p as i32),
                    _mm256_set1_epi32(2 * p as i32 + 1),
                );
                if !B::MINS {
                    let o =
                        _mm512_maskz_permutexvar_epi32(0x0101, pick, _mm512_castsi128_si512(off));
                    l = _mm512_sub_epi32(l, o);
                }
                let d = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(ds));
                acc2[r][p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(l), acc2[r][p]);
            }
            let mut dsa = [0f32; 4];
            let mut offa = [0i32; 4];
            // SAFETY: four writable f32 and i32.
            _mm_storeu_ps(dsa.as_mut_ptr(), ds);
            _mm_storeu_si128(offa.as_mut_ptr() as *mut __m128i, off);
            for t in 2 * paired..TT {
                let mut is = if VNNI {
                    k5::fold(wide[r][t])
                } else {
                    isum[r][t]
                };
                if !B::MINS {
                    is = _mm256_sub_epi32(is, _mm256_setr_epi32(offa[t], 0, 0, 0, 0, 0, 0, 0));
                }
                acc[r][t] =
                    _mm256_fmadd_ps(_mm256_set1_ps(dsa[t]), _mm256_cvtepi32_ps(is), acc[r][t]);
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
            let a = if VNNI && t < TT / 2 * 2 {
                let v = acc2[r][t / 2];
                if t % 2 == 0 {
                    _mm512_castps512_ps256(v)
                } else {
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
                }
            } else {
                acc[r][t]
            };
            out[r][t] = kq::hsum_f32(a) - m[t];
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
    let rb = job.row_bytes;
    let row = |r: usize| cast::<B>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
    let start = job.rows.start;
    let nr = job.rows.len();
    let mut table = MaybeUninit::<[[Unpacked<B>; MAX_NB]; R]>::uninit();
    let base = table.as_mut_ptr() as *mut Unpacked<B>;
    let mut i = 0;
    while i < nr {
        let rr = if i + R <= nr { R } else { 1 };
        // A row tile fetches the rows of a later one while it reads its own.
        let next = if rr == R {
            w.as_ptr().wrapping_add((start + i + PF_TILES * R) * rb)
        } else {
            core::ptr::null()
        };
        // With one token tile (a few sequences decoded together) the table would be read
        // once: unpacking into it would only add its stores and loads.
        if nb <= MAX_NB && job.n_tok > T {
            let pf_step = R * core::mem::size_of::<B>();
            for k in 0..nb {
                if !next.is_null() {
                    let p = next.wrapping_add(k * pf_step);
                    for off in (0..pf_step).step_by(64) {
                        // A prefetch never faults, even past the end of the weights.
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
                    }
                }
                for j in 0..rr {
                    // SAFETY: k < nb = the row's blocks; j < R, k < MAX_NB: inside
                    // `table`, whose entries are 64-byte aligned.
                    Unpacked::write::<VNNI>(
                        row(start + i + j).get_unchecked(k),
                        base.add(j * MAX_NB + k),
                    );
                }
            }
            // SAFETY: entries 0..nb of rows 0..rr were all written just above.
            let unpacked = |j: usize| core::slice::from_raw_parts(base.add(j * MAX_NB), nb);
            if rr == R {
                let rows: [&[Unpacked<B>]; R] = core::array::from_fn(unpacked);
                token_tiles::<_, VNNI, R>(rows, job, acts, out, i, core::ptr::null());
            } else {
                token_tiles::<_, VNNI, 1>([unpacked(0)], job, acts, out, i, core::ptr::null());
            }
        } else if rr == R {
            let rows: [&[B]; R] = core::array::from_fn(|j| row(start + i + j));
            token_tiles::<_, VNNI, R>(rows, job, acts, out, i, next);
        } else {
            token_tiles::<_, VNNI, 1>([row(start + i)], job, acts, out, i, next);
        }
        i += rr;
    }
    true
}

/// Every token tile of one row tile (`rows`: rows `i..i + RR` of the job's output), the
/// first one prefetching `prefetch` (null: none) as it goes.
///
/// # Safety
/// As [`tile`]: every row has the job's blocks.
#[inline(always)]
unsafe fn token_tiles<X: TileBlock, const VNNI: bool, const RR: usize>(
    rows: [&[X]; RR],
    job: &Job,
    acts: &[u8],
    out: &mut [f32],
    i: usize,
    prefetch: *const u8,
) {
    let (n_tok, arb) = (job.n_tok, job.act_row_bytes);
    let nb = arb / core::mem::size_of::<BlockQ8K>();
    let act = |t: usize| cast::<BlockQ8K>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    let mut t = 0;
    while t < n_tok {
        let tt = (n_tok - t).min(T);
        // The other token tiles find this tile's rows in cache.
        let pf = if t == 0 { prefetch } else { core::ptr::null() };
        macro_rules! run {
            ($t:expr) => {{
                let res =
                    tile::<X, VNNI, RR, $t>(rows, core::array::from_fn(|j| act(t + j)), nb, pf);
                for (r, v) in res.iter().enumerate() {
                    out[(i + r) * n_tok + t..][..$t].copy_from_slice(v);
                }
            }};
        }
        match tt {
            4 => run!(4),
            3 => run!(3),
            2 => run!(2),
            _ => run!(1),
        }
        t += tt;
    }
}
