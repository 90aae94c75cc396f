//! NEON (and NEON + dotprod) row-range products over repacked weights
//! ([`crate::repack::Layout`]): Q8_0x4 (baseline NEON, and dotprod when given that
//! layout), Q8_0x4s (dotprod), Q5_0x4s and Q4_0x4s (both).
//!
//! The arithmetic is [`super::neon_rows`]'s ([`crate::quant::q8_0::Order::BlockSum`]):
//! per (row, token) one f32 accumulator, fed once per block with the block's exact
//! integer sum, `acc = fma(d_w * d_a, sum, acc)`; the four rows of a group share one
//! vector, so a block costs one `scvtf` and one `fmla` per group and token. What the
//! layouts save on top:
//! - all of them: the four rows come as one sequential stream and their four f16 scales
//!   are adjacent (one `fcvtl`);
//! - Q8_0x4s: `sdot` by element leaves the four rows' sums in the four lanes, so a
//!   group-block is eight `sdot` (no per-row reduction, no activation shuffles);
//! - Q5_0x4s: the fifth bits of a chunk are one shift and one mask away; `sli`/`sri`
//!   merge them with the nibbles, and the `- 16` of every weight is taken out once per
//!   block and token as `16 * sum(a)` instead of once per weight;
//! - Q4_0x4s: the same chunks without fifth bits (one `and` or `ushr` per 16 weights),
//!   `- 8` as `8 * sum(a)`; its float step is Q4_0's reference order
//!   (`sum += (sumi * d_w) * d_a`, [`Tile::step`]) rather than the fused one.
//!
//! Rows of a partial group at the ends of the range are computed with their group and
//! dropped; the plain tail rows (`rows % 4`) go to the plain kernel. Each (row, token)
//! therefore has the plain kernels' bits.
#![allow(unsafe_code)]

use core::arch::aarch64::*;
use core::ops::Range;

use super::neon_kquant::load16;
use super::neon_legacy::{h2f, h2f4};
use super::neon_rows::{lane, rows4, Dot, Mull, Sdot};
use super::table::{KernelTable, PackedJob};
use crate::blocks::{cast, Pod};
use crate::quant::q8_0::{BlockQ8_0, BLOCK_BYTES};
use crate::quant::{q4_0, q5_0};
use crate::repack::{BlockQ4_0x4s, BlockQ5_0x4d, BlockQ5_0x4s, BlockQ8_0x4, BlockQ8_0x4s};
use crate::GgmlType;

/// Tokens per tile.
const T: usize = 2;

/// Product over a repacked tensor (`w`: all of its rows) of plain type `ty` with `block`
/// bytes per plain block (each paired with `act_block` activation bytes) for `rows`:
/// `job` computes the rows in whole groups of four, or `false` (nothing written) when
/// the shapes do not fit. Rows past the last whole group are plain; they go to `table`'s
/// plain kernel.
///
/// # Safety
/// `job` may rely on the checked [`Job`]: every group-block of its rows' groups lies
/// inside `w`, every activation row inside `acts`, and the output it is given has one
/// value per (row, token). `table` is a table for this CPU.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn run_split(
    table: &'static KernelTable,
    ty: GgmlType,
    (block, act_block): (usize, usize),
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
    job: impl FnOnce(&Job, &mut [f32]),
) -> bool {
    let Some(PackedJob { n_tok, arb, split }) =
        PackedJob::new(w, row_bytes, &rows, acts, out.len(), (block, act_block, 4))
    else {
        return false;
    };
    let (head, tail) = out.split_at_mut((split - rows.start) * n_tok);
    if split > rows.start {
        let j = Job {
            rb: row_bytes,
            rows: rows.start..split,
            arb,
            n_tok,
        };
        job(&j, head);
    }
    if split < rows.end {
        return table.rows(ty, w, row_bytes, split..rows.end, acts, arb, tail);
    }
    true
}

/// A `PackedFn` `$name` over [`run_split`]: `$job(job, w, acts, out)` (an entry point
/// compiled for the table's ISA) computes the whole groups of plain type `$ty`
/// (`$block` bytes per plain block, each paired with `$act` activation bytes).
macro_rules! packed_fn {
    ($name:ident, $job:expr, $ty:ident, $block:expr, $act:expr) => {
        /// # Safety
        /// The CPU has the ISA of the table that lists this function.
        pub(super) unsafe fn $name(
            table: &'static $crate::arch::table::KernelTable,
            w: &[u8],
            row_bytes: usize,
            rows: core::ops::Range<usize>,
            acts: &[u8],
            out: &mut [f32],
        ) -> bool {
            let shape = ($block, $act);
            let ty = $crate::GgmlType::$ty;
            // SAFETY: the caller's contract; `run_split` checked the shapes the job reads.
            unsafe {
                $crate::arch::neon_repack::run_split(
                    table,
                    ty,
                    shape,
                    w,
                    row_bytes,
                    rows,
                    acts,
                    out,
                    |j, head| $job(j, w, acts, head),
                )
            }
        }
    };
}
pub(super) use packed_fn;
packed_fn!(
    q8_0x4_base,
    jobs::base::<RowsTile<Mull>, 2, 4>,
    Q8_0,
    BLOCK_BYTES,
    BLOCK_BYTES
);
packed_fn!(
    q8_0x4_dot,
    jobs::dot::<RowsTile<Sdot>, 2>,
    Q8_0,
    BLOCK_BYTES,
    BLOCK_BYTES
);
packed_fn!(
    q8_0x4s_dot,
    jobs::dot::<LaneTile, 4>,
    Q8_0,
    BLOCK_BYTES,
    BLOCK_BYTES
);
const Q5B: usize = q5_0::BLOCK_BYTES;
packed_fn!(
    q5_0x4s_base,
    jobs::base::<Q5Tile<Mull>, 2, 4>,
    Q5_0,
    Q5B,
    BLOCK_BYTES
);
packed_fn!(
    q5_0x4s_dot,
    jobs::dot::<Q5Tile<Sdot>, 2>,
    Q5_0,
    Q5B,
    BLOCK_BYTES
);
packed_fn!(q5_0x4d_dot, jobs::dot::<Q5DTile, 2>, Q5_0, Q5B, BLOCK_BYTES);
const Q4B: usize = q4_0::BLOCK_BYTES;
packed_fn!(
    q4_0x4s_base,
    jobs::base::<Q4Tile<Mull>, 2, 2>,
    Q4_0,
    Q4B,
    BLOCK_BYTES
);
packed_fn!(
    q4_0x4s_dot,
    jobs::dot::<Q4Tile<Sdot>, 2>,
    Q4_0,
    Q4B,
    BLOCK_BYTES
);

