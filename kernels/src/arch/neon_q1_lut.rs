//! Q1_0 by table lookup on baseline NEON: the `tbl` half of [`super::q1_lut`] (which
//! states the arithmetic and why it is exact). Runs on every aarch64 core (Cortex-A53,
//! Apple A7: no dotprod needed; the dotprod table uses it too: a bit-plane `cmtst` +
//! `sdot` kernel needs a mask and an `sdot` per 16 multiply-adds, against one `tbl`
//! pair per 64 here).
//!
//! Per 16 rows and four activations: one `tbl` into the `L` table and one into the `H`
//! table, indexed by a nibble of the rows' sign bytes (`and` / `ushr` of one 16-byte
//! load, shared by both lookups). Four groups add up in bytes, then go into two i16
//! accumulators started at `-sum(q)` as `2 L + 32 H` (`umlal`, `smlal`); per Q8_0 block
//! the accumulators widen (`sxtl`), convert and meet the activation scale in one `fmla`
//! per four rows (exact, see [`super::q1_lut`]). One row group at a time: the tables of
//! one half Q8_0 block (8 registers), the accumulators and the temporaries fill the 32
//! vector registers. Per 16 rows and Q8_0 block 63 instructions (50 of them lookups,
//! their indices, byte sums and widening), per Q1_0 block 268 (0.131 per weight).
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_legacy::h2f;
use super::q1_lut::{LutKernel, Tables, KC, R, RG, SUB};
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
        t.neg_sum[k] = [-y.q_sum() as i16; 2];
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

/// Half a Q8_0 block (four groups, sixteen rows) in asm text: the groups' `L` and `H`
/// tables (`v0..=v3`, `v4..=v7`, 128 bytes from `{t}`), the rows' two sign-byte vectors
/// (`v8`, `v9`, 32 bytes from `{w}`), their nibbles (`and` / `ushr`, `v10..=v13`),
/// eight `tbl`, the byte sums of `L` (`v14`, at most 4 x 60 = 240) and `H` (`v8`, i8:
/// -128..=112), and `acc += 2 L + 32 H` into the 16-bit accumulators `v18` (rows 0..8)
/// and `v19` (rows 8..16) with `umlal` / `smlal` by the constant vectors `v29` (2) and
/// `v30` (32). The 16-bit arithmetic wraps, but the value it ends at (`isum`, `|.| <=
/// 4096`) is an i16, so it is exact. 25 instructions per 256 multiply-adds.
macro_rules! half_asm {
    () => {
        concat!(
            "ld1 {{v0.16b, v1.16b, v2.16b, v3.16b}}, [{t}], #64\n",
            "ld1 {{v4.16b, v5.16b, v6.16b, v7.16b}}, [{t}], #64\n",
            "ld1 {{v8.16b, v9.16b}}, [{w}], #32\n",
            "and v10.16b, v8.16b, v28.16b\n",
            "ushr v11.16b, v8.16b, #4\n",
            "and v12.16b, v9.16b, v28.16b\n",
            "ushr v13.16b, v9.16b, #4\n",
            "tbl v14.16b, {{v0.16b}}, v10.16b\n",
            "tbl v15.16b, {{v1.16b}}, v11.16b\n",
            "tbl v16.16b, {{v2.16b}}, v12.16b\n",
            "tbl v17.16b, {{v3.16b}}, v13.16b\n",
            "tbl v8.16b, {{v4.16b}}, v10.16b\n",
            "tbl v9.16b, {{v5.16b}}, v11.16b\n",
            "tbl v10.16b, {{v6.16b}}, v12.16b\n",
            "tbl v11.16b, {{v7.16b}}, v13.16b\n",
            "add v14.16b, v14.16b, v15.16b\n",
            "add v16.16b, v16.16b, v17.16b\n",
            "add v8.16b, v8.16b, v9.16b\n",
            "add v10.16b, v10.16b, v11.16b\n",
            "add v14.16b, v14.16b, v16.16b\n",
            "add v8.16b, v8.16b, v10.16b\n",
            "umlal v18.8h, v14.8b, v29.8b\n",
            "umlal2 v19.8h, v14.16b, v29.16b\n",
            "smlal v18.8h, v8.8b, v30.8b\n",
            "smlal2 v19.8h, v8.16b, v30.16b\n",
        )
    };
}

