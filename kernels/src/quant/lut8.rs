//! Q1_0 and Q2_0 times Q8_0 through **8-bit** lookup tables (`--lut8`): the arithmetic of
//! the [`crate::repack::Layout::Q1_0x16Lut8`] / [`crate::repack::Layout::Q2_0x16Lut8`]
//! kernels. It is *not* llama.cpp's. An exact table of four 1-bit weights' subset sums
//! (or two 2-bit weights' pair sums) spans 10 bits, so the exact kernels need two byte
//! tables per lookup (Q1_0) or pair tables with several merges (Q2_0); here every entry is
//! rounded to one signed byte, which halves the lookups (the seed's kernel: "about 8 NEON
//! ops + 2 loads per 128 multiply-adds") at the cost of a rounding error per entry. Opt-in
//! only; its distance from the exact product is measured by `kernels/tests/lut8.rs` and
//! stated in the README.
//!
//! Both formats have 18-byte blocks (an f16 scale, 16 code bytes) whose 32 nibbles each
//! index one table of 16 entries: a Q1_0 nibble holds four sign bits (group `g` = weights
//! `4g..4g + 4`, 128 weights, four Q8_0 activation blocks), a Q2_0 nibble two 2-bit codes
//! (pair `g` = weights `2g, 2g + 1`, levels `L = code - 1` in -1..=2, 64 weights, two Q8_0
//! blocks). Q2_0's tables hold the centred levels `2L - 1` (-3, -1, 1, 3: a quarter
//! narrower than `2L`, so a quarter finer once rounded), and the rest, `sum(q)` over the
//! block, is one offset per block and token. Per weight block, with Q8_0 blocks `y_k`
//! (scales `d_k`):
//! - `T_g(n)`, the exact integer dot of table `g`'s activations with the (centred)
//!   levels nibble `n` encodes ([`Lut8Format::entries`]);
//! - `m = max_k |d_k| * W_k`, where `W_k` ([`Lut8Format::widest`]) bounds `|T_g(n)|` over
//!   block `k`'s tables; `c_k = d_k * (127 / m)` (f32, in that order), entries `e_g(n) =
//!   rne(T_g(n) * c_k)` clamped to ±127 (`rne`: round to nearest, ties to even), the
//!   offset `o = rne(sum_k c_k * B_k)` ([`Lut8Format::bias`] `B_k`: 0 for Q1_0, `sum(q)`
//!   for Q2_0; the products added in `k` order), and the block's table scale `s = m /
//!   (127 * DIV)` ([`Lut8Format::DIV`]: 1, or 2 for Q2_0's doubled levels);
//! - a row with nibbles `n_g` and scale `d_w`: `isum = o + sum_g e_g(n_g)` (exact in i16:
//!   at most 32 x 127 plus `|o|` <= 2 x 16 x 127 / 3), then `sum = fma(isum, d_w * s,
//!   sum)` block after block.
//!
//! Blocks whose activations are all zero have `s = 0` (zero tables); a non-finite `d_k`
//! gives `s = NaN` (zero tables), so the row's sum is NaN as in the exact kernels.
use super::q8_0::{act_blocks, BlockQ8_0};
use crate::blocks::cast;
use crate::f16::read_f16;

/// Tables (nibbles) per weight block.
pub const GROUPS: usize = 32;
/// The most Q8_0 blocks a weight block spans.
pub const MAX_SUB: usize = 4;

/// One weight block's tables: `[g][n]` is table `g`'s entry for nibble `n`.
pub type BlockTables = [[i8; 16]; GROUPS];

/// A weight block of either format: an f16 scale, then 16 code bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}
crate::pod_block!(Block);
static_assertions::const_assert_eq!(core::mem::size_of::<Block>(), super::q1_0::BLOCK_BYTES);
static_assertions::const_assert_eq!(core::mem::size_of::<Block>(), super::q2_0::BLOCK_BYTES);

/// What a format contributes: how its nibbles map to exact integer table entries.
pub trait Lut8Format {
    /// Q8_0 activation blocks per weight block.
    const SUB: usize;
    /// Tables per Q8_0 block (`GROUPS / SUB`).
    const PER_SUB: usize = GROUPS / Self::SUB;
    /// What the entries are divided by to give the dot product (2: doubled levels).
    const DIV: f32 = 1.0;
    /// A bound on `|T_g(n)|` over the tables of Q8_0 block `y` (at most 768).
    fn widest(y: &BlockQ8_0) -> i32;
    /// `T_j(n)` for table `j` of `y` (`0..PER_SUB`), every nibble `n`.
    fn entries(y: &BlockQ8_0, j: usize) -> [i32; 16];
    /// The part of `DIV` x the dot product that the tables leave out, per Q8_0 block.
    fn bias(_y: &BlockQ8_0) -> i32 {
        0
    }
}

