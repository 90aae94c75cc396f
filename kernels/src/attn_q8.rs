//! Attention inner loops over a Q8_0 KV cache (llama.cpp's `--cache-type-k/v q8_0`):
//! each cached row is blocks of 32 int8 values along the head dimension with one f16
//! scale ([`BlockQ8_0`], 8.5 bits per value, 34 bytes per 32 values).
//!
//! - Scores: the query is quantized to Q8_0 too and dotted with each key row by the
//!   Q8_0 x Q8_0 kernel the matmuls use ([`matvec::vec_dot`]: exact int8 sums per
//!   block, `sdot`/VNNI/AVX2 where the CPU has them). This is llama.cpp's flash-attention
//!   arithmetic for a Q8_0 K (it converts Q to K's dot type).
//! - Values: `out[d] += (w_j * scale_jb) * q_jd`, rows in order, a zero weight skipped
//!   (never read), one f32 multiply and add per value (no fused step, so the loop gives
//!   the same bits scalar or auto-vectorized, on every ISA).
//!
//! Nothing here is ISA code: the dot kernels are `matvec`'s, which dispatch on
//! [`CpuFeatures`] and are tested against their scalar references there.
use crate::ggml_type::GgmlType;
use crate::matvec;
use crate::quant::q8_0::{self, BlockQ8_0, BLOCK_BYTES, QK};
use crate::CpuFeatures;

/// Bytes of a Q8_0 row of `values` (a multiple of 32), `None` otherwise.
pub fn row_bytes(values: usize) -> Option<usize> {
    values.is_multiple_of(QK).then(|| values / QK * BLOCK_BYTES)
}

/// Store `x` (whole blocks of 32) as Q8_0 into `dst` with the quantizer llama.cpp's
/// CPU backend uses for its cache copies and activations ([`q8_0::quantize_row_x86`]).
#[inline]
pub fn quantize(x: &[f32], dst: &mut [u8]) {
    q8_0::quantize_row_x86(x, dst)
}

/// `n` rows of `len` blocks, row `j` starting at block `j * stride` of `data`: the
/// Q8_0 key or value rows of one KV head over a span of positions.
#[derive(Clone, Copy, Debug)]
pub struct Q8Rows<'a> {
    data: &'a [u8],
    stride: usize,
    len: usize,
    n: usize,
}

impl<'a> Q8Rows<'a> {
    /// `n` rows, or as many as `data` holds (strides and lengths in blocks).
    pub fn new(data: &'a [u8], stride: usize, len: usize, n: usize) -> Q8Rows<'a> {
        let fit = crate::attn::rows_that_fit(data.len() / BLOCK_BYTES, stride, len);
        Q8Rows {
            data,
            stride,
            len,
            n: n.min(fit),
        }
    }
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.n
    }
    /// Values per row.
    pub fn row_len(&self) -> usize {
        self.len * QK
    }
    /// The bytes of row `j` (`j < rows()`).
    #[inline]
    pub fn row(&self, j: usize) -> &'a [u8] {
        let s = j * self.stride * BLOCK_BYTES;
        &self.data[s..s + self.len * BLOCK_BYTES]
    }
}

/// `outs[g][j] = k.row(j) · qs[g]` for Q8_0 queries `qs` (each [`row_bytes`] of the
/// row length), on the fastest Q8_0 x Q8_0 kernel `feat` allows.
pub fn dots(feat: &CpuFeatures, k: &Q8Rows, qs: &[&[u8]], outs: &mut [&mut [f32]]) {
    // The kernel is looked up once per call, not once per cached row.
    let kernel = crate::arch::table(feat).dot_kernel(GgmlType::Q8_0);
    for (q, out) in qs.iter().zip(outs.iter_mut()) {
        for (j, o) in out.iter_mut().enumerate().take(k.rows()) {
            let w = k.row(j);
            // Err / None only for a query that is not one K row long, which the callers'
            // shapes rule out: NaN then, never a plausible score.
            *o = match kernel.and_then(|d| d.call(w, q)) {
                Some(v) => v,
                None => matvec::vec_dot_reference(GgmlType::Q8_0, feat, w, q).unwrap_or(f32::NAN),
            };
        }
    }
}

/// [`dots`] through the scalar reference of the arithmetic `feat`'s kernel computes
/// (what [`dots`] returns bit for bit).
pub fn dots_reference(feat: &CpuFeatures, k: &Q8Rows, qs: &[&[u8]], outs: &mut [&mut [f32]]) {
    for (q, out) in qs.iter().zip(outs.iter_mut()) {
        for (j, o) in out.iter_mut().enumerate().take(k.rows()) {
            *o = matvec::vec_dot_reference(GgmlType::Q8_0, feat, k.row(j), q).unwrap_or(f32::NAN);
        }
    }
}

/// `outs[g] = sum_j ws[g][j] * v.row(j)` (see the module doc for the arithmetic),
/// rows with a zero weight skipped; `outs[g]` holds `v.row_len()` values.
pub fn weighted_sum(v: &Q8Rows, ws: &[&[f32]], outs: &mut [&mut [f32]]) {
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        let len = out.len().min(v.row_len());
        let out = &mut out[..len];
        out.fill(0.0);
        for (j, wj) in w.iter().enumerate().take(v.rows()) {
            if *wj == 0.0 {
                continue;
            }
            let blocks = q8_0::act_blocks(v.row(j));
            for (b, acc) in blocks.iter().zip(out.chunks_mut(QK)) {
                mad_block(b, *wj, acc);
            }
        }
    }
}

