//! The row-range loop shared by the Q4_1/Q5_1 kernels of every ISA ([`super::x86_min`],
//! [`super::neon_min`]): token tiles, a table of the activation scales and scaled sums
//! as f32 built once per token tile, and row tiles of 4 rows for one token or
//! [`MinTile::ROWS`] rows for several, then single rows. The ISA file supplies the tile
//! ([`MinTile::tile`]: `RR` rows x `TT` tokens, every pair with its own accumulators in
//! the reference's order), so tiling changes no bit.
#![allow(unsafe_code)]

use super::Job;
use crate::blocks::{cast, Pod};
use crate::quant::q8_1::BlockQ8_1;

/// Width of the token table (the most tokens any ISA's tile takes).
pub(super) const T: usize = 8;
/// Most blocks per row the table holds (4096 columns, 8 KiB); longer rows return
/// `false` and take the one-row kernel.
pub(super) const MAX_NB: usize = 128;

/// A weight block with an f16 scale and minimum (Q4_1, Q5_1).
pub(super) trait MinBlock: Pod {
    /// The f16 scale.
    fn d(&self) -> [u8; 2];
    /// The f16 minimum.
    fn m(&self) -> [u8; 2];
}

macro_rules! min_block {
    ($($b:ty),*) => {$(
        impl MinBlock for $b {
            #[inline(always)]
            fn d(&self) -> [u8; 2] {
                self.d
            }
            #[inline(always)]
            fn m(&self) -> [u8; 2] {
                self.m
            }
        }
    )*};
}
min_block!(crate::quant::q4_1::BlockQ4_1, crate::quant::q5_1::BlockQ5_1);

/// The activation scales and scaled sums of one token tile as f32, blocks `0..nb`,
/// tokens `0..T` (entries past the tile's tokens hold zeros or an earlier tile's values;
/// their lanes are computed but never read).
#[repr(C, align(32))]
pub(super) struct TokTable {
    pub(super) da: [[f32; T]; MAX_NB],
    pub(super) sa: [[f32; T]; MAX_NB],
}

/// One ISA's tile for blocks `B`.
pub(super) trait MinTile<B: MinBlock> {
    /// Tokens per token tile (at most [`T`]).
    const TOKENS: usize;
    /// Rows per tile when there are two or more tokens (1, or 2 for any larger value).
    const ROWS: usize;
    /// `RR` rows x `TT` tokens of a token tile (`tab`), all of `nb` blocks; `prefetch`
    /// (or null) is where the tile after next starts.
    ///
    /// # Safety
    /// The CPU has the ISA; every slice of `w` and `a` has at least `nb <= MAX_NB`
    /// blocks and `tab` holds blocks `0..nb`.
    unsafe fn tile<const RR: usize, const TT: usize>(
        w: [&[B]; RR],
        a: [&[BlockQ8_1]; TT],
        tab: &TokTable,
        nb: usize,
        prefetch: *const u8,
    ) -> [[f32; TT]; RR];
}

/// Row tiles ahead a one-token tile prefetches (as `x86_rows::PF_TILES`).
const PF_TILES: usize = 5;

/// The row-range product of `job`; `false` (nothing written) for shapes the tiles do not
/// take (rows not whole blocks, longer than [`MAX_NB`]).
///
/// # Safety
/// The CPU has `K`'s ISA (inline this into a function compiled for it); `job` was
/// checked against `w`, `acts` and `out` by `Job::new`.
#[inline(always)]
pub(super) unsafe fn body<B: MinBlock, K: MinTile<B>>(
    job: &Job,
    w: &[u8],
    acts: &[u8],
    out: &mut [f32],
    f16: impl Fn([u8; 2]) -> f32,
) -> bool {
    let bsz = core::mem::size_of::<B>();
    let nb = job.row_bytes / bsz;
    if nb * bsz != job.row_bytes
        || nb * core::mem::size_of::<BlockQ8_1>() != job.act_row_bytes
        || nb > MAX_NB
    {
        return false;
    }
    let (n_tok, rb, arb) = (job.n_tok, job.row_bytes, job.act_row_bytes);
    let row = |r: usize| cast::<B>(&w[r * rb..(r + 1) * rb]).unwrap_or(&[]);
    let act = |t: usize| cast::<BlockQ8_1>(&acts[t * arb..(t + 1) * arb]).unwrap_or(&[]);
    let (start, nr) = (job.rows.start, job.rows.len());
    let mut tab = TokTable {
        da: [[0.0; T]; MAX_NB],
        sa: [[0.0; T]; MAX_NB],
    };
    let mut t0 = 0;
    while t0 < n_tok {
        let tt = (n_tok - t0).min(K::TOKENS);
        for t in 0..tt {
            for (k, b) in act(t0 + t).iter().enumerate() {
                tab.da[k][t] = f16(b.d);
                tab.sa[k][t] = f16(b.s);
            }
        }
        let group = if tt == 1 { 4 } else { K::ROWS };
        let mut i = 0;
        while i < nr {
            let whole = i + group <= nr;
            macro_rules! run {
                ($r:expr, $t:expr) => {{
                    let next = if $r == 4 {
                        w.as_ptr().wrapping_add((start + i + PF_TILES * 4) * rb)
                    } else {
                        core::ptr::null()
                    };
                    let res = K::tile::<$r, $t>(
                        core::array::from_fn(|j| row(start + i + j)),
                        core::array::from_fn(|j| act(t0 + j)),
                        &tab,
                        nb,
                        next,
                    );
                    for (r, v) in res.iter().enumerate() {
                        out[(i + r) * n_tok + t0..][..$t].copy_from_slice(v);
                    }
                    i += $r;
                }};
            }
            macro_rules! arms {
                ($($t:literal)*) => {
                    match (whole, tt) {
                        (true, 1) => run!(4, 1),
                        $((true, $t) if K::ROWS == 1 => run!(1, $t),)*
                        $((true, $t) => run!(2, $t),)*
                        (false, 1) => run!(1, 1),
                        $((false, $t) => run!(1, $t),)*
                        // tt is in 1..=T.
                        _ => return false,
                    }
                };
            }
            arms!(2 3 4 5 6 7 8);
        }
        t0 += tt;
    }
    true
}
