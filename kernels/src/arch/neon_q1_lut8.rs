//! Q1_0 and Q2_0 through 8-bit tables on baseline NEON (`--lut8`): the `tbl` half of the
//! inexact arithmetic of [`crate::quant::lut8`] over [`crate::repack::Layout::Q1_0x16Lut8`]
//! and [`crate::repack::Layout::Q2_0x16Lut8`] (the bytes of Q1_0x16 / Q2_0x16, one layout),
//! driven by [`super::q1_lut::matmul`] with its [`super::q1_lut::Tables8`]. Every aarch64
//! core (no dotprod needed).
//!
//! Per 16 rows and one 16-byte load of the rows' code bytes (eight Q1_0 or four Q2_0
//! weights per row): `and` / `ushr` for the two nibbles, one `tbl` per nibble into its
//! table, and each result widened into two i16 accumulators (`saddw` / `saddw2`, started
//! at the block's offset, 0 for Q1_0, by one `ld2r`): 8 instructions per 128 Q1_0
//! multiply-adds against 12.5 in the exact kernel, which needs two tables per group. Per
//! block the accumulators (`isum`, exact in i16) widen, convert and meet `d_w * s` in one
//! fused multiply-add per four rows, as the reference. Per 16 rows and block 165
//! instructions (Q1_0: 0.081 per weight, Q2_0: 0.161), plus the tables (built here with
//! NEON, once per token and 16 blocks).
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use super::neon_legacy::h2f;
use super::q1_lut::{LutKernel, Tables8, KC, R, RG};
use crate::quant::lut8::{block_scale, offset, BlockScale, Lut8Format, GROUPS, Q1, Q2};
use crate::quant::q8_0::BlockQ8_0;
use crate::repack::BlockQ1_0x16;

/// `m[i]` (i16 lanes `n = 0..8`): all ones where bit `i` of `n` is set.
const BIT_MASKS: [[i16; 8]; 3] = {
    let mut m = [[0i16; 8]; 3];
    let mut i = 0;
    while i < 3 {
        let mut n = 0;
        while n < 8 {
            if (n >> i) & 1 == 1 {
                m[i][n] = -1;
            }
            n += 1;
        }
        i += 1;
    }
    m
};

/// One Q1_0 group's 16 table entries (as `Q1::entries`, then `round_entries`): its
/// activations are lanes `$l0, $l0 + 1, $l0 + 2` (and the next) of the widened `$w`, its sum `S` lane
/// `$g` of `$s`. Patterns `n < 8` (bit 3 clear, so `q3` counts negative) are `2 (sum of
/// the set bits' q) - S`, scaled by `$c`, rounded to nearest even (`fcvtns`, the
/// reference's `rne`), narrowed with saturation and clamped to -127; patterns `n >= 8`
/// are `e(n) = -e(15 - n)` (every sign flipped: exact, as rounding to even and the clamp
/// are symmetric).
macro_rules! entries {
    ($w:expr, $s:expr, $m:expr, $c:expr, $l0:literal, $l1:literal, $l2:literal, $g:literal) => {{
        let ms = vaddq_s16(
            vaddq_s16(
                vandq_s16($m[0], vdupq_laneq_s16::<$l0>($w)),
                vandq_s16($m[1], vdupq_laneq_s16::<$l1>($w)),
            ),
            vandq_s16($m[2], vdupq_laneq_s16::<$l2>($w)),
        );
        let t = vsubq_s16(vshlq_n_s16::<1>(ms), vdupq_laneq_s16::<$g>($s));
        let lo = vcvtnq_s32_f32(vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(t))), $c));
        let hi = vcvtnq_s32_f32(vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(t)), $c));
        let e = vmax_s8(
            vqmovn_s16(vqmovn_high_s32(vqmovn_s32(lo), hi)),
            vdup_n_s8(-127),
        );
        vcombine_s8(e, vneg_s8(vrev64_s8(e)))
    }};
}

/// One Q8_0 block's quants `v` widened to i16, in order.
#[inline(always)]
unsafe fn widened(v: [int8x16_t; 2]) -> [int16x8_t; 4] {
    [
        vmovl_s8(vget_low_s8(v[0])),
        vmovl_high_s8(v[0]),
        vmovl_s8(vget_low_s8(v[1])),
        vmovl_high_s8(v[1]),
    ]
}

