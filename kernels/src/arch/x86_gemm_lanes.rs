//! Matrix-matrix tiles for Q8_0 and Q5_0 weights on AVX2 and AVX-512 VNNI: the
//! prompt-processing products of the block-32 formats (two or more tokens; one token
//! stays on the interleaved-row kernel of [`super::x86_rows`]).
//!
//! The loop runs over token tiles of up to [`T`] tokens. Everything that depends only on
//! the activations is computed once per token tile into tables on the stack (not once per
//! weight-row tile): the f32 activation scales and, for the integer sums, the activation
//! quants (Q8_0; biased to unsigned bytes for VNNI) or `-16 * sum(a)` per lane (Q5_0).
//! Then every tile of `RR` weight rows x `TT` tokens first writes the `nb x RR x TT` scale
//! products `d_w * d_a` into a third table, so that the block loop is, per (row, token)
//! pair, the integer sums (one `vpdpbusd` with VNNI), one conversion and one fused
//! multiply-add whose scale operand is a broadcast load; eight finished accumulators are
//! reduced together ([`reduce8`]).
//!
//! Integer sums, eight i32 lanes of four consecutive products per block, as
//! [`crate::quant::q8_0::lane_sums`]:
//! - Q8_0, VNNI: `vpdpbusd(-128 * sum(w), a + 128, w)`: the activation biased by 128 is an
//!   unsigned byte for every i8 (including -128), `vpdpbusd` sums u8 x i8 products in
//!   i32 without saturation, and `-128 * sum(w)` (once per weight block and tile) is
//!   exact, so the lane is the exact `sum(w * a)` for any bytes.
//! - Q8_0, AVX2: llama.cpp's sign trick `madd(maddubs(|w|, sign(a, w)), 1)`, exact for
//!   activations in -127..=127 (the one-token kernel's arithmetic; see [`super::x86_rows`]
//!   for -128).
//! - Q5_0: `sum(u * a) - 16 * sum(a)` with the unsigned quants `u` in 0..32 (the fifth bit
//!   added under a byte mask with VNNI): one `vpdpbusd` starting from `-16 * sum(a)`, or
//!   `madd(maddubs(u, a), 1)` (no i16 pair sum saturates) plus it; exact.
//!
//! Tiles, measured on Gemma 3 270M's shapes (AMD EPYC, Zen 4; 64 tokens): VNNI 2 rows x 8
//! tokens (beat 3 x 7 / 3 x 8 by about 15 % on Q8_0 and 6 % on Q5_0, and 4 x 5, 4 x 6,
//! 2 x 12, 1 x 8, and 512-bit token pairs); AVX2 1 x 8 (16 registers; beat 2 x 4 by
//! 13-20 %). On the Zen 5 VM, whose 512-bit `vpdpbusd` and FMA run at the 256-bit rate,
//! whole token tiles go two tokens per 512-bit vector ([`pair_tile`], 4 rows x 8 tokens;
//! the 256-bit tiles keep the token remainders): 64 tokens, Q5_0 2048 x 640 1.14-1.38 ->
//! 0.80-0.90 ms, Q8_0 256 x 640 0.125-0.153 -> 0.076-0.098 ms (2 rows: 0.86-1.10 and
//! 0.081-0.111); Gemma pp512 +17 % at -t 1 and -t 2.
//!
//! Floats: every pair computes `acc[l] = fma(d_w * d_a, lane[l], acc[l])` per block in
//! block order (`d_w * d_a` is exact in f32: two f16 significands) and reduces the eight
//! lanes with [`hsum8`]'s tree at the end, as `crate::quant::q8_0::lanes8_dot`. Only
//! loads, unpacking and the activation-side integer work are shared, so no bit changes.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::x86_f16::read_f16;
use core::mem::MaybeUninit;

use super::x86_legacy::{bits_to_mask, nibbles};
use super::Job;
use crate::blocks::{cast, Pod};
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q8_0::{hsum8, BlockQ8_0};

