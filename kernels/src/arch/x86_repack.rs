//! AVX2 row-range products over repacked Q8_0 weights ([`crate::repack::Layout::Q8_0x4`]).
//!
//! The arithmetic is [`super::x86_rows`]'s for Q8_0 (llama.cpp's sign trick into eight
//! integer lanes, one fused multiply-add per block and lane, the `hsum8` tree); only
//! the addressing and the tiles differ. A group's four rows come as one sequential
//! stream of 136-byte group-blocks instead of four streams a row apart (which the plain
//! kernel has to prefetch by hand). Tiles: 4 rows x 1 token, and for prompts 2 rows x 4
//! tokens (each half of the group in turn: 4 x 4 accumulators would not fit in the 16
//! vector registers; the second half re-reads the group-blocks from L1). Rows of a
//! partial group at the ends of the range are computed with their group and dropped;
//! the plain tail rows (`rows % 4`) go to the plain kernel. Each (row, token) therefore
//! has the plain kernels' bits.
//!
//! Measured (`tests/repack.rs`, 262144 x 640, one thread, AMD EPYC with AVX-512 VNNI,
//! other jobs running; plain time / repacked time, best of 7 alternating runs):
//! - AVX2 (both sides): 1 token 1.07-1.46x (typically ~1.35x), 4 and 8 tokens ~1.04x
//!   (a 4 x 4 tile instead of two 2 x 4 ran at 0.57x).
//! - AVX-512 VNNI (both sides): 1 token 1.50x; 4 tokens 0.91-0.94x, 8 and 16 tokens 0.63x:
//!   the plain side's prompt kernel (`super::x86_gemm_lanes`, 2 x 8 tiles over
//!   precomputed activation tables) is not ported to this layout (2 x 8 tiles without the
//!   tables were no faster than 4 x 4 here).
//! - AVX-512 VNNI tokens now go in pairs through 512-bit vectors ([`pair_tile`]):
//!   `kernels/examples/insn_count q8_0 4096 640 N REPS repack`, natively, microseconds per
//!   token before -> after: 2 tokens 100 -> 71, 4 tokens 81 -> 54, 64 tokens 87 -> 56
//!   (one token, unchanged: ~105; a loaded machine, one run each).
#![allow(unsafe_code)]

use core::arch::x86_64::*;
use core::ops::Range;

use super::x86_legacy::load32;
use super::x86_stream::fetch_ahead;
use crate::blocks::cast;
use crate::quant::q8_0::{hsum8, BlockQ8_0, BLOCK_BYTES};
use crate::repack::BlockQ8_0x4;
use crate::GgmlType;

use super::table::{KernelTable, PackedJob};

/// Tokens per tile.
const T: usize = 4;
// One token fetches its stream 8 KiB ahead (`super::x86_stream`): 60 group-blocks. On
// the older AMD EPYC VM 8 or 24 blocks ahead was no faster (8 blocks: 0.8x); on the Zen 5
// VM 8 KiB took the 262144 x 640 head from 6.07 to 4.95 ms (medians of 5).

/// Product over a repacked Q8_0x4 tensor (`w`: all of its rows) for `rows`, or `false`
/// (nothing written) when the shapes do not fit. Rows past the last whole group are
/// plain; they go to `table`'s plain Q8_0 kernel.
///
/// # Safety
/// The CPU has AVX2 with FMA and F16C (`VNNI`: and AVX-512 F/BW/VL/VNNI), and `table`
/// is a table for this CPU.
pub(super) unsafe fn matmul<const VNNI: bool>(
    table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let shape = (BLOCK_BYTES, BLOCK_BYTES, 4);
    split_groups(
        table,
        GgmlType::Q8_0,
        shape,
        w,
        row_bytes,
        rows,
        acts,
        out,
        |job, grouped, head| {
            // SAFETY: the caller guarantees the ISA; `PackedJob` put every group-block of the
            // groups of `grouped` (all in whole groups) inside `w`, every activation row
            // inside `acts`, and `head` has one value per (row, token) of `grouped`.
            unsafe {
                if VNNI {
                    groups_job_vnni(w, row_bytes, grouped, acts, job.n_tok, head)
                } else {
                    groups_job(w, row_bytes, grouped, acts, job.n_tok, head)
                }
            };
            true
        },
    )
}

