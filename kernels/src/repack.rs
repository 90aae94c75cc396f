//! Repacked (row-interleaved) weight layouts.
//!
//! A weight matrix in GGUF is stored row after row, so a kernel that computes four rows
//! at once reads four streams a whole row apart (for the 262144 x 640 Q8_0 head of
//! Gemma 3 270M, 680 bytes apart), which the hardware prefetcher follows badly. A
//! repacked matrix stores the rows of a group interleaved block by block, so the same
//! tile reads one sequential stream.
//!
//! [`Layout::Q8_0x4`] (Q8_0 weights only): rows are taken in groups of four. For group
//! `g` (rows `4g..4g+4`) and block `b`, one 136-byte [`BlockQ8_0x4`] holds the four f16
//! scales first (`d[r]`, 8 bytes, so the NEON kernel converts them with one
//! instruction) and then the four rows' 32 quants (`qs[r]`). The group-blocks of group `g`
//! fill bytes `4g * row_bytes .. 4(g+1) * row_bytes`, exactly the bytes the four plain
//! rows occupied, so the repacked tensor has the plain tensor's size and
//! [`repack_in_place`] needs no second copy of it. When the row count is not a multiple
//! of four, the last `rows % 4` rows stay plain at the end (no padding, so sizes never
//! change and offsets into a cache file are the plain ones).
//!
//! Every product over a repacked matrix ([`matmul_rows`]) gives, per (row, token), the
//! plain kernels' bits: the same blocks in the same order with the same fused steps
//! ([`crate::quant::q8_0::lanes8_dot`]).
use core::ops::Range;

use crate::blocks::{cast, cast_mut};
use crate::matvec::KernelError;
use crate::quant::q8_0::{self, BlockQ8_0, BLOCK_BYTES, QK};
use crate::{CpuFeatures, GgmlType};

/// How a weight tensor's bytes are arranged in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// As in GGUF: row after row.
    #[default]
    Plain,
    /// Q8_0, groups of four rows interleaved block by block ([`BlockQ8_0x4`]); the last
    /// `rows % 4` rows plain.
    Q8_0x4,
}

impl Layout {
    /// Stable id (stored in repack cache files).
    pub fn id(self) -> u32 {
        match self {
            Layout::Plain => 0,
            Layout::Q8_0x4 => 1,
        }
    }
    /// The layout of id `id`, if known.
    pub fn from_id(id: u32) -> Option<Layout> {
        match id {
            0 => Some(Layout::Plain),
            1 => Some(Layout::Q8_0x4),
            _ => None,
        }
    }
    /// Rows per interleaved group (1 for [`Layout::Plain`]).
    pub fn group_rows(self) -> usize {
        match self {
            Layout::Plain => 1,
            Layout::Q8_0x4 => 4,
        }
    }
    /// Short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Plain => "plain",
            Layout::Q8_0x4 => "q8_0x4",
        }
    }
    /// The repacked layout pinch uses for weights of type `ty`, if any.
    pub fn preferred(ty: GgmlType) -> Option<Layout> {
        match ty {
            GgmlType::Q8_0 => Some(Layout::Q8_0x4),
            _ => None,
        }
    }
    /// Whether tensors of type `ty` can have this layout.
    pub fn fits(self, ty: GgmlType) -> bool {
        match self {
            Layout::Plain => true,
            Layout::Q8_0x4 => ty == GgmlType::Q8_0,
        }
    }
    /// Scratch bytes [`repack_in_place`] / [`unpack_in_place`] need for rows of
    /// `row_bytes`: one group of rows.
    pub fn scratch_bytes(self, row_bytes: usize) -> usize {
        match self {
            Layout::Plain => 0,
            Layout::Q8_0x4 => 4 * row_bytes,
        }
    }
}

/// Whether `layout` has a SIMD kernel on this CPU (without one, [`matmul_rows`] falls
/// back to a scalar loop slower than the plain scalar path: do not repack then).
pub fn has_fast_kernel(layout: Layout, feat: &CpuFeatures) -> bool {
    match layout {
        Layout::Plain => true,
        Layout::Q8_0x4 => {
            (cfg!(target_arch = "x86_64") && feat.avx2)
                || (cfg!(target_arch = "aarch64") && feat.neon)
        }
    }
}

