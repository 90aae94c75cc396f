//! The quants of [`crate::repack::BlockQ2Kx8`] regrouped with NEON: the expert pager
//! repacks every Q2_K matrix it reads into a slot, so this runs per expert read, and
//! the scalar loops cost about 5 instructions per byte (2.53 M for a 768 x 2048 matrix
//! under qemu, 4.1x its one-token product on a Cortex-A53); with these, 1.19 M
//! (`kernels/examples/insn_count.rs`, `repacks`).
//!
//! Per row and 16 plain bytes (four words `w_k`), output word `kp` is
//! `OR_k ((w_k >> 2kp) & 0x03030303) << 2k`: the four shifted-and-masked vectors are
//! shifted by lane (`<< 2k`) and the four lanes of each summed with two pairwise adds
//! (the fields are disjoint, so the sum is the OR), leaving output words 0..4 in the
//! four lanes. The scale bytes (a transpose of eight rows) are table lookups. The bytes
//! equal the scalar loops' in `crate::repack_lowbit`.
#![allow(unsafe_code)]

use core::arch::aarch64::*;

use crate::quant::q2_k::BlockQ2K;

/// Output words `kp = 0..4` of the 16 plain quant bytes at `src`, in four lanes.
///
/// # Safety
/// The CPU has NEON (the aarch64 baseline).
#[inline(always)]
unsafe fn regroup16(src: &[u8; 16]) -> uint32x4_t {
    // SAFETY: `src` is 16 readable bytes; NEON per the caller.
    unsafe {
        let w = vreinterpretq_u32_u8(vld1q_u8(src.as_ptr()));
        let mask = vdupq_n_u32(0x0303_0303);
        let by_lane = vld1q_s32([0i32, 2, 4, 6].as_ptr());
        let field = |t: uint32x4_t| vshlq_u32(vandq_u32(t, mask), by_lane);
        let (a0, a1) = (field(w), field(vshrq_n_u32::<2>(w)));
        let (a2, a3) = (field(vshrq_n_u32::<4>(w)), field(vshrq_n_u32::<6>(w)));
        vpaddq_u32(vpaddq_u32(a0, a1), vpaddq_u32(a2, a3))
    }
}

/// `scales` of [`crate::repack::BlockQ2Kx8`] from eight Q2_K rows: vector `p` is byte
/// `2p` of rows 0..8, then byte `2p + 1` of rows 0..8, gathered by two four-register
/// table lookups (rows 0..4 and rows 4..8; an index of 0x80 and up gives 0, so the two
/// halves OR together).
pub(crate) fn pack_scales(rows: &[&BlockQ2K], scales: &mut [[u8; 16]; 8]) {
    let [r0, r1, r2, r3, r4, r5, r6, r7] = rows else {
        return;
    };
    const Z: u8 = 0x80;
    let low = [0, 16, 32, 48, Z, Z, Z, Z, 1, 17, 33, 49, Z, Z, Z, Z];
    let high = [Z, Z, Z, Z, 0, 16, 32, 48, Z, Z, Z, Z, 1, 17, 33, 49];
    // SAFETY: NEON is part of the aarch64 baseline; every load reads a row's 16 scale
    // bytes or a 16-byte index array, every store writes one 16-byte vector of `scales`.
    unsafe {
        let first = uint8x16x4_t(
            vld1q_u8(r0.scales.as_ptr()),
            vld1q_u8(r1.scales.as_ptr()),
            vld1q_u8(r2.scales.as_ptr()),
            vld1q_u8(r3.scales.as_ptr()),
        );
        let second = uint8x16x4_t(
            vld1q_u8(r4.scales.as_ptr()),
            vld1q_u8(r5.scales.as_ptr()),
            vld1q_u8(r6.scales.as_ptr()),
            vld1q_u8(r7.scales.as_ptr()),
        );
        let (mut lo, mut hi) = (vld1q_u8(low.as_ptr()), vld1q_u8(high.as_ptr()));
        let two = vdupq_n_u8(2);
        for out in scales.iter_mut() {
            let v = vorrq_u8(vqtbl4q_u8(first, lo), vqtbl4q_u8(second, hi));
            vst1q_u8(out.as_mut_ptr(), v);
            lo = vaddq_u8(lo, two);
            hi = vaddq_u8(hi, two);
        }
    }
}

/// `qs` of [`crate::repack::BlockQ2Kx8`] from eight Q2_K rows (the layout's doc gives
/// the order).
pub(crate) fn pack_qs(rows: &[&BlockQ2K], qs: &mut [[[u8; 16]; 2]; 16]) {
    for (r, row) in rows.iter().enumerate().take(8) {
        let (h, at) = (r / 4, 4 * (r % 4));
        for (c, s) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let base = 32 * c + 16 * s;
            let src: &[u8; 16] = row.qs[base..base + 16].try_into().unwrap_or(&[0; 16]);
            // SAFETY: NEON is part of the aarch64 baseline this module is compiled for.
            let v = unsafe { regroup16(src) };
            let mut words = [0u32; 4];
            // SAFETY: `words` is four writable u32s.
            unsafe { vst1q_u32(words.as_mut_ptr(), v) };
            for (kp, word) in words.iter().enumerate() {
                qs[8 * c + 2 * kp + s][h][at..at + 4].copy_from_slice(&word.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repack_lowbit::{pack_q2k_qs_scalar, pack_q2k_scales_scalar};

    #[test]
    fn neon_regrouping_gives_the_scalar_bytes() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut byte = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        };
        for case in 0..64 {
            let rows: [BlockQ2K; 8] = core::array::from_fn(|_| BlockQ2K {
                scales: core::array::from_fn(|_| byte()),
                // Every bit pattern, plus all-ones and all-zero rows now and then.
                qs: core::array::from_fn(|_| match case % 8 {
                    0 => 0xff,
                    1 => 0,
                    _ => byte(),
                }),
                d: [byte(), byte()],
                dmin: [byte(), byte()],
            });
            let refs: [&BlockQ2K; 8] = core::array::from_fn(|r| &rows[r]);
            let (mut neon, mut scalar) = ([[[0u8; 16]; 2]; 16], [[[1u8; 16]; 2]; 16]);
            pack_qs(&refs, &mut neon);
            pack_q2k_qs_scalar(&refs, &mut scalar);
            assert_eq!(neon, scalar, "case {case}");
            let (mut neon, mut scalar) = ([[0u8; 16]; 8], [[1u8; 16]; 8]);
            pack_scales(&refs, &mut neon);
            pack_q2k_scales_scalar(&refs, &mut scalar);
            assert_eq!(neon, scalar, "scales, case {case}");
        }
    }
}