/// `sdot` by element: `acc[i] += dot(w[4i..4i+4], a[4L..4L+4])`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub(super) unsafe fn sdot_lane<const L: i32>(
    mut acc: int32x4_t,
    w: int8x16_t,
    a: int8x16_t,
) -> int32x4_t {
    // SAFETY: callers run only when the CPU has dotprod; the instruction touches only
    // the three vector registers named here.
    core::arch::asm!(
        "sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[{l}]",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        l = const L,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// `acc` plus the four rows' sums of eight chunks (chunk `c`: 4 rows x 4 bytes, paired
/// with bytes `4(c % 4)..` of activation half `c / 4`).
#[inline(always)]
unsafe fn sdot_chunks(acc: int32x4_t, q: &[int8x16_t; 8], a: &[int8x16_t; 2]) -> int32x4_t {
    let s = sdot_lane::<0>(acc, q[0], a[0]);
    let s = sdot_lane::<1>(s, q[1], a[0]);
    let s = sdot_lane::<2>(s, q[2], a[0]);
    let s = sdot_lane::<3>(s, q[3], a[0]);
    let s = sdot_lane::<0>(s, q[4], a[1]);
    let s = sdot_lane::<1>(s, q[5], a[1]);
    let s = sdot_lane::<2>(s, q[6], a[1]);
    sdot_lane::<3>(s, q[7], a[1])
}

/// The shape of one call's work on whole groups.
pub(super) struct Job {
    /// Bytes per plain row.
    pub(super) rb: usize,
    pub(super) rows: Range<usize>,
    /// Bytes per activation row.
    pub(super) arb: usize,
    pub(super) n_tok: usize,
}

/// One repacked layout's products, split into what depends on the weights only
/// (prepared once per group-block), what depends on the activation block only (once per
/// block and token, shared by every group of the tile), and the four rows' exact sums.
trait Tile {
    type G: Pod;
    type W: Copy;
    type A: Copy;
    unsafe fn weights(b: &Self::G) -> Self::W;
    /// The four rows' f16 scales (adjacent in every layout).
    fn scales(b: &Self::G) -> &[[u8; 2]; 4];
    unsafe fn act(y: &BlockQ8_0) -> Self::A;
    unsafe fn sums(w: &Self::W, a: &Self::A) -> int32x4_t;
    /// One block's float step for a group and token: `acc = fma(d_w * d_a, sum, acc)`
    /// ([`crate::quant::q8_0::Order::BlockSum`]; `d_w * d_a` is exact in f32, two f16
    /// significands, as in the reference).
    #[inline(always)]
    unsafe fn step(acc: float32x4_t, s: int32x4_t, dw: float32x4_t, da: f32) -> float32x4_t {
        vfmaq_f32(acc, vcvtq_f32_s32(s), vmulq_n_f32(dw, da))
    }
    /// The group-block at `*p` prepared, and its four rows' scales as f32; `*p` moves to
    /// the next group-block.
    ///
    /// # Safety
    /// A group-block is readable at `*p`.
    #[inline(always)]
    unsafe fn load(p: &mut *const Self::G) -> (Self::W, float32x4_t) {
        let b = &**p;
        *p = p.add(1);
        // The four rows' scales are adjacent: one load, one exact conversion.
        let d = h2f4(vld1_u16(Self::scales(b).as_ptr() as *const u16));
        (Self::weights(b), d)
    }
    /// One token: the four rows' sums of the group-block at `*p` against `a`, and its
    /// scales as f32; `*p` moves to the next group-block.
    ///
    /// # Safety
    /// As [`Tile::load`].
    #[inline(always)]
    unsafe fn load_sums1(p: &mut *const Self::G, a: &Self::A) -> (int32x4_t, float32x4_t) {
        let (w, d) = Self::load(p);
        (Self::sums(&w, a), d)
    }
}

/// `GG` groups (4 rows each) against `TT` tokens, all of `nb` blocks: per (group, token)
/// one vector of four f32 accumulators, fed once per block by [`Tile::step`].
///
/// # Safety
/// NEON (and dotprod where `K` uses `sdot`); `nb` group-blocks are readable at every
/// `g[i]` and `nb` blocks at every `a[t]`.
#[inline(always)]
unsafe fn tile<K: Tile, const GG: usize, const TT: usize>(
    g: [*const K::G; GG],
    a: [*const BlockQ8_0; TT],
    nb: usize,
) -> [[[f32; TT]; 4]; GG] {
    let mut acc = [[vdupq_n_f32(0.0); TT]; GG];
    let (mut g, mut a) = (g, a);
    if TT == 1 {
        for _ in 0..nb {
            // SAFETY: the caller's `nb` blocks start at a[0]; one per step.
            let y = &*a[0];
            a[0] = a[0].add(1);
            let (ay, da) = (K::act(y), h2f(y.d));
            // Group by group: one written-out kernel each (see `Tile::load_sums1`).
            for i in 0..GG {
                // SAFETY: as for `a`, at g[i].
                let (s, dw) = K::load_sums1(&mut g[i], &ay);
                acc[i][0] = K::step(acc[i][0], s, dw, da);
            }
        }
    } else {
        for _ in 0..nb {
            let mut w = [core::mem::MaybeUninit::<K::W>::uninit(); GG];
            let mut dw = [vdupq_n_f32(0.0); GG];
            for i in 0..GG {
                // SAFETY: the caller's `nb` group-blocks start at g[i]; one per step.
                let (wi, di) = K::load(&mut g[i]);
                w[i].write(wi);
                dw[i] = di;
            }
            for t in 0..TT {
                // SAFETY: as for `g`.
                let y = &*a[t];
                a[t] = a[t].add(1);
                let ay = K::act(y);
                let da = h2f(y.d);
                for i in 0..GG {
                    let s = K::sums(w[i].assume_init_ref(), &ay);
                    acc[i][t] = K::step(acc[i][t], s, dw[i], da);
                }
            }
        }
    }
    core::array::from_fn(|i| core::array::from_fn(|r| core::array::from_fn(|t| lane(acc[i][t], r))))
}

/// One token against a Q8_0x4s group-block at `p` (136 bytes: eight chunks, then the four
/// f16 scales): eight `sdot` by element, the rows' sums in the four lanes, and the scales
/// as f32; `p` moves past the group-block. Written out so that the chunks come in two
/// `ld1` of four registers with the pointer moved by the loads (LLVM makes four `ldp`
/// and address arithmetic of them).
///
/// # Safety
/// NEON + dotprod; 136 bytes are readable at `p`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn q8_group_sdot(p: &mut *const u8, a: &[int8x16_t; 2]) -> (int32x4_t, float32x4_t) {
    let s: int32x4_t;
    let d: uint16x4_t;
    // SAFETY: the caller's 136 readable bytes; writes only the registers named here.
    core::arch::asm!(
        "ld1 {{v24.16b, v25.16b, v26.16b, v27.16b}}, [{p}], #64",
        "movi {s:v}.4s, #0",
        "ld1 {{v28.16b, v29.16b, v30.16b, v31.16b}}, [{p}], #64",
        "sdot {s:v}.4s, v24.16b, {a0:v}.4b[0]",
        "sdot {s:v}.4s, v25.16b, {a0:v}.4b[1]",
        "sdot {s:v}.4s, v26.16b, {a0:v}.4b[2]",
        "sdot {s:v}.4s, v27.16b, {a0:v}.4b[3]",
        "sdot {s:v}.4s, v28.16b, {a1:v}.4b[0]",
        "sdot {s:v}.4s, v29.16b, {a1:v}.4b[1]",
        "sdot {s:v}.4s, v30.16b, {a1:v}.4b[2]",
        "sdot {s:v}.4s, v31.16b, {a1:v}.4b[3]",
        "ldr {d:d}, [{p}], #8",
        p = inout(reg) *p,
        a0 = in(vreg) a[0],
        a1 = in(vreg) a[1],
        s = out(vreg) s,
        d = out(vreg) d,
        out("v24") _, out("v25") _, out("v26") _, out("v27") _,
        out("v28") _, out("v29") _, out("v30") _, out("v31") _,
        options(pure, readonly, nostack, preserves_flags),
    );
    (s, h2f4(d))
}

/// [`q8_group_sdot`] for baseline NEON over a Q8_0x4 group-block (four rows of 32 quants,
/// then the scales): per row [`Mull::block`] (`smull`, `smlal2` of each half, `saddlp`,
/// `sadalp`), the four rows' totals by [`rows4`].
///
/// # Safety
/// NEON; 136 bytes are readable at `p`.
#[inline(always)]
unsafe fn q8_group_mull(p: &mut *const u8, a: &[int8x16_t; 2]) -> (int32x4_t, float32x4_t) {
    let s: int32x4_t;
    let d: uint16x4_t;
    // SAFETY: the caller's 136 readable bytes; writes only the registers named here.
    core::arch::asm!(
        "ld1 {{v24.16b, v25.16b, v26.16b, v27.16b}}, [{p}], #64",
        "ld1 {{v28.16b, v29.16b, v30.16b, v31.16b}}, [{p}], #64",
        "smull {t0:v}.8h, v24.8b, {a0:v}.8b",
        "smull {t1:v}.8h, v25.8b, {a1:v}.8b",
        "smull {t2:v}.8h, v26.8b, {a0:v}.8b",
        "smull {t3:v}.8h, v27.8b, {a1:v}.8b",
        "smlal2 {t0:v}.8h, v24.16b, {a0:v}.16b",
        "smlal2 {t1:v}.8h, v25.16b, {a1:v}.16b",
        "smlal2 {t2:v}.8h, v26.16b, {a0:v}.16b",
        "smlal2 {t3:v}.8h, v27.16b, {a1:v}.16b",
        "smull v24.8h, v28.8b, {a0:v}.8b",
        "smull v25.8h, v29.8b, {a1:v}.8b",
        "smull v26.8h, v30.8b, {a0:v}.8b",
        "smull v27.8h, v31.8b, {a1:v}.8b",
        "smlal2 v24.8h, v28.16b, {a0:v}.16b",
        "smlal2 v25.8h, v29.16b, {a1:v}.16b",
        "smlal2 v26.8h, v30.16b, {a0:v}.16b",
        "smlal2 v27.8h, v31.16b, {a1:v}.16b",
        "saddlp {t0:v}.4s, {t0:v}.8h",
        "saddlp {t2:v}.4s, {t2:v}.8h",
        "saddlp v24.4s, v24.8h",
        "saddlp v26.4s, v26.8h",
        "sadalp {t0:v}.4s, {t1:v}.8h",
        "sadalp {t2:v}.4s, {t3:v}.8h",
        "sadalp v24.4s, v25.8h",
        "sadalp v26.4s, v27.8h",
        "addp {t0:v}.4s, {t0:v}.4s, {t2:v}.4s",
        "addp v24.4s, v24.4s, v26.4s",
        "ldr {d:d}, [{p}], #8",
        "addp {s:v}.4s, {t0:v}.4s, v24.4s",
        p = inout(reg) *p,
        a0 = in(vreg) a[0],
        a1 = in(vreg) a[1],
        s = out(vreg) s,
        d = out(vreg) d,
        t0 = out(vreg) _,
        t1 = out(vreg) _,
        t2 = out(vreg) _,
        t3 = out(vreg) _,
        out("v24") _, out("v25") _, out("v26") _, out("v27") _,
        out("v28") _, out("v29") _, out("v30") _, out("v31") _,
        options(pure, readonly, nostack, preserves_flags),
    );
    (s, h2f4(d))
}
static_assertions::const_assert_eq!(core::mem::offset_of!(BlockQ8_0x4, d), 128);
static_assertions::const_assert_eq!(core::mem::offset_of!(BlockQ8_0x4s, d), 128);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ8_0x4s>(), 136);