/// Most tokens per token tile (the tables' width, a multiple of 8).
const T: usize = 8;
/// Most blocks per row the stack tables hold (4096 columns, about 45 KiB of stack;
/// Gemma 3 270M's Q5_0/Q8_0 rows have 20). Longer rows return `false` and take the
/// caller's path.
const MAX_NB: usize = 128;
/// How many row tiles ahead a tile prefetches its weight rows (as `x86_rows::PF_TILES`).
const PF_TILES: usize = 5;

/// A block-32 weight format as the tiles see it.
pub(super) trait Lanes: Pod {
    /// Q8_0: signed weights against biased activations; Q5_0: unsigned weights against
    /// the activations as they are.
    const SIGNED: bool;
    /// The f16 scale.
    fn d(&self) -> [u8; 2];
    /// The 32 quants: i8 (Q8_0) or unsigned 0..32 (Q5_0), in weight order; `VNNI`
    /// allows AVX-512 BW/VL instructions.
    unsafe fn quants<const VNNI: bool>(&self) -> __m256i;
}

impl Lanes for BlockQ8_0 {
    const SIGNED: bool = true;
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn quants<const VNNI: bool>(&self) -> __m256i {
        // SAFETY: 32 readable bytes; unaligned load.
        _mm256_loadu_si256(self.qs.as_ptr() as *const __m256i)
    }
}

impl Lanes for BlockQ5_0 {
    const SIGNED: bool = false;
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    unsafe fn quants<const VNNI: bool>(&self) -> __m256i {
        // Byte j holds weight j; bit j of `qh` adds 16 to it.
        let nib = nibbles(&self.qs);
        let k = u32::from_le_bytes(self.qh);
        if VNNI {
            _mm256_mask_add_epi8(nib, k, nib, _mm256_set1_epi8(16))
        } else {
            _mm256_or_si256(
                nib,
                _mm256_and_si256(bits_to_mask(k), _mm256_set1_epi8(0x10)),
            )
        }
    }
}

/// What a token tile shares with every row tile, for blocks `0..nb`: `da` for all `T`
/// tokens (0 past the tile's tokens), `aux` for the tile's tokens (the rest is never
/// read).
#[repr(C, align(32))]
struct TokTables {
    /// Activation scales as f32.
    da: [[f32; T]; MAX_NB],
    /// Q8_0: the activation quants + 128 as unsigned bytes (VNNI) or as they are (AVX2);
    /// Q5_0: `-16 * sum(a)` per lane of four activation bytes.
    aux: [[__m256i; T]; MAX_NB],
}

/// Whole token tiles with AVX-512 VNNI go two tokens per 512-bit vector
/// ([`pair_tile`]): the activation operands of tokens `2p` and `2p + 1`, interleaved by
/// 32-bit lane, once per token tile and block (lane `2l` is token `2p`'s lane `l`, lane
/// `2l + 1` token `2p + 1`'s).
#[repr(C, align(64))]
struct PairTables {
    /// The activation operand of `vpdpbusd`: Q8_0 the biased quants, Q5_0 the quants.
    act: [[__m512i; T / 2]; MAX_NB],
    /// Q5_0: `-16 * sum(a)` per lane, where the accumulation starts (Q8_0: unused).
    start: [[__m512i; T / 2]; MAX_NB],
}

/// Two tokens' eight lanes interleaved (`a` in the even lanes, `b` in the odd ones).
#[inline(always)]
unsafe fn interleave(a: __m256i, b: __m256i) -> __m512i {
    let idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    _mm512_permutex2var_epi32(_mm512_castsi256_si512(a), idx, _mm512_castsi256_si512(b))
}

/// Each 32-bit lane of `w` twice (the weights against an interleaved token pair).
#[inline(always)]
unsafe fn twice(w: __m256i) -> __m512i {
    let idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    _mm512_permutexvar_epi32(idx, _mm512_castsi256_si512(w))
}