/// `|q|` of one Q8_0 block's quants `v`, widened to i16 (so -128 gives 128), in order.
#[inline(always)]
unsafe fn abs_widened(v: [int8x16_t; 2]) -> [int16x8_t; 4] {
    let z = vdupq_n_s8(0);
    [
        vabdl_s8(vget_low_s8(v[0]), vget_low_s8(z)),
        vabdl_high_s8(v[0], z),
        vabdl_s8(vget_low_s8(v[1]), vget_low_s8(z)),
        vabdl_high_s8(v[1], z),
    ]
}

/// `max_g sum_i |q_{4g+i}|` of one Q8_0 block's quants `v` (as `Q1::widest`: `|q|`
/// widened, so -128 counts 128).
#[inline(always)]
unsafe fn widest(v: [int8x16_t; 2]) -> i32 {
    let a = abs_widened(v);
    let g = vpaddq_s16(vpaddq_s16(a[0], a[1]), vpaddq_s16(a[2], a[3]));
    i32::from(vmaxvq_s16(g))
}

/// The quants of a Q8_0 block as two vectors.
#[inline(always)]
unsafe fn quants(y: &BlockQ8_0) -> [int8x16_t; 2] {
    let p = y.qs.as_ptr() as *const i8;
    [vld1q_s8(p), vld1q_s8(p.add(16))]
}

/// The scales of one weight block of format `F` (its Q8_0 blocks `y`, quants `v`) by the
/// reference's scalar `block_scale` and `offset`, from `widest` and `bias` (NEON, the same
/// integers as `F::widest` / `F::bias`); writes the table scale and offset and, unless
/// the block is scaled, zero tables.
#[inline(always)]
unsafe fn scale_of<F: Lut8Format>(
    y: &[BlockQ8_0],
    v: &[[int8x16_t; 2]; 4],
    widest: impl Fn([int8x16_t; 2]) -> i32,
    bias: impl Fn([int8x16_t; 2]) -> i32,
    k: usize,
    t: &mut Tables8,
) -> Option<[f32; 4]> {
    let mut d = [0.0f32; 4];
    let mut w = [0i32; 4];
    let mut b = [0i32; 4];
    for j in 0..F::SUB {
        d[j] = h2f(y[j].d);
        w[j] = widest(v[j]);
        b[j] = bias(v[j]);
    }
    let scale = block_scale(&d[..F::SUB], &w[..F::SUB], F::DIV);
    t.s[k] = scale.s();
    t.o[k] = [0; 2];
    match scale {
        BlockScale::Scaled { c, .. } => {
            // |o| <= 2 x 127 x 16 / 3 (see `quant::lut8`): an i16.
            let o = offset(&c[..F::SUB], &b[..F::SUB]) as i16;
            t.o[k] = [o; 2];
            Some(c)
        }
        _ => {
            t.t[k] = [[0; 16]; GROUPS];
            None
        }
    }
}

/// Q1_0's 8-bit tables of `act` (whole Q8_0 blocks, at most `KC * 4`): the block scales
/// by the reference's scalar code, the entries eight groups at a time (about 30
/// instructions per group, against about 80 for the scalar loop).
#[target_feature(enable = "neon")]
unsafe fn build_q1(act: &[BlockQ8_0], t: &mut Tables8) {
    let m = BIT_MASKS.map(|x| vld1q_s16(x.as_ptr()));
    for (k, y) in act.chunks_exact(Q1::SUB).take(KC).enumerate() {
        let v: [[int8x16_t; 2]; 4] = core::array::from_fn(|j| quants(&y[j]));
        let Some(c) = scale_of::<Q1>(y, &v, |x| widest(x), |_| 0, k, t) else {
            continue;
        };
        for (j, vj) in v.iter().enumerate() {
            let c = vdupq_n_f32(c[j]);
            let w = widened(*vj);
            let s = vpaddq_s16(vpaddq_s16(w[0], w[1]), vpaddq_s16(w[2], w[3]));
            let e = [
                entries!(w[0], s, m, c, 0, 1, 2, 0),
                entries!(w[0], s, m, c, 4, 5, 6, 1),
                entries!(w[1], s, m, c, 0, 1, 2, 2),
                entries!(w[1], s, m, c, 4, 5, 6, 3),
                entries!(w[2], s, m, c, 0, 1, 2, 4),
                entries!(w[2], s, m, c, 4, 5, 6, 5),
                entries!(w[3], s, m, c, 0, 1, 2, 6),
                entries!(w[3], s, m, c, 4, 5, 6, 7),
            ];
            for (g, eg) in e.into_iter().enumerate() {
                vst1q_s8(t.t[k][8 * j + g].as_mut_ptr(), eg);
            }
        }
    }
}

