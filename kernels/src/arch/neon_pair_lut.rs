//! TQ2_0 and Q2_0 by table lookup on baseline NEON (no dotprod: Cortex-A53, Apple A7)
//! over the repacked [`crate::repack::Layout::Tq2_0x16`] /
//! [`crate::repack::Layout::Q2_0x16`] layouts: sixteen rows side by side, each byte four
//! consecutive 2-bit codes, so a nibble is the code pair of two consecutive weights.
//!
//! Per activation pair `(a0, a1)` and per token, a 16-entry table holds the pair's dot
//! product with every code pair `n = c0 + 4 c1`: `S(n) = (c0 - 1) a0 + (c1 - 1) a1` (the
//! level is `code - 1`; code 3, level 2, which no TQ2_0 quantizer writes but the
//! reference defines, is tabled too). One `tbl` by a nibble of a 16-row vector then gives
//! sixteen rows' products of two weights. `|S| <= 512` does not fit a byte, so each table
//! is split at the entry, `S = lo + 32 hi` with `lo = S & 31` (0..32) and `hi = S >> 5`
//! (-16..16): two tables per pair, one shared index. The eight pairs of 16 weights add up
//! exactly in bytes (`lo` at most 8 x 31 = 248, `hi` in -128..=120), then widen into
//! 16-bit accumulators. Each row's integer sum over a block is therefore the
//! reference's exact `sum(level * q)`, and the float steps after it are the
//! reference's, lane by lane ([`crate::quant::tq2_0::vec_dot`]: `sum += sumi * (d_a *
//! d_w)` per 256 weights; [`crate::quant::q2_0::vec_dot`]: `sumi += d_a * isum` per Q8_0
//! block, fused as in [`super::neon_ternary_pack`] since the product is exact, and `sum
//! += d_w * sumi` per 64 weights): the result is the plain reference's bit for bit.
//!
//! The same 16-row driver runs Q2_0 with `sdot` over [`crate::repack::Layout::Q2_0x16d`]
//! (dotprod table only, [`Q20d`]): one vector holds sixteen rows times four weights, the
//! rows spread over the four 2-bit fields of each byte, so each masked field is an `sdot`
//! operand for four rows with its own accumulator and nothing is merged (0.185
//! instructions per weight under qemu `max`, against 0.272 for `Q2_0x4`).
//!
//! Per 16 rows x 16 weights: one 64-byte weight load, four 64-byte table loads, eight
//! index operations (`and`, `ushr`), sixteen `tbl`, fourteen byte adds and four widening
//! adds (Q2_0: `uaddw` of `lo` and `smlal` of `hi` by 32 into one i16 pair that ends at
//! the exact `isum`, so a Q8_0 block needs only `sxtl`, `scvtf` and `fmla` after it).
//! Tables are built for [`KCOLS`] columns at a time (16 KiB on the stack); the plain
//! tail rows (`rows % 16`) go to the plain row kernels.
#![allow(unsafe_code)]

use core::arch::aarch64::*;
use core::ops::Range;

use super::neon_legacy::h2f;
use super::neon_ternary_pack::{packed_fn, plain_rows};
use super::table::{KernelTable, PackedJob};
use crate::blocks::{cast, Pod};
use crate::quant::{q2_0, q8_0, q8_k, tq2_0};
use crate::repack::{BlockQ2_0x16, BlockQ2_0x16d, BlockTq2_0x16, BlockTq2_0x16d};
use crate::GgmlType;

/// Rows per group-block.
const R: usize = 16;
/// Weights per unit (one 64-byte load of sixteen rows, eight pairs).
const U: usize = 16;
/// Columns whose tables are built at once.
const KCOLS: usize = 1024;

/// The tables of up to [`KCOLS`] activations: per unit, the `lo` tables of its eight
/// pairs, then their `hi` tables (i8 as bytes), 256 contiguous bytes.
struct Tables([[u8; 16]; KCOLS / U * 16]);

/// `(c0 - 1, c1 - 1)` of entry `n` (i16 lanes 0..8 and 8..16).
const LEVELS: [[i16; 16]; 2] = {
    let mut l = [[0i16; 16]; 2];
    let mut n = 0;
    while n < 16 {
        l[0][n] = (n & 3) as i16 - 1;
        l[1][n] = (n >> 2) as i16 - 1;
        n += 1;
    }
    l
};

