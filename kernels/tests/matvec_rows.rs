//! `matvec_rows` / `matmul_rows` (tiled, ISA picked once per call) against the scalar
//! reference of their arithmetic `vec_dot_reference` (Q8_0/Q5_0 sum per block on NEON), one (row, token) pair at a time, **bit for bit**, for
//! every feature set the running CPU has (x86: AVX2; aarch64: NEON, NEON+dotprod).
//!
//! Row and token counts cover full tiles and every remainder (1..=9 rows, 1..=9
//! tokens). Activations are what the engine feeds the kernels: `quantize_activation` of
//! f32 values, so Q8_0 quants lie in -127..=127 (the range on which the Q8_0 sign trick
//! is exact); the edge tests pin down the extremes: -128 weights, ±127 activations
//! (the i16 pair sums closest to saturation) and the degenerate all-zero block.
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{matmul_rows, matvec_rows, quantize_activation, vec_dot_reference};
use pinch_kernels::GgmlType;

/// Random blocks with plausible f16 scales in the places each format keeps them.
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (qk, bytes) = ty.block_geometry();
    let mut w: Vec<u8> = (0..rows * cols / qk * bytes)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_mut(bytes) {
        let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs()).to_le_bytes();
        match ty {
            // K-quants keep d (and dmin) at the start (Q4_K, Q5_K) or the end (the
            // others): set both, the other bytes are quants or scales either way.
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0 => {
                let n = blk.len();
                blk[n - 4..].copy_from_slice(&[d[0], d[1], d[0], d[1]]);
                blk[..4].copy_from_slice(&[d[0], d[1], d[0], d[1]]);
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {}
            _ => blk[..2].copy_from_slice(&d),
        }
    }
    if ty == GgmlType::F16 {
        for c in w.chunks_mut(2) {
            c.copy_from_slice(&pinch_kernels::f16::f32_to_f16(rng.f32()).to_le_bytes());
        }
    }
    w
}

fn acts(rng: &mut Rng, ty: GgmlType, n_tok: usize, cols: usize) -> (Vec<u8>, usize) {
    let fmt = ty.act_format().unwrap();
    let a = common::random_acts(rng, fmt, n_tok, cols, &[0.1, 1.0, 30.0]);
    (a, fmt.row_bytes(cols).unwrap())
}

/// Every (row, token) of `matmul_rows` (and `matvec_rows` per token) equals the scalar
/// reference's bits (F32: within the f64-sum tolerance of `legacy_simd`).
fn check(ty: GgmlType, w: &[u8], rows: usize, a: &[u8], arb: usize, what: &str) {
    let n_tok = a.len() / arb;
    let rb = w.len() / rows;
    for feat in feature_sets() {
        // A sub-range that starts inside the matrix, as a worker's share does.
        for lo in [0, rows / 3] {
            let r = lo..rows;
            let mut out = vec![f32::NAN; r.len() * n_tok];
            matmul_rows(ty, &feat, w, rb, r.clone(), a, arb, &mut out).unwrap();
            for (i, row) in r.clone().enumerate() {
                for t in 0..n_tok {
                    let want = vec_dot_reference(
                        ty,
                        &feat,
                        &w[row * rb..(row + 1) * rb],
                        &a[t * arb..(t + 1) * arb],
                    )
                    .unwrap();
                    let got = out[i * n_tok + t];
                    let ok = if ty == GgmlType::F32 {
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0)
                    } else {
                        got.to_bits() == want.to_bits()
                    };
                    assert!(
                        ok,
                        "{} {what} on {}: rows {r:?} row {row} token {t}/{n_tok}: {got} vs scalar {want}",
                        ty.name(),
                        feat.describe()
                    );
                }
            }
            for t in [0, n_tok - 1] {
                let mut o1 = vec![f32::NAN; r.len()];
                matvec_rows(
                    ty,
                    &feat,
                    w,
                    rb,
                    r.clone(),
                    &a[t * arb..(t + 1) * arb],
                    &mut o1,
                )
                .unwrap();
                for (i, v) in o1.iter().enumerate() {
                    assert_eq!(
                        v.to_bits(),
                        out[i * n_tok + t].to_bits(),
                        "{} {what}: matvec vs matmul on {}",
                        ty.name(),
                        feat.describe()
                    );
                }
            }
        }
    }
}

fn check_type(ty: GgmlType) {
    let (qk, _) = ty.block_geometry();
    let mut rng = Rng(0x51ed_270b ^ ty as u64);
    for (rows, n_tok, nb) in [
        (1, 1, 1),
        (4, 4, 3),
        (5, 3, 2),
        (9, 9, 1),
        (8, 5, 20),
        (7, 1, 5),
        (3, 8, 2),
    ] {
        let cols = nb * qk.max(32);
        let cols = cols / qk * qk;
        let w = weights(&mut rng, ty, rows, cols);
        let (a, arb) = acts(&mut rng, ty, n_tok, cols);
        check(ty, &w, rows, &a, arb, &format!("{rows}x{cols} tok {n_tok}"));
    }
}

