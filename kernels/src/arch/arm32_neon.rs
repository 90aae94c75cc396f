//! NEON dot products for 32-bit ARM (armv7-a): Q8_0, Q4_0, Q5_0, Q1_0 (with Q8_0
//! activations) and Q4_K (with Q8_K).
//!
//! `core::arch::arm`'s NEON intrinsics and `#[target_feature(enable = "neon")]` are
//! unstable on 32-bit ARM, and the armv7 target's baseline is VFPv3-D16 without NEON (not
//! every armv7 core has it: Cortex-A9 routers often lack it). So the integer inner loops
//! are stable inline assembly that enables NEON only inside each block ([`neon_asm`]), and
//! the table of [`super::arm32_table`] holding these functions is picked only when
//! detection proved NEON present (`HWCAP_NEON`, see [`crate::CpuFeatures::detect`]). The blocks use `q0`-`q7` (`d0`-`d15`), the registers a D16 target
//! knows, and declare each one they write.
//!
//! Each block computes a block's integer sums exactly (`vmull.s8` is exact in i16, then
//! `vpadal.s16` widens into i32), and the float steps are the scalar reference's, step
//! for step, in Rust, so the results are bit-identical to `crate::quant` in the order
//! `crate::quant::q8_0::Order::of` names for NEON (Q8_0 and Q5_0 sum each block, as on
//! aarch64).
#![allow(unsafe_code)]

/// `asm!` with NEON enabled for its block: the `.fpu neon` directive on Linux (NEON is
/// not in the armv7 target's baseline), nothing on Apple's armv7s, whose baseline has
/// NEON and whose Mach-O assembler has no `.fpu`.
#[cfg(not(target_vendor = "apple"))]
macro_rules! neon_asm {
    ($($t:tt)*) => { core::arch::asm!(".fpu neon", $($t)*) };
}
#[cfg(target_vendor = "apple")]
macro_rules! neon_asm {
    ($($t:tt)*) => { core::arch::asm!($($t)*) };
}

/// A block's exact dot product: `block_dot!(setup lines; operands)` runs the setup, which
/// leaves 32 signed bytes in `d0`-`d3` and 32 more in `d4`-`d7`, then forms the 32
/// products exactly (`vmull.s8`: |i8 * i8| <= 16384 fits i16), widens them into four i32
/// lanes (`vpaddl`/`vpadal.s16`) and adds those into the operand `r`. Every NEON register
/// it may touch (`d0`-`d15`) is declared clobbered; it only reads memory.
macro_rules! block_dot {
    ($($setup:literal,)* ; $($operands:tt)*) => {
        neon_asm!(
            $($setup,)*
            "vmull.s8 q4, d0, d4",
            "vmull.s8 q5, d1, d5",
            "vmull.s8 q6, d2, d6",
            "vmull.s8 q7, d3, d7",
            "vpaddl.s16 q4, q4",
            "vpadal.s16 q4, q5",
            "vpadal.s16 q4, q6",
            "vpadal.s16 q4, q7",
            "vadd.i32 d8, d8, d9",
            "vpadd.i32 d8, d8, d8",
            "vmov.32 {r}, d8[0]",
            $($operands)*
            out("d0") _, out("d1") _, out("d2") _, out("d3") _,
            out("d4") _, out("d5") _, out("d6") _, out("d7") _,
            out("d8") _, out("d9") _, out("d10") _, out("d11") _,
            out("d12") _, out("d13") _, out("d14") _, out("d15") _,
            options(nostack, readonly, preserves_flags),
        )
    };
}

use crate::f16::read_f16;
use crate::quant::q1_0::BlockQ1_0;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_k::{self, BlockQ4K};
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q8_0::{self, BlockQ8_0};
use crate::quant::q8_k::BlockQ8K;

/// Q8_0 x Q8_0 over paired blocks.
///
/// # Safety
/// The CPU has NEON.
pub(super) unsafe fn q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    q8_0::block_sum_dot(w.iter().zip(a).map(|(x, y)| {
        // SAFETY: the caller guarantees NEON.
        let s = unsafe { dot32(&x.qs, &y.qs) };
        (x.scale() * y.scale(), s)
    }))
}

/// Q4_0 x Q8_0 over paired blocks.
///
/// # Safety
/// The CPU has NEON.
pub(super) unsafe fn q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        // SAFETY: the caller guarantees NEON.
        let sumi = unsafe { dot_q4_0(&x.qs, &y.qs) };
        sum += sumi as f32 * read_f16(x.d) * y.scale();
    }
    sum
}