/// `RR` weight rows against the eight tokens of a whole token tile, AVX-512 VNNI, two
/// tokens per 512-bit vector: per (row, token pair, block) one `vpdpbusd`, one conversion
/// and one fused multiply-add whose scale operand is the pair's two products `d_w * d_a`
/// broadcast as one 64-bit word, i.e. [`tile`]'s arithmetic on each lane of each token
/// (same integers, same fused multiply-adds in block order, same reduction), with half
/// its instructions. On the Zen 5 VM 512-bit `vpdpbusd` and FMA run at the 256-bit ones'
/// rate; on cores that split them in two (Zen 4) this tile gains nothing (measured before:
/// see the module doc).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; every slice in `w` has at least `nb <= MAX_NB` blocks; `pt`
/// and `tab` hold blocks `0..nb` of the tile's eight tokens.
#[inline(always)]
unsafe fn pair_tile<B: Lanes, const RR: usize>(
    w: [&[B]; RR],
    tab: *const TokTables,
    pt: *const PairTables,
    dt: *mut [[[f32; T]; RR]; MAX_NB],
    nb: usize,
    prefetch: *const u8,
) -> [[f32; T]; RR] {
    scale_products::<B, RR, T>(&w, tab, dt, nb);
    // acc[p][r]: row r against tokens 2p, 2p + 1.
    let mut acc = [[_mm512_setzero_ps(); RR]; T / 2];
    let pf_step = RR * core::mem::size_of::<B>();
    for k in 0..nb {
        fetch_step(prefetch, k, pf_step);
        // SAFETY: k < nb <= w[r].len() and MAX_NB.
        let wq: [__m512i; RR] =
            core::array::from_fn(|r| twice(w[r].get_unchecked(k).quants::<true>()));
        // Q8_0: -128 * sum(w) per lane, exact (as `tile`).
        let winit: [__m512i; RR] = if B::SIGNED {
            core::array::from_fn(|r| {
                let s = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(),
                    _mm512_set1_epi8(0x80u8 as i8),
                    wq[r],
                );
                _mm512_sub_epi32(_mm512_setzero_si512(), s)
            })
        } else {
            [_mm512_setzero_si512(); RR]
        };
        let dk = core::ptr::addr_of!((*dt)[k]) as *const [f32; T];
        for (p, acc_p) in acc.iter_mut().enumerate() {
            // SAFETY: k < nb, p < T / 2: written for this token tile.
            let at = (*pt).act[k][p];
            for r in 0..RR {
                let g = if B::SIGNED {
                    _mm512_dpbusd_epi32(winit[r], at, wq[r])
                } else {
                    _mm512_dpbusd_epi32((*pt).start[k][p], wq[r], at)
                };
                // d_w * d_a of tokens 2p and 2p + 1 (adjacent in `dt`), in every lane pair.
                // SAFETY: 8 readable bytes inside `dt[k][r]` (2p + 2 <= T), written above.
                let dd = _mm_loadl_epi64((*dk.add(r)).as_ptr().add(2 * p) as *const __m128i);
                let d = _mm512_castsi512_ps(_mm512_broadcastq_epi64(dd));
                acc_p[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(g), acc_p[r]);
            }
        }
    }
    // Even lanes to the low half (token 2p), odd lanes to the high half (token 2p + 1).
    let split = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    let mut out = [[0.0f32; T]; RR];
    for r in 0..RR {
        let tok: [__m256; T] = core::array::from_fn(|t| {
            let v = _mm512_permutexvar_ps(split, acc[t / 2][r]);
            if t % 2 == 0 {
                _mm512_castps512_ps256(v)
            } else {
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
            }
        });
        // SAFETY: T == 8 writable f32.
        _mm256_storeu_ps(out[r].as_mut_ptr(), reduce8(tok));
    }
    out
}

/// Block step `k` of the row tile at `prefetch` (null: none) requested: the `pf_step`
/// bytes of the tile's rows' block `k` (consecutive steps cover the whole tile).
#[inline(always)]
unsafe fn fetch_step(prefetch: *const u8, k: usize, pf_step: usize) {
    if !prefetch.is_null() {
        let p = prefetch.wrapping_add(k * pf_step);
        let mut off = 0;
        while off < pf_step {
            // A prefetch never faults, even past the end of the weights.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
            off += 64;
        }
    }
}