/// The shape of a product over a repacked tensor of plain type `ty` checked
/// ([`PackedJob::new`] with `shape`), then `groups` on the rows in whole groups
/// (`rows.start..split`, with their outputs) and `table`'s plain kernel on the rest;
/// `false` when the shapes do not fit or `groups` fails.
#[allow(clippy::too_many_arguments)]
pub(super) fn split_groups(
    table: &'static KernelTable,
    ty: GgmlType,
    shape: (usize, usize, usize),
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
    groups: impl FnOnce(&PackedJob, Range<usize>, &mut [f32]) -> bool,
) -> bool {
    let Some(job) = PackedJob::new(w, row_bytes, &rows, acts, out.len(), shape) else {
        return false;
    };
    let (split, n_tok) = (job.split, job.n_tok);
    let (head, tail) = out.split_at_mut((split - rows.start) * n_tok);
    if split > rows.start && !groups(&job, rows.start..split, head) {
        return false;
    }
    split >= rows.end || table.rows(ty, w, row_bytes, split..rows.end, acts, job.arb, tail)
}

#[inline(always)]
unsafe fn reduce(acc: __m256) -> f32 {
    let mut l = [0.0f32; 8];
    // SAFETY: 8 writable f32.
    _mm256_storeu_ps(l.as_mut_ptr(), acc);
    hsum8(l)
}

/// Rows `R0..R0 + RN` of one group against `TT` tokens, all of `nb` blocks.
///
/// # Safety
/// AVX2/FMA/F16C; `nb` group-blocks are readable at `g` and `nb` blocks at every `a[t]`;
/// `R0 + RN <= 4`.
#[inline(always)]
unsafe fn tile<const VNNI: bool, const TT: usize, const R0: usize, const RN: usize>(
    g: *const BlockQ8_0x4,
    a: [*const BlockQ8_0; TT],
    nb: usize,
) -> [[f32; TT]; RN] {
    let mut acc = [[_mm256_setzero_ps(); TT]; RN];
    for k in 0..nb {
        // SAFETY: k < nb group-blocks at `g`.
        let b = &*g.add(k);
        if TT == 1 {
            fetch_ahead(b);
        }
        let p: [[__m256i; 2]; RN] = core::array::from_fn(|r| {
            let q = load32(&b.qs[R0 + r]);
            [_mm256_abs_epi8(q), q]
        });
        // The group's four scales are adjacent: one conversion for all of them, one
        // product with each token's scale, then one lane broadcast per row.
        let dw4 = _mm_cvtph_ps(_mm_loadl_epi64(b.d.as_ptr() as *const __m128i));
        for t in 0..TT {
            // SAFETY: k < nb blocks at `a[t]`.
            let y = &*a[t].add(k);
            let av = load32(&y.qs);
            // d_w * d_a is exact in f32 (two f16 significands), as in the reference.
            let d4 = _mm256_castps128_ps256(_mm_mul_ps(
                dw4,
                _mm_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(y.d) as i16)),
            ));
            for r in 0..RN {
                let sa = _mm256_sign_epi8(av, p[r][1]);
                let gs = if VNNI {
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), p[r][0], sa)
                } else {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(p[r][0], sa), _mm256_set1_epi16(1))
                };
                let d = _mm256_permutevar8x32_ps(d4, _mm256_set1_epi32((R0 + r) as i32));
                acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(gs), acc[r][t]);
            }
        }
    }
    let mut out = [[0.0f32; TT]; RN];
    for r in 0..RN {
        for t in 0..TT {
            out[r][t] = reduce(acc[r][t]);
        }
    }
    out
}