/// Q5_0 x Q8_0 over paired blocks.
///
/// # Safety
/// The CPU has NEON.
pub(super) unsafe fn q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    q8_0::block_sum_dot(w.iter().zip(a).map(|(x, y)| {
        // SAFETY: the caller guarantees NEON.
        let s = unsafe { dot_q5_0(&x.qh, &x.qs, &y.qs) };
        (read_f16(x.d) * y.scale(), s)
    }))
}

/// Q1_0 x Q8_0 (four activation blocks per weight block).
///
/// # Safety
/// The CPU has NEON.
pub(super) unsafe fn q1_0(w: &[BlockQ1_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (x, ys) in w.iter().zip(a.chunks_exact(4)) {
        let mut sumi = 0.0f32;
        for (bits, y) in x.qs.as_chunks::<4>().0.iter().zip(ys) {
            // SAFETY: the caller guarantees NEON.
            let block = unsafe { dot_signs(bits, &y.qs) };
            sumi += y.scale() * block as f32;
        }
        sum += read_f16(x.d) * sumi;
    }
    sum
}

/// Q4_K x Q8_K over paired blocks: the float steps of `crate::quant::q8_k::kquant_dot`
/// around the NEON lane sums.
///
/// # Safety
/// The CPU has NEON.
pub(super) unsafe fn q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut mins = 0f32;
    for (x, y) in w.iter().zip(a) {
        let t = q4_k::terms(x, y);
        let scales: [i32; 16] = core::array::from_fn(|g| i32::from(t.scales[g]));
        let mut lanes = [0i32; 8];
        let parts = x.qs.as_chunks::<32>().0.iter();
        let parts = parts
            .zip(y.qs.as_chunks::<64>().0)
            .zip(scales.as_chunks::<4>().0);
        for ((qs, a), sc) in parts {
            // SAFETY: the caller guarantees NEON.
            unsafe { lanes_q4_64(qs, a, sc, &mut lanes) };
        }
        lanes[0] = lanes[0].wrapping_sub(t.offset);
        for (s, lane) in acc.iter_mut().zip(lanes) {
            *s = libm::fmaf(t.d, lane as f32, *s);
        }
        mins += t.dmin * t.mins as f32;
    }
    q8_0::hsum8(acc) - mins
}

/// Exact `sum(w[j] * a[j])` of 32 signed bytes each.
///
/// # Safety
/// The CPU must have NEON.
#[inline]
unsafe fn dot32(w: &[u8; 32], a: &[u8; 32]) -> i32 {
    let r: i32;
    // SAFETY: reads 32 bytes at each pointer, which the array references cover; writes
    // only the declared registers. NEON is the caller's precondition.
    unsafe {
        block_dot!(
            "vld1.8 {{d0, d1, d2, d3}}, [{w}]",
            "vld1.8 {{d4, d5, d6, d7}}, [{a}]",
            ;
            w = in(reg) w.as_ptr(),
            a = in(reg) a.as_ptr(),
            r = out(reg) r,
        );
    }
    r
}

/// Exact `sum((nibble(j) - 8) * a[j])` of one Q4_0 block (low nibbles are weights 0..16,
/// high nibbles 16..32) with a Q8_0 activation block.
///
/// # Safety
/// The CPU must have NEON.
#[inline]
unsafe fn dot_q4_0(qs: &[u8; 16], a: &[u8; 32]) -> i32 {
    let r: i32;
    // SAFETY: reads 16 bytes at `qs` and 32 at `a`, which the array references cover;
    // writes only the declared registers. NEON is the caller's precondition.
    unsafe {
        block_dot!(
            "vld1.8 {{d0, d1}}, [{qs}]",
            "vmov.i8 q1, #15",
            "vand q2, q0, q1",
            "vshr.u8 q3, q0, #4",
            "vmov.i8 q1, #8",
            "vsub.i8 q2, q2, q1",
            "vsub.i8 q3, q3, q1",
            "vld1.8 {{d0, d1, d2, d3}}, [{a}]",
            ;
            qs = in(reg) qs.as_ptr(),
            a = in(reg) a.as_ptr(),
            r = out(reg) r,
        );
    }
    r
}