/// The 32 activation quants of a block as two vectors.
#[inline(always)]
unsafe fn act_q(y: &BlockQ8_0) -> [int8x16_t; 2] {
    let v = vld1q_s8_x2(y.qs.as_ptr() as *const i8);
    [v.0, v.1]
}

/// Q8_0x4: each row's 32 quants in two vectors, its sum by [`Dot::block`].
struct RowsTile<D>(core::marker::PhantomData<D>);
impl<D: Dot> Tile for RowsTile<D> {
    type G = BlockQ8_0x4;
    type W = [[int8x16_t; 2]; 4];
    type A = [int8x16_t; 2];
    #[inline(always)]
    unsafe fn weights(b: &BlockQ8_0x4) -> Self::W {
        core::array::from_fn(|r| {
            [
                vreinterpretq_s8_u8(load16(&b.qs[r])),
                vreinterpretq_s8_u8(load16(&b.qs[r][16..])),
            ]
        })
    }
    #[inline(always)]
    fn scales(b: &BlockQ8_0x4) -> &[[u8; 2]; 4] {
        &b.d
    }
    #[inline(always)]
    unsafe fn act(y: &BlockQ8_0) -> Self::A {
        act_q(y)
    }
    #[inline(always)]
    unsafe fn sums(w: &Self::W, a: &Self::A) -> int32x4_t {
        rows4(core::array::from_fn(|r| D::block(w[r], *a)))
    }
    #[inline(always)]
    unsafe fn load_sums1(p: &mut *const BlockQ8_0x4, a: &Self::A) -> (int32x4_t, float32x4_t) {
        if D::FUSED {
            let mut q = *p as *const u8;
            let r = q8_group_mull(&mut q, a);
            *p = q as *const BlockQ8_0x4;
            r
        } else {
            let (w, d) = Self::load(p);
            (Self::sums(&w, a), d)
        }
    }
}

