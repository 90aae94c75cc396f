//! Products over repacked weights (`pinch_kernels::repack`: Q8_0x4, Q8_0x4s, Q5_0x4s,
//! Q5_0x4d, Q4_0x4s)
//! against the plain scalar reference of the CPU's arithmetic (`vec_dot_reference`),
//! **bit for bit** per (row, token), for every feature set the running CPU has (x86:
//! AVX2, AVX-512 VNNI; aarch64: NEON, NEON+dotprod) and every layout (without a SIMD
//! kernel the scalar loop runs and must agree too), over odd row counts (plain tail
//! rows), unaligned row ranges and token counts around the tiles.
//!
//! `repack_vs_plain_speed` (ignored) times plain vs repacked on Gemma 3 270M's output
//! matrix (262144 x 640 Q8_0), one thread, alternating:
//! `cargo test --release -p pinch-kernels --test repack -- --ignored --nocapture`.
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{matmul_rows, quantize_activation, vec_dot_reference};
use pinch_kernels::repack::{self, Layout};
use pinch_kernels::{ActFormat, CpuFeatures, GgmlType};

fn weights(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    weights_of(rng, GgmlType::Q8_0, rows, cols)
}

/// Random blocks of `ty` (Q8_0, Q5_0 or Q4_0) with small positive f16 scales first.
fn weights_of(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let bb = ty.block_geometry().1;
    let mut w: Vec<u8> = (0..rows * cols / 32 * bb)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_mut(bb) {
        let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs()).to_le_bytes();
        blk[..2].copy_from_slice(&d);
    }
    w
}

/// The repacked layouts and their weight types.
const LAYOUTS: [(Layout, GgmlType); 5] = [
    (Layout::Q8_0x4, GgmlType::Q8_0),
    (Layout::Q8_0x4s, GgmlType::Q8_0),
    (Layout::Q5_0x4s, GgmlType::Q5_0),
    (Layout::Q5_0x4d, GgmlType::Q5_0),
    (Layout::Q4_0x4s, GgmlType::Q4_0),
];

use common::repacked_as;

/// The SIMD kernels exist where `Layout::preferred` says so, and run (no scalar loop).
#[test]
fn preferred_layouts_have_simd_kernels_that_run() {
    for feat in feature_sets() {
        for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0] {
            let Some(layout) = Layout::preferred(ty, &feat) else {
                continue;
            };
            let (rows, cols) = (8usize, 64usize);
            let rb = ty.row_bytes(cols as u64).unwrap() as usize;
            let mut rng = Rng(3);
            let w = repacked_as(layout, ty, &weights_of(&mut rng, ty, rows, cols), rb);
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
                "{layout:?} on {feat:?}: no SIMD kernel ran"
            );
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let detected = CpuFeatures::detect();
        let neon = detected.only(&[pinch_kernels::cpu::Feature::Neon]);
        assert_eq!(
            Layout::preferred(GgmlType::Q8_0, &neon),
            Some(Layout::Q8_0x4)
        );
        // Without dotprod on this CPU `dot` is `neon` (nothing can add the feature).
        let dot = detected;
        if dot.dotprod() {
            assert_eq!(
                Layout::preferred(GgmlType::Q8_0, &dot),
                Some(Layout::Q8_0x4s)
            );
        }
        assert_eq!(
            Layout::preferred(GgmlType::Q5_0, &neon),
            Some(Layout::Q5_0x4s)
        );
        for feat in [neon, dot] {
            assert_eq!(
                Layout::preferred(GgmlType::Q4_0, &feat),
                Some(Layout::Q4_0x4s)
            );
        }
        assert_eq!(
            Layout::preferred(GgmlType::Q5_0, &dot),
            Some(if dot.dotprod() {
                Layout::Q5_0x4d
            } else {
                Layout::Q5_0x4s
            })
        );
    }
}

fn acts(rng: &mut Rng, n_tok: usize, cols: usize) -> Vec<u8> {
    common::random_acts(rng, ActFormat::Q8_0, n_tok, cols, &[3.0])
}

fn repacked(w: &[u8], rb: usize) -> Vec<u8> {
    repacked_as(Layout::Q8_0x4, GgmlType::Q8_0, w, rb)
}