/// One block of four Q8_0 rows: the four scales, then the four rows' quants.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0x4 {
    /// Scales (f16 little-endian) of rows 0..4 of the group.
    pub d: [[u8; 2]; 4],
    /// Quants (i8 as bytes) of rows 0..4 of the group.
    pub qs: [[u8; QK]; 4],
}
crate::pod_block!(BlockQ8_0x4);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockQ8_0x4>(), 4 * BLOCK_BYTES);

/// Check that `data` is whole rows of `row_bytes` of type `ty` that `layout` fits.
fn check_shape(
    layout: Layout,
    ty: GgmlType,
    data_len: usize,
    row_bytes: usize,
) -> Result<(), KernelError> {
    if !layout.fits(ty) {
        return Err(KernelError::Unsupported(ty));
    }
    let (_, bytes) = ty.block_geometry();
    if row_bytes == 0 || !row_bytes.is_multiple_of(bytes) || !data_len.is_multiple_of(row_bytes) {
        return Err(KernelError::BadLength {
            what: "repack: tensor bytes (whole rows of whole blocks)",
            expected: data_len / row_bytes.max(1) * row_bytes,
            found: data_len,
        });
    }
    Ok(())
}

fn check_scratch(layout: Layout, row_bytes: usize, scratch: &[u8]) -> Result<(), KernelError> {
    let need = layout.scratch_bytes(row_bytes);
    if scratch.len() < need {
        return Err(KernelError::BadLength {
            what: "repack scratch",
            expected: need,
            found: scratch.len(),
        });
    }
    Ok(())
}

/// Rearrange a plain tensor of type `ty` (`data`: whole rows of `row_bytes`) into
/// `layout`, in place, one group of rows at a time through `scratch` (at least
/// [`Layout::scratch_bytes`]). The tensor never exists twice.
pub fn repack_in_place(
    layout: Layout,
    ty: GgmlType,
    data: &mut [u8],
    row_bytes: usize,
    scratch: &mut [u8],
) -> Result<(), KernelError> {
    check_shape(layout, ty, data.len(), row_bytes)?;
    check_scratch(layout, row_bytes, scratch)?;
    match layout {
        Layout::Plain => Ok(()),
        Layout::Q8_0x4 => {
            let gb = 4 * row_bytes;
            let nb = row_bytes / BLOCK_BYTES;
            let scratch = &mut scratch[..gb];
            for group in data.chunks_exact_mut(gb) {
                scratch.copy_from_slice(group);
                let src = cast::<BlockQ8_0>(scratch).unwrap_or(&[]);
                let dst = cast_mut::<BlockQ8_0x4>(group).unwrap_or(&mut []);
                for (b, out) in dst.iter_mut().enumerate() {
                    for r in 0..4 {
                        let x = &src[r * nb + b];
                        out.d[r] = x.d;
                        out.qs[r] = x.qs;
                    }
                }
            }
            Ok(())
        }
    }
}

/// The inverse of [`repack_in_place`]: back to plain rows.
pub fn unpack_in_place(
    layout: Layout,
    ty: GgmlType,
    data: &mut [u8],
    row_bytes: usize,
    scratch: &mut [u8],
) -> Result<(), KernelError> {
    check_shape(layout, ty, data.len(), row_bytes)?;
    check_scratch(layout, row_bytes, scratch)?;
    match layout {
        Layout::Plain => Ok(()),
        Layout::Q8_0x4 => {
            let gb = 4 * row_bytes;
            let nb = row_bytes / BLOCK_BYTES;
            let scratch = &mut scratch[..gb];
            for group in data.chunks_exact_mut(gb) {
                scratch.copy_from_slice(group);
                let src = cast::<BlockQ8_0x4>(scratch).unwrap_or(&[]);
                let dst = cast_mut::<BlockQ8_0>(group).unwrap_or(&mut []);
                for (b, x) in src.iter().enumerate() {
                    for r in 0..4 {
                        let out = &mut dst[r * nb + b];
                        out.d = x.d[r];
                        out.qs = x.qs[r];
                    }
                }
            }
            Ok(())
        }
    }
}