/// Q8_0x4s: eight `sdot` by element per group-block and token.
struct LaneTile;
impl Tile for LaneTile {
    type G = BlockQ8_0x4s;
    type W = [int8x16_t; 8];
    type A = [int8x16_t; 2];
    #[inline(always)]
    unsafe fn weights(b: &BlockQ8_0x4s) -> Self::W {
        core::array::from_fn(|k| vreinterpretq_s8_u8(load16(&b.qs[k])))
    }
    #[inline(always)]
    fn scales(b: &BlockQ8_0x4s) -> &[[u8; 2]; 4] {
        &b.d
    }
    #[inline(always)]
    unsafe fn act(y: &BlockQ8_0) -> Self::A {
        act_q(y)
    }
    #[inline(always)]
    unsafe fn sums(q: &Self::W, a: &Self::A) -> int32x4_t {
        sdot_chunks(vdupq_n_s32(0), q, a)
    }
    #[inline(always)]
    unsafe fn load_sums1(p: &mut *const BlockQ8_0x4s, a: &Self::A) -> (int32x4_t, float32x4_t) {
        let mut q = *p as *const u8;
        let r = q8_group_sdot(&mut q, a);
        *p = q as *const BlockQ8_0x4s;
        r
    }
}

/// Q5_0x4d: eight chunks of `8 s` (`s = q - 16`), a mask for the first four, a shift
/// and an insert (`sli`) of the bit pairs for the others; eight `sdot` by element give
/// `8 * sum(s a)`, exact, shifted back once per block and token.
struct Q5DTile;

/// `sli #6`: `src << 6 | dest & 0x3f` per byte (written out: LLVM would use two
/// instructions).
#[inline(always)]
unsafe fn sli6(mut dest: uint8x16_t, src: uint8x16_t) -> uint8x16_t {
    // SAFETY: baseline Advanced SIMD; reads and writes only the named registers.
    core::arch::asm!("sli {d:v}.16b, {s:v}.16b, #6", d = inout(vreg) dest, s = in(vreg) src,
        options(pure, nomem, nostack, preserves_flags));
    dest
}

