//! Q5_0 over the repacked [`crate::repack::Layout::Q5_0x4s`] layout with AVX-512 VNNI:
//! the generation product of Gemma's q/k/gate/up matrices, which the plain 256-bit kernel
//! ([`super::x86_rows`]) runs compute-bound (about 14 instructions per row and block,
//! most of them unpacking).
//!
//! The layout puts a group's four rows side by side by lanes: chunk `k` of a group-block
//! holds bytes `4k..4k + 4` of rows 0..4, whose low nibbles are each row's weights of
//! x86 lane `k` (weights `4k..4k + 4`) and whose high nibbles are its lane `4 + k`. So
//! the whole 64-byte nibble part is one 512-bit vector whose 32-bit element `(k, r)`
//! (128-bit lane `k`, element `r`) is row `r`'s lane `k` (low nibbles) or `4 + k` (high
//! nibbles), and one `vpdpbusd` against the activation lane `k` (or `4 + k`) broadcast
//! over each 128-bit lane gives all four rows' integer lanes at once: per group-block and
//! token two `vpdpbusd`, two conversions and two fused multiply-adds for 128 weights,
//! and the unpacking once for four rows (the fifth bits are bit-sliced: one shift per
//! 128-bit lane and a byte-sign mask give the 64 mask bits of each half).
//!
//! The numbers are `x86_rows`' for every (row, token): each element accumulates
//! `fma(d_w * d_a, lane, acc)` for its row and lane in block order, with the same exact
//! integer lane (`sum(u * a) - 16 * sum(a)`, the unsigned quants `u` in 0..32) and the same
//! product `d_w * d_a`; the eight lanes of a row are then reduced by [`hsum8`]'s tree.
//! Several tokens (prompts) take the plain kernels on the group's rows unpacked to a stack
//! buffer, which are the same numbers by construction.
//!
//! # Safety (for every `unsafe fn` here)
//! Callers run on a CPU with AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; memory is read
//! only through slices whose lengths the callers checked ([`PackedJob`]).
#![allow(unsafe_code)]

use core::arch::x86_64::*;
use core::ops::Range;

use super::table::KernelTable;
use super::x86_f16::read_f16;
use super::x86_legacy::load32;
use super::x86_repack::split_groups;
use super::x86_stream::fetch_ahead;
use crate::blocks::{cast, cast_mut};
use crate::quant::q5_0::{BlockQ5_0, BLOCK_BYTES};
use crate::quant::q8_0::{self, hsum8, BlockQ8_0};
use crate::repack::BlockQ5_0x4s;
use crate::GgmlType;

/// Rows per group.
const G: usize = 4;
/// Stack bytes for a prompt's unpacked plain rows (a chunk of groups per call of the
/// plain tiles; 32, 64, 128 and 256 KiB measured within the noise of each other).
const UNPACKED: usize = 64 * 1024;

/// One token's block as the transposed product needs it: activation lane `k` (`lo`) and
/// `4 + k` (`hi`) broadcast over 128-bit lane `k`, where each integer sum starts
/// (`-16 * sum(a)` of that lane), and the scale.
struct Act {
    lo: __m512i,
    hi: __m512i,
    start_lo: __m512i,
    start_hi: __m512i,
    d: __m512,
}

#[inline(always)]
unsafe fn act(y: &BlockQ8_0) -> Act {
    let a = _mm512_castsi256_si512(load32(&y.qs));
    let lo = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        a,
    );
    let hi = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
        a,
    );
    // 16 * (sum of a lane's four activations), exact, negated.
    let start = |v: __m512i| {
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(16), v);
        _mm512_sub_epi32(_mm512_setzero_si512(), s)
    };
    Act {
        lo,
        hi,
        start_lo: start(lo),
        start_hi: start(hi),
        d: _mm512_set1_ps(read_f16(y.d)),
    }
}