/// The four rows of one group against `TP` pairs of tokens, AVX-512 VNNI: a pair's two
/// activation blocks fill one 512-bit vector and each row's weights are broadcast to
/// both halves, so one `vpdpbusd`, conversion and fused multiply-add serve two tokens.
/// There is no 512-bit `vpsignb`: the activations are biased to unsigned bytes (`a ^
/// 0x80` = `a + 128`) and the accumulation starts from `-128 * sum(w)` per lane, which
/// gives the exact `sum(w * a)` of the sign trick's lanes (equal for every activation
/// of a Q8_0 quantization, -127..=127). The scale products, the per-lane fused
/// multiply-adds in block order and the `hsum8` tree per token are [`tile`]'s, so every
/// (row, token) keeps its bits; this halves the instructions per token of the 4 x 4
/// tile, for the few tokens of sequences decoded together as for prompts.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `nb` group-blocks are readable at `g` and `nb` blocks at every
/// activation pointer.
#[inline(always)]
unsafe fn pair_tile<const TP: usize>(
    g: *const BlockQ8_0x4,
    a: [[*const BlockQ8_0; 2]; TP],
    nb: usize,
) -> [[[f32; 2]; TP]; 4] {
    let zero = _mm512_setzero_si512();
    let bias = _mm512_set1_epi8(0x80u8 as i8);
    // Row r's scale in every lane: `d_w[r] d_a[t0]` below, `d_w[r] d_a[t1]` above.
    let idx: [__m512i; 4] = core::array::from_fn(|r| {
        let (lo, hi) = (r as i32, 4 + r as i32);
        _mm512_setr_epi32(
            lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
        )
    });
    let mut acc = [[_mm512_setzero_ps(); TP]; 4];
    for k in 0..nb {
        // SAFETY: k < nb group-blocks at `g`.
        let b = &*g.add(k);
        let w: [__m512i; 4] = core::array::from_fn(|r| _mm512_broadcast_i64x4(load32(&b.qs[r])));
        let start: [__m512i; 4] =
            core::array::from_fn(|r| _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, w[r])));
        let dw4 = _mm_cvtph_ps(_mm_loadl_epi64(b.d.as_ptr() as *const __m128i));
        for (p, pa) in a.iter().enumerate() {
            // SAFETY: k < nb blocks at both activation pointers.
            let (y0, y1) = (&*pa[0].add(k), &*pa[1].add(k));
            let av =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load32(&y0.qs)), load32(&y1.qs));
            let au = _mm512_xor_si512(av, bias);
            let da = |y: &BlockQ8_0| _mm_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(y.d) as i16));
            // d_w * d_a is exact in f32 (two f16 significands), as in `tile`.
            let dd = _mm512_castps256_ps512(_mm256_set_m128(
                _mm_mul_ps(dw4, da(y1)),
                _mm_mul_ps(dw4, da(y0)),
            ));
            for r in 0..4 {
                let gs = _mm512_dpbusd_epi32(start[r], au, w[r]);
                let d = _mm512_permutexvar_ps(idx[r], dd);
                acc[r][p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(gs), acc[r][p]);
            }
        }
    }
    let mut out = [[[0.0f32; 2]; TP]; 4];
    for r in 0..4 {
        for p in 0..TP {
            let v = acc[r][p];
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            out[r][p] = [reduce(_mm512_castps512_ps256(v)), reduce(hi)];
        }
    }
    out
}

/// Rows `rows` (all inside whole groups) of a Q8_0x4 tensor, AVX2.
///
/// # Safety
/// See [`groups_body`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_job(
    w: &[u8],
    rb: usize,
    rows: Range<usize>,
    acts: &[u8],
    n_tok: usize,
    out: &mut [f32],
) {
    groups_body::<false>(w, rb, rows, acts, n_tok, out)
}