impl Tile for Q5DTile {
    type G = BlockQ5_0x4d;
    type W = [int8x16_t; 8];
    type A = [int8x16_t; 2];
    #[inline(always)]
    unsafe fn weights(b: &BlockQ5_0x4d) -> Self::W {
        let x: [uint8x16_t; 4] = core::array::from_fn(|k| load16(&b.x[k]));
        let e = load16(&b.e);
        let pairs = [
            e,
            vshrq_n_u8::<2>(e),
            vshrq_n_u8::<4>(e),
            vshrq_n_u8::<6>(e),
        ];
        let top = vdupq_n_u8(0xf8);
        core::array::from_fn(|c| {
            let k = c % 4;
            vreinterpretq_s8_u8(if c < 4 {
                vandq_u8(x[k], top)
            } else {
                sli6(vshlq_n_u8::<3>(x[k]), pairs[k])
            })
        })
    }
    #[inline(always)]
    fn scales(b: &BlockQ5_0x4d) -> &[[u8; 2]; 4] {
        &b.d
    }
    #[inline(always)]
    unsafe fn act(y: &BlockQ8_0) -> Self::A {
        act_q(y)
    }
    #[inline(always)]
    unsafe fn sums(q: &Self::W, a: &Self::A) -> int32x4_t {
        // Exact: |8 * sum| <= 8 * 32 * 16 * 128.
        vshrq_n_s32::<3>(sdot_chunks(vdupq_n_s32(0), q, a))
    }
    #[inline(always)]
    unsafe fn load_sums1(p: &mut *const BlockQ5_0x4d, a: &Self::A) -> (int32x4_t, float32x4_t) {
        let mut q = *p as *const u8;
        let r = q5d_group_sdot(&mut q, a);
        *p = q as *const BlockQ5_0x4d;
        r
    }
}

/// [`Q5DTile`]'s chunks and sums for one token, written out as [`q8_group_sdot`]: per
/// chunk position `k`, `x[k] & 0xf8` and `sli(x[k] << 3, e >> 2k, 6)`, each one `sdot`
/// by element; the total shifted back by 3. `p` moves past the 88-byte group-block.
///
/// # Safety
/// NEON + dotprod; 88 bytes are readable at `p`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn q5d_group_sdot(p: &mut *const u8, a: &[int8x16_t; 2]) -> (int32x4_t, float32x4_t) {
    let s: int32x4_t;
    let d: uint16x4_t;
    let top = vdupq_n_u8(0xf8);
    // SAFETY: the caller's 88 readable bytes; writes only the registers named here.
    core::arch::asm!(
        "ld1 {{v24.16b, v25.16b, v26.16b, v27.16b}}, [{p}], #64",
        "ldr q28, [{p}], #16",
        "ldr {d:d}, [{p}], #8",
        "movi {s:v}.4s, #0",
        "ushr v29.16b, v28.16b, #2",
        "ushr v30.16b, v28.16b, #4",
        "ushr v31.16b, v28.16b, #6",
        "shl {t:v}.16b, v24.16b, #3",
        "and v24.16b, v24.16b, {top:v}.16b",
        "sli {t:v}.16b, v28.16b, #6",
        "sdot {s:v}.4s, v24.16b, {a0:v}.4b[0]",
        "sdot {s:v}.4s, {t:v}.16b, {a1:v}.4b[0]",
        "shl {t:v}.16b, v25.16b, #3",
        "and v25.16b, v25.16b, {top:v}.16b",
        "sli {t:v}.16b, v29.16b, #6",
        "sdot {s:v}.4s, v25.16b, {a0:v}.4b[1]",
        "sdot {s:v}.4s, {t:v}.16b, {a1:v}.4b[1]",
        "shl {t:v}.16b, v26.16b, #3",
        "and v26.16b, v26.16b, {top:v}.16b",
        "sli {t:v}.16b, v30.16b, #6",
        "sdot {s:v}.4s, v26.16b, {a0:v}.4b[2]",
        "sdot {s:v}.4s, {t:v}.16b, {a1:v}.4b[2]",
        "shl {t:v}.16b, v27.16b, #3",
        "and v27.16b, v27.16b, {top:v}.16b",
        "sli {t:v}.16b, v31.16b, #6",
        "sdot {s:v}.4s, v27.16b, {a0:v}.4b[3]",
        "sdot {s:v}.4s, {t:v}.16b, {a1:v}.4b[3]",
        // Exact: |8 * sum| <= 8 * 32 * 16 * 128.
        "sshr {s:v}.4s, {s:v}.4s, #3",
        p = inout(reg) *p,
        a0 = in(vreg) a[0],
        a1 = in(vreg) a[1],
        top = in(vreg) top,
        s = out(vreg) s,
        d = out(vreg) d,
        t = out(vreg) _,
        out("v24") _, out("v25") _, out("v26") _, out("v27") _,
        out("v28") _, out("v29") _, out("v30") _, out("v31") _,
        options(pure, readonly, nostack, preserves_flags),
    );
    (s, h2f4(d))
}

/// Q5_0x4s: the fifth bits merged into the nibbles with `sli`/`sri`, giving eight
/// chunks of unsigned 5-bit values `w5 = weight + 16` (`lo[k]`: weights `4k..4k+4` of
/// rows 0..4, `hi[k]`: `16 + 4k..`); the `- 16` is applied once per block and token as
/// `-16 * sum(a)`.
struct Q5Tile<D>(core::marker::PhantomData<D>);

/// The eight 5-bit chunks of a Q5_0x4s group-block.
#[inline(always)]
unsafe fn q5_chunks(b: &BlockQ5_0x4s) -> [int8x16_t; 8] {
    let q: [uint8x16_t; 4] = core::array::from_fn(|k| load16(&b.qs[k]));
    let h = load16(&b.qh);
    // Chunk k's fifth bits are bit k (low nibbles) and bit 4 + k (high nibbles).
    let hk = [
        h,
        vshrq_n_u8::<1>(h),
        vshrq_n_u8::<2>(h),
        vshrq_n_u8::<3>(h),
    ];
    let (one, b4) = (vdupq_n_u8(1), vdupq_n_u8(0x10));
    core::array::from_fn(|c| {
        let k = c % 4;
        vreinterpretq_s8_u8(if c < 4 {
            // (bit << 4) | (q & 0xf)
            vsliq_n_u8::<4>(q[k], vandq_u8(hk[k], one))
        } else {
            // (bit << 4) | (q >> 4)
            vsriq_n_u8::<4>(vandq_u8(hk[k], b4), q[k])
        })
    })
}