/// Q2_0's centred levels `2 L - 1` per nibble `n` (lanes `n = 0..8`, then `8..16`):
/// weight `2g` has code `n & 3`, weight `2g + 1` code `n >> 2`.
const LEVELS: [[i16; 8]; 4] = {
    let mut l = [[0i16; 8]; 4];
    let mut n = 0;
    while n < 16 {
        l[n / 8][n % 8] = 2 * (n & 3) as i16 - 3;
        l[2 + n / 8][n % 8] = 2 * (n >> 2) as i16 - 3;
        n += 1;
    }
    l
};

/// `3 max_p (|q_{2p}| + |q_{2p+1}|)` of one Q8_0 block's quants `v` (as `Q2::widest`).
#[inline(always)]
unsafe fn widest_q2(v: [int8x16_t; 2]) -> i32 {
    let a = abs_widened(v);
    let p = vmaxq_s16(vpaddq_s16(a[0], a[1]), vpaddq_s16(a[2], a[3]));
    3 * i32::from(vmaxvq_s16(p))
}

/// `sum(q)` of one Q8_0 block's quants `v` (as `Q2::bias`).
#[inline(always)]
unsafe fn sum_q(v: [int8x16_t; 2]) -> i32 {
    i32::from(vaddlvq_s8(v[0])) + i32::from(vaddlvq_s8(v[1]))
}

/// One Q2_0 pair's 16 entries (as `Q2::entries` then `round_entries`): its activations are
/// lanes `$l0`, `$l0 + 1` of the widened `$w`; `T(n) = C0(n) q0 + C1(n) q1` (centred
/// levels) in i16, then
/// scaled by `$c`, rounded to nearest even (`fcvtns`), narrowed with saturation and
/// clamped to -127.
macro_rules! pair_entries {
    ($w:expr, $l:expr, $c:expr, $l0:literal, $l1:literal) => {{
        let (q0, q1) = (vdupq_laneq_s16::<$l0>($w), vdupq_laneq_s16::<$l1>($w));
        let t = [
            vmlaq_s16(vmulq_s16($l[0], q0), $l[2], q1),
            vmlaq_s16(vmulq_s16($l[1], q0), $l[3], q1),
        ];
        let r = |x: int16x8_t| {
            let lo = vcvtnq_s32_f32(vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(x))), $c));
            let hi = vcvtnq_s32_f32(vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(x)), $c));
            vqmovn_high_s32(vqmovn_s32(lo), hi)
        };
        vmaxq_s8(
            vqmovn_high_s16(vqmovn_s16(r(t[0])), r(t[1])),
            vdupq_n_s8(-127),
        )
    }};
}

/// Q2_0's 8-bit tables of `act` (whole Q8_0 blocks, at most `KC * 2`).
#[target_feature(enable = "neon")]
unsafe fn build_q2(act: &[BlockQ8_0], t: &mut Tables8) {
    let l = LEVELS.map(|x| vld1q_s16(x.as_ptr()));
    for (k, y) in act.chunks_exact(Q2::SUB).take(KC).enumerate() {
        let mut v = [[vdupq_n_s8(0); 2]; 4];
        v[0] = quants(&y[0]);
        v[1] = quants(&y[1]);
        let Some(c) = scale_of::<Q2>(y, &v, |x| widest_q2(x), |x| sum_q(x), k, t) else {
            continue;
        };
        for (j, vj) in v.iter().take(Q2::SUB).enumerate() {
            let c = vdupq_n_f32(c[j]);
            let w = widened(*vj);
            for (h, wh) in w.into_iter().enumerate() {
                let e = [
                    pair_entries!(wh, l, c, 0, 1),
                    pair_entries!(wh, l, c, 2, 3),
                    pair_entries!(wh, l, c, 4, 5),
                    pair_entries!(wh, l, c, 6, 7),
                ];
                for (i, ei) in e.into_iter().enumerate() {
                    vst1q_s8(t.t[k][16 * j + 4 * h + i].as_mut_ptr(), ei);
                }
            }
        }
    }
}