/// Build the tables of the int8 quants `q` (a multiple of [`U`]) into `t` (16 per unit).
#[inline(always)]
unsafe fn build(q: &[u8], t: &mut [[u8; 16]]) {
    let c0 = [
        vld1q_s16(LEVELS[0].as_ptr()),
        vld1q_s16(LEVELS[0][8..].as_ptr()),
    ];
    let c1 = [
        vld1q_s16(LEVELS[1].as_ptr()),
        vld1q_s16(LEVELS[1][8..].as_ptr()),
    ];
    let m31 = vdupq_n_u8(31);
    for (u, qs) in q.chunks_exact(U).enumerate() {
        for k in 0..8 {
            let (a0, a1) = (qs[2 * k] as i8 as i16, qs[2 * k + 1] as i8 as i16);
            let s0 = vmlaq_n_s16(vmulq_n_s16(c0[0], a0), c1[0], a1);
            let s1 = vmlaq_n_s16(vmulq_n_s16(c0[1], a0), c1[1], a1);
            let low = vuzp1q_u8(vreinterpretq_u8_s16(s0), vreinterpretq_u8_s16(s1));
            let hi = vshrn_high_n_s16::<5>(vshrn_n_s16::<5>(s0), s1);
            vst1q_u8(t[16 * u + k].as_mut_ptr(), vandq_u8(low, m31));
            vst1q_u8(t[16 * u + 8 + k].as_mut_ptr(), vreinterpretq_u8_s8(hi));
        }
    }
}

/// One unit (16 rows x 16 weights) in asm text: the weights from `{w}`, the unit's 16
/// tables from `{t}` (both advanced), the index nibbles (`and` / `ushr` of each weight
/// vector: pairs 0..8 are `v4, v0, v5, v1, v6, v2, v7, v3`), sixteen `tbl` into the table
/// registers, the byte sums (`lo` in `v12`, then the `hi` tables loaded into the freed
/// registers and summed in `v8`), and four widening adds into the accumulators. Only
/// `v0..=v16` are used, so the caller's sums stay in registers. Written out because LLVM splits the grouped loads into `ldp`
/// pairs and reassociates the sums (about 55 instructions instead of 47).
macro_rules! unit_asm {
    (acc) => {
        unit_asm!(
            "uaddw {a0:v}.8h, {a0:v}.8h, v12.8b\n",
            "uaddw2 {a1:v}.8h, {a1:v}.8h, v12.16b\n",
            "saddw {a2:v}.8h, {a2:v}.8h, v8.8b\n",
            "saddw2 {a3:v}.8h, {a3:v}.8h, v8.16b\n"
        )
    };
    (first) => {
        unit_asm!(
            "ushll {a0:v}.8h, v12.8b, #0\n",
            "ushll2 {a1:v}.8h, v12.16b, #0\n",
            "sshll {a2:v}.8h, v8.8b, #0\n",
            "sshll2 {a3:v}.8h, v8.16b, #0\n"
        )
    };
    ($l0:literal, $l1:literal, $h0:literal, $h1:literal) => {
        concat!(
            "ld1 {{v0.16b, v1.16b, v2.16b, v3.16b}}, [{w}], #64\n",
            "ld1 {{v8.16b, v9.16b, v10.16b, v11.16b}}, [{t}], #64\n",
            "ld1 {{v12.16b, v13.16b, v14.16b, v15.16b}}, [{t}], #64\n",
            "and v4.16b, v0.16b, {m:v}.16b\n",
            "ushr v0.16b, v0.16b, #4\n",
            "and v5.16b, v1.16b, {m:v}.16b\n",
            "ushr v1.16b, v1.16b, #4\n",
            "and v6.16b, v2.16b, {m:v}.16b\n",
            "ushr v2.16b, v2.16b, #4\n",
            "and v7.16b, v3.16b, {m:v}.16b\n",
            "ushr v3.16b, v3.16b, #4\n",
            "tbl v8.16b, {{v8.16b}}, v4.16b\n",
            "tbl v9.16b, {{v9.16b}}, v0.16b\n",
            "tbl v10.16b, {{v10.16b}}, v5.16b\n",
            "tbl v11.16b, {{v11.16b}}, v1.16b\n",
            "tbl v12.16b, {{v12.16b}}, v6.16b\n",
            "tbl v13.16b, {{v13.16b}}, v2.16b\n",
            "tbl v14.16b, {{v14.16b}}, v7.16b\n",
            "tbl v15.16b, {{v15.16b}}, v3.16b\n",
            "add v12.16b, v12.16b, v13.16b\n",
            "add v14.16b, v14.16b, v15.16b\n",
            "add v8.16b, v8.16b, v9.16b\n",
            "add v10.16b, v10.16b, v11.16b\n",
            "add v12.16b, v12.16b, v14.16b\n",
            "add v8.16b, v8.16b, v10.16b\n",
            "add v12.16b, v8.16b, v12.16b\n",
            "ld1 {{v8.16b, v9.16b, v10.16b, v11.16b}}, [{t}], #64\n",
            $l0,
            $l1,
            "ld1 {{v13.16b, v14.16b, v15.16b, v16.16b}}, [{t}], #64\n",
            "tbl v8.16b, {{v8.16b}}, v4.16b\n",
            "tbl v9.16b, {{v9.16b}}, v0.16b\n",
            "tbl v10.16b, {{v10.16b}}, v5.16b\n",
            "tbl v11.16b, {{v11.16b}}, v1.16b\n",
            "tbl v13.16b, {{v13.16b}}, v6.16b\n",
            "tbl v14.16b, {{v14.16b}}, v2.16b\n",
            "tbl v15.16b, {{v15.16b}}, v7.16b\n",
            "tbl v16.16b, {{v16.16b}}, v3.16b\n",
            "add v8.16b, v8.16b, v9.16b\n",
            "add v10.16b, v10.16b, v11.16b\n",
            "add v13.16b, v13.16b, v14.16b\n",
            "add v15.16b, v15.16b, v16.16b\n",
            "add v8.16b, v8.16b, v10.16b\n",
            "add v13.16b, v13.16b, v15.16b\n",
            "add v8.16b, v8.16b, v13.16b\n",
            $h0,
            $h1,
        )
    };
}