/// `-offset * sum(a)` over an activation block, in every lane: the sums of unsigned
/// chunks `weight + offset` start there.
#[inline(always)]
unsafe fn minus_offset_sum(a: [int8x16_t; 2], offset: i32) -> int32x4_t {
    let sum = vaddlvq_s8(a[0]) as i32 + vaddlvq_s8(a[1]) as i32;
    vdupq_n_s32(-offset * sum)
}

/// How a [`Q5Tile`] (and a [`Q4Tile`]) multiplies the eight unsigned chunks (`weight +
/// offset`) with an activation block: the token-side values it prepares once per block
/// and token (`offset` taken out as `-offset * sum(a)`), and the four rows' sums.
trait ChunkSums: Sized {
    type A: Copy;
    unsafe fn act(y: &BlockQ8_0, offset: i32) -> Self::A;
    unsafe fn sums(w: &[int8x16_t; 8], a: &Self::A) -> int32x4_t;
    /// [`Tile::load_sums1`] of a [`Q5Tile`].
    #[inline(always)]
    unsafe fn load_sums1(p: &mut *const BlockQ5_0x4s, a: &Self::A) -> (int32x4_t, float32x4_t) {
        let (w, d) = Q5Tile::<Self>::load(p);
        (Self::sums(&w, a), d)
    }
}

impl<D: ChunkSums> Tile for Q5Tile<D> {
    type G = BlockQ5_0x4s;
    type W = [int8x16_t; 8];
    type A = D::A;
    #[inline(always)]
    unsafe fn weights(b: &BlockQ5_0x4s) -> Self::W {
        q5_chunks(b)
    }
    #[inline(always)]
    fn scales(b: &BlockQ5_0x4s) -> &[[u8; 2]; 4] {
        &b.d
    }
    #[inline(always)]
    unsafe fn act(y: &BlockQ8_0) -> Self::A {
        D::act(y, 16)
    }
    #[inline(always)]
    unsafe fn sums(w: &Self::W, a: &Self::A) -> int32x4_t {
        D::sums(w, a)
    }
    #[inline(always)]
    unsafe fn load_sums1(p: &mut *const BlockQ5_0x4s, a: &Self::A) -> (int32x4_t, float32x4_t) {
        D::load_sums1(p, a)
    }
}

impl ChunkSums for Sdot {
    /// The activation quants and `-offset * sum(a)`.
    type A = ([int8x16_t; 2], int32x4_t);
    #[inline(always)]
    unsafe fn act(y: &BlockQ8_0, offset: i32) -> Self::A {
        let a = act_q(y);
        (a, minus_offset_sum(a, offset))
    }
    #[inline(always)]
    unsafe fn sums(q: &[int8x16_t; 8], (a, s): &Self::A) -> int32x4_t {
        // Starting from -offset * sum(a) subtracts the offset of all 32 weights.
        sdot_chunks(*s, q, a)
    }
}

impl ChunkSums for Mull {
    /// The activation words broadcast (chunk `c` pairs with word `c % 4` of half
    /// `c / 4`), and `-offset * sum(a)`.
    type A = ([int8x16_t; 8], int32x4_t);
    #[inline(always)]
    unsafe fn act(y: &BlockQ8_0, offset: i32) -> Self::A {
        let a = act_q(y);
        let w = [vreinterpretq_s32_s8(a[0]), vreinterpretq_s32_s8(a[1])];
        let b = [
            vdupq_laneq_s32::<0>(w[0]),
            vdupq_laneq_s32::<1>(w[0]),
            vdupq_laneq_s32::<2>(w[0]),
            vdupq_laneq_s32::<3>(w[0]),
            vdupq_laneq_s32::<0>(w[1]),
            vdupq_laneq_s32::<1>(w[1]),
            vdupq_laneq_s32::<2>(w[1]),
            vdupq_laneq_s32::<3>(w[1]),
        ];
        (
            b.map(|v| vreinterpretq_s8_s32(v)),
            minus_offset_sum(a, offset),
        )
    }
    /// Products in i16: each i16 lane adds eight products `w5 * a` (or `w4 * a`), |sum|
    /// <= 8 * 31 * 128 < 2^15, exact for any activation.
    #[inline(always)]
    unsafe fn sums(w: &[int8x16_t; 8], (b, s): &Self::A) -> int32x4_t {
        // Rows 0, 1 in `p01`, rows 2, 3 in `p23`.
        let mut p01 = vmull_s8(vget_low_s8(w[0]), vget_low_s8(b[0]));
        let mut p23 = vmull_high_s8(w[0], b[0]);
        for c in 1..8 {
            p01 = vmlal_s8(p01, vget_low_s8(w[c]), vget_low_s8(b[c]));
            p23 = vmlal_high_s8(p23, w[c], b[c]);
        }
        vaddq_s32(vpaddq_s32(vpaddlq_s16(p01), vpaddlq_s16(p23)), *s)
    }
    #[inline(always)]
    unsafe fn load_sums1(p: &mut *const BlockQ5_0x4s, a: &Self::A) -> (int32x4_t, float32x4_t) {
        let mut q = *p as *const u8;
        let r = q5_group_mull(&mut q, a);
        *p = q as *const BlockQ5_0x4s;
        r
    }
}

/// Q4_0x4s: the eight chunks of unsigned nibbles `w4 = weight + 8` (`and` for the low
/// nibbles, weights `4k..4k+4`; `ushr` for the high ones, `16 + 4k..`), the `- 8` taken
/// out once per block and token as `-8 * sum(a)`, and Q4_0's own float step.
struct Q4Tile<D>(core::marker::PhantomData<D>);

/// The eight 4-bit chunks of a Q4_0x4s group-block, in [`q5_chunks`]' order.
#[inline(always)]
unsafe fn q4_chunks(b: &BlockQ4_0x4s) -> [int8x16_t; 8] {
    let q: [uint8x16_t; 4] = core::array::from_fn(|k| load16(&b.qs[k]));
    let m4 = vdupq_n_u8(0x0f);
    core::array::from_fn(|c| {
        vreinterpretq_s8_u8(if c < 4 {
            vandq_u8(q[c], m4)
        } else {
            vshrq_n_u8::<4>(q[c - 4])
        })
    })
}