/// Exact `sum((nibble(j) | bit(j) << 4) - 16) * a[j])` of one Q5_0 block (fifth bit `j`
/// at bit `j % 8` of `qh[j / 8]`) with a Q8_0 activation block.
///
/// # Safety
/// The CPU must have NEON.
#[inline]
unsafe fn dot_q5_0(qh: &[u8; 4], qs: &[u8; 16], a: &[u8; 32]) -> i32 {
    let r: i32;
    // SAFETY: reads 4 bytes at `qh`, 16 at `qs`, 32 at `a` and 8 at `BIT_OF_LANE`, which
    // the references cover; writes only the declared registers. NEON is the caller's
    // precondition. q2/q3 get the low four bits of weights 0..16/16..32, the `vtst`
    // masks of the fifth bits (and 16) add bit 4, then 16 is subtracted.
    unsafe {
        block_dot!(
            "vld1.8 {{d0, d1}}, [{qs}]",
            "vmov.i8 q1, #15",
            "vand q2, q0, q1",
            "vshr.u8 q3, q0, #4",
            "vld1.8 {{d0[]}}, [{qh}]!",
            "vld1.8 {{d1[]}}, [{qh}]!",
            "vld1.8 {{d2[]}}, [{qh}]!",
            "vld1.8 {{d3[]}}, [{qh}]",
            "vld1.8 {{d8}}, [{lanes}]",
            "vtst.8 d0, d0, d8",
            "vtst.8 d1, d1, d8",
            "vtst.8 d2, d2, d8",
            "vtst.8 d3, d3, d8",
            "vmov.i8 q4, #16",
            "vand q0, q0, q4",
            "vand q1, q1, q4",
            "vorr q2, q2, q0",
            "vorr q3, q3, q1",
            "vsub.i8 q2, q2, q4",
            "vsub.i8 q3, q3, q4",
            "vld1.8 {{d0, d1, d2, d3}}, [{a}]",
            ;
            qh = inout(reg) qh.as_ptr() => _,
            qs = in(reg) qs.as_ptr(),
            lanes = in(reg) BIT_OF_LANE.as_ptr(),
            a = in(reg) a.as_ptr(),
            r = out(reg) r,
        );
    }
    r
}