/// [`groups_job`] with AVX-512 VNNI: `vpdpbusd` for the lane sums (the same exact
/// integers), and 32 vector registers, so prompts use 4 x 4 tiles.
///
/// # Safety
/// See [`groups_body`]; the CPU has AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn groups_job_vnni(
    w: &[u8],
    rb: usize,
    rows: Range<usize>,
    acts: &[u8],
    n_tok: usize,
    out: &mut [f32],
) {
    groups_body::<true>(w, rb, rows, acts, n_tok, out)
}

/// The loop over groups and token tiles.
///
/// # Safety
/// AVX2/FMA/F16C; `rows.end <= 4 * (w.len() / (4 * rb))` rounded up to a whole group
/// present in `w`; `acts` is `n_tok` rows of `rb`; `out.len() == rows.len() * n_tok`.
#[inline(always)]
unsafe fn groups_body<const VNNI: bool>(
    w: &[u8],
    rb: usize,
    rows: Range<usize>,
    acts: &[u8],
    n_tok: usize,
    out: &mut [f32],
) {
    let nb = rb / BLOCK_BYTES;
    let act = |t: usize| acts.as_ptr().add(t * rb) as *const BlockQ8_0;
    let mut put = |r: usize, t: usize, v: f32| {
        if rows.contains(&r) {
            out[(r - rows.start) * n_tok + t] = v;
        }
    };
    for g in rows.start / 4..rows.end.div_ceil(4) {
        let gw = cast::<BlockQ8_0x4>(&w[g * 4 * rb..(g + 1) * 4 * rb]).unwrap_or(&[]);
        if gw.len() != nb {
            return;
        }
        let gp = gw.as_ptr();
        let mut t = 0;
        if VNNI {
            // Token pairs in 512-bit vectors (two pairs a tile, then one).
            while t + 2 <= n_tok {
                let pairs = if t + 4 <= n_tok { 2 } else { 1 };
                let pair = |p: usize| [act(t + 2 * p), act(t + 2 * p + 1)];
                let mut res = [[[0.0f32; 2]; 2]; 4];
                if pairs == 2 {
                    res = pair_tile::<2>(gp, [pair(0), pair(1)], nb);
                } else {
                    let one = pair_tile::<1>(gp, [pair(0)], nb);
                    for (o, i) in res.iter_mut().zip(one) {
                        o[0] = i[0];
                    }
                }
                for (r, rr) in res.iter().enumerate() {
                    for (p, pv) in rr.iter().take(pairs).enumerate() {
                        put(4 * g + r, t + 2 * p, pv[0]);
                        put(4 * g + r, t + 2 * p + 1, pv[1]);
                    }
                }
                t += 2 * pairs;
            }
        }
        while t + T <= n_tok {
            // AVX2: two rows at a time (a 4 x 4 tile's 16 accumulators do not fit in the
            // 16 vector registers); VNNI code has 32.
            let a: [_; T] = core::array::from_fn(|j| act(t + j));
            if VNNI {
                let res = tile::<VNNI, T, 0, 4>(gp, a, nb);
                for (r, rr) in res.iter().enumerate() {
                    for (j, v) in rr.iter().enumerate() {
                        put(4 * g + r, t + j, *v);
                    }
                }
            } else {
                let lo = tile::<VNNI, T, 0, 2>(gp, a, nb);
                let hi = tile::<VNNI, T, 2, 2>(gp, a, nb);
                for (r, rr) in lo.iter().chain(&hi).enumerate() {
                    for (j, v) in rr.iter().enumerate() {
                        put(4 * g + r, t + j, *v);
                    }
                }
            }
            t += T;
        }
        while t < n_tok {
            let res = tile::<VNNI, 1, 0, 4>(gp, [act(t)], nb);
            for (r, rr) in res.iter().enumerate() {
                put(4 * g + r, t, rr[0]);
            }
            t += 1;
        }
    }
}