impl<D: ChunkSums> Tile for Q4Tile<D> {
    type G = BlockQ4_0x4s;
    type W = [int8x16_t; 8];
    type A = D::A;
    #[inline(always)]
    unsafe fn weights(b: &BlockQ4_0x4s) -> Self::W {
        q4_chunks(b)
    }
    #[inline(always)]
    fn scales(b: &BlockQ4_0x4s) -> &[[u8; 2]; 4] {
        &b.d
    }
    #[inline(always)]
    unsafe fn act(y: &BlockQ8_0) -> Self::A {
        D::act(y, 8)
    }
    #[inline(always)]
    unsafe fn sums(w: &Self::W, a: &Self::A) -> int32x4_t {
        D::sums(w, a)
    }
    /// [`crate::quant::q4_0::vec_dot`]'s step, lane by lane: `sum += (sumi * d_w) * d_a`,
    /// two roundings and an add (not fused).
    #[inline(always)]
    unsafe fn step(acc: float32x4_t, s: int32x4_t, dw: float32x4_t, da: f32) -> float32x4_t {
        vaddq_f32(acc, vmulq_n_f32(vmulq_f32(vcvtq_f32_s32(s), dw), da))
    }
}

/// [`q5_chunks`] and [`Mull`]'s [`ChunkSums::sums`] for one token, written out as
/// [`q8_group_mull`]: per chunk position `k` the high chunk `sri(h >> k & 0x10, q[k], 4)`
/// and the low chunk `sli(q[k], h >> k & 1, 4)`, each multiplied (`smlal`, `smlal2`) by
/// its broadcast activation word as soon as it is made. `p` moves past the 88-byte
/// group-block.
///
/// # Safety
/// NEON; 88 bytes are readable at `p`.
#[inline(always)]
unsafe fn q5_group_mull(
    p: &mut *const u8,
    (b, m16): &([int8x16_t; 8], int32x4_t),
) -> (int32x4_t, float32x4_t) {
    let s: int32x4_t;
    let d: uint16x4_t;
    let (one, b4) = (vdupq_n_u8(1), vdupq_n_u8(0x10));
    // SAFETY: the caller's 88 readable bytes; writes only the registers named here.
    core::arch::asm!(
        "ld1 {{v24.16b, v25.16b, v26.16b, v27.16b}}, [{p}], #64",
        "ldr q28, [{p}], #16",
        "ldr {d:d}, [{p}], #8",
        "ushr v29.16b, v28.16b, #1",
        "ushr v30.16b, v28.16b, #2",
        "ushr v31.16b, v28.16b, #3",
        // k = 0
        "and {t:v}.16b, v28.16b, {b4:v}.16b",
        "and v28.16b, v28.16b, {one:v}.16b",
        "sri {t:v}.16b, v24.16b, #4",
        "sli v24.16b, v28.16b, #4",
        "smull {p01:v}.8h, v24.8b, {b0:v}.8b",
        "smull2 {p23:v}.8h, v24.16b, {b0:v}.16b",
        "smlal {p01:v}.8h, {t:v}.8b, {b4w:v}.8b",
        "smlal2 {p23:v}.8h, {t:v}.16b, {b4w:v}.16b",
        // k = 1
        "and {t:v}.16b, v29.16b, {b4:v}.16b",
        "and v29.16b, v29.16b, {one:v}.16b",
        "sri {t:v}.16b, v25.16b, #4",
        "sli v25.16b, v29.16b, #4",
        "smlal {p01:v}.8h, v25.8b, {b1:v}.8b",
        "smlal2 {p23:v}.8h, v25.16b, {b1:v}.16b",
        "smlal {p01:v}.8h, {t:v}.8b, {b5:v}.8b",
        "smlal2 {p23:v}.8h, {t:v}.16b, {b5:v}.16b",
        // k = 2
        "and {t:v}.16b, v30.16b, {b4:v}.16b",
        "and v30.16b, v30.16b, {one:v}.16b",
        "sri {t:v}.16b, v26.16b, #4",
        "sli v26.16b, v30.16b, #4",
        "smlal {p01:v}.8h, v26.8b, {b2:v}.8b",
        "smlal2 {p23:v}.8h, v26.16b, {b2:v}.16b",
        "smlal {p01:v}.8h, {t:v}.8b, {b6:v}.8b",
        "smlal2 {p23:v}.8h, {t:v}.16b, {b6:v}.16b",
        // k = 3
        "and {t:v}.16b, v31.16b, {b4:v}.16b",
        "and v31.16b, v31.16b, {one:v}.16b",
        "sri {t:v}.16b, v27.16b, #4",
        "sli v27.16b, v31.16b, #4",
        "smlal {p01:v}.8h, v27.8b, {b3:v}.8b",
        "smlal2 {p23:v}.8h, v27.16b, {b3:v}.16b",
        "smlal {p01:v}.8h, {t:v}.8b, {b7:v}.8b",
        "smlal2 {p23:v}.8h, {t:v}.16b, {b7:v}.16b",
        // Exact: each i16 lane adds eight products w5 * a, |sum| <= 8 * 31 * 128.
        "saddlp {p01:v}.4s, {p01:v}.8h",
        "saddlp {p23:v}.4s, {p23:v}.8h",
        "addp {s:v}.4s, {p01:v}.4s, {p23:v}.4s",
        "add {s:v}.4s, {s:v}.4s, {m16:v}.4s",
        p = inout(reg) *p,
        b0 = in(vreg) b[0],
        b1 = in(vreg) b[1],
        b2 = in(vreg) b[2],
        b3 = in(vreg) b[3],
        b4w = in(vreg) b[4],
        b5 = in(vreg) b[5],
        b6 = in(vreg) b[6],
        b7 = in(vreg) b[7],
        m16 = in(vreg) *m16,
        one = in(vreg) one,
        b4 = in(vreg) b4,
        s = out(vreg) s,
        d = out(vreg) d,
        t = out(vreg) _,
        p01 = out(vreg) _,
        p23 = out(vreg) _,
        out("v24") _, out("v25") _, out("v26") _, out("v27") _,
        out("v28") _, out("v29") _, out("v30") _, out("v31") _,
        options(pure, readonly, nostack, preserves_flags),
    );
    (s, h2f4(d))
}