/// Block `b` of row `r` of a Q8_0x4 tensor of `n_rows` rows (plain blocks for the tail).
#[inline]
fn q8_0x4_block(w: &[u8], row_bytes: usize, n_rows: usize, r: usize, b: usize) -> BlockQ8_0 {
    let n4 = n_rows / 4 * 4;
    if r >= n4 {
        let o = r * row_bytes + b * BLOCK_BYTES;
        return cast::<BlockQ8_0>(&w[o..o + BLOCK_BYTES]).unwrap_or(&[])[0];
    }
    let o = (r / 4) * 4 * row_bytes + b * 4 * BLOCK_BYTES;
    let g = &cast::<BlockQ8_0x4>(&w[o..o + 4 * BLOCK_BYTES]).unwrap_or(&[])[0];
    BlockQ8_0 {
        d: g.d[r % 4],
        qs: g.qs[r % 4],
    }
}

/// Copy row `r` of a tensor in `layout` (`w`: all of its rows) out as a plain row
/// (`dst.len() == row_bytes`).
pub fn row_to_plain(
    layout: Layout,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    r: usize,
    dst: &mut [u8],
) -> Result<(), KernelError> {
    check_shape(layout, ty, w.len(), row_bytes)?;
    let n_rows = w.len() / row_bytes;
    if r >= n_rows || dst.len() != row_bytes {
        return Err(KernelError::BadLength {
            what: "repack: row",
            expected: row_bytes,
            found: if r >= n_rows { 0 } else { dst.len() },
        });
    }
    match layout {
        Layout::Plain => dst.copy_from_slice(&w[r * row_bytes..(r + 1) * row_bytes]),
        Layout::Q8_0x4 => {
            let out = cast_mut::<BlockQ8_0>(dst).unwrap_or(&mut []);
            for (b, o) in out.iter_mut().enumerate() {
                *o = q8_0x4_block(w, row_bytes, n_rows, r, b);
            }
        }
    }
    Ok(())
}

/// Dequantize row `r` of a tensor in `layout` into `dst` (`cols` values).
pub fn dequantize_row(
    layout: Layout,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    r: usize,
    dst: &mut [f32],
) -> Result<(), KernelError> {
    match layout {
        Layout::Plain => {
            let n_rows = w.len() / row_bytes.max(1);
            if r >= n_rows {
                return Err(KernelError::BadLength {
                    what: "dequantize: row",
                    expected: row_bytes,
                    found: 0,
                });
            }
            crate::matvec::dequantize_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], dst)
        }
        Layout::Q8_0x4 => {
            check_shape(layout, ty, w.len(), row_bytes)?;
            let n_rows = w.len() / row_bytes;
            let nb = row_bytes / BLOCK_BYTES;
            if r >= n_rows || dst.len() != nb * QK {
                return Err(KernelError::BadLength {
                    what: "dequantize: row",
                    expected: nb * QK,
                    found: dst.len(),
                });
            }
            for (b, out) in dst.chunks_exact_mut(QK).enumerate() {
                let x = q8_0x4_block(w, row_bytes, n_rows, r, b);
                let d = x.scale();
                for (j, o) in out.iter_mut().enumerate() {
                    *o = x.q(j) as f32 * d;
                }
            }
            Ok(())
        }
    }
}

/// Scalar reference: dot product of row `r` of a Q8_0x4 tensor (`w`: all its rows) with
/// one Q8_0 activation row, in the arithmetic of [`q8_0::vec_dot`].
pub fn dot_row_scalar(w: &[u8], row_bytes: usize, r: usize, act: &[u8]) -> f32 {
    let n_rows = w.len() / row_bytes.max(1);
    let a = q8_0::act_blocks(act);
    let nb = row_bytes / BLOCK_BYTES;
    q8_0::lanes8_dot((0..nb).zip(a).map(|(b, y)| {
        let x = q8_0x4_block(w, row_bytes, n_rows, r, b);
        let q: [i32; QK] = core::array::from_fn(|j| x.q(j));
        (x.scale() * y.scale(), q8_0::lane_sums(&q, y))
    }))
}

