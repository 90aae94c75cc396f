//! Q1_0 and Q2_0 through 8-bit tables (`--lut8`, `Layout::Q1_0x16Lut8` /
//! `Layout::Q2_0x16Lut8`, the inexact arithmetic of `quant::lut8`):
//! - the kernels (NEON `tbl`; elsewhere the scalar loop) equal that arithmetic's scalar
//!   reference **bit for bit** per (row, token), on the shapes of the exact kernels' tests
//!   (padded tail rows, unaligned ranges, several tokens, rows longer than a table chunk,
//!   extreme activations);
//! - the tables themselves: Q1_0's sign symmetry, the scale reaching ±127, every entry
//!   within half a step of the exact one, zero and non-finite blocks;
//! - the distance from the exact products (`q1_0::vec_dot`, `q2_0::vec_dot`), the bound
//!   the README states: on activations shaped like a transformer's (Gaussian, a few large
//!   outliers) the RMS error of a row's dot product is at most 1.5 % of the RMS of the
//!   exact products.
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{quantize_activation, vec_dot_scalar};
use pinch_kernels::quant::lut8::{self, Block, Lut8Format, Q1, Q2};
use pinch_kernels::quant::q8_0::BlockQ8_0;
use pinch_kernels::repack::{self, Layout};
use pinch_kernels::{ActFormat, GgmlType};

/// One format: its type, its 8-bit table layout, its weights per block, its reference.
#[derive(Clone, Copy)]
struct Fmt {
    ty: GgmlType,
    layout: Layout,
    qk: usize,
    reference: fn(&[u8], &[u8]) -> f32,
}

const FORMATS: [Fmt; 2] = [
    Fmt {
        ty: GgmlType::Q1_0,
        layout: Layout::Q1_0x16Lut8,
        qk: 128,
        reference: lut8::vec_dot::<Q1>,
    },
    Fmt {
        ty: GgmlType::Q2_0,
        layout: Layout::Q2_0x16Lut8,
        qk: 64,
        reference: lut8::vec_dot::<Q2>,
    },
];

fn weights(f: Fmt, rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..rows * cols / f.qk * 18)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_mut(18) {
        let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs()).to_le_bytes();
        blk[..2].copy_from_slice(&d);
    }
    w
}

fn q8(x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; x.len() / 32 * 34];
    quantize_activation(ActFormat::Q8_0, x, &mut a).unwrap();
    a
}

/// `matmul_rows` over the repacked `wr` for `range` equals the format's reference on the
/// plain rows, bit for bit, on every feature set of this CPU.
fn check(f: Fmt, w: &[u8], wr: &[u8], a: &[u8], n_tok: usize, range: std::ops::Range<usize>) {
    let arb = a.len() / n_tok;
    // Columns from the activation row (Q8_0: 34 bytes per 32 values).
    let rb = arb / 34 * 32 / f.qk * 18;
    let rows = w.len() / rb;
    for feat in feature_sets() {
        let mut out = vec![f32::NAN; range.len() * n_tok];
        repack::matmul_rows(
            f.layout,
            f.ty,
            &feat,
            wr,
            rb,
            range.clone(),
            a,
            arb,
            &mut out,
        )
        .unwrap();
        for (i, r) in range.clone().enumerate() {
            for t in 0..n_tok {
                let e = (f.reference)(&w[r * rb..(r + 1) * rb], &a[t * arb..(t + 1) * arb]);
                let g = out[i * n_tok + t];
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{} {feat:?} rows {rows} cols {} range {range:?} row {r} tok {t}: {g} vs {e}",
                    f.ty.name(),
                    rb / 18 * f.qk
                );
            }
        }
    }
}

#[test]
fn lut8_kernels_equal_their_scalar_reference_bits() {
    let mut rng = Rng(0x0151_0c08);
    for f in FORMATS {
        for rows in [1usize, 15, 16, 17, 33, 50] {
            for cols in [128usize, 256, 1152, 2560] {
                let rb = f.ty.row_bytes(cols as u64).unwrap() as usize;
                let w = weights(f, &mut rng, rows, cols);
                let wr = common::repacked_as(f.layout, f.ty, &w, rb);
                for n_tok in [1usize, 2, 3] {
                    let a = common::random_acts(&mut rng, ActFormat::Q8_0, n_tok, cols, &[3.0]);
                    for range in [
                        0..rows,
                        1.min(rows)..rows,
                        rows / 2..rows,
                        (rows / 16 * 16).min(rows)..rows,
                        3.min(rows)..rows.min(20),
                        rows..rows,
                    ] {
                        check(f, &w, &wr, &a, n_tok, range);
                    }
                }
            }
        }
    }
}

