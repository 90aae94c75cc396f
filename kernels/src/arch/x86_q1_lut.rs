//! Q1_0 by table lookup on AVX2: the `vpshufb` half of [`super::q1_lut`].
//!
//! One 256-bit `vpshufb` looks up two groups at once: the pair's 16 bytes (16 rows)
//! broadcast to both 128-bit lanes, the low nibbles kept in lane 0 and the high nibbles
//! in lane 1 (`vpsrlvd` by 0 / 4, then a mask), against the two groups' tables loaded
//! as one 32-byte vector. Each lane then sums four groups of a Q8_0 block in bytes
//! (exact: at most 240 and -128..=112, see [`super::q1_lut`]), the lanes are widened to
//! i16 and added, and the float steps are the scalar reference's.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::q1_lut::{LutKernel, Tables, GROUPS, KC, R, RG, SUB};
use super::x86_stream::fetch_ahead;
use crate::quant::q8_0::BlockQ8_0;
use crate::repack::BlockQ1_0x16;

// `b` indexes the blocks of all RG row groups and the tables at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups(
    blocks: [&[BlockQ1_0x16]; RG],
    nkb: usize,
    t: &Tables,
    sums_out: &mut [[f32; R]; RG],
) {
    let m15 = _mm256_set1_epi8(15);
    let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    let mut sums: [[__m256; 2]; RG] = core::array::from_fn(|i| {
        [
            _mm256_loadu_ps(sums_out[i].as_ptr()),
            _mm256_loadu_ps(sums_out[i][8..].as_ptr()),
        ]
    });
    for b in 0..nkb {
        for blk in blocks {
            // SAFETY: a hint only (see `fetch_ahead`).
            unsafe { fetch_ahead(&blk[b]) };
        }
        let mut sumi = [[_mm256_setzero_ps(); 2]; RG];
        for sb in 0..SUB {
            let k = b * SUB + sb;
            let mut lb = [_mm256_setzero_si256(); RG];
            let mut hb = [_mm256_setzero_si256(); RG];
            for j in 0..4 {
                let p = sb * 4 + j;
                let g = b * GROUPS + 2 * p;
                let lt = _mm256_loadu_si256(t.lh[Tables::lo(g)].as_ptr() as *const __m256i);
                let ht = _mm256_loadu_si256(t.lh[Tables::hi(g)].as_ptr() as *const __m256i);
                for r in 0..RG {
                    let v = _mm_loadu_si128(blocks[r][b].qs[p].as_ptr() as *const __m128i);
                    let idx = _mm256_and_si256(
                        _mm256_srlv_epi32(_mm256_broadcastsi128_si256(v), shift),
                        m15,
                    );
                    lb[r] = _mm256_add_epi8(lb[r], _mm256_shuffle_epi8(lt, idx));
                    hb[r] = _mm256_add_epi8(hb[r], _mm256_shuffle_epi8(ht, idx));
                }
            }
            let start = _mm256_set1_epi16(t.neg_sum[k][0]);
            let d = _mm256_set1_ps(t.d[k]);
            for r in 0..RG {
                let l16 = _mm256_add_epi16(
                    _mm256_cvtepu8_epi16(_mm256_castsi256_si128(lb[r])),
                    _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(lb[r])),
                );
                let h16 = _mm256_add_epi16(
                    _mm256_cvtepi8_epi16(_mm256_castsi256_si128(hb[r])),
                    _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(hb[r])),
                );
                let s16 = _mm256_add_epi16(
                    _mm256_add_epi16(_mm256_slli_epi16::<5>(h16), _mm256_slli_epi16::<1>(l16)),
                    start,
                );
                let s = [
                    _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s16)),
                    _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(s16)),
                ];
                for (h, sh) in s.into_iter().enumerate() {
                    // `sumi += d_a * isum`, fused: the product is exact (see `q1_lut`).
                    sumi[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sh), d, sumi[r][h]);
                }
            }
        }
        for r in 0..RG {
            let dp = blocks[r][b].d.as_ptr() as *const __m128i;
            let dw = [
                _mm256_cvtph_ps(_mm_loadu_si128(dp)),
                _mm256_cvtph_ps(_mm_loadu_si128(dp.add(1))),
            ];
            for h in 0..2 {
                sums[r][h] = _mm256_add_ps(sums[r][h], _mm256_mul_ps(dw[h], sumi[r][h]));
            }
        }
    }
    for (o, v) in sums_out.iter_mut().zip(sums) {
        _mm256_storeu_ps(o.as_mut_ptr(), v[0]);
        _mm256_storeu_ps(o[8..].as_mut_ptr(), v[1]);
    }
}

/// Tables of `act` in scalar code (a small part of the work: once per token and table
/// chunk, shared by every row).
fn build_scalar(act: &[BlockQ8_0], t: &mut Tables) {
    for (k, y) in act.iter().enumerate().take(KC * SUB) {
        t.d[k] = y.scale();
        t.neg_sum[k] = [-y.q_sum() as i16; 2];
        for g in 0..8 {
            let (lo, hi) = (Tables::lo(8 * k + g), Tables::hi(8 * k + g));
            t.lh[lo][0] = 0;
            t.lh[hi][0] = 0;
            for n in 1..16usize {
                let bit = n.trailing_zeros() as usize;
                let q = y.qs[4 * g + bit];
                t.lh[lo][n] = t.lh[lo][n & (n - 1)].wrapping_add(q & 15);
                t.lh[hi][n] = t.lh[hi][n & (n - 1)].wrapping_add(((q as i8) >> 4) as u8);
            }
        }
    }
}

/// The AVX2 instantiation.
pub(super) struct Avx2;

impl LutKernel for Avx2 {
    type Tables = Tables;
    fn tables() -> Tables {
        Tables::new()
    }
    unsafe fn build(act: &[BlockQ8_0], t: &mut Tables) {
        build_scalar(act, t)
    }
    unsafe fn groups(
        blocks: [&[BlockQ1_0x16]; RG],
        nkb: usize,
        t: &Tables,
        sums: &mut [[f32; R]; RG],
    ) {
        // SAFETY: the caller's contract (AVX2 with FMA and F16C).
        unsafe { groups(blocks, nkb, t, sums) }
    }
}