#[test]
fn q8_0_rows_match_scalar_exactly() {
    check_type(GgmlType::Q8_0);
}
#[test]
fn q5_0_rows_match_scalar_exactly() {
    check_type(GgmlType::Q5_0);
}
#[test]
fn q4_0_rows_match_scalar_exactly() {
    check_type(GgmlType::Q4_0);
}
#[test]
fn q4_k_rows_match_scalar_exactly() {
    check_type(GgmlType::Q4_K);
}
#[test]
fn q6_k_rows_match_scalar_exactly() {
    check_type(GgmlType::Q6_K);
}
#[test]
fn q5_k_rows_match_scalar_exactly() {
    check_type(GgmlType::Q5_K);
}
#[test]
fn q3_k_rows_match_scalar_exactly() {
    check_type(GgmlType::Q3_K);
}
#[test]
fn q2_k_rows_match_scalar_exactly() {
    check_type(GgmlType::Q2_K);
}
#[test]
fn f16_rows_match_scalar_exactly() {
    check_type(GgmlType::F16);
}

/// Weights of -128 (magnitude 128 after `abs`) against activations of ±127: the largest
/// i16 pair sums the Q8_0 sign trick can form (2 * 128 * 127), which must not saturate.
#[test]
fn q8_0_extreme_quants_do_not_saturate() {
    let mut rng = Rng(99);
    let (rows, n_tok, nb) = (5, 5, 3);
    let mut w = weights(&mut rng, GgmlType::Q8_0, rows, nb * 32);
    for (i, blk) in w.chunks_mut(34).enumerate() {
        for (j, q) in blk[2..].iter_mut().enumerate() {
            *q = if (i + j) % 5 == 0 { 0x7f } else { 0x80 };
        }
    }
    let (mut a, arb) = acts(&mut rng, GgmlType::Q8_0, n_tok, nb * 32);
    for (i, blk) in a.chunks_mut(34).enumerate() {
        for (j, q) in blk[2..].iter_mut().enumerate() {
            *q = if (i + j / 2) % 2 == 0 {
                127
            } else {
                (-127i8) as u8
            };
        }
    }
    check(GgmlType::Q8_0, &w, rows, &a, arb, "extremes");
}

/// An all-zero input block quantizes to scale 0: its lanes add exactly 0 whatever the
/// integer sums are.
#[test]
fn q8_0_zero_activation_block_contributes_nothing() {
    let mut rng = Rng(7);
    let (rows, nb) = (6, 4);
    let w = weights(&mut rng, GgmlType::Q8_0, rows, nb * 32);
    let fmt = GgmlType::Q8_0.act_format().unwrap();
    let arb = fmt.row_bytes(nb * 32).unwrap();
    let mut x: Vec<f32> = (0..nb * 32).map(|_| rng.f32()).collect();
    x[32..64].iter_mut().for_each(|v| *v = 0.0);
    let mut a = vec![0u8; arb];
    quantize_activation(fmt, &x, &mut a).unwrap();
    check(GgmlType::Q8_0, &w, rows, &a, arb, "zero block");
}

/// A degenerate input block (amax so small that `127 / amax` overflows) can quantize to
/// scale 0 with quants of -128, the one activation byte on which the Q8_0 sign trick
/// (and the NEON i16 pair step) are not exact. Its lanes are multiplied by 0, so the
/// result must still have the reference's bits.
#[test]
fn q8_0_minus_128_activations_under_a_zero_scale_do_not_change_bits() {
    let mut rng = Rng(0x128);
    let (rows, nb, n_tok) = (9, 3, 5);
    let w = weights(&mut rng, GgmlType::Q8_0, rows, nb * 32);
    let (mut a, arb) = acts(&mut rng, GgmlType::Q8_0, n_tok, nb * 32);
    for t in 0..n_tok {
        let blk = &mut a[t * arb + 34..t * arb + 68];
        blk[..2].copy_from_slice(&[0, 0]);
        for (j, q) in blk[2..].iter_mut().enumerate() {
            *q = if j % 3 == 0 {
                0x80
            } else {
                (rng.next() as u8).max(0x81)
            };
        }
    }
    // The quantizer really does produce such a block.
    let fmt = GgmlType::Q8_0.act_format().unwrap();
    let mut q = vec![0u8; 34];
    quantize_activation(fmt, &[-1e-45f32; 32], &mut q).unwrap();
    assert_eq!(&q[..2], &[0, 0], "scale of a subnormal block");
    assert!(
        q[2..].iter().all(|&b| b == 0x80),
        "quants of a subnormal block: {q:?}"
    );
    check(GgmlType::Q8_0, &w, rows, &a, arb, "-128 under zero scale");
}