/// `acc[i] += (w * scale) * q[i]`.
#[inline]
fn mad_block(b: &BlockQ8_0, w: f32, acc: &mut [f32]) {
    let s = w * b.scale();
    for (a, q) in acc.iter_mut().zip(b.qs.iter()) {
        *a += s * (*q as i8 as f32);
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::attn::tests::feats;
    use crate::testutil::Rng;
    use std::vec;
    use std::vec::Vec;

    /// `n` rows of `len` values quantized at a stride of `len + pad` values.
    fn plane(rng: &mut Rng, n: usize, len: usize, pad: usize) -> (Vec<f32>, Vec<u8>) {
        let f: Vec<f32> = (0..n * (len + pad)).map(|_| rng.f32() * 2.0).collect();
        let mut q = vec![0u8; row_bytes(f.len()).unwrap()];
        quantize(&f, &mut q);
        (f, q)
    }

    fn dequant(b: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; b.len() / BLOCK_BYTES * QK];
        q8_0::dequantize_row(b, &mut out);
        out
    }

    #[test]
    fn row_bytes_needs_whole_blocks() {
        assert_eq!(row_bytes(256), Some(8 * 34));
        assert_eq!(row_bytes(0), Some(0));
        assert_eq!(row_bytes(48), None);
    }

    #[test]
    fn dots_equal_the_reference_and_the_dequantized_product() {
        let mut rng = Rng(0x5eed_0008);
        for len in [32usize, 64, 128, 256] {
            for n in [0usize, 1, 7, 33] {
                let (_, k) = plane(&mut rng, n, len, 32);
                let rows = Q8Rows::new(&k, (len + 32) / QK, len / QK, n);
                assert_eq!(rows.rows(), n);
                let qf: Vec<f32> = (0..3 * len).map(|_| rng.f32() * 3.0).collect();
                let mut qb = vec![0u8; row_bytes(3 * len).unwrap()];
                quantize(&qf, &mut qb);
                let qs: Vec<&[u8]> = qb.chunks(row_bytes(len).unwrap()).collect();
                for f in feats() {
                    let mut a = vec![f32::NAN; 3 * n.max(1)];
                    let mut b = vec![f32::NAN; 3 * n.max(1)];
                    dots(
                        &f,
                        &rows,
                        &qs,
                        &mut a.chunks_mut(n.max(1)).collect::<Vec<_>>(),
                    );
                    dots_reference(
                        &f,
                        &rows,
                        &qs,
                        &mut b.chunks_mut(n.max(1)).collect::<Vec<_>>(),
                    );
                    for g in 0..3 {
                        for j in 0..n {
                            let (x, y) = (a[g * n + j], b[g * n + j]);
                            assert_eq!(x.to_bits(), y.to_bits(), "len={len} n={n} {f:?}");
                            // Against the f32 product of the dequantized rows: the int8
                            // sums are exact, only the float sums of blocks differ.
                            let kr = dequant(rows.row(j));
                            let qr = dequant(qs[g]);
                            let want: f32 = kr.iter().zip(&qr).map(|(p, q)| p * q).sum();
                            assert!((x - want).abs() <= 1e-4 * (1.0 + want.abs()), "{x} {want}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn weighted_sum_is_the_dequantized_sum_and_skips_zero_weights() {
        let mut rng = Rng(0xfade_0008);
        for len in [32usize, 64, 256] {
            for n in [0usize, 1, 16, 50] {
                let (_, mut v) = plane(&mut rng, n, len, 0);
                let w: Vec<f32> = (0..2 * n)
                    .map(|i| if i % 3 == 1 { 0.0 } else { rng.f32().abs() })
                    .collect();
                // A zero-weight row of query 0 whose bytes are garbage (a NaN scale):
                // skipped, so it changes nothing.
                if n > 1 {
                    v[len / QK * BLOCK_BYTES] = 0xff;
                    v[len / QK * BLOCK_BYTES + 1] = 0x7f;
                }
                let mut w = w;
                if n > 1 {
                    w[1] = 0.0;
                    w[n + 1] = 0.0;
                }
                let rows = Q8Rows::new(&v, len / QK, len / QK, n);
                let ws: Vec<&[f32]> = (0..2).map(|g| &w[g * n..(g + 1) * n]).collect();
                let mut got = vec![f32::NAN; 2 * len];
                weighted_sum(&rows, &ws, &mut got.chunks_mut(len).collect::<Vec<_>>());
                for g in 0..2 {
                    for d in 0..len {
                        let mut want = 0.0f32;
                        for (j, wj) in ws[g].iter().enumerate() {
                            if *wj != 0.0 {
                                want += dequant(rows.row(j))[d] * wj;
                            }
                        }
                        let x = got[g * len + d];
                        assert!(x.is_finite(), "len={len} n={n}");
                        assert!((x - want).abs() <= 1e-5 * (1.0 + want.abs()), "{x} {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn q8_rows_keep_only_the_rows_the_data_holds() {
        let d = [0u8; 10 * BLOCK_BYTES];
        let rows = |stride, len, n| Q8Rows::new(&d, stride, len, n).rows();
        assert_eq!(rows(4, 2, 3), 3);
        assert_eq!(rows(4, 3, 3), 2);
        assert_eq!(rows(4, 11, 3), 0);
        assert_eq!(rows(0, 10, 5), 5);
    }
}