/// One Q8_0 block (`$lane`: its scale's lane of `v31`) in asm text: the accumulators
/// start at `-sum(q)` (`ld2r` from `{n}`), two halves, then `isum` widened to i32,
/// converted, and `sumi += d_a * isum` into `v20..=v23` (rows 4q..4q + 4), fused: the
/// product is exact (see [`super::q1_lut`]). `$op` is `fmul` for the first block (the
/// product itself: `0 + d_a * isum`) and `fmla` after it.
macro_rules! sub_asm {
    ($op:literal, $lane:literal) => {
        concat!(
            "ld2r {{v18.8h, v19.8h}}, [{n}], #4\n",
            half_asm!(),
            half_asm!(),
            "sxtl v14.4s, v18.4h\n",
            "sxtl2 v15.4s, v18.8h\n",
            "sxtl v16.4s, v19.4h\n",
            "sxtl2 v17.4s, v19.8h\n",
            "scvtf v14.4s, v14.4s\n",
            "scvtf v15.4s, v15.4s\n",
            "scvtf v16.4s, v16.4s\n",
            "scvtf v17.4s, v17.4s\n",
            $op,
            " v20.4s, v14.4s, v31.s[",
            $lane,
            "]\n",
            $op,
            " v21.4s, v15.4s, v31.s[",
            $lane,
            "]\n",
            $op,
            " v22.4s, v16.4s, v31.s[",
            $lane,
            "]\n",
            $op,
            " v23.4s, v17.4s, v31.s[",
            $lane,
            "]\n",
        )
    };
}

/// `sums` (16 rows) plus the dot products of the group-blocks `blocks[..nkb]` with the
/// tabled activations, one Q1_0 block per loop trip, written out in asm (LLVM split
/// the grouped loads, turned the multiply-accumulates by constants into `mul`/`mla`
/// after widening adds and spilled: about 330 instructions per block against 268).
/// Per block: four Q8_0 blocks, then the rows' f16 scales (`fcvtl`) and `sum += d_w *
/// sumi` (multiply, then add: no fused step, as the reference).
#[target_feature(enable = "neon")]
unsafe fn group(blocks: &[BlockQ1_0x16], nkb: usize, t: &Tables, io: &mut [f32; R]) {
    let nkb = nkb.min(blocks.len()).min(KC);
    if nkb == 0 {
        return;
    }
    // SAFETY: NEON (the caller's contract). The asm reads `nkb` group-blocks from
    // `blocks` (288 bytes each: 256 sign bytes, then 32 scale bytes), their tables
    // (1024 bytes each from `t.lh`), `4 nkb` entries of `t.neg_sum` and of `t.d`, and
    // reads and writes the 16 floats of `io`; it writes only the clobbered registers.
    unsafe {
        core::arch::asm!(
            "ld1 {{v24.4s, v25.4s, v26.4s, v27.4s}}, [{io}]",
            "movi v28.16b, #15",
            "movi v29.16b, #2",
            "movi v30.16b, #32",
            "2:",
            "ldr q31, [{d}], #16",
            sub_asm!("fmul", "0"),
            sub_asm!("fmla", "1"),
            sub_asm!("fmla", "2"),
            sub_asm!("fmla", "3"),
            "ld1 {{v8.8h, v9.8h}}, [{w}], #32",
            "fcvtl v10.4s, v8.4h",
            "fcvtl2 v11.4s, v8.8h",
            "fcvtl v12.4s, v9.4h",
            "fcvtl2 v13.4s, v9.8h",
            "fmul v20.4s, v10.4s, v20.4s",
            "fmul v21.4s, v11.4s, v21.4s",
            "fmul v22.4s, v12.4s, v22.4s",
            "fmul v23.4s, v13.4s, v23.4s",
            "fadd v24.4s, v24.4s, v20.4s",
            "fadd v25.4s, v25.4s, v21.4s",
            "fadd v26.4s, v26.4s, v22.4s",
            "fadd v27.4s, v27.4s, v23.4s",
            "subs {k}, {k}, #1",
            "b.ne 2b",
            "st1 {{v24.4s, v25.4s, v26.4s, v27.4s}}, [{io}]",
            io = in(reg) io.as_mut_ptr(),
            w = inout(reg) blocks.as_ptr() => _,
            t = inout(reg) t.lh.as_ptr() => _,
            n = inout(reg) t.neg_sum.as_ptr() => _,
            d = inout(reg) t.d.as_ptr() => _,
            k = inout(reg) nkb => _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _,
            out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _,
            out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _,
            out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _,
            out("v28") _, out("v29") _, out("v30") _, out("v31") _,
            options(nostack),
        );
    }
}

/// The NEON instantiation.
pub(super) struct Neon;

impl LutKernel for Neon {
    type Tables = Tables;
    fn tables() -> Tables {
        Tables::new()
    }
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