/// Q1_0: four sign bits per nibble (bit `i` set: weight `4g + i` is `+d`).
pub struct Q1;
/// Q2_0: two codes per nibble (weight `2g` in bits 0..2, `2g + 1` in bits 2..4).
pub struct Q2;

impl Lut8Format for Q1 {
    const SUB: usize = 4;
    fn widest(y: &BlockQ8_0) -> i32 {
        (0..8)
            .map(|g| (0..4).map(|i| y.q(4 * g + i).abs()).sum::<i32>())
            .max()
            .unwrap_or(0)
    }
    fn entries(y: &BlockQ8_0, j: usize) -> [i32; 16] {
        core::array::from_fn(|n| {
            (0..4)
                .map(|i| {
                    let q = y.q(4 * j + i);
                    if (n >> i) & 1 == 1 {
                        q
                    } else {
                        -q
                    }
                })
                .sum()
        })
    }
}

/// `2 L - 1` for a Q2_0 code (level `L = code - 1`): -3, -1, 1, 3.
#[inline(always)]
fn centred(code: usize) -> i32 {
    2 * code as i32 - 3
}

impl Lut8Format for Q2 {
    const SUB: usize = 2;
    const DIV: f32 = 2.0;
    fn widest(y: &BlockQ8_0) -> i32 {
        (0..16)
            .map(|p| 3 * (y.q(2 * p).abs() + y.q(2 * p + 1).abs()))
            .max()
            .unwrap_or(0)
    }
    fn entries(y: &BlockQ8_0, j: usize) -> [i32; 16] {
        let (q0, q1) = (y.q(2 * j), y.q(2 * j + 1));
        core::array::from_fn(|n| centred(n & 3) * q0 + centred(n >> 2) * q1)
    }
    fn bias(y: &BlockQ8_0) -> i32 {
        (0..32).map(|j| y.q(j)).sum()
    }
}

/// Round to nearest, ties to even, for `|x| < 2^22` (the `fcvtns` rule): the addition
/// rounds away the fraction in f32's own mode.
#[inline(always)]
fn rne(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (x + MAGIC) - MAGIC
}

/// How a block's tables are scaled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockScale {
    /// All activations zero: zero tables, `s = 0`.
    Zero,
    /// A non-finite activation scale: zero tables, `s = NaN`.
    NonFinite,
    /// `c[k]` multiplies Q8_0 block `k`'s entries; `s` is the table scale.
    Scaled { c: [f32; MAX_SUB], s: f32 },
}

impl BlockScale {
    /// The table scale `s`.
    pub fn s(&self) -> f32 {
        match self {
            BlockScale::Zero => 0.0,
            BlockScale::NonFinite => f32::NAN,
            BlockScale::Scaled { s, .. } => *s,
        }
    }
}

/// The scales of a block from its Q8_0 scales `d` and [`Lut8Format::widest`] bounds
/// (equal lengths, at most [`MAX_SUB`]); `s` is `m / (127 * div)`.
pub fn block_scale(d: &[f32], widest: &[i32], div: f32) -> BlockScale {
    if d.iter().any(|x| !x.is_finite()) {
        return BlockScale::NonFinite;
    }
    let mut m = 0.0f32;
    for (dk, wk) in d.iter().zip(widest) {
        let v = dk.abs() * *wk as f32;
        if v > m {
            m = v;
        }
    }
    if m == 0.0 {
        return BlockScale::Zero;
    }
    let inv = 127.0 / m;
    let mut c = [0.0f32; MAX_SUB];
    for (ck, dk) in c.iter_mut().zip(d) {
        *ck = dk * inv;
    }
    BlockScale::Scaled {
        c,
        s: m / (127.0 * div),
    }
}

/// One table's entries: `rne(T(n) * c)` clamped to ±127.
pub fn round_entries(t: [i32; 16], c: f32) -> [i8; 16] {
    t.map(|v| (rne(v as f32 * c) as i32).clamp(-127, 127) as i8)
}

