//! Q1_0 by table lookup on baseline NEON: the `tbl` half of [`super::q1_lut`] (which
//! states the arithmetic and why it is exact). Runs on every aarch64 core (Cortex-A53,
//! Apple A7: no dotprod needed; the dotprod table uses it too: a bit-plane `cmtst` +
//! `sdot` kernel needs a mask and an `sdot` per 16 multiply-adds, against one `tbl`
//! pair per 64 here).
//!
//! Per 16 rows and four activations: one `tbl` into the `L` table and one into the `H`
//! table, indexed by a nibble of the rows' sign bytes (`and` / `ushr` of one 16-byte
//! load, shared by both lookups). Four groups add up in bytes, then go into two i16
//! accumulators as `2 L + 32 H` (`umull`/`umlal`, `smlal`); per Q8_0 block the
//! accumulators widen onto `-sum(q)` (`saddw`), convert and meet the activation scale
//! in one `fmla` per four rows (exact, see [`super::q1_lut`]). Two row groups share
//! each table load, and the tables of one half Q8_0 block (8 registers) are all that is
//! live, so nothing spills.
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_legacy::{h2f, h2f4};
use super::q1_lut::{LutKernel, Tables, GROUPS, KC, R, RG, SUB};
use crate::quant::q8_0::BlockQ8_0;
use crate::repack::BlockQ1_0x16;

/// `m[i]`: lane `n` is 0xff when bit `i` of `n` is set.
const BIT_MASKS: [[u8; 16]; 4] = {
    let mut m = [[0u8; 16]; 4];
    let mut i = 0;
    while i < 4 {
        let mut n = 0;
        while n < 16 {
            if (n >> i) & 1 == 1 {
                m[i][n] = 0xff;
            }
            n += 1;
        }
        i += 1;
    }
    m
};

/// The 16 subset sums of lanes `4g..4g+4` of `v` (bytes, wrapping: callers keep them in
/// range).
#[inline(always)]
unsafe fn subset_sums<const G: i32>(v: uint8x16_t, m: &[uint8x16_t; 4]) -> uint8x16_t {
    // Lanes 4G + i broadcast by `tbl` with a constant index (no lane-generic `dup`).
    let sel = |i: i32| vdupq_n_u8((4 * G + i) as u8);
    let t0 = vandq_u8(m[0], vqtbl1q_u8(v, sel(0)));
    let t1 = vandq_u8(m[1], vqtbl1q_u8(v, sel(1)));
    let t2 = vandq_u8(m[2], vqtbl1q_u8(v, sel(2)));
    let t3 = vandq_u8(m[3], vqtbl1q_u8(v, sel(3)));
    vaddq_u8(vaddq_u8(t0, t1), vaddq_u8(t2, t3))
}

/// Build the tables of `act` (whole Q8_0 blocks, at most `KC * SUB`).
#[target_feature(enable = "neon")]
unsafe fn build(act: &[BlockQ8_0], t: &mut Tables) {
    let m = BIT_MASKS.map(|x| vld1q_u8(x.as_ptr()));
    let m15 = vdupq_n_u8(15);
    for (k, y) in act.iter().enumerate().take(KC * SUB) {
        t.d[k] = h2f(y.d);
        t.neg_sum[k] = -y.q_sum();
        for half in 0..2 {
            let v = vld1q_u8(y.qs[16 * half..].as_ptr());
            let l = vandq_u8(v, m15);
            let h = vreinterpretq_u8_s8(vshrq_n_s8::<4>(vreinterpretq_s8_u8(v)));
            let g = 8 * k + 4 * half;
            vst1q_u8(t.lh[Tables::lo(g)].as_mut_ptr(), subset_sums::<0>(l, &m));
            vst1q_u8(
                t.lh[Tables::lo(g + 1)].as_mut_ptr(),
                subset_sums::<1>(l, &m),
            );
            vst1q_u8(
                t.lh[Tables::lo(g + 2)].as_mut_ptr(),
                subset_sums::<2>(l, &m),
            );
            vst1q_u8(
                t.lh[Tables::lo(g + 3)].as_mut_ptr(),
                subset_sums::<3>(l, &m),
            );
            vst1q_u8(t.lh[Tables::hi(g)].as_mut_ptr(), subset_sums::<0>(h, &m));
            vst1q_u8(
                t.lh[Tables::hi(g + 1)].as_mut_ptr(),
                subset_sums::<1>(h, &m),
            );
            vst1q_u8(
                t.lh[Tables::hi(g + 2)].as_mut_ptr(),
                subset_sums::<2>(h, &m),
            );
            vst1q_u8(
                t.lh[Tables::hi(g + 3)].as_mut_ptr(),
                subset_sums::<3>(h, &m),
            );
        }
    }
}