/// ±127 everywhere (every table at full scale), alternating signs, a zero block (scale 0:
/// zero tables), and a first weight block of zero activations.
#[test]
fn lut8_kernels_on_extreme_activations_equal_their_reference_bits() {
    for f in FORMATS {
        let (rows, cols) = (40usize, 512usize);
        let rb = f.ty.row_bytes(cols as u64).unwrap() as usize;
        let mut rng = Rng(8);
        let mut w = weights(f, &mut rng, rows, cols);
        for (i, blk) in w.chunks_mut(18).enumerate() {
            match i % 3 {
                0 => blk[2..].fill(0xff),
                1 => blk[2..].fill(0),
                _ => {}
            }
        }
        let wr = common::repacked_as(f.layout, f.ty, &w, rb);
        for pattern in 0..4 {
            let x = common::extreme_values(pattern, cols);
            check(f, &w, &wr, &q8(&x), 1, 0..rows);
        }
        let x: Vec<f32> = (0..cols)
            .map(|j| if j < 160 { 0.0 } else { (j % 7) as f32 - 3.0 })
            .collect();
        check(f, &w, &wr, &q8(&x), 1, 0..rows);
    }
}

fn act_block(q: [i8; 32], d: f32) -> BlockQ8_0 {
    let mut b = [0u8; 34];
    b[..2].copy_from_slice(&pinch_kernels::f16::f32_to_f16(d).to_le_bytes());
    for (o, v) in b[2..].iter_mut().zip(q) {
        *o = v as u8;
    }
    *pinch_kernels::blocks::cast::<BlockQ8_0>(&b)
        .unwrap()
        .first()
        .unwrap()
}

/// Every entry of format `F`'s tables of `ys` is within half a step of the exact one,
/// and the widest uses the whole byte; returns the tables.
fn tables_near_exact<F: Lut8Format>(ys: &[BlockQ8_0]) -> lut8::BlockTables {
    let mut t = [[0i8; 16]; lut8::GROUPS];
    let ts = lut8::block_tables::<F>(ys, &mut t);
    // One step of the entries, in activation units.
    let s = ts.s * F::DIV;
    assert!(s > 0.0);
    // The offset stands for `sum(q)` of each Q8_0 block (Q2_0), within half a step.
    let bias: f32 = ys.iter().map(|y| F::bias(y) as f32 * y.scale()).sum();
    assert!(
        (ts.offset as f32 * s - bias).abs() <= 0.5 * s * 1.0001,
        "offset {} x {s} vs {bias}",
        ts.offset
    );
    let top = t.iter().flatten().map(|e| e.unsigned_abs()).max().unwrap();
    assert!(top >= 64, "the widest entry uses the byte: {top}");
    for (g, row) in t.iter().enumerate() {
        let y = &ys[g / F::PER_SUB];
        let exact = F::entries(y, g % F::PER_SUB);
        for (n, e) in row.iter().enumerate() {
            let v = exact[n] as f32 * y.scale();
            assert!(
                (f32::from(*e) * s - v).abs() <= 0.5 * s * 1.0001,
                "g {g} n {n}: {e} x {s} vs {v}"
            );
        }
    }
    t
}