/// The offset `rne(sum_k c_k * B_k)` of a block from its [`Lut8Format::bias`] values `b`
/// (0 where every `B_k` is 0).
pub fn offset(c: &[f32], b: &[i32]) -> i32 {
    if b.iter().all(|&x| x == 0) {
        return 0;
    }
    let mut v = 0.0f32;
    for (ck, bk) in c.iter().zip(b) {
        v += ck * *bk as f32;
    }
    rne(v) as i32
}

/// A block's table scale and offset.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TableScale {
    pub s: f32,
    pub offset: i32,
}

/// The tables of one weight block's activations `y` (its `F::SUB` Q8_0 blocks) into `t`;
/// returns the table scale and offset.
pub fn block_tables<F: Lut8Format>(y: &[BlockQ8_0], t: &mut BlockTables) -> TableScale {
    *t = [[0; 16]; GROUPS];
    let Some(y) = y.get(..F::SUB) else {
        return TableScale {
            s: f32::NAN,
            offset: 0,
        };
    };
    let mut d = [0.0f32; MAX_SUB];
    let mut w = [0i32; MAX_SUB];
    let mut b = [0i32; MAX_SUB];
    for (k, yk) in y.iter().enumerate() {
        d[k] = yk.scale();
        w[k] = F::widest(yk);
        b[k] = F::bias(yk);
    }
    let scale = block_scale(&d[..F::SUB], &w[..F::SUB], F::DIV);
    let mut offset_ = 0;
    if let BlockScale::Scaled { c, .. } = scale {
        for (k, yk) in y.iter().enumerate() {
            for j in 0..F::PER_SUB {
                t[F::PER_SUB * k + j] = round_entries(F::entries(yk, j), c[k]);
            }
        }
        offset_ = offset(&c[..F::SUB], &b[..F::SUB]);
    }
    TableScale {
        s: scale.s(),
        offset: offset_,
    }
}

/// Nibble `g` of block `x`.
#[inline(always)]
pub fn nibble(x: &Block, g: usize) -> usize {
    usize::from((x.qs[g / 2] >> (4 * (g % 2))) & 15)
}

/// `sum_g e_g(n_g)` of block `x` with tables `t`.
pub fn block_isum(x: &Block, t: &BlockTables) -> i32 {
    (0..GROUPS).map(|g| i32::from(t[g][nibble(x, g)])).sum()
}

/// `fma(o + isum, d_w * s, sum)` of block `x` and its activations `ys` (tables built in
/// `t`).
pub fn block_dot<F: Lut8Format>(x: &Block, ys: &[BlockQ8_0], t: &mut BlockTables, sum: f32) -> f32 {
    let ts = block_tables::<F>(ys, t);
    let isum = ts.offset + block_isum(x, t);
    libm::fmaf(isum as f32, read_f16(x.d) * ts.s, sum)
}

/// Scalar reference: one row of weight blocks (`w`) dotted with a Q8_0 activation row in
/// this arithmetic.
pub fn vec_dot<F: Lut8Format>(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<Block>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    let mut t = [[0i8; 16]; GROUPS];
    let mut sum = 0.0f32;
    for (x, ys) in w.iter().zip(a.chunks_exact(F::SUB)) {
        sum = block_dot::<F>(x, ys, &mut t, sum);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rne_rounds_ties_to_even() {
        for (x, r) in [
            (0.5f32, 0.0f32),
            (1.5, 2.0),
            (2.5, 2.0),
            (-0.5, -0.0),
            (-1.5, -2.0),
            (126.49, 126.0),
            (-126.51, -127.0),
        ] {
            assert_eq!(rne(x), r, "{x}");
        }
    }

    /// `widest` bounds every entry, and is reached for Q1_0 (all signs matching).
    #[test]
    fn widest_bounds_the_entries() {
        let mut b = [0u8; 34];
        for (i, v) in b[2..].iter_mut().enumerate() {
            *v = ((i * 37 + 11) % 256) as u8;
        }
        let y = cast::<BlockQ8_0>(&b).unwrap()[0];
        let top = |e: [i32; 16]| e.iter().map(|v| v.abs()).max().unwrap();
        let q1 = (0..8).map(|j| top(Q1::entries(&y, j))).max().unwrap();
        assert_eq!(q1, Q1::widest(&y));
        let q2 = (0..16).map(|j| top(Q2::entries(&y, j))).max().unwrap();
        assert_eq!(q2, Q2::widest(&y), "the centred levels reach the bound");
    }
}