/// One group's rows against one token, all of `nb` group-blocks: `out[r]` for row `r`.
///
/// # Safety
/// The ISA above; `g` and `a` have at least `nb` blocks.
#[inline(always)]
unsafe fn group(g: &[BlockQ5_0x4s], a: &[BlockQ8_0], nb: usize) -> [f32; G] {
    let sh = fifth_bit_shifts();
    let m4 = _mm512_set1_epi8(0x0f);
    let sixteen = _mm512_set1_epi8(16);
    let (mut acc_lo, mut acc_hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for k in 0..nb {
        // SAFETY: k < nb <= g.len(), a.len().
        let b = g.get_unchecked(k);
        fetch_ahead(b);
        let y = act(a.get_unchecked(k));
        let qs = _mm512_loadu_si512(b.qs.as_ptr() as *const _);
        let lo = _mm512_and_si512(qs, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(qs), m4);
        let (k_lo, k_hi) = fifth_bits(b, sh);
        let u_lo = _mm512_mask_add_epi8(lo, k_lo, lo, sixteen);
        let u_hi = _mm512_mask_add_epi8(hi, k_hi, hi, sixteen);
        // The four rows' scales in every 128-bit lane (element r: row r).
        let dw = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_loadl_epi64(
            b.d.as_ptr() as *const __m128i
        )));
        // d_w * d_a is exact in f32 (two f16 significands), as in the reference.
        let d = _mm512_mul_ps(dw, y.d);
        let g_lo = _mm512_dpbusd_epi32(y.start_lo, u_lo, y.lo);
        let g_hi = _mm512_dpbusd_epi32(y.start_hi, u_hi, y.hi);
        acc_lo = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(g_lo), acc_lo);
        acc_hi = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(g_hi), acc_hi);
    }
    let (mut lo, mut hi) = ([0.0f32; 16], [0.0f32; 16]);
    // SAFETY: 16 writable f32 each.
    _mm512_storeu_ps(lo.as_mut_ptr(), acc_lo);
    _mm512_storeu_ps(hi.as_mut_ptr(), acc_hi);
    // Row r's lane l: element (l, r) of the low half's sums for l < 4, (l - 4, r) of the
    // high half's after.
    core::array::from_fn(|r| {
        hsum8(core::array::from_fn(|l| {
            if l < 4 {
                lo[4 * l + r]
            } else {
                hi[4 * (l - 4) + r]
            }
        }))
    })
}

/// Rows `rows` (all inside whole groups) of a Q5_0x4s tensor against one token.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn one_token(w: &[u8], rb: usize, rows: Range<usize>, a: &[BlockQ8_0], out: &mut [f32]) {
    let nb = rb / BLOCK_BYTES;
    for gi in rows.start / G..rows.end.div_ceil(G) {
        let Some(gw) = cast::<BlockQ5_0x4s>(&w[gi * G * rb..(gi + 1) * G * rb]) else {
            return;
        };
        if gw.len() != nb || a.len() < nb {
            return;
        }
        let res = group(gw, a, nb);
        for (r, v) in res.iter().enumerate() {
            let row = G * gi + r;
            if rows.contains(&row) {
                out[row - rows.start] = *v;
            }
        }
    }
}

/// Product over a Q5_0x4s tensor (`w`: all of its rows) for `rows` and every token in
/// `acts`, or `false` (nothing written) when the shapes do not fit. One token runs the
/// transposed product; several run `table`'s plain kernels on the groups unpacked to the
/// stack (or, for rows too long to unpack four at a stack buffer, the one-token product
/// per token); the plain tail rows (`rows % 4`) take `table`'s plain kernel.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI, and `table` is a table for it.
pub(super) unsafe fn matmul(
    table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let shape = (BLOCK_BYTES, q8_0::BLOCK_BYTES, G);
    split_groups(
        table,
        GgmlType::Q5_0,
        shape,
        w,
        row_bytes,
        rows,
        acts,
        out,
        |job, grouped, head| {
            let (n_tok, arb) = (job.n_tok, job.arb);
            let chunk_rows = UNPACKED / row_bytes / G * G;
            if n_tok == 1 {
                let Some(a) = cast::<BlockQ8_0>(&acts[..arb]) else {
                    return false;
                };
                // SAFETY: the caller's ISA; `PackedJob` checked that the groups of `grouped`
                // are whole and inside `w`.
                unsafe { one_token(w, row_bytes, grouped, a, head) };
            } else if chunk_rows == 0 {
                // Rows too long to unpack four at a time: token by token, strided out.
                for t in 0..n_tok {
                    let Some(a) = cast::<BlockQ8_0>(&acts[t * arb..(t + 1) * arb]) else {
                        return false;
                    };
                    let mut col = [0.0f32; 64];
                    let mut r = grouped.start;
                    while r < grouped.end {
                        let end = (r + col.len()).min(grouped.end);
                        // SAFETY: as above, for a sub-range of `grouped`.
                        unsafe { one_token(w, row_bytes, r..end, a, &mut col[..end - r]) };
                        for (i, v) in col[..end - r].iter().enumerate() {
                            head[(r - grouped.start + i) * n_tok + t] = *v;
                        }
                        r = end;
                    }
                }
            } else {
                let mut buf = [0u8; UNPACKED];
                let mut c0 = grouped.start / G * G;
                while c0 < grouped.end {
                    let c1 = (c0 + chunk_rows).min(grouped.end.div_ceil(G) * G);
                    let plain = &mut buf[..(c1 - c0) * row_bytes];
                    // SAFETY: the caller's ISA.
                    if !unsafe { unpack(&w[c0 * row_bytes..c1 * row_bytes], row_bytes, plain) } {
                        return false;
                    }
                    let (lo, hi) = (c0.max(grouped.start), c1.min(grouped.end));
                    let o = &mut head[(lo - grouped.start) * n_tok..(hi - grouped.start) * n_tok];
                    let ok = table.rows(
                        GgmlType::Q5_0,
                        plain,
                        row_bytes,
                        lo - c0..hi - c0,
                        acts,
                        arb,
                        o,
                    );
                    if !ok {
                        return false;
                    }
                    c0 = c1;
                }
            }
            true
        },
    )
}