/// Bit `j % 8` of each lane's byte, as in Q1_0 blocks and Q5_0's fifth bits.
static BIT_OF_LANE: [u8; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// Exact `sum(bit(j) ? a[j] : -a[j])` over 32 activations, with bit `j` at bit `j % 8`
/// of `bits[j / 8]` (one Q8_0 sub-block of a Q1_0 block).
///
/// # Safety
/// The CPU must have NEON.
#[inline]
unsafe fn dot_signs(bits: &[u8; 4], a: &[u8; 32]) -> i32 {
    let r: i32;
    // SAFETY: reads 4 bytes at `bits`, 32 at `a` and 8 at `BIT_OF_LANE`, which the
    // references cover; writes only the declared registers. NEON is the caller's
    // precondition. Each sign byte is -1 where the bit is set and +1 where it is not
    // (`vtst` mask | 1), so the product sum is the negated answer.
    unsafe {
        block_dot!(
            "vld1.8 {{d0[]}}, [{bits}]!",
            "vld1.8 {{d1[]}}, [{bits}]!",
            "vld1.8 {{d2[]}}, [{bits}]!",
            "vld1.8 {{d3[]}}, [{bits}]",
            "vld1.8 {{d8}}, [{lanes}]",
            "vmov.i8 d9, #1",
            "vtst.8 d0, d0, d8",
            "vtst.8 d1, d1, d8",
            "vtst.8 d2, d2, d8",
            "vtst.8 d3, d3, d8",
            "vorr d0, d0, d9",
            "vorr d1, d1, d9",
            "vorr d2, d2, d9",
            "vorr d3, d3, d9",
            "vld1.8 {{d4, d5, d6, d7}}, [{a}]",
            ;
            bits = inout(reg) bits.as_ptr() => _,
            lanes = in(reg) BIT_OF_LANE.as_ptr(),
            a = in(reg) a.as_ptr(),
            r = out(reg) r,
        );
    }
    r.wrapping_neg()
}

/// Add 64 Q4_K weights' lane sums into `lanes`, as `crate::quant::q8_k::kquant_dot`
/// forms them: `qs` holds the 32 bytes of two 32-weight chunks (low nibbles, then high),
/// `a` their 64 activations, `scales` the four 16-weight group scales. Lane `l` of a
/// chunk gets `scale(group of l) * sum of weights 4l..4l+4 times their activations`,
/// with the wrapping i32 arithmetic of the reference.
///
/// # Safety
/// The CPU must have NEON.
#[inline]
unsafe fn lanes_q4_64(qs: &[u8; 32], a: &[u8; 64], scales: &[i32; 4], lanes: &mut [i32; 8]) {
    // SAFETY: reads 32 bytes at `qs`, 64 at `a`, 16 at `scales` and 32 at `lanes`, writes
    // 32 at `lanes`: the array references cover them and `lanes` is borrowed mutably.
    // Writes only the declared registers. NEON is the caller's precondition.
    //
    // Per chunk: q3/q2 (then q0/q1) hold weights 0..16/16..32 as bytes 0..15; q4/q5 the
    // activations; q6/q7 become lanes 0..3/4..7 (vmull to i16, vpaddl to pairs, vpadd to
    // quads); q2/q3 are then free for the group scales and the running lanes.
    unsafe {
        neon_asm!(
            "vld1.8 {{d0, d1, d2, d3}}, [{qs}]",
            "vmov.i8 q2, #15",
            "vand q3, q0, q2",
            "vand q2, q1, q2",
            "vshr.u8 q0, q0, #4",
            "vshr.u8 q1, q1, #4",
            // Chunk 0: low nibbles (q3 = weights 0..16, q2 = 16..32).
            "vld1.8 {{d8, d9, d10, d11}}, [{a}]!",
            "vmull.s8 q6, d6, d8",
            "vmull.s8 q7, d7, d9",
            "vpaddl.s16 q6, q6",
            "vpaddl.s16 q7, q7",
            "vpadd.i32 d12, d12, d13",
            "vpadd.i32 d13, d14, d15",
            "vmull.s8 q7, d4, d10",
            "vmull.s8 q4, d5, d11",
            "vpaddl.s16 q7, q7",
            "vpaddl.s16 q4, q4",
            "vpadd.i32 d14, d14, d15",
            "vpadd.i32 d15, d8, d9",
            "vld1.32 {{d4[], d5[]}}, [{sc}]!",
            "vld1.32 {{d6[], d7[]}}, [{sc}]!",
            "vmul.i32 q6, q6, q2",
            "vmul.i32 q7, q7, q3",
            "vld1.32 {{d4, d5, d6, d7}}, [{lanes}]",
            "vadd.i32 q2, q2, q6",
            "vadd.i32 q3, q3, q7",
            // Chunk 1: high nibbles (q0 = weights 0..16, q1 = 16..32).
            "vld1.8 {{d8, d9, d10, d11}}, [{a}]",
            "vmull.s8 q6, d0, d8",
            "vmull.s8 q7, d1, d9",
            "vpaddl.s16 q6, q6",
            "vpaddl.s16 q7, q7",
            "vpadd.i32 d12, d12, d13",
            "vpadd.i32 d13, d14, d15",
            "vmull.s8 q7, d2, d10",
            "vmull.s8 q4, d3, d11",
            "vpaddl.s16 q7, q7",
            "vpaddl.s16 q4, q4",
            "vpadd.i32 d14, d14, d15",
            "vpadd.i32 d15, d8, d9",
            "vld1.32 {{d0[], d1[]}}, [{sc}]!",
            "vld1.32 {{d2[], d3[]}}, [{sc}]",
            "vmul.i32 q6, q6, q0",
            "vmul.i32 q7, q7, q1",
            "vadd.i32 q2, q2, q6",
            "vadd.i32 q3, q3, q7",
            "vst1.32 {{d4, d5, d6, d7}}, [{lanes}]",
            qs = in(reg) qs.as_ptr(),
            a = inout(reg) a.as_ptr() => _,
            sc = inout(reg) scales.as_ptr() => _,
            lanes = in(reg) lanes.as_mut_ptr(),
            out("d0") _, out("d1") _, out("d2") _, out("d3") _,
            out("d4") _, out("d5") _, out("d6") _, out("d7") _,
            out("d8") _, out("d9") _, out("d10") _, out("d11") _,
            out("d12") _, out("d13") _, out("d14") _, out("d15") _,
            options(nostack, preserves_flags),
        );
    }
}