/// `$name(w, t) -> Acc`: the byte sums of the units written out in `$body` (the first
/// starts the accumulators, no zeroing, no loop counter) of sixteen rows: the weights at
/// `w` (64 bytes per unit), their tables at `t` (256 bytes per unit).
macro_rules! units_fn {
    ($name:ident, $($body:tt)*) => {
        /// # Safety
        /// NEON; `w` and `t` are readable for the units of the body.
        #[inline(always)]
        unsafe fn $name(w: *const u8, t: *const u8) -> Acc {
            let (lo0, lo1, hi0, hi1);
            // SAFETY: the caller's contract; the asm reads only those bytes and writes
            // only the named and clobbered registers.
            unsafe {
                core::arch::asm!(
                    $($body)*,
                    w = inout(reg) w => _,
                    t = inout(reg) t => _,
                    m = in(vreg) vdupq_n_u8(15),
                    a0 = out(vreg) lo0,
                    a1 = out(vreg) lo1,
                    a2 = out(vreg) hi0,
                    a3 = out(vreg) hi1,
                    out("v0") _, out("v1") _, out("v2") _, out("v3") _,
                    out("v4") _, out("v5") _, out("v6") _, out("v7") _,
                    out("v8") _, out("v9") _, out("v10") _, out("v11") _,
                    out("v12") _, out("v13") _, out("v14") _, out("v15") _,
                    out("v16") _,
                    options(pure, readonly, nostack, preserves_flags),
                );
            }
            Acc { lo: [lo0, lo1], hi: [hi0, hi1] }
        }
    };
}
units_fn!(
    units16,
    unit_asm!(first),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc),
    unit_asm!(acc)
);