/// Rows `job.rows` (inside whole groups present in `w`, group-blocks of type `G`) of a
/// repacked tensor: `GG` groups at a time (the activation work shared by their rows) x
/// tiles of `TT` tokens (`tile(groups, t)`), the last tokens one by one (`tile1`). At the
/// end of the range the last group stands in for the missing ones (computed again, not
/// written): one tile shape fewer in the binary for a few groups' work per call.
///
/// The groups are checked once (all of them whole inside `w`) and walked by pointer; for
/// one token, `GG` groups wholly inside the range are `4 GG` adjacent outputs, written
/// in one copy. Only the groups at the ends of the range (and prompts) store row by row
/// ([`put_rows`]): the per-row bookkeeping cost ~20 instructions a row before, 6 % of a
/// Q8_0 head's work.
#[inline(always)]
pub(super) unsafe fn walk<G: Pod, const GG: usize, const TT: usize>(
    job: &Job,
    w: &[u8],
    out: &mut [f32],
    mut tile: impl FnMut([*const G; GG], usize) -> [[[f32; TT]; 4]; GG],
    mut tile1: impl FnMut([*const G; GG], usize) -> [[[f32; 1]; 4]; GG],
) {
    let (rb, n_tok) = (job.rb, job.n_tok);
    let nb = 4 * rb / core::mem::size_of::<G>();
    let rows = &job.rows;
    let (mut g, end) = (rows.start / 4, rows.end.div_ceil(4));
    if g >= end {
        return;
    }
    let Some(gw) = w.get(g * 4 * rb..end * 4 * rb).and_then(cast::<G>) else {
        return;
    };
    if nb == 0 || gw.len() != (end - g) * nb {
        return;
    }
    let first = g;
    // SAFETY (of every `add` below): `g + i` is clamped to `end - 1`, whose `nb`
    // group-blocks end `gw`.
    let ptrs = |g: usize| -> [*const G; GG] {
        core::array::from_fn(|i| gw.as_ptr().add(((g + i).min(end - 1) - first) * nb))
    };
    while g < end {
        let p = ptrs(g);
        let groups = (end - g).min(GG);
        let mut t = 0;
        while t + TT <= n_tok {
            put_rows(out, rows, n_tok, g, t, groups, &tile(p, t));
            t += TT;
        }
        while t < n_tok {
            let res = tile1(p, t);
            let (r0, r1) = (4 * g, 4 * (g + GG));
            if n_tok == 1 && r0 >= rows.start && r1 <= rows.end {
                // One token, whole groups: their rows are adjacent in `out`.
                let o = &mut out[r0 - rows.start..r1 - rows.start];
                for (i, gr) in res.iter().enumerate() {
                    o[4 * i..4 * i + 4].copy_from_slice(&gr.map(|rr| rr[0]));
                }
            } else {
                put_rows(out, rows, n_tok, g, t, groups, &res);
            }
            t += 1;
        }
        g += GG;
    }
}

/// Stores the first `groups` of `res` (groups `g..`, tokens `t..t + TT`) into `out` (one
/// value per row of `rows` and token), skipping rows outside `rows`.
#[inline(never)]
fn put_rows<const GG: usize, const TT: usize>(
    out: &mut [f32],
    rows: &Range<usize>,
    n_tok: usize,
    g: usize,
    t: usize,
    groups: usize,
    res: &[[[f32; TT]; 4]; GG],
) {
    for (i, gr) in res.iter().take(groups).enumerate() {
        for (r, rr) in gr.iter().enumerate() {
            let row = 4 * (g + i) + r;
            if rows.contains(&row) {
                for (j, v) in rr.iter().enumerate() {
                    out[(row - rows.start) * n_tok + t + j] = *v;
                }
            }
        }
    }
}

/// Rows `job.rows` of a repacked tensor with tile `K`, `GG` groups at a time.
#[inline(always)]
unsafe fn body<K: Tile, const GG: usize>(job: &Job, w: &[u8], acts: &[u8], out: &mut [f32]) {
    let nb = 4 * job.rb / core::mem::size_of::<K::G>();
    let act = |t: usize| acts.as_ptr().add(t * job.arb) as *const BlockQ8_0;
    walk::<K::G, GG, T>(
        job,
        w,
        out,
        |g, t| tile::<K, GG, T>(g, core::array::from_fn(|j| act(t + j)), nb),
        |g, t| tile::<K, GG, 1>(g, [act(t)], nb),
    )
}

/// Entry points, one per feature set (so that `sdot` is only compiled into the dotprod
/// one).
mod jobs {
    use super::*;

    /// `GG` groups a pass for prompts, `GG1` for one token (whose tiles hold fewer
    /// registers: four groups share one activation block's work without spilling).
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn base<K: Tile, const GG: usize, const GG1: usize>(
        job: &Job,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) {
        if job.n_tok == 1 {
            body::<K, GG1>(job, w, acts, out)
        } else {
            body::<K, GG>(job, w, acts, out)
        }
    }

    #[target_feature(enable = "neon,dotprod")]
    pub(super) unsafe fn dot<K: Tile, const GG: usize>(
        job: &Job,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) {
        body::<K, GG>(job, w, acts, out)
    }
}