/// [`crate::matvec::matmul_rows`] for a tensor in `layout`: `w` holds *all* rows of the
/// tensor (the layout's groups are counted from row 0), `rows` is any range of them
/// (ranges aligned to [`Layout::group_rows`] are fastest), `out[i * n_tok + t] =
/// dot(row rows.start + i, activation t)`, bit for bit what the plain kernels give.
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows(
    layout: Layout,
    ty: GgmlType,
    feat: &CpuFeatures,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_row_bytes: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if layout == Layout::Plain {
        return crate::matvec::matmul_rows(ty, feat, w, row_bytes, rows, acts, act_row_bytes, out);
    }
    check_shape(layout, ty, w.len(), row_bytes)?;
    let n_rows = w.len() / row_bytes;
    if act_row_bytes != row_bytes || !acts.len().is_multiple_of(act_row_bytes) {
        // Q8_0 weights pair with Q8_0 activations of the same block count.
        return Err(KernelError::BadLength {
            what: "activation rows",
            expected: row_bytes,
            found: act_row_bytes,
        });
    }
    let n_tok = acts.len() / act_row_bytes;
    if rows.start > rows.end || rows.end > n_rows {
        return Err(KernelError::BadLength {
            what: "weight rows",
            expected: rows.end * row_bytes,
            found: w.len(),
        });
    }
    if out.len() != rows.len() * n_tok {
        return Err(KernelError::BadLength {
            what: "output",
            expected: rows.len() * n_tok,
            found: out.len(),
        });
    }
    if crate::arch::repack_matmul_rows(layout, feat, w, row_bytes, rows.clone(), acts, out) {
        return Ok(());
    }
    matmul_rows_scalar(w, row_bytes, rows, acts, out);
    Ok(())
}