#[test]
fn simd_on_repacked_rows_equals_plain_scalar_bits() {
    let mut rng = Rng(0x5eed_4e9a);
    for (layout, ty) in LAYOUTS {
        for rows in [1usize, 3, 4, 5, 8, 11, 16, 17] {
            for cols in [32usize, 64, 160, 640] {
                let rb = ty.row_bytes(cols as u64).unwrap() as usize;
                let arb = cols / 32 * 34;
                let w = weights_of(&mut rng, ty, rows, cols);
                let wr = repacked_as(layout, ty, &w, rb);
                for n_tok in [1usize, 2, 3, 4, 5, 7, 9] {
                    let a = acts(&mut rng, n_tok, cols);
                    let ranges = [
                        0..rows,
                        1.min(rows)..rows,
                        0..rows.saturating_sub(1),
                        rows / 2..rows,
                        (rows / 4 * 4).min(rows)..rows,
                        2.min(rows)..rows.min(6),
                        rows..rows,
                    ];
                    for feat in feature_sets() {
                        let want: Vec<f32> = (0..rows * n_tok)
                            .map(|k| {
                                let (r, t) = (k / n_tok, k % n_tok);
                                vec_dot_reference(
                                    ty,
                                    &feat,
                                    &w[r * rb..(r + 1) * rb],
                                    &a[t * arb..(t + 1) * arb],
                                )
                                .unwrap()
                            })
                            .collect();
                        for range in ranges.iter().filter(|r| r.start <= r.end) {
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
                                    let (g, e) = (out[i * n_tok + t], want[r * n_tok + t]);
                                    assert_eq!(
                                        g.to_bits(),
                                        e.to_bits(),
                                        "{layout:?} {feat:?} rows {rows} cols {cols} n_tok {n_tok} \
                                         range {range:?} row {r} tok {t}: {g} vs {e}"
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

/// Extremes: -128 weights, ±127 activations and an all-zero (scale 0) activation block.
#[test]
fn simd_on_repacked_edge_values_equals_plain_scalar_bits() {
    let (rows, cols) = (9usize, 128usize);
    let rb = cols / 32 * 34;
    let mut rng = Rng(99);
    let mut w = weights(&mut rng, rows, cols);
    for (i, blk) in w.chunks_mut(34).enumerate() {
        for (j, q) in blk[2..].iter_mut().enumerate() {
            *q = if (i + j) % 3 == 0 { 0x80 } else { 0x7f };
        }
    }
    let mut x = vec![0.0f32; 2 * cols];
    for (j, v) in x[..cols].iter_mut().enumerate() {
        *v = if j % 2 == 0 { 1.0 } else { -1.0 };
    }
    let mut a = vec![0u8; 2 * rb];
    quantize_activation(ActFormat::Q8_0, &x[..cols], &mut a[..rb]).unwrap();
    quantize_activation(ActFormat::Q8_0, &x[cols..], &mut a[rb..]).unwrap();
    for (feat, layout, n_tok) in feature_sets().into_iter().flat_map(|f| {
        // One token (the written-out one-token group kernels) and a two-token tile.
        [Layout::Q8_0x4, Layout::Q8_0x4s]
            .into_iter()
            .flat_map(move |l| [(f, l, 1), (f, l, 2)])
    }) {
        let wr = repacked_as(layout, GgmlType::Q8_0, &w, rb);
        let mut out = vec![0.0f32; rows * n_tok];
        repack::matmul_rows(
            layout,
            GgmlType::Q8_0,
            &feat,
            &wr,
            rb,
            0..rows,
            &a[..n_tok * rb],
            rb,
            &mut out,
        )
        .unwrap();
        for r in 0..rows {
            for t in 0..n_tok {
                let e = vec_dot_reference(
                    GgmlType::Q8_0,
                    &feat,
                    &w[r * rb..(r + 1) * rb],
                    &a[t * rb..(t + 1) * rb],
                )
                .unwrap();
                assert_eq!(
                    out[r * n_tok + t].to_bits(),
                    e.to_bits(),
                    "{layout:?} {feat:?} row {r} tok {t}"
                );
            }
        }
    }
}

fn best() -> CpuFeatures {
    *feature_sets().last().unwrap()
}

#[test]
#[ignore]
fn repack_vs_plain_speed() {
    let env = |k: &str| std::env::var(k).ok().and_then(|s| s.parse().ok());
    let rows: usize = env("REPACK_ROWS").unwrap_or(262_144);
    let cols = 640usize;
    let rb = cols / 32 * 34;
    let mut rng = Rng(1);
    let w = weights(&mut rng, rows, cols);
    let mut wr = w.clone();
    let mut scratch = vec![0u8; Layout::Q8_0x4.scratch_bytes(rb)];
    let t0 = std::time::Instant::now();
    repack::repack_in_place(Layout::Q8_0x4, GgmlType::Q8_0, &mut wr, rb, &mut scratch).unwrap();
    let t_repack = t0.elapsed().as_secs_f64();
    let feat = best();
    let reps: usize = env("REPS").unwrap_or(7);
    let toks: Vec<usize> = std::env::var("REPACK_TOKS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or(vec![1, 4, 8]);
    // `REPACK_ONLY=plain|repacked|none`: run one side only (instruction counts under
    // qemu: subtract the `none` run, which only builds the data).
    let only = std::env::var("REPACK_ONLY").unwrap_or_default();
    if !only.is_empty() {
        for &n_tok in &toks {
            let a = acts(&mut rng, n_tok, cols);
            let mut out = vec![0.0f32; rows * n_tok];
            for _ in 0..reps {
                match only.as_str() {
                    "plain" => {
                        matmul_rows(GgmlType::Q8_0, &feat, &w, rb, 0..rows, &a, rb, &mut out)
                            .unwrap()
                    }
                    "repacked" => repack::matmul_rows(
                        Layout::Q8_0x4,
                        GgmlType::Q8_0,
                        &feat,
                        &wr,
                        rb,
                        0..rows,
                        &a,
                        rb,
                        &mut out,
                    )
                    .unwrap(),
                    _ => {}
                }
            }
            println!("{only} n_tok {n_tok}: {}", out.iter().sum::<f32>());
        }
        return;
    }
    println!("features {feat:?}, {rows} x {cols} Q8_0, 1 thread, best of {reps} alternating runs");
    println!(
        "repack_in_place of the whole matrix ({:.0} MB): {:.1} ms",
        (rows * rb) as f64 / 1e6,
        t_repack * 1e3
    );
    for n_tok in toks {
        let a = acts(&mut rng, n_tok, cols);
        let mut out_p = vec![0.0f32; rows * n_tok];
        let mut out_r = vec![0.0f32; rows * n_tok];
        let (mut bp, mut br) = (f64::MAX, f64::MAX);
        for _ in 0..reps {
            let t0 = std::time::Instant::now();
            matmul_rows(GgmlType::Q8_0, &feat, &w, rb, 0..rows, &a, rb, &mut out_p).unwrap();
            bp = bp.min(t0.elapsed().as_secs_f64());
            let t0 = std::time::Instant::now();
            repack::matmul_rows(
                Layout::Q8_0x4,
                GgmlType::Q8_0,
                &feat,
                &wr,
                rb,
                0..rows,
                &a,
                rb,
                &mut out_r,
            )
            .unwrap();
            br = br.min(t0.elapsed().as_secs_f64());
        }
        assert!(out_p
            .iter()
            .zip(&out_r)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        let gb = (rows * rb) as f64 / 1e9;
        println!(
            "n_tok {n_tok}: plain {:.2} ms ({:.1} GB/s), repacked {:.2} ms ({:.1} GB/s), plain/repacked = {:.3}",
            bp * 1e3,
            gb / bp,
            br * 1e3,
            gb / br,
            bp / br
        );
    }
}

/// The SIMD paths above are really taken (not the scalar fallback).
#[test]
fn simd_path_is_taken_where_the_cpu_has_one() {
    let (rows, cols) = (6usize, 64usize);
    let rb = cols / 32 * 34;
    let mut rng = Rng(5);
    let wr = repacked(&weights(&mut rng, rows, cols), rb);
    let a = acts(&mut rng, 3, cols);
    for feat in feature_sets() {
        let mut out = vec![0.0f32; rows * 3];
        let took = pinch_kernels::arch::repack_matmul_rows(
            Layout::Q8_0x4,
            &feat,
            &wr,
            rb,
            0..rows,
            &a,
            &mut out,
        );
        // armv7 has no kernels for repacked layouts (nor prefers one): plain rows there.
        let simd = feat != CpuFeatures::SCALAR && !cfg!(target_arch = "arm");
        assert_eq!(took, simd, "{feat:?}");
        assert_eq!(
            took,
            repack::has_fast_kernel(Layout::Q8_0x4, &feat),
            "{feat:?}"
        );
    }
}

/// Q5_0x4s on x86 runs several tokens on groups unpacked to a 64 KiB stack buffer, in
/// chunks (here 200 rows of 1024 columns: three chunks), and rows too long for four of
/// them to fit (24,576 columns) token by token through the one-token product: both give
/// the plain scalar bits, for whole and partial row ranges.
#[test]
fn q5_0x4s_chunked_and_long_rows_equal_plain_scalar_bits() {
    let ty = GgmlType::Q5_0;
    let mut rng = Rng(0x0510_4a5e);
    for (rows, cols) in [(200usize, 1024usize), (13, 24576)] {
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        let arb = cols / 32 * 34;
        let w = weights_of(&mut rng, ty, rows, cols);
        let wr = repacked_as(Layout::Q5_0x4s, ty, &w, rb);
        for n_tok in [1usize, 2, 5] {
            let a = acts(&mut rng, n_tok, cols);
            for feat in feature_sets() {
                for range in [0..rows, 3..rows - 2, 90..rows.min(99)] {
                    let range = range.start.min(range.end)..range.end;
                    let mut out = vec![f32::NAN; range.len() * n_tok];
                    repack::matmul_rows(
                        Layout::Q5_0x4s,
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
                            let want = vec_dot_reference(
                                ty,
                                &feat,
                                &w[r * rb..(r + 1) * rb],
                                &a[t * arb..(t + 1) * arb],
                            )
                            .unwrap();
                            let got = out[i * n_tok + t];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{feat:?} {rows}x{cols} n_tok {n_tok} range {range:?} row {r} tok {t}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
