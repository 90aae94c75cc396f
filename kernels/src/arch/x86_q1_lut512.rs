//! Q1_0 by table lookup on AVX-512 VBMI + VNNI: the `vpermb` half of [`super::q1_lut`].
//!
//! `vpermb` looks a byte up in 64 bytes, i.e. in a run's four 16-entry tables at once
//! (the [`Tables`] layout keeps four groups' `L` tables, then their `H` tables, side by
//! side), so one lookup serves 16 rows x 4 groups if each row's four indices sit in its
//! own 32-bit lane with the group's table number above the nibble. Per Q8_0 block (two
//! runs of four groups) and 16 rows:
//! - one `vpermb` gathers the block's 64 sign bytes (`qs[4 sb..4 sb + 4]`, 16 rows each)
//!   so that 64-bit lane `q` holds rows `2q` and `2q + 1`'s 32 bits of the block;
//! - per run, one `vpmultishiftqb` cuts each row's four nibbles out of its lane into
//!   bytes `4r..4r + 4`, and one `vpternlogd` keeps the nibble and sets the table number
//!   (`idx & 15 | 16 j`);
//! - two `vpermb` give the `L` and `H` subset sums, and two `vpdpbusd` add `2 L` and
//!   `32 H` of the lane's four bytes to the row's 32-bit sum, which starts at `-sum(q)`:
//!   the exact `sum(s_j q_j)` ([`super::q1_lut`]), one row per lane;
//! - the float steps are the scalar reference's, 16 rows at once (the product `d_a *
//!   isum` is exact, so the fused multiply-add rounds once, as the reference does).
//!
//! About 15 instructions per 512 weights. The tables are built with the same lookups
//! (four masked byte adds per table instead of 16 scalar entries).
#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::q1_lut::{LutKernel, Tables, GROUPS, KC, R, RG, SUB};
use super::x86_stream::fetch_ahead;
use crate::quant::q8_0::BlockQ8_0;
use crate::repack::BlockQ1_0x16;

/// `vpermb` indices that put rows `2q`, `2q + 1` of a Q8_0 block's four sign-byte
/// vectors (`p0..p3`, 16 rows each) into 64-bit lane `q`: `p0 p1` of row `2q`, then of
/// row `2q + 1` (the first run's 32 bits), then `p2 p3` the same way (the second run's).
const GATHER: [u8; 64] = {
    let mut x = [0u8; 64];
    let mut q = 0;
    while q < 8 {
        let (r0, r1) = (2 * q as u8, 2 * q as u8 + 1);
        let lane = [r0, 16 + r0, r1, 16 + r1, 32 + r0, 48 + r0, 32 + r1, 48 + r1];
        let mut i = 0;
        while i < 8 {
            x[8 * q + i] = lane[i];
            i += 1;
        }
        q += 1;
    }
    x
};

/// `vpmultishiftqb` bit offsets of the nibbles of a 64-bit lane's two rows: the first
/// run's (bits 0..32) and the second's (bits 32..64).
const fn nibble_offsets(base: u8) -> [u8; 64] {
    let mut x = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        x[i] = base + 4 * (i % 8) as u8;
        i += 1;
    }
    x
}
const RUN_A: [u8; 64] = nibble_offsets(0);
const RUN_B: [u8; 64] = nibble_offsets(32);

/// Byte `4r + j` of a lookup index: the table number `j` of the run (`16 j`).
const TABLE_OF_SLOT: [u8; 64] = {
    let mut x = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        x[i] = 16 * (i % 4) as u8;
        i += 1;
    }
    x
};

/// For building: `vpermb` indices broadcasting, to entries `16 j..16 j + 16`, activation
/// `4 j + bit` of the run starting at byte `run` of the block.
const fn spread(run: u8, bit: u8) -> [u8; 64] {
    let mut x = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        x[i] = run + 4 * (i / 16) as u8 + bit;
        i += 1;
    }
    x
}
const SPREAD: [[[u8; 64]; 4]; 2] = [
    [spread(0, 0), spread(0, 1), spread(0, 2), spread(0, 3)],
    [spread(16, 0), spread(16, 1), spread(16, 2), spread(16, 3)],
];

/// For building: the entries `n` of each 16-entry table whose pattern has `bit` set.
const fn with_bit(bit: u32) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < 64 {
        if (i % 16) & (1 << bit) != 0 {
            m |= 1 << i;
        }
        i += 1;
    }
    m
}
const WITH_BIT: [u64; 4] = [with_bit(0), with_bit(1), with_bit(2), with_bit(3)];

#[inline]
#[target_feature(enable = "avx512f")]
fn load(x: &[u8; 64]) -> __m512i {
    // SAFETY: 64 readable bytes; unaligned loads.
    unsafe { _mm512_loadu_si512(x.as_ptr() as *const _) }
}

/// The four 16-byte tables of a run from `lh[at]` (`Tables::lo` / `hi` of a multiple of
/// four), as one vector.
#[inline]
#[target_feature(enable = "avx512f")]
fn tables4(t: &Tables, at: usize) -> __m512i {
    let four = &t.lh[at..at + 4];
    // SAFETY: `four` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(four.as_ptr() as *const _) }
}

