//! The repacked K-quant layouts (`Layout::Q4Kx4`, `Layout::Q6Kx4`): repacking is
//! lossless, and every product over them (each feature set of the running CPU: on
//! aarch64 NEON and NEON+dotprod, elsewhere the scalar loop) equals the scalar reference
//! of their arithmetic (`repack::dot_row_scalar`: whole groups summed per block,
//! `kquant::kquant_dot_blocksum`; plain tail rows as the plain kernels) **bit for bit**
//! per (row, token), over odd row counts, unaligned row ranges and token counts around
//! the tiles. The block-sum order itself stays within a few ulp of the row's magnitude
//! of the plain (llama.cpp x86) order.
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::vec_dot_reference;
use pinch_kernels::quant::q8_0::Order;
use pinch_kernels::repack::{self, Layout};
use pinch_kernels::{ActFormat, CpuFeatures, GgmlType};

const LAYOUTS: [(Layout, GgmlType); 2] = [
    (Layout::Q4Kx4, GgmlType::Q4_K),
    (Layout::Q6Kx4, GgmlType::Q6_K),
];

/// Random blocks of `ty` with small finite f16 factors (`d`, and `dmin` for Q4_K).
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let bb = ty.block_geometry().1;
    let mut w: Vec<u8> = (0..rows * cols / 256 * bb)
        .map(|_| rng.next() as u8)
        .collect();
    let f = |rng: &mut Rng| {
        pinch_kernels::f16::f32_to_f16(0.0005 + 0.002 * rng.f32().abs()).to_le_bytes()
    };
    for blk in w.chunks_mut(bb) {
        match ty {
            GgmlType::Q4_K => {
                let (d, m) = (f(rng), f(rng));
                blk[..2].copy_from_slice(&d);
                blk[2..4].copy_from_slice(&m);
            }
            _ => {
                let d = f(rng);
                blk[bb - 2..].copy_from_slice(&d);
            }
        }
    }
    w
}

fn acts(rng: &mut Rng, n_tok: usize, cols: usize) -> Vec<u8> {
    common::random_acts(rng, ActFormat::Q8_K, n_tok, cols, &[3.0])
}

use common::repacked_as as repacked;

#[test]
fn repack_is_lossless_and_rows_read_back() {
    let mut rng = Rng(11);
    for (layout, ty) in LAYOUTS {
        for rows in [1usize, 4, 5, 8, 11] {
            let cols = 512;
            let rb = ty.row_bytes(cols as u64).unwrap() as usize;
            let w = weights(&mut rng, ty, rows, cols);
            let mut r = repacked(layout, ty, &w, rb);
            if rows >= 4 {
                assert_ne!(r, w, "{layout:?} rows {rows}: nothing moved");
            }
            let mut row = vec![0u8; rb];
            let (mut f1, mut f2) = (vec![0f32; cols], vec![0f32; cols]);
            for i in 0..rows {
                repack::row_to_plain(layout, ty, &r, rb, i, &mut row).unwrap();
                assert_eq!(
                    row,
                    w[i * rb..(i + 1) * rb],
                    "{layout:?} rows {rows} row {i}"
                );
                repack::dequantize_row(layout, ty, &r, rb, i, &mut f1).unwrap();
                repack::dequantize_row(Layout::Plain, ty, &w, rb, i, &mut f2).unwrap();
                assert_eq!(f1, f2);
            }
            let mut scratch = vec![0u8; layout.scratch_bytes(rb)];
            repack::unpack_in_place(layout, ty, &mut r, rb, &mut scratch).unwrap();
            assert_eq!(r, w);
            assert_eq!(Layout::from_id(layout.id()), Some(layout));
        }
    }
}