/// `dt[k][r][t] = d_w(row r, block k) * d_a(token t, block k)` for `t < TT` (rounded up
/// to 8), which the tiles read as broadcast loads.
///
/// # Safety
/// AVX2/F16C; every slice in `w` has at least `nb <= MAX_NB` blocks and `tab.da[k]` is
/// written for every `k < nb`.
#[inline(always)]
unsafe fn scale_products<B: Lanes, const RR: usize, const TT: usize>(
    w: &[&[B]; RR],
    tab: *const TokTables,
    dt: *mut [[[f32; T]; RR]; MAX_NB],
    nb: usize,
) {
    for k in 0..nb {
        for (r, wr) in w.iter().enumerate() {
            // SAFETY: k < nb <= MAX_NB and <= w[r].len(); `da[k]` is initialized; `dt` is
            // written through a raw pointer before any read; c * 8 + 8 <= T.
            let h = wr.get_unchecked(k).d();
            let dw = _mm256_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(h) as i16));
            for c in 0..TT.div_ceil(8) {
                let da = core::ptr::addr_of!((*tab).da[k]) as *const f32;
                let p = core::ptr::addr_of_mut!((*dt)[k][r]) as *mut f32;
                _mm256_storeu_ps(
                    p.add(8 * c),
                    _mm256_mul_ps(dw, _mm256_loadu_ps(da.add(8 * c))),
                );
            }
        }
    }
}

/// `RR` weight rows against `TT` tokens (of a token tile whose tables are `tab`), all of
/// `nb` blocks; `dt` is scratch for the scale products.
///
/// # Safety
/// AVX2/FMA/F16C (and AVX-512 F/BW/VL/VNNI when `VNNI`); every slice in `w` and `a` has
/// at least `nb <= MAX_NB` blocks, and `tab` holds blocks `0..nb` of tokens `0..TT`.
#[inline(always)]
unsafe fn tile<B: Lanes, const VNNI: bool, const RR: usize, const TT: usize>(
    w: [&[B]; RR],
    a: [&[BlockQ8_0]; TT],
    tab: *const TokTables,
    dt: *mut [[[f32; T]; RR]; MAX_NB],
    nb: usize,
    prefetch: *const u8,
) -> [[f32; TT]; RR] {
    // Scale products first, so that the block loop reads them as broadcast loads.
    scale_products::<B, RR, TT>(&w, tab, dt, nb);
    let mut acc = [[_mm256_setzero_ps(); TT]; RR];
    let pf_step = RR * core::mem::size_of::<B>();
    for k in 0..nb {
        fetch_step(prefetch, k, pf_step);
        // SAFETY: k < nb <= w[r].len(), a[t].len() and MAX_NB.
        let wq: [__m256i; RR] = core::array::from_fn(|r| w[r].get_unchecked(k).quants::<VNNI>());
        // AVX2 Q8_0: |w| for `maddubs` (the sign goes to the activation).
        let wabs: [__m256i; RR] = if B::SIGNED && !VNNI {
            core::array::from_fn(|r| _mm256_abs_epi8(wq[r]))
        } else {
            [_mm256_setzero_si256(); RR]
        };
        let ones = _mm256_set1_epi16(1);
        let aux = core::ptr::addr_of!((*tab).aux[k]) as *const __m256i;
        let dk = core::ptr::addr_of!((*dt)[k]) as *const [f32; T];
        // Q8_0: -128 * sum(w) per lane, exact.
        let winit: [__m256i; RR] = if B::SIGNED && VNNI {
            core::array::from_fn(|r| {
                let s = _mm256_dpbusd_epi32(
                    _mm256_setzero_si256(),
                    _mm256_set1_epi8(0x80u8 as i8),
                    wq[r],
                );
                _mm256_sub_epi32(_mm256_setzero_si256(), s)
            })
        } else {
            [_mm256_setzero_si256(); RR]
        };
        for t in 0..TT {
            // SAFETY: t < TT <= the tile's tokens, whose `aux` entries are initialized.
            let at = if B::SIGNED {
                *aux.add(t)
            } else {
                _mm256_loadu_si256(a[t].get_unchecked(k).qs.as_ptr() as *const __m256i)
            };
            for r in 0..RR {
                let g = if VNNI {
                    if B::SIGNED {
                        _mm256_dpbusd_epi32(winit[r], at, wq[r])
                    } else {
                        _mm256_dpbusd_epi32(*aux.add(t), wq[r], at)
                    }
                } else if B::SIGNED {
                    // llama.cpp's sign trick: exact for activations in -127..=127 (see
                    // `x86_rows`), as the one-token kernel.
                    let p16 = _mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(at, wq[r]));
                    _mm256_madd_epi16(p16, ones)
                } else {
                    // u in 0..32: no i16 pair sum saturates.
                    let p16 = _mm256_maddubs_epi16(wq[r], at);
                    _mm256_add_epi32(_mm256_madd_epi16(p16, ones), *aux.add(t))
                };
                // SAFETY: written above for this k and r.
                let d = _mm256_set1_ps((*dk.add(r))[t]);
                acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(g), acc[r][t]);
            }
        }
    }
    let mut out = [[0.0f32; TT]; RR];
    for r in 0..RR {
        if TT == 8 {
            let v = reduce8(core::array::from_fn(|t| acc[r][t]));
            // SAFETY: TT == 8 writable f32.
            _mm256_storeu_ps(out[r].as_mut_ptr(), v);
            continue;
        }
        for t in 0..TT {
            let mut l = [0.0f32; 8];
            // SAFETY: 8 writable f32.
            _mm256_storeu_ps(l.as_mut_ptr(), acc[r][t]);
            out[r][t] = hsum8(l);
        }
    }
    out
}