#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn build(act: &[BlockQ8_0], t: &mut Tables) {
    let m15 = _mm512_set1_epi8(15);
    let eight = _mm512_set1_epi8(8);
    let mut spread = [[_mm512_setzero_si512(); 4]; 2];
    for run in 0..2 {
        for bit in 0..4 {
            spread[run][bit] = load(&SPREAD[run][bit]);
        }
    }
    for (k, y) in act.iter().enumerate().take(KC * SUB) {
        t.d[k] = y.scale();
        t.neg_sum[k] = [-y.q_sum() as i16; 2];
        // SAFETY: 32 readable bytes of the block.
        let q = _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(y.qs.as_ptr() as *const _) });
        let lo = _mm512_and_si512(q, m15);
        // `q >> 4` as i8: the high nibble, sign-extended from 4 bits.
        let hi4 = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m15);
        let hi = _mm512_sub_epi8(_mm512_xor_si512(hi4, eight), eight);
        for run in 0..2 {
            let g = 8 * k + 4 * run;
            for (src, at) in [(lo, Tables::lo(g)), (hi, Tables::hi(g))] {
                let mut tab = _mm512_setzero_si512();
                for bit in 0..4 {
                    let v = _mm512_permutexvar_epi8(spread[run][bit], src);
                    tab = _mm512_mask_add_epi8(tab, WITH_BIT[bit], tab, v);
                }
                // SAFETY: `at` starts four 16-byte tables (`Tables::lo` / `hi` of a
                // multiple of four), 64 writable bytes inside `t.lh`.
                unsafe { _mm512_storeu_si512(t.lh[at..at + 4].as_mut_ptr() as *mut _, tab) };
            }
        }
    }
}

// `b` indexes the blocks of all RG row groups and the tables at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn groups(
    blocks: [&[BlockQ1_0x16]; RG],
    nkb: usize,
    t: &Tables,
    sums_out: &mut [[f32; R]; RG],
) {
    let (gather, run_a, run_b, slot) = (
        load(&GATHER),
        load(&RUN_A),
        load(&RUN_B),
        load(&TABLE_OF_SLOT),
    );
    let m15 = _mm512_set1_epi8(15);
    let two = _mm512_set1_epi8(2);
    let thirty_two = _mm512_set1_epi8(32);
    let mut sums = [_mm512_setzero_ps(); RG];
    for (s, o) in sums.iter_mut().zip(sums_out.iter()) {
        // SAFETY: 16 readable f32.
        *s = unsafe { _mm512_loadu_ps(o.as_ptr()) };
    }
    for b in 0..nkb {
        for blk in blocks {
            // SAFETY: a hint only (see `fetch_ahead`).
            unsafe { fetch_ahead(&blk[b]) };
        }
        let mut sumi = [_mm512_setzero_ps(); RG];
        for sb in 0..SUB {
            let k = b * SUB + sb;
            let g = b * GROUPS + 8 * sb;
            let (la, ha) = (tables4(t, Tables::lo(g)), tables4(t, Tables::hi(g)));
            let (lb, hb) = (tables4(t, Tables::lo(g + 4)), tables4(t, Tables::hi(g + 4)));
            let start = _mm512_set1_epi32(t.neg_sum[k][0] as i32);
            let d = _mm512_set1_ps(t.d[k]);
            for r in 0..RG {
                // SAFETY: `qs[4 sb..4 sb + 4]` are 64 contiguous bytes of the block.
                let x = unsafe { _mm512_loadu_si512(blocks[r][b].qs[4 * sb].as_ptr() as *const _) };
                let x = _mm512_permutexvar_epi8(gather, x);
                // (A & B) | C: the nibble, and the table number above it.
                let ia = _mm512_ternarylogic_epi32::<0xEA>(
                    _mm512_multishift_epi64_epi8(run_a, x),
                    m15,
                    slot,
                );
                let ib = _mm512_ternarylogic_epi32::<0xEA>(
                    _mm512_multishift_epi64_epi8(run_b, x),
                    m15,
                    slot,
                );
                let mut acc = _mm512_dpbusd_epi32(start, _mm512_permutexvar_epi8(ia, la), two);
                acc = _mm512_dpbusd_epi32(acc, thirty_two, _mm512_permutexvar_epi8(ia, ha));
                acc = _mm512_dpbusd_epi32(acc, _mm512_permutexvar_epi8(ib, lb), two);
                acc = _mm512_dpbusd_epi32(acc, thirty_two, _mm512_permutexvar_epi8(ib, hb));
                // `sumi += d_a * isum`, fused: the product is exact (see `q1_lut`).
                sumi[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), d, sumi[r]);
            }
        }
        for r in 0..RG {
            // SAFETY: the 16 f16 scales of the group-block, 32 bytes.
            let dw = _mm512_cvtph_ps(unsafe {
                _mm256_loadu_si256(blocks[r][b].d.as_ptr() as *const __m256i)
            });
            sums[r] = _mm512_add_ps(sums[r], _mm512_mul_ps(dw, sumi[r]));
        }
    }
    for (o, v) in sums_out.iter_mut().zip(sums) {
        // SAFETY: 16 writable f32.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    }
}

/// The AVX-512 VBMI instantiation.
pub(super) struct Vbmi;

impl LutKernel for Vbmi {
    type Tables = Tables;
    fn tables() -> Tables {
        Tables::new()
    }
    unsafe fn build(act: &[BlockQ8_0], t: &mut Tables) {
        // SAFETY: the caller's contract (AVX-512 F/BW/VL/VNNI/VBMI with AVX2).
        unsafe { build(act, t) }
    }
    unsafe fn groups(
        blocks: [&[BlockQ1_0x16]; RG],
        nkb: usize,
        t: &Tables,
        sums: &mut [[f32; R]; RG],
    ) {
        // SAFETY: the caller's contract (AVX-512 F/BW/VL/VNNI/VBMI with AVX2).
        unsafe { groups(blocks, nkb, t, sums) }
    }
}