#[test]
fn tables_are_near_exact_full_scale_and_safe_on_zero_and_nan() {
    let mut rng = Rng(3);
    let ys: Vec<BlockQ8_0> = (0..4)
        .map(|k| {
            act_block(
                core::array::from_fn(|_| (rng.next() % 255) as i8),
                0.01 * (k + 1) as f32,
            )
        })
        .collect();
    let t = tables_near_exact::<Q1>(&ys);
    let top = t.iter().flatten().map(|e| e.unsigned_abs()).max().unwrap();
    assert_eq!(top, 127, "Q1_0's widest bound is reached");
    for g in &t {
        for n in 0..16 {
            assert_eq!(g[n], -g[15 - n], "flipping every sign negates the entry");
        }
    }
    tables_near_exact::<Q2>(&ys[..2]);
    for sub in [4usize, 2] {
        let mut t = [[0i8; 16]; lut8::GROUPS];
        let build = |y: &[BlockQ8_0], t: &mut lut8::BlockTables| {
            if sub == 4 {
                lut8::block_tables::<Q1>(y, t).s
            } else {
                lut8::block_tables::<Q2>(y, t).s
            }
        };
        // Zero activations: zero tables, scale 0.
        let z: Vec<BlockQ8_0> = (0..sub).map(|_| act_block([0; 32], 0.0)).collect();
        assert_eq!(build(&z, &mut t), 0.0);
        assert!(t.iter().flatten().all(|&e| e == 0));
        // A non-finite activation scale: NaN, so the row's sum is NaN (as the exact
        // kernels').
        let mut n = z.clone();
        n[1] = act_block([1; 32], f32::INFINITY);
        assert!(build(&n, &mut t).is_nan());
        let w = [Block {
            d: [0, 0x3c],
            qs: [0x5a; 16],
        }];
        let wb = pinch_kernels::blocks::bytes_of(&w);
        let ab = pinch_kernels::blocks::bytes_of(&n);
        let dot = if sub == 4 {
            lut8::vec_dot::<Q1>(wb, ab)
        } else {
            lut8::vec_dot::<Q2>(wb, ab)
        };
        assert!(dot.is_nan());
    }
}

/// Gaussian-like activations (Box-Muller) with a few large outliers, as a transformer's
/// hidden states; random weights. The README states this bound, and what quantizing the
/// activations to Q8_0 already costs (printed).
#[test]
fn lut8_stays_within_one_and_a_half_percent_of_the_exact_product() {
    for f in FORMATS {
        let (rows, cols) = (256usize, 2048usize);
        let rb = f.ty.row_bytes(cols as u64).unwrap() as usize;
        let mut rng = Rng(21);
        let w = weights(f, &mut rng, rows, cols);
        let mut worst = 0.0f64;
        for trial in 0..4 {
            let x: Vec<f32> = (0..cols)
                .map(|j| {
                    let (u, v) = (rng.f32().abs().max(1e-7), rng.f32().abs());
                    let g = (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos();
                    if j % 397 == trial {
                        12.0 * g.signum()
                    } else {
                        g
                    }
                })
                .collect();
            let a = q8(&x);
            let (mut err, mut sig, mut q8_err) = (0.0f64, 0.0f64, 0.0f64);
            let mut wf = vec![0.0f32; cols];
            for r in 0..rows {
                let row = &w[r * rb..(r + 1) * rb];
                let exact = vec_dot_scalar(f.ty, row, &a).unwrap() as f64;
                let lut8 = (f.reference)(row, &a) as f64;
                err += (lut8 - exact).powi(2);
                sig += exact.powi(2);
                pinch_kernels::matvec::dequantize_row(f.ty, row, &mut wf).unwrap();
                let float: f64 = wf
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                q8_err += (exact - float).powi(2);
            }
            let rel = (err / sig).sqrt();
            let q8 = (q8_err / sig).sqrt();
            println!(
                "{} trial {trial}: RMS error / RMS product {rel:.5} (Q8_0 activations vs float: {q8:.5})",
                f.ty.name()
            );
            assert!(
                rel > 0.0,
                "the rounding changes something (else this measures nothing)"
            );
            worst = worst.max(rel);
        }
        assert!(
            worst <= 0.015,
            "{}: relative RMS error {worst}",
            f.ty.name()
        );
    }
}

/// `--lut8` picks the layouts only where a kernel for them exists (NEON); the exact
/// layouts stay the preferred ones everywhere.
#[test]
fn lut8_layouts_are_chosen_only_on_request_and_where_they_have_a_kernel() {
    for feat in feature_sets() {
        let neon = cfg!(target_arch = "aarch64") && feat.neon();
        for f in FORMATS {
            assert_ne!(Layout::preferred(f.ty, &feat), Some(f.layout), "{feat:?}");
            let with = Layout::preferred_with(f.ty, &feat, true);
            assert_eq!(with == Some(f.layout), neon, "{feat:?}");
            assert_eq!(
                Layout::preferred_with(f.ty, &feat, false),
                Layout::preferred(f.ty, &feat)
            );
        }
        assert_eq!(
            Layout::preferred_with(GgmlType::Q8_0, &feat, true),
            Layout::preferred(GgmlType::Q8_0, &feat)
        );
    }
}