/// The byte sums of four groups for 16 rows: `(L, H)` looked up by the nibbles of the
/// rows' sign bytes `p` (groups `2i`, `2i + 1` of `p.i`).
#[inline(always)]
unsafe fn lookups(
    p: uint8x16x2_t,
    lt: &uint8x16x4_t,
    ht: &uint8x16x4_t,
) -> (uint8x16_t, int8x16_t) {
    let m15 = vdupq_n_u8(15);
    let i0 = vandq_u8(p.0, m15);
    let i1 = vshrq_n_u8::<4>(p.0);
    let i2 = vandq_u8(p.1, m15);
    let i3 = vshrq_n_u8::<4>(p.1);
    let lb = vaddq_u8(
        vaddq_u8(vqtbl1q_u8(lt.0, i0), vqtbl1q_u8(lt.1, i1)),
        vaddq_u8(vqtbl1q_u8(lt.2, i2), vqtbl1q_u8(lt.3, i3)),
    );
    let hb = vaddq_u8(
        vaddq_u8(vqtbl1q_u8(ht.0, i0), vqtbl1q_u8(ht.1, i1)),
        vaddq_u8(vqtbl1q_u8(ht.2, i2), vqtbl1q_u8(ht.3, i3)),
    );
    (lb, vreinterpretq_s8_u8(hb))
}

/// `sums` (16 rows) plus the dot products of the group-blocks `blocks[..nkb]` with the
/// tabled activations. One row group at a time: the 16 table registers of a Q8_0 block,
/// the accumulators and the temporaries just fit the 32 vector registers (two groups
/// side by side would share the table loads but spill more than they save).
#[target_feature(enable = "neon")]
unsafe fn group(blocks: &[BlockQ1_0x16], nkb: usize, t: &Tables, io: &mut [f32; R]) {
    // Opaque to the optimizer: with a known 32 or 2 it turns each `smlal`/`umlal` into
    // a shift and an add (twice the instructions).
    let c32q = core::hint::black_box(vdupq_n_s8(32));
    let c2q = core::hint::black_box(vdupq_n_u8(2));
    let c32 = vget_low_s8(c32q);
    let c2 = vget_low_u8(c2q);
    let mut sums: [float32x4_t; 4] = core::array::from_fn(|q| vld1q_f32(io[4 * q..].as_ptr()));
    for (b, blk) in blocks.iter().enumerate().take(nkb) {
        let mut sumi = [vdupq_n_f32(0.0); 4];
        for sb in 0..SUB {
            let k = b * SUB + sb;
            let g = b * GROUPS + sb * 8;
            let p = sb * 4;
            let lt = vld1q_u8_x4(t.lh[Tables::lo(g)].as_ptr());
            let ht = vld1q_u8_x4(t.lh[Tables::hi(g)].as_ptr());
            let (lb, hb) = lookups(vld1q_u8_x2(blk.qs[p].as_ptr()), &lt, &ht);
            let mut a0 = vreinterpretq_s16_u16(vmull_u8(vget_low_u8(lb), c2));
            let mut a1 = vreinterpretq_s16_u16(vmull_high_u8(lb, c2q));
            a0 = vmlal_s8(a0, vget_low_s8(hb), c32);
            a1 = vmlal_high_s8(a1, hb, c32q);
            let lt = vld1q_u8_x4(t.lh[Tables::lo(g + 4)].as_ptr());
            let ht = vld1q_u8_x4(t.lh[Tables::hi(g + 4)].as_ptr());
            let (lb, hb) = lookups(vld1q_u8_x2(blk.qs[p + 2].as_ptr()), &lt, &ht);
            a0 = vreinterpretq_s16_u16(vmlal_u8(vreinterpretq_u16_s16(a0), vget_low_u8(lb), c2));
            a1 = vreinterpretq_s16_u16(vmlal_high_u8(vreinterpretq_u16_s16(a1), lb, c2q));
            a0 = vmlal_s8(a0, vget_low_s8(hb), c32);
            a1 = vmlal_high_s8(a1, hb, c32q);
            let neg = vld1q_dup_s32(&t.neg_sum[k]);
            let s = [
                vaddw_s16(neg, vget_low_s16(a0)),
                vaddw_high_s16(neg, a0),
                vaddw_s16(neg, vget_low_s16(a1)),
                vaddw_high_s16(neg, a1),
            ];
            for (q, sq) in s.into_iter().enumerate() {
                // `sumi += d_a * isum`, fused: the product is exact (see `q1_lut`); the
                // first is `0 + d_a * isum`, the product itself.
                let x = vcvtq_f32_s32(sq);
                sumi[q] = if sb == 0 {
                    vmulq_n_f32(x, t.d[k])
                } else {
                    vfmaq_n_f32(sumi[q], x, t.d[k])
                };
            }
        }
        let dp = blk.d.as_ptr() as *const u16;
        for (q, si) in sumi.into_iter().enumerate() {
            let dw = h2f4(vld1_u16(dp.add(4 * q)));
            // `sum += d_w * sumi`: multiply, then add (not exact: no fused step).
            sums[q] = vaddq_f32(sums[q], vmulq_f32(dw, si));
        }
    }
    for (q, v) in sums.into_iter().enumerate() {
        vst1q_f32(io[4 * q..].as_mut_ptr(), v);
    }
}

/// The NEON instantiation.
pub(super) struct Neon;

impl LutKernel for Neon {
    unsafe fn build(act: &[BlockQ8_0], t: &mut Tables) {
        // SAFETY: the caller's contract (Advanced SIMD).
        unsafe { build(act, t) }
    }
    unsafe fn groups(
        blocks: [&[BlockQ1_0x16]; RG],
        nkb: usize,
        t: &Tables,
        sums: &mut [[f32; R]; RG],
    ) {
        for (x, s) in blocks.into_iter().zip(sums) {
            // SAFETY: the caller's contract (Advanced SIMD; the slices hold `nkb` blocks).
            unsafe { group(x, nkb, t, s) }
        }
    }
}
