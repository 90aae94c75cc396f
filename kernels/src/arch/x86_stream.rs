//! Software prefetch for the one-token kernels that read each weight row once, in order
//! (the K-quant rows, the repacked Q8_0x4 groups): one sequential stream per worker. On
//! the AMD EPYC (Zen 5) VM the hardware prefetcher alone left that stream below memory
//! speed. One token, one thread, medians of 5 alternating runs (`matvec_perf`,
//! `repack -- repack_vs_plain_speed`), none / 4 / 8 / 16 KiB ahead: the 248,320 x 1024
//! Q6_K head 7.38 / 6.69 / 6.04 / 6.24 ms, the 262,144 x 640 Q8_0x4 head 6.07 / 5.60 /
//! 4.95 / 5.26 ms. Matrices that stay in cache lose about 5 % to the extra instructions
//! (0.062 -> 0.065 ms for a 1024 x 3584 Q6_K run again and again), which a model, read
//! once per token from memory, does not see. A prefetch only hints: it never faults and
//! changes no result.
#![allow(unsafe_code)]

use core::arch::x86_64::*;

/// How many bytes ahead of the block being read its stream is fetched.
pub(super) const AHEAD: usize = 8192;

/// Fetch the cache lines of the bytes `AHEAD` past `block` (as many as the block spans,
/// so consecutive blocks fetch every line of their stream at least once).
///
/// # Safety
/// None beyond SSE (every x86-64 CPU): the address is only computed (wrapping) and
/// hinted, never dereferenced; past the end of the weights the hint is dropped.
#[inline(always)]
pub(super) unsafe fn fetch_ahead<B>(block: &B) {
    let p = (block as *const B as *const u8).wrapping_add(AHEAD);
    let mut off = 0;
    while off < core::mem::size_of::<B>() {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
        off += 64;
    }
}