/// Eight accumulators reduced at once, lane `t` of the result being [`hsum8`] of `a[t]`
/// with its exact order: `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))` (the operands
/// of each addition may be swapped: IEEE addition is commutative).
#[inline(always)]
unsafe fn reduce8(a: [__m256; 8]) -> __m256 {
    // s[i] = [a(2i) lanes 0..4 + 4..8 | a(2i+1) lanes 0..4 + 4..8]: v0..v3 of two accumulators.
    let s: [__m256; 4] = core::array::from_fn(|i| {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(x, y),
            _mm256_permute2f128_ps::<0x31>(x, y),
        )
    });
    // w[j] = [v0 + v2, v1 + v3 of a(4j), of a(4j + 2) | of a(4j + 1), of a(4j + 3)].
    let w: [__m256; 2] = core::array::from_fn(|j| {
        let (x, y) = (s[2 * j], s[2 * j + 1]);
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    });
    // [a0, a2, a4, a6 | a1, a3, a5, a7]: (v0 + v2) + (v1 + v3).
    let r = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(w[0], w[1]),
        _mm256_shuffle_ps::<0b11_01_11_01>(w[0], w[1]),
    );
    _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// AVX-512 VNNI (`vpdpbusd` on 256-bit vectors, byte masks for Q5_0's fifth bit): `R`
/// rows x `TT` tokens per tile.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn job_vnni<B: Lanes, const R: usize, const TT: usize>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    body::<B, true, R, TT>(job, w, acts, out)
}

/// AVX2 (`maddubs` + `madd`; 16 vector registers): `R` rows x `TT` tokens per tile.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn job_avx2<B: Lanes, const R: usize, const TT: usize>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    body::<B, false, R, TT>(job, w, acts, out)
}