/// Eight groups (a quarter of a Q1_0 block, sixteen rows) in asm text: the groups'
/// tables (`v0..=v7`, 128 bytes from `{t}`), the rows' four sign-byte vectors (`v8..=v11`,
/// 64 bytes from `{w}`), their low nibbles (`v12..=v15`) and high nibbles (in place), eight
/// `tbl` and the widening adds into `v16` (rows 0..8) and `v17` (rows 8..16), which the
/// block started at its offset.
macro_rules! quarter_asm {
    () => {
        concat!(
            "ld1 {{v0.16b, v1.16b, v2.16b, v3.16b}}, [{t}], #64\n",
            "ld1 {{v4.16b, v5.16b, v6.16b, v7.16b}}, [{t}], #64\n",
            "ld1 {{v8.16b, v9.16b, v10.16b, v11.16b}}, [{w}], #64\n",
            "and v12.16b, v8.16b, v28.16b\n",
            "and v13.16b, v9.16b, v28.16b\n",
            "and v14.16b, v10.16b, v28.16b\n",
            "and v15.16b, v11.16b, v28.16b\n",
            "ushr v8.16b, v8.16b, #4\n",
            "ushr v9.16b, v9.16b, #4\n",
            "ushr v10.16b, v10.16b, #4\n",
            "ushr v11.16b, v11.16b, #4\n",
            "tbl v12.16b, {{v0.16b}}, v12.16b\n",
            "tbl v8.16b, {{v1.16b}}, v8.16b\n",
            "tbl v13.16b, {{v2.16b}}, v13.16b\n",
            "tbl v9.16b, {{v3.16b}}, v9.16b\n",
            "tbl v14.16b, {{v4.16b}}, v14.16b\n",
            "tbl v10.16b, {{v5.16b}}, v10.16b\n",
            "tbl v15.16b, {{v6.16b}}, v15.16b\n",
            "tbl v11.16b, {{v7.16b}}, v11.16b\n",
            "saddw v16.8h, v16.8h, v12.8b\n",
            "saddw2 v17.8h, v17.8h, v12.16b\n",
            "saddw v16.8h, v16.8h, v8.8b\n",
            "saddw2 v17.8h, v17.8h, v8.16b\n",
            "saddw v16.8h, v16.8h, v13.8b\n",
            "saddw2 v17.8h, v17.8h, v13.16b\n",
            "saddw v16.8h, v16.8h, v9.8b\n",
            "saddw2 v17.8h, v17.8h, v9.16b\n",
            "saddw v16.8h, v16.8h, v14.8b\n",
            "saddw2 v17.8h, v17.8h, v14.16b\n",
            "saddw v16.8h, v16.8h, v10.8b\n",
            "saddw2 v17.8h, v17.8h, v10.16b\n",
            "saddw v16.8h, v16.8h, v15.8b\n",
            "saddw2 v17.8h, v17.8h, v15.16b\n",
            "saddw v16.8h, v16.8h, v11.8b\n",
            "saddw2 v17.8h, v17.8h, v11.16b\n",
        )
    };
}