/// Word shifts that move bit `k` (`LO`) / `4 + k` (`HI`) of every byte to its top bit in
/// 128-bit lane `k` (what a word shift carries across the byte boundary never reaches a
/// top bit).
#[inline(always)]
unsafe fn fifth_bit_shifts() -> (__m512i, __m512i) {
    let lo = _mm512_setr_epi64(
        0x0007_0007_0007_0007,
        0x0007_0007_0007_0007,
        0x0006_0006_0006_0006,
        0x0006_0006_0006_0006,
        0x0005_0005_0005_0005,
        0x0005_0005_0005_0005,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
    );
    (lo, _mm512_sub_epi16(lo, _mm512_set1_epi16(4)))
}

/// The fifth bits of a group-block as two 64-bit masks over the nibble vector's bytes:
/// bit `16k + 4r + j` of the first is weight `4k + j` of row `r`, of the second weight
/// `16 + 4k + j`.
#[inline(always)]
unsafe fn fifth_bits(b: &BlockQ5_0x4s, sh: (__m512i, __m512i)) -> (u64, u64) {
    let qh = _mm512_broadcast_i32x4(_mm_loadu_si128(b.qh.as_ptr() as *const __m128i));
    (
        _mm512_movepi8_mask(_mm512_sllv_epi16(qh, sh.0)),
        _mm512_movepi8_mask(_mm512_sllv_epi16(qh, sh.1)),
    )
}

/// Row `r`'s 16 bits of a [`fifth_bits`] mask, in weight order (bits `16k + 4r + j` to
/// bit `4k + j`).
#[inline(always)]
fn row_bits(m: u64, r: usize) -> u32 {
    let x = (m >> (4 * r)) & 0x000f_000f_000f_000f;
    let x = (x | x >> 12) & 0x0000_00ff_0000_00ff;
    ((x | x >> 24) & 0xffff) as u32
}

/// A group-block's four plain Q5_0 blocks (what `Group::unpack` of `crate::repack` gives, with vector
/// shuffles instead of a loop per bit): the nibble bytes are a 4 x 4 transpose of 32-bit
/// elements, the fifth bits come from [`fifth_bits`].
#[inline(always)]
unsafe fn unpack_block(b: &BlockQ5_0x4s, sh: (__m512i, __m512i)) -> [BlockQ5_0; G] {
    let qs = _mm512_loadu_si512(b.qs.as_ptr() as *const _);
    let t = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
        qs,
    );
    let mut bytes = [0u8; 64];
    // SAFETY: 64 writable bytes.
    _mm512_storeu_si512(bytes.as_mut_ptr() as *mut _, t);
    let (lo, hi) = fifth_bits(b, sh);
    core::array::from_fn(|r| BlockQ5_0 {
        d: b.d[r],
        qh: (row_bits(lo, r) | row_bits(hi, r) << 16).to_le_bytes(),
        qs: core::array::from_fn(|q| bytes[16 * r + q]),
    })
}

/// Whole groups `src` of a Q5_0x4s tensor back to plain rows in `dst` (same size).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn unpack(src: &[u8], row_bytes: usize, dst: &mut [u8]) -> bool {
    let nb = row_bytes / BLOCK_BYTES;
    let sh = fifth_bit_shifts();
    for (gs, gd) in src
        .chunks_exact(G * row_bytes)
        .zip(dst.chunks_exact_mut(G * row_bytes))
    {
        let (Some(g), Some(p)) = (cast::<BlockQ5_0x4s>(gs), cast_mut::<BlockQ5_0>(gd)) else {
            return false;
        };
        for (k, b) in g.iter().enumerate().take(nb) {
            for (r, plain) in unpack_block(b, sh).into_iter().enumerate() {
                p[r * nb + k] = plain;
            }
        }
    }
    true
}