#[inline(always)]
unsafe fn body<B: Lanes, const VNNI: bool, const R: usize, const TT: usize>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let nb = job.row_bytes / core::mem::size_of::<B>();
    if nb * core::mem::size_of::<B>() != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8_0>() != job.act_row_bytes
        || nb > MAX_NB
        || TT > T
    {
        return false;
    }
    let n_tok = job.n_tok;
    let rb = job.row_bytes;
    let arb = job.act_row_bytes;
    let row = |r: usize| cast::<B>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
    let act = |t: usize| cast::<BlockQ8_0>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    let start = job.rows.start;
    let nr = job.rows.len();

    // Uninitialized scratch, accessed only through raw pointers: each entry is written
    // before it is read.
    let mut tab_m = MaybeUninit::<TokTables>::uninit();
    let tab = tab_m.as_mut_ptr();
    let mut pair_m = MaybeUninit::<PairTables>::uninit();
    let pt = pair_m.as_mut_ptr();
    let mut dt_m = MaybeUninit::<[[[f32; T]; R]; MAX_NB]>::uninit();
    let dt = dt_m.as_mut_ptr();
    // The one-row tiles' products, in the same (larger) buffer.
    let dt1 = dt as *mut [[[f32; T]; 1]; MAX_NB];

    let mut t0 = 0;
    while t0 < n_tok {
        let tt = (n_tok - t0).min(TT);
        // Token tables for blocks 0..nb and tokens t0..t0 + tt.
        for t in 0..T {
            if t >= tt {
                for k in 0..nb {
                    // SAFETY: k < nb <= MAX_NB, t < T: inside the table.
                    (*tab).da[k][t] = 0.0;
                }
                continue;
            }
            let y = act(t0 + t);
            for k in 0..nb {
                // SAFETY: k < nb = y.len() (checked above) and <= MAX_NB, t < T; writes
                // into the tables through raw pointers.
                let b = y.get_unchecked(k);
                let q = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                let aux = if B::SIGNED {
                    if VNNI {
                        _mm256_xor_si256(q, _mm256_set1_epi8(0x80u8 as i8))
                    } else {
                        q
                    }
                } else {
                    // 16 * sum(a) per four bytes (exact), negated.
                    let s = if VNNI {
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(16), q)
                    } else {
                        let p16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
                        _mm256_slli_epi32::<4>(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
                    };
                    _mm256_sub_epi32(_mm256_setzero_si256(), s)
                };
                (*tab).aux[k][t] = aux;
                (*tab).da[k][t] = read_f16(b.d);
            }
        }
        // A whole token tile with VNNI: the token pairs' interleaved operands.
        let pairs = VNNI && tt == T;
        if pairs {
            for k in 0..nb {
                for p in 0..T / 2 {
                    // SAFETY: k < nb <= MAX_NB; tokens 2p, 2p + 1 < tt were written above
                    // (`aux`), and their blocks exist (`act` rows of nb blocks).
                    let (x, y) = (act(t0 + 2 * p), act(t0 + 2 * p + 1));
                    let q = |b: &BlockQ8_0| _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                    let (ax, ay) = ((*tab).aux[k][2 * p], (*tab).aux[k][2 * p + 1]);
                    if B::SIGNED {
                        (*pt).act[k][p] = interleave(ax, ay);
                    } else {
                        (*pt).act[k][p] = interleave(q(x.get_unchecked(k)), q(y.get_unchecked(k)));
                        (*pt).start[k][p] = interleave(ax, ay);
                    }
                }
            }
        }
        let mut i = 0;
        while i < nr {
            let rr = if i + R <= nr { R } else { 1 };
            let next = if rr == R {
                w.as_ptr().wrapping_add((start + i + PF_TILES * R) * rb)
            } else {
                core::ptr::null()
            };
            macro_rules! run {
                ($r:expr, $t:expr, $dt:expr) => {{
                    let res = tile::<B, VNNI, $r, $t>(
                        core::array::from_fn(|j| row(start + i + j)),
                        core::array::from_fn(|j| act(t0 + j)),
                        tab,
                        $dt,
                        nb,
                        next,
                    );
                    for (r, v) in res.iter().enumerate() {
                        out[(i + r) * n_tok + t0..][..$t].copy_from_slice(v);
                    }
                }};
            }
            if pairs && rr == R {
                let res = pair_tile::<B, R>(
                    core::array::from_fn(|j| row(start + i + j)),
                    tab,
                    pt,
                    dt,
                    nb,
                    next,
                );
                for (r, v) in res.iter().enumerate() {
                    out[(i + r) * n_tok + t0..][..T].copy_from_slice(v);
                }
                i += rr;
                continue;
            }
            macro_rules! arms {
                ($($t:literal)*) => {
                    match (rr == R, tt) {
                        $((true, $t) => run!(R, $t, dt),)*
                        $((false, $t) => run!(1, $t, dt1),)*
                        _ => {}
                    }
                };
            }
            arms!(1 2 3 4 5 6 7 8);
            i += rr;
        }
        t0 += tt;
    }
    true
}