/// The scalar loop of [`matmul_rows`] for [`Layout::Q8_0x4`] (shapes already checked).
pub fn matmul_rows_scalar(
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    acts: &[u8],
    out: &mut [f32],
) {
    let n_tok = acts.len() / row_bytes;
    for (i, r) in rows.enumerate() {
        for t in 0..n_tok {
            out[i * n_tok + t] =
                dot_row_scalar(w, row_bytes, r, &acts[t * row_bytes..(t + 1) * row_bytes]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::f16::f32_to_f16;
    use crate::testutil::Rng;

    /// A random Q8_0 tensor with realistic scales and the activation rows for it.
    fn tensor(rows: usize, nb: usize, seed: u64) -> ([u8; 4096], usize) {
        let mut rng = Rng(seed);
        let mut w = [0u8; 4096];
        let n = rows * nb * BLOCK_BYTES;
        rng.fill_bytes(&mut w[..n]);
        for blk in w[..n].chunks_mut(BLOCK_BYTES) {
            let d = 0.001 + (rng.f32().abs() * 0.05);
            blk[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        }
        (w, n)
    }

    fn acts(n_tok: usize, nb: usize, seed: u64) -> ([u8; 1024], usize) {
        let mut rng = Rng(seed);
        let mut x = [0.0f32; 256];
        let mut a = [0u8; 1024];
        let n = nb * QK;
        for t in 0..n_tok {
            rng.fill_f32(&mut x[..n], 2.0);
            q8_0::quantize_row_x86(
                &x[..n],
                &mut a[t * nb * BLOCK_BYTES..(t + 1) * nb * BLOCK_BYTES],
            );
        }
        (a, n_tok * nb * BLOCK_BYTES)
    }

    #[test]
    fn repack_then_unpack_is_the_identity_and_rows_read_back() {
        for rows in [1usize, 3, 4, 5, 8, 9, 11] {
            let nb = 3;
            let rb = nb * BLOCK_BYTES;
            let (orig, n) = tensor(rows, nb, rows as u64 + 1);
            let mut w = orig;
            let mut scratch = [0u8; 4 * 3 * BLOCK_BYTES];
            repack_in_place(
                Layout::Q8_0x4,
                GgmlType::Q8_0,
                &mut w[..n],
                rb,
                &mut scratch,
            )
            .unwrap();
            if rows >= 4 {
                assert_ne!(&w[..n], &orig[..n], "rows {rows}: repack changed nothing");
            }
            // Tail rows stay plain.
            let n4 = rows / 4 * 4;
            assert_eq!(&w[n4 * rb..n], &orig[n4 * rb..n]);
            let mut row = [0u8; 3 * BLOCK_BYTES];
            let mut f1 = [0.0f32; 3 * QK];
            let mut f2 = [0.0f32; 3 * QK];
            for r in 0..rows {
                row_to_plain(Layout::Q8_0x4, GgmlType::Q8_0, &w[..n], rb, r, &mut row).unwrap();
                assert_eq!(&row[..], &orig[r * rb..(r + 1) * rb], "rows {rows} row {r}");
                dequantize_row(Layout::Q8_0x4, GgmlType::Q8_0, &w[..n], rb, r, &mut f1).unwrap();
                dequantize_row(Layout::Plain, GgmlType::Q8_0, &orig[..n], rb, r, &mut f2).unwrap();
                assert_eq!(f1, f2);
            }
            unpack_in_place(
                Layout::Q8_0x4,
                GgmlType::Q8_0,
                &mut w[..n],
                rb,
                &mut scratch,
            )
            .unwrap();
            assert_eq!(&w[..n], &orig[..n], "rows {rows}");
        }
    }

    #[test]
    fn bad_shapes_and_types_are_errors() {
        let mut w = [0u8; 4 * BLOCK_BYTES];
        let mut s = [0u8; 4 * BLOCK_BYTES];
        assert!(
            repack_in_place(Layout::Q8_0x4, GgmlType::Q4_0, &mut w, BLOCK_BYTES, &mut s).is_err()
        );
        assert!(repack_in_place(Layout::Q8_0x4, GgmlType::Q8_0, &mut w, 33, &mut s).is_err());
        assert!(repack_in_place(
            Layout::Q8_0x4,
            GgmlType::Q8_0,
            &mut w,
            BLOCK_BYTES,
            &mut s[..10]
        )
        .is_err());
        let mut out = [0.0f32; 1];
        let a = [0u8; BLOCK_BYTES];
        let f = CpuFeatures::SCALAR;
        assert!(matmul_rows(
            Layout::Q8_0x4,
            GgmlType::Q8_0,
            &f,
            &w,
            BLOCK_BYTES,
            3..5,
            &a,
            BLOCK_BYTES,
            &mut out
        )
        .is_err());
        assert!(matmul_rows(
            Layout::Q8_0x4,
            GgmlType::Q8_0,
            &f,
            &w,
            BLOCK_BYTES,
            0..2,
            &a,
            BLOCK_BYTES,
            &mut out
        )
        .is_err());
        assert_eq!(Layout::from_id(Layout::Q8_0x4.id()), Some(Layout::Q8_0x4));
        assert_eq!(Layout::from_id(99), None);
    }

    /// Scalar repacked products equal the plain scalar reference bit for bit, per (row,
    /// token), over odd row counts and unaligned ranges (the SIMD paths are checked in
    /// `tests/repack.rs`, for every feature set of the running CPU).
    #[test]
    fn repacked_products_equal_plain_reference_bits() {
        let feats = [CpuFeatures::SCALAR];
        for rows in [1usize, 4, 7, 12, 13] {
            for nb in [1usize, 2, 5] {
                let rb = nb * BLOCK_BYTES;
                let (orig, n) = tensor(rows, nb, (rows * 31 + nb) as u64);
                let mut w = orig;
                let mut scratch = [0u8; 4 * 5 * BLOCK_BYTES];
                repack_in_place(
                    Layout::Q8_0x4,
                    GgmlType::Q8_0,
                    &mut w[..n],
                    rb,
                    &mut scratch,
                )
                .unwrap();
                for n_tok in [1usize, 2, 3, 4, 5, 9] {
                    if n_tok * rb > 1024 {
                        continue;
                    }
                    let (a, an) = acts(n_tok, nb, (n_tok * 7 + rows) as u64);
                    let a = &a[..an];
                    let ranges = [0..rows, 1..rows, 0..rows.min(3), rows / 2..rows, rows..rows];
                    for range in ranges {
                        let mut out = [0.0f32; 13 * 9];
                        let out = &mut out[..range.len() * n_tok];
                        for f in &feats {
                            out.fill(f32::NAN);
                            matmul_rows(
                                Layout::Q8_0x4,
                                GgmlType::Q8_0,
                                f,
                                &w[..n],
                                rb,
                                range.clone(),
                                a,
                                rb,
                                out,
                            )
                            .unwrap();
                            for (i, r) in range.clone().enumerate() {
                                for t in 0..n_tok {
                                    let want = q8_0::vec_dot(
                                        &orig[r * rb..(r + 1) * rb],
                                        &a[t * rb..(t + 1) * rb],
                                    );
                                    let got = out[i * n_tok + t];
                                    assert_eq!(got.to_bits(), want.to_bits(), "{f:?} rows {rows} nb {nb} n_tok {n_tok} range {range:?} r {r} t {t}: {got} vs {want}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