/// `io` (16 rows) plus the dot products of the group-blocks `blocks[..nkb]` with the
/// tabled activations, one weight block per loop trip: the accumulators start at the
/// block's offset (`ld2r`), four quarters, then the rows' f16 scales times the block's
/// table scale (`fcvtl`, `fmul`) and `sum = fma(isum, d_w * s, sum)`.
#[target_feature(enable = "neon")]
unsafe fn group(blocks: &[BlockQ1_0x16], nkb: usize, t: &Tables8, io: &mut [f32; R]) {
    let nkb = nkb.min(blocks.len()).min(KC);
    if nkb == 0 {
        return;
    }
    // SAFETY: NEON (the caller's contract). The asm reads `nkb` group-blocks from
    // `blocks` (288 bytes each: 256 sign bytes, then 32 scale bytes), their tables (512
    // bytes each from `t.t`), scales (`t.s`) and offsets (`t.o`, 4 bytes each), and
    // reads and writes the 16 floats of
    // `io`; it writes only the clobbered registers.
    unsafe {
        core::arch::asm!(
            "ld1 {{v24.4s, v25.4s, v26.4s, v27.4s}}, [{io}]",
            "movi v28.16b, #15",
            "2:",
            "ld1r {{v30.4s}}, [{s}], #4",
            "ld2r {{v16.8h, v17.8h}}, [{o}], #4",
            quarter_asm!(),
            quarter_asm!(),
            quarter_asm!(),
            quarter_asm!(),
            "ld1 {{v8.8h, v9.8h}}, [{w}], #32",
            "fcvtl v10.4s, v8.4h",
            "fcvtl2 v11.4s, v8.8h",
            "fcvtl v12.4s, v9.4h",
            "fcvtl2 v13.4s, v9.8h",
            "fmul v10.4s, v10.4s, v30.4s",
            "fmul v11.4s, v11.4s, v30.4s",
            "fmul v12.4s, v12.4s, v30.4s",
            "fmul v13.4s, v13.4s, v30.4s",
            "sxtl v14.4s, v16.4h",
            "sxtl2 v15.4s, v16.8h",
            "sxtl v18.4s, v17.4h",
            "sxtl2 v19.4s, v17.8h",
            "scvtf v14.4s, v14.4s",
            "scvtf v15.4s, v15.4s",
            "scvtf v18.4s, v18.4s",
            "scvtf v19.4s, v19.4s",
            "fmla v24.4s, v14.4s, v10.4s",
            "fmla v25.4s, v15.4s, v11.4s",
            "fmla v26.4s, v18.4s, v12.4s",
            "fmla v27.4s, v19.4s, v13.4s",
            "subs {k}, {k}, #1",
            "b.ne 2b",
            "st1 {{v24.4s, v25.4s, v26.4s, v27.4s}}, [{io}]",
            io = in(reg) io.as_mut_ptr(),
            w = inout(reg) blocks.as_ptr() => _,
            t = inout(reg) t.t.as_ptr() => _,
            s = inout(reg) t.s.as_ptr() => _,
            o = inout(reg) t.o.as_ptr() => _,
            k = inout(reg) nkb => _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _,
            out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _,
            out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _,
            out("v28") _, out("v30") _,
            options(nostack),
        );
    }
}

/// The 8-bit table kernel over `blocks` (either format: same layout and asm).
#[inline(always)]
unsafe fn groups(
    blocks: [&[BlockQ1_0x16]; RG],
    nkb: usize,
    t: &Tables8,
    sums: &mut [[f32; R]; RG],
) {
    for (x, s) in blocks.into_iter().zip(sums) {
        // SAFETY: the caller's contract (Advanced SIMD; the slices hold `nkb` blocks).
        unsafe { group(x, nkb, t, s) }
    }
}

/// Q1_0 through 8-bit tables on NEON.
pub(super) struct NeonQ1Lut8;
/// Q2_0 through 8-bit tables on NEON (its Q2_0x16 groups read as Q1_0x16: same layout).
pub(super) struct NeonQ2Lut8;

macro_rules! lut8_kernel {
    ($name:ident, $fmt:ty, $build:ident) => {
        impl LutKernel for $name {
            const SUB: usize = <$fmt as Lut8Format>::SUB;
            type Tables = Tables8;
            fn tables() -> Tables8 {
                Tables8::new()
            }
            unsafe fn build(act: &[BlockQ8_0], t: &mut Tables8) {
                // SAFETY: the caller's contract (Advanced SIMD).
                unsafe { $build(act, t) }
            }
            unsafe fn groups(
                blocks: [&[BlockQ1_0x16]; RG],
                nkb: usize,
                t: &Tables8,
                sums: &mut [[f32; R]; RG],
            ) {
                // SAFETY: the caller's contract.
                unsafe { groups(blocks, nkb, t, sums) }
            }
        }
    };
}
lut8_kernel!(NeonQ1Lut8, Q1, build_q1);
lut8_kernel!(NeonQ2Lut8, Q2, build_q2);