/// Two units (one Q8_0 block of Q2_0) of sixteen rows as their exact sums, i16 (rows
/// 0..8 and 8..16): `lo + 32 hi` goes straight into one accumulator pair (`uaddw`,
/// `smlal` by 32), so no merge follows. The 16-bit adds wrap, but the value they end at,
/// `isum` (`|.| <= 2 x 128 x 32 = 2^13`), is an i16, so it is exact.
///
/// # Safety
/// NEON; `w` (128 bytes) and `t` (512 bytes) are readable.
#[inline(always)]
unsafe fn units2_isum(w: *const u8, t: *const u8) -> [int16x8_t; 2] {
    let (i0, i1);
    // SAFETY: the caller's contract; the asm reads only those bytes and writes only the
    // named and clobbered registers.
    unsafe {
        core::arch::asm!(
            unit_asm!(
                "ushll {a0:v}.8h, v12.8b, #0\n",
                "ushll2 {a1:v}.8h, v12.16b, #0\n",
                "smlal {a0:v}.8h, v8.8b, {c:v}.8b\n",
                "smlal2 {a1:v}.8h, v8.16b, {c:v}.16b\n"
            ),
            unit_asm!(
                "uaddw {a0:v}.8h, {a0:v}.8h, v12.8b\n",
                "uaddw2 {a1:v}.8h, {a1:v}.8h, v12.16b\n",
                "smlal {a0:v}.8h, v8.8b, {c:v}.8b\n",
                "smlal2 {a1:v}.8h, v8.16b, {c:v}.16b\n"
            ),
            w = inout(reg) w => _,
            t = inout(reg) t => _,
            m = in(vreg) vdupq_n_u8(15),
            c = in(vreg) vdupq_n_s8(32),
            a0 = out(vreg) i0,
            a1 = out(vreg) i1,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _,
            out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _,
            out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    [i0, i1]
}

/// Sixteen rows' `lo` sums (u16, rows 0..8 and 8..16) and `hi` sums (i16).
#[derive(Clone, Copy)]
struct Acc {
    lo: [uint16x8_t; 2],
    hi: [int16x8_t; 2],
}

impl Acc {
    /// Rows `4q..4q + 4`: `lo + 32 hi` as i32 (exact for any sums the accumulators hold).
    #[inline(always)]
    unsafe fn rows(&self) -> [int32x4_t; 4] {
        core::array::from_fn(|q| {
            let (lo, hi) = (self.lo[q / 2], self.hi[q / 2]);
            let (l, h) = if q % 2 == 0 {
                (vget_low_u16(lo), vshll_n_s16::<5>(vget_low_s16(hi)))
            } else {
                (vget_high_u16(lo), vshll_n_s16::<5>(vget_high_s16(hi)))
            };
            vreinterpretq_s32_u32(vaddw_u16(vreinterpretq_u32_s32(h), l))
        })
    }
}

/// A repacked 16-row format: its group-block, plain type, activation tables and float
/// steps.
trait Fmt {
    type G: Pod;
    const TY: GgmlType;
    /// Weights and bytes of a plain block.
    const QK: usize;
    const BLOCK: usize;
    /// Activation bytes per plain block.
    const ACT: usize;
    /// Table entries per plain block (the pair tables: 16 per unit).
    const TABS: usize = Self::QK / U * 16;
    /// The int8 quants of plain block `b`'s activations `a` (`QK` bytes).
    fn quants(a: &[u8]) -> impl Iterator<Item = &[u8]>;
    /// The tables of the activation blocks `ab` into `t` ([`Fmt::TABS`] per plain
    /// block): the pair tables unless a format says otherwise.
    #[inline(always)]
    unsafe fn build(ab: &[u8], t: &mut [[u8; 16]]) {
        for (i, q) in Self::quants(ab).enumerate() {
            build(q, &mut t[i * q.len() / U * 16..]);
        }
    }
    /// `sum[q] +=` (rows `4q..`) this block's terms, `t`: its tables.
    unsafe fn block(x: &Self::G, a: &[u8], t: &[[u8; 16]], sum: &mut [float32x4_t; 4]);
}

/// The sixteen rows' f16 scales, four rows per vector (one load, `fcvtl` / `fcvtl2`).
#[inline(always)]
unsafe fn scales(d: &[[u8; 2]; 16]) -> [float32x4_t; 4] {
    let v = vld1q_u16_x2(d.as_ptr() as *const u16);
    let (a, b, c, e): (float32x4_t, float32x4_t, float32x4_t, float32x4_t);
    // SAFETY: `fcvtl` / `fcvtl2` are ARMv8-A base SIMD&FP; only the named registers.
    unsafe {
        core::arch::asm!(
            "fcvtl {a:v}.4s, {x:v}.4h",
            "fcvtl2 {b:v}.4s, {x:v}.8h",
            "fcvtl {c:v}.4s, {y:v}.4h",
            "fcvtl2 {e:v}.4s, {y:v}.8h",
            x = in(vreg) v.0,
            y = in(vreg) v.1,
            a = out(vreg) a,
            b = out(vreg) b,
            c = out(vreg) c,
            e = lateout(vreg) e,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    [a, b, c, e]
}

struct Tq2;
impl Fmt for Tq2 {
    type G = BlockTq2_0x16;
    const TY: GgmlType = GgmlType::TQ2_0;
    const QK: usize = tq2_0::QK;
    const BLOCK: usize = tq2_0::BLOCK_BYTES;
    const ACT: usize = q8_k::BLOCK_BYTES;
    fn quants(a: &[u8]) -> impl Iterator<Item = &[u8]> {
        q8_k::act_blocks(a).iter().map(|y| &y.qs[..])
    }
    /// `|sumi| <= 256 x 2 x 128`: the 16-bit `lo` (at most 16 x 248) and `hi` (16 x 128)
    /// sums hold a whole block; `sum += sumi * (d_a * d_w)`.
    #[inline(always)]
    unsafe fn block(x: &BlockTq2_0x16, a: &[u8], t: &[[u8; 16]], sum: &mut [float32x4_t; 4]) {
        // Sixteen units: `QK / U`.
        let acc = units16(x.qs.as_ptr() as *const u8, t.as_ptr() as *const u8);
        let da = q8_k::act_blocks(a)[0].scale();
        let d = scales(&x.d);
        for (q, s) in acc.rows().into_iter().enumerate() {
            let dd = vmulq_n_f32(d[q], da);
            sum[q] = vaddq_f32(sum[q], vmulq_f32(vcvtq_f32_s32(s), dd));
        }
    }
}

struct Q20;
impl Fmt for Q20 {
    type G = BlockQ2_0x16;
    const TY: GgmlType = GgmlType::Q2_0;
    const QK: usize = q2_0::QK;
    const BLOCK: usize = q2_0::BLOCK_BYTES;
    const ACT: usize = 2 * q8_0::BLOCK_BYTES;
    fn quants(a: &[u8]) -> impl Iterator<Item = &[u8]> {
        q8_0::act_blocks(a).iter().map(|y| &y.qs[..])
    }
    /// Per Q8_0 block `sumi += d_a * isum` (fused: `|isum| <= 2^13`, an f16 scale has 11
    /// significant bits, the product is exact), then `sum += d_w * sumi`.
    #[inline(always)]
    unsafe fn block(x: &BlockQ2_0x16, a: &[u8], t: &[[u8; 16]], sum: &mut [float32x4_t; 4]) {
        let w = x.qs.as_ptr() as *const u8;
        let ys = q8_0::act_blocks(a);
        let mut sumi = [vdupq_n_f32(0.0); 4];
        for (s, y) in ys.iter().enumerate().take(2) {
            let isum = units2_isum(w.add(128 * s), t[32 * s..].as_ptr() as *const u8);
            let da = h2f(y.d);
            for (q, si) in sumi.iter_mut().enumerate() {
                let h = isum[q / 2];
                let v = if q % 2 == 0 {
                    vmovl_s16(vget_low_s16(h))
                } else {
                    vmovl_high_s16(h)
                };
                // The first is `0 + d_a * isum`, the product itself.
                *si = if s == 0 {
                    vmulq_n_f32(vcvtq_f32_s32(v), da)
                } else {
                    vfmaq_n_f32(*si, vcvtq_f32_s32(v), da)
                };
            }
        }
        let d = scales(&x.d);
        for q in 0..4 {
            sum[q] = vaddq_f32(sum[q], vmulq_f32(d[q], sumi[q]));
        }
    }
}

/// One vector of [`BlockQ2_0x16d`] (`$v`: sixteen rows times activation word `$j` of
/// `$a`) in asm text: its four fields (three masks `v4..=v6` in place, the top field
/// shifted down) and four `sdot` by element, field `f` into `v16 + f` (rows `4f..4f +
/// 4`, scaled by `4^f` for `f < 3`).
macro_rules! q2d_vec_asm {
    ($v:literal, $a:literal, $j:literal) => {
        concat!(
            "and v7.16b, ",
            $v,
            ".16b, v4.16b\n",
            "and v8.16b, ",
            $v,
            ".16b, v5.16b\n",
            "and v9.16b, ",
            $v,
            ".16b, v6.16b\n",
            "ushr ",
            $v,
            ".16b, ",
            $v,
            ".16b, #6\n",
            "sdot v16.4s, v7.16b, ",
            $a,
            ".4b[",
            $j,
            "]\n",
            "sdot v17.4s, v8.16b, ",
            $a,
            ".4b[",
            $j,
            "]\n",
            "sdot v18.4s, v9.16b, ",
            $a,
            ".4b[",
            $j,
            "]\n",
            "sdot v19.4s, ",
            $v,
            ".16b, ",
            $a,
            ".4b[",
            $j,
            "]\n",
        )
    };
}

/// Four vectors from `{w}` times the four words of `$a`, in asm text.
macro_rules! q2d_quad_asm {
    ($a:literal) => {
        concat!(
            "ld1 {{v24.16b, v25.16b, v26.16b, v27.16b}}, [{w}], #64\n",
            q2d_vec_asm!("v24", $a, "0"),
            q2d_vec_asm!("v25", $a, "1"),
            q2d_vec_asm!("v26", $a, "2"),
            q2d_vec_asm!("v27", $a, "3"),
        )
    };
}

/// The sixteen rows' f16 scales at `{w}` as f32 in asm text: rows 0..4 in `v26`, 4..8
/// in `v27`, 8..12 in `v24`, 12..16 in `v25`.
macro_rules! scales16_asm {
    () => {
        concat!(
            "ld1 {{v24.8h, v25.8h}}, [{w}]\n",
            "fcvtl v26.4s, v24.4h\n",
            "fcvtl2 v27.4s, v24.8h\n",
            "fcvtl v24.4s, v25.4h\n",
            "fcvtl2 v25.4s, v25.8h\n",
        )
    };
}

/// The sixteen rows' sums `v28..=v31` plus the four given registers, in asm text.
macro_rules! sums_add_asm {
    ($a:literal, $b:literal, $c:literal, $d:literal) => {
        concat!(
            "fadd v28.4s, v28.4s, ",
            $a,
            ".4s\n",
            "fadd v29.4s, v29.4s, ",
            $b,
            ".4s\n",
            "fadd v30.4s, v30.4s, ",
            $c,
            ".4s\n",
            "fadd v31.4s, v31.4s, ",
            $d,
            ".4s\n",
        )
    };
}

/// One Q8_0 block of [`BlockQ2_0x16d`] in asm text: its record from `{t}` (`v0`, `v1`:
/// the 32 quants; `v2`: `-s`, `-4 s`, `-16 s`, `d_a` with `s = sum(q)`), the four
/// accumulators started at `-4^f s` (so that field `f`'s ends at `4^f isum`), eight
/// vectors from `{w}`, then `isum` as f32 (`scvtf` with 0, 2, 4 fraction bits: exact,
/// `|4^f isum| <= 2^17`) and `sumi += d_a * isum` into `v20..=v23`, fused (the product
/// is exact, see [`Q20`]); `$op` is `fmul` for the first block (`0 + d_a * isum`).
macro_rules! q2d_sub_asm {
    ($op:literal) => {
        concat!(
            "ld1 {{v0.16b, v1.16b, v2.16b}}, [{t}], #48\n",
            "dup v16.4s, v2.s[0]\n",
            "dup v17.4s, v2.s[1]\n",
            "dup v18.4s, v2.s[2]\n",
            "dup v19.4s, v2.s[0]\n",
            q2d_quad_asm!("v0"),
            q2d_quad_asm!("v1"),
            "scvtf v16.4s, v16.4s\n",
            "scvtf v17.4s, v17.4s, #2\n",
            "scvtf v18.4s, v18.4s, #4\n",
            "scvtf v19.4s, v19.4s\n",
            $op,
            " v20.4s, v16.4s, v2.s[3]\n",
            $op,
            " v21.4s, v17.4s, v2.s[3]\n",
            $op,
            " v22.4s, v18.4s, v2.s[3]\n",
            $op,
            " v23.4s, v19.4s, v2.s[3]\n",
        )
    };
}

/// Q2_0 over [`BlockQ2_0x16d`] with `sdot` (dotprod only): per Q8_0 block and 16 rows
/// 79 instructions (64 of them masks and `sdot`), per Q2_0 block 171 (0.167 per weight).
struct Q20d;
impl Fmt for Q20d {
    type G = BlockQ2_0x16d;
    const TY: GgmlType = GgmlType::Q2_0;
    const QK: usize = q2_0::QK;
    const BLOCK: usize = q2_0::BLOCK_BYTES;
    const ACT: usize = 2 * q8_0::BLOCK_BYTES;
    /// Per Q8_0 block a 48-byte record: the quants, then `-s`, `-4 s`, `-16 s` (i32)
    /// and `d_a` (f32 bits).
    const TABS: usize = 6;
    fn quants(a: &[u8]) -> impl Iterator<Item = &[u8]> {
        q8_0::act_blocks(a).iter().map(|y| &y.qs[..])
    }
    #[inline(always)]
    unsafe fn build(ab: &[u8], t: &mut [[u8; 16]]) {
        for (y, r) in q8_0::act_blocks(ab).iter().zip(t.chunks_exact_mut(3)) {
            let s = y.q_sum();
            r[0].copy_from_slice(&y.qs[..16]);
            r[1].copy_from_slice(&y.qs[16..]);
            let c = [-s, -4 * s, -16 * s, y.scale().to_bits() as i32];
            for (b, v) in r[2].chunks_exact_mut(4).zip(c) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    /// Per Q8_0 block `sumi += d_a * isum` (fused, as [`Q20`]), then `sum += d_w *
    /// sumi` (multiply, then add).
    #[inline(always)]
    unsafe fn block(x: &BlockQ2_0x16d, _: &[u8], t: &[[u8; 16]], sum: &mut [float32x4_t; 4]) {
        let [mut s0, mut s1, mut s2, mut s3] = *sum;
        // SAFETY: dotprod (the caller's contract: only the dotprod table lists this
        // layout's kernel). The asm reads the 288 bytes of `x` and the block's two
        // 48-byte records (`t` holds at least `TABS` entries), and writes only the named
        // and clobbered registers.
        unsafe {
            core::arch::asm!(
                q2d_sub_asm!("fmul"),
                q2d_sub_asm!("fmla"),
                scales16_asm!(),
                "fmul v20.4s, v26.4s, v20.4s",
                "fmul v21.4s, v27.4s, v21.4s",
                "fmul v22.4s, v24.4s, v22.4s",
                "fmul v23.4s, v25.4s, v23.4s",
                sums_add_asm!("v20", "v21", "v22", "v23"),
                w = inout(reg) (x as *const BlockQ2_0x16d).cast::<u8>() => _,
                t = inout(reg) t[..Self::TABS].as_ptr() => _,
                in("v4") vdupq_n_u8(0x03),
                in("v5") vdupq_n_u8(0x0c),
                in("v6") vdupq_n_u8(0x30),
                inout("v28") s0,
                inout("v29") s1,
                inout("v30") s2,
                inout("v31") s3,
                out("v0") _, out("v1") _, out("v2") _,
                out("v7") _, out("v8") _, out("v9") _,
                out("v16") _, out("v17") _, out("v18") _, out("v19") _,
                out("v20") _, out("v21") _, out("v22") _, out("v23") _,
                out("v24") _, out("v25") _, out("v26") _, out("v27") _,
                options(readonly, nostack, preserves_flags),
            );
        }
        *sum = [s0, s1, s2, s3];
    }
}

/// TQ2_0 over [`BlockTq2_0x16d`] with `sdot` (dotprod only), as [`Q20d`] with one
/// activation block per plain block: per 16 rows 562 instructions per block (0.137 per
/// weight), 512 of them masks and `sdot`.
struct Tq2d;
impl Fmt for Tq2d {
    type G = BlockTq2_0x16d;
    const TY: GgmlType = GgmlType::TQ2_0;
    const QK: usize = tq2_0::QK;
    const BLOCK: usize = tq2_0::BLOCK_BYTES;
    const ACT: usize = q8_k::BLOCK_BYTES;
    /// Per block a 272-byte record: `-s`, `-4 s`, `-16 s` (i32, `s = sum(q)`) and `d_a`
    /// (f32 bits), then the 256 quants.
    const TABS: usize = 17;
    fn quants(a: &[u8]) -> impl Iterator<Item = &[u8]> {
        q8_k::act_blocks(a).iter().map(|y| &y.qs[..])
    }
    #[inline(always)]
    unsafe fn build(ab: &[u8], t: &mut [[u8; 16]]) {
        for (y, r) in q8_k::act_blocks(ab).iter().zip(t.chunks_exact_mut(17)) {
            let s: i32 = y.qs.iter().map(|&q| q as i8 as i32).sum();
            let c = [-s, -4 * s, -16 * s, y.scale().to_bits() as i32];
            for (b, v) in r[0].chunks_exact_mut(4).zip(c) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            for (e, q) in r[1..].iter_mut().zip(y.qs.chunks_exact(16)) {
                e.copy_from_slice(q);
            }
        }
    }
    /// `|4^f isum| <= 16 x 256 x 2 x 128 = 2^20`: exact in i32 and in the fixed-point
    /// `scvtf`; `sum += isum * (d_a * d_w)` (multiply, multiply, add), as the reference.
    #[inline(always)]
    unsafe fn block(x: &BlockTq2_0x16d, _: &[u8], t: &[[u8; 16]], sum: &mut [float32x4_t; 4]) {
        let [mut s0, mut s1, mut s2, mut s3] = *sum;
        // SAFETY: dotprod (only the dotprod table lists this layout's kernel). The asm
        // reads the 1056 bytes of `x` and the block's 272-byte record (`t` holds at least
        // `TABS` entries), and writes only the named and clobbered registers.
        unsafe {
            core::arch::asm!(
                "ld1 {{v20.16b}}, [{t}], #16",
                "dup v16.4s, v20.s[0]",
                "dup v17.4s, v20.s[1]",
                "dup v18.4s, v20.s[2]",
                "dup v19.4s, v20.s[0]",
                "ld1 {{v0.16b, v1.16b, v2.16b, v3.16b}}, [{t}], #64",
                q2d_quad_asm!("v0"),
                q2d_quad_asm!("v1"),
                q2d_quad_asm!("v2"),
                q2d_quad_asm!("v3"),
                "ld1 {{v0.16b, v1.16b, v2.16b, v3.16b}}, [{t}], #64",
                q2d_quad_asm!("v0"),
                q2d_quad_asm!("v1"),
                q2d_quad_asm!("v2"),
                q2d_quad_asm!("v3"),
                "ld1 {{v0.16b, v1.16b, v2.16b, v3.16b}}, [{t}], #64",
                q2d_quad_asm!("v0"),
                q2d_quad_asm!("v1"),
                q2d_quad_asm!("v2"),
                q2d_quad_asm!("v3"),
                "ld1 {{v0.16b, v1.16b, v2.16b, v3.16b}}, [{t}], #64",
                q2d_quad_asm!("v0"),
                q2d_quad_asm!("v1"),
                q2d_quad_asm!("v2"),
                q2d_quad_asm!("v3"),
                "scvtf v16.4s, v16.4s",
                "scvtf v17.4s, v17.4s, #2",
                "scvtf v18.4s, v18.4s, #4",
                "scvtf v19.4s, v19.4s",
                scales16_asm!(),
                "fmul v26.4s, v26.4s, v20.s[3]",
                "fmul v27.4s, v27.4s, v20.s[3]",
                "fmul v24.4s, v24.4s, v20.s[3]",
                "fmul v25.4s, v25.4s, v20.s[3]",
                "fmul v16.4s, v16.4s, v26.4s",
                "fmul v17.4s, v17.4s, v27.4s",
                "fmul v18.4s, v18.4s, v24.4s",
                "fmul v19.4s, v19.4s, v25.4s",
                sums_add_asm!("v16", "v17", "v18", "v19"),
                w = inout(reg) (x as *const BlockTq2_0x16d).cast::<u8>() => _,
                t = inout(reg) t[..Self::TABS].as_ptr() => _,
                in("v4") vdupq_n_u8(0x03),
                in("v5") vdupq_n_u8(0x0c),
                in("v6") vdupq_n_u8(0x30),
                inout("v28") s0,
                inout("v29") s1,
                inout("v30") s2,
                inout("v31") s3,
                out("v0") _, out("v1") _, out("v2") _, out("v3") _,
                out("v7") _, out("v8") _, out("v9") _,
                out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _,
                out("v24") _, out("v25") _, out("v26") _, out("v27") _,
                options(readonly, nostack, preserves_flags),
            );
        }
        *sum = [s0, s1, s2, s3];
    }
}

/// The product over a repacked tensor of format `F` for `rows` and every activation row;
/// `false` (nothing written) when the shapes do not fit.
///
/// # Safety
/// NEON; `table` is a table for this CPU.
#[inline(always)]
unsafe fn run<F: Fmt>(
    table: &'static KernelTable,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) -> bool {
    let shape = (F::BLOCK, F::ACT, R);
    let Some(PackedJob { n_tok, arb, split }) =
        PackedJob::new(w, row_bytes, &rows, acts, out.len(), shape)
    else {
        return false;
    };
    let (head, tail) = out.split_at_mut((split - rows.start) * n_tok);
    if !plain_rows(table, F::TY, w, row_bytes, split..rows.end, acts, arb, tail) {
        return false;
    }
    if split == rows.start {
        return true;
    }
    let nb = row_bytes / F::BLOCK;
    let kb = KCOLS / F::QK;
    let gb = R * row_bytes;
    let (g0, g1) = (rows.start / R, split.div_ceil(R));
    let mut tabs = Tables([[0; 16]; KCOLS / U * 16]);
    for t in 0..n_tok {
        let a = &acts[t * arb..(t + 1) * arb];
        for b0 in (0..nb).step_by(kb) {
            let nkb = kb.min(nb - b0);
            let ab = &a[b0 * F::ACT..(b0 + nkb) * F::ACT];
            F::build(ab, &mut tabs.0);
            for g in g0..g1 {
                let Some(x) = cast::<F::G>(&w[g * gb..(g + 1) * gb]) else {
                    return false;
                };
                let first = g * R;
                // A whole group in range with one token: its sums are 16 contiguous outputs.
                let whole = n_tok == 1 && rows.start <= first && first + R <= split;
                let live = |j: usize| (rows.start..split).contains(&(first + j));
                let at = |j: usize| (first + j - rows.start) * n_tok + t;
                let mut s = [0f32; R];
                if b0 > 0 {
                    if whole {
                        s.copy_from_slice(&head[first - rows.start..first - rows.start + R]);
                    } else {
                        for (j, v) in s.iter_mut().enumerate() {
                            if live(j) {
                                *v = head[at(j)];
                            }
                        }
                    }
                }
                let mut sum: [float32x4_t; 4] =
                    core::array::from_fn(|q| vld1q_f32(s[4 * q..].as_ptr()));
                for b in 0..nkb {
                    let tb = &tabs.0[b * F::TABS..];
                    F::block(&x[b0 + b], &ab[b * F::ACT..(b + 1) * F::ACT], tb, &mut sum);
                }
                for (q, v) in sum.into_iter().enumerate() {
                    vst1q_f32(s[4 * q..].as_mut_ptr(), v);
                }
                if whole {
                    head[first - rows.start..first - rows.start + R].copy_from_slice(&s);
                    continue;
                }
                for (j, v) in s.into_iter().enumerate() {
                    if live(j) {
                        head[at(j)] = v;
                    }
                }
            }
        }
    }
    true
}

packed_fn!(tq2_0x16_base, tq2_0x16_base_in, "neon", run::<Tq2>);
packed_fn!(q2_0x16_base, q2_0x16_base_in, "neon", run::<Q20>);
packed_fn!(q2_0x16d_dot, q2_0x16d_dot_in, "neon,dotprod", run::<Q20d>);
packed_fn!(tq2_0x16d_dot, tq2_0x16d_dot_in, "neon,dotprod", run::<Tq2d>);