#[test]
fn products_on_repacked_k_quants_equal_the_block_sum_reference_bits() {
    let mut rng = Rng(0x4b51_7e57);
    for (layout, ty) in LAYOUTS {
        for rows in [1usize, 3, 4, 5, 8, 12, 13] {
            for cols in [256usize, 768] {
                let rb = ty.row_bytes(cols as u64).unwrap() as usize;
                let arb = ActFormat::Q8_K.row_bytes(cols).unwrap();
                let w = weights(&mut rng, ty, rows, cols);
                let wr = repacked(layout, ty, &w, rb);
                for n_tok in [1usize, 2, 3, 5] {
                    let a = acts(&mut rng, n_tok, cols);
                    let want = |feat: &CpuFeatures| -> Vec<f32> {
                        (0..rows * n_tok)
                            .map(|k| {
                                let (r, t) = (k / n_tok, k % n_tok);
                                let act = &a[t * arb..(t + 1) * arb];
                                let o = Order::of(feat);
                                repack::dot_row_scalar(layout, o, &wr, rb, r, act)
                            })
                            .collect()
                    };
                    let ranges = [
                        0..rows,
                        1.min(rows)..rows,
                        rows / 2..rows,
                        2.min(rows)..rows.min(6),
                        rows..rows,
                    ];
                    for feat in feature_sets() {
                        let want = want(&feat);
                        for range in ranges.clone() {
                            let mut out = vec![f32::NAN; range.len() * n_tok];
                            repack::matmul_rows(
                                layout,
                                ty,
                                &feat,
                                &wr,
                                rb,
                                range.clone(),
                                &a,
                                arb,
                                &mut out,
                            )
                            .unwrap();
                            for (i, r) in range.clone().enumerate() {
                                for t in 0..n_tok {
                                    let (got, exp) = (out[i * n_tok + t], want[r * n_tok + t]);
                                    assert_eq!(
                                        got.to_bits(),
                                        exp.to_bits(),
                                        "{layout:?} {} rows {rows} cols {cols} n_tok {n_tok} \
                                         range {range:?} r {r} t {t}: {got} vs {exp}",
                                        feat.describe()
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The block-sum order against the plain kernels' (llama.cpp's x86 eight-lane) order on
/// the same rows: equal up to float rounding, at most 1e-5 of the sum of |products|.
#[test]
fn block_sum_order_stays_within_rounding_of_the_plain_order() {
    let mut rng = Rng(5);
    for (layout, ty) in LAYOUTS {
        let (rows, cols) = (8usize, 1024usize);
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        let arb = ActFormat::Q8_K.row_bytes(cols).unwrap();
        let w = weights(&mut rng, ty, rows, cols);
        let wr = repacked(layout, ty, &w, rb);
        let a = acts(&mut rng, 3, cols);
        let mut wf = vec![0f32; cols];
        let mut af = vec![0f32; cols];
        for t in 0..3 {
            let act = &a[t * arb..(t + 1) * arb];
            pinch_kernels::matvec::dequantize_row(GgmlType::Q8_K, act, &mut af).unwrap();
            for r in 0..rows {
                let plain =
                    vec_dot_reference(ty, &CpuFeatures::SCALAR, &w[r * rb..(r + 1) * rb], act)
                        .unwrap();
                let packed = repack::dot_row_scalar(layout, Order::Lanes8, &wr, rb, r, act);
                pinch_kernels::matvec::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut wf)
                    .unwrap();
                let mag: f64 = wf.iter().zip(&af).map(|(x, y)| (x * y).abs() as f64).sum();
                let diff = (plain - packed).abs() as f64;
                assert!(
                    diff <= 1e-5 * mag,
                    "{layout:?} r {r} t {t}: {plain} vs {packed} (|products| {mag})"
                );
            }
        }
    }
}

/// On aarch64 the K-quant layouts are preferred and their SIMD kernels run.
#[test]
fn k_quant_layouts_are_preferred_where_they_have_kernels() {
    for feat in feature_sets() {
        for (layout, ty) in LAYOUTS {
            let pref = Layout::preferred(ty, &feat);
            if cfg!(target_arch = "aarch64") && feat.describe() != "scalar" {
                assert_eq!(pref, Some(layout), "{}", feat.describe());
                let (rows, cols) = (8usize, 256usize);
                let rb = ty.row_bytes(cols as u64).unwrap() as usize;
                let mut rng = Rng(3);
                let w = repacked(layout, ty, &weights(&mut rng, ty, rows, cols), rb);
                let a = acts(&mut rng, 1, cols);
                let mut out = vec![0.0f32; rows];
                assert!(
                    pinch_kernels::arch::repack_matmul_rows(
                        layout,
                        &feat,
                        &w,
                        rb,
                        0..rows,
                        &a,
                        &mut out
                    ),
                    "{layout:?} on {}: no SIMD kernel ran",
                    feat.describe()
                );
            } else if !cfg!(target_arch = "aarch64") {
                assert_ne!(pref, Some(layout), "x86 keeps plain K-quant rows");
            }
        }
    }
}
