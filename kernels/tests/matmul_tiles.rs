//! The prompt-processing tiles (x86: `arch::x86_gemm` for Q4_K/Q6_K, `x86_gemm_lanes`
//! and `x86_rows`' 4 x 4 tiles for Q8_0/Q5_0) against the scalar reference of their arithmetic (`vec_dot_reference`: Q8_0/Q5_0 sum per block on NEON), **bit for
//! bit**, for every feature set the running CPU has: token counts that leave every tile
//! remainder (1, 2, 3, 5, 8, 13, 64), row counts with and without a partial row tile,
//! row sub-ranges starting inside a tile, and K-quant activations whose raw bytes hit
//! the extremes (quants -128 and 127, bsums that do not match the quants).
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{matmul_rows, vec_dot_reference};
use pinch_kernels::GgmlType;

/// Random blocks with plausible f16 scales where each format keeps them.
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (qk, bytes) = ty.block_geometry();
    let mut w: Vec<u8> = (0..rows * cols / qk * bytes)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_mut(bytes) {
        let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs()).to_le_bytes();
        match ty {
            // Q4_K: d, dmin first; Q6_K: d last.
            GgmlType::Q4_K => blk[..4].copy_from_slice(&[d[0], d[1], d[0], d[1]]),
            GgmlType::Q6_K => {
                let n = blk.len();
                blk[n - 2..].copy_from_slice(&d);
            }
            // Q4_1/Q5_1: d, then a minimum of either sign.
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                let m = pinch_kernels::f16::f32_to_f16(0.3 * rng.f32()).to_le_bytes();
                blk[..4].copy_from_slice(&[d[0], d[1], m[0], m[1]]);
            }
            _ => blk[..2].copy_from_slice(&d),
        }
    }
    w
}

/// Activations as the engine makes them (`quantize_activation` of f32 rows).
fn acts(rng: &mut Rng, ty: GgmlType, n_tok: usize, cols: usize) -> (Vec<u8>, usize) {
    let fmt = ty.act_format().unwrap();
    let a = common::random_acts(rng, fmt, n_tok, cols, &[0.1, 1.0, 30.0]);
    (a, fmt.row_bytes(cols).unwrap())
}

fn check(ty: GgmlType, w: &[u8], rows: usize, a: &[u8], arb: usize, what: &str) {
    let n_tok = a.len() / arb;
    let rb = w.len() / rows;
    for feat in feature_sets() {
        for lo in [0, 1.min(rows - 1), rows / 2] {
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
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{} {what} on {}: rows {r:?} row {row} token {t}/{n_tok}: {got} vs scalar {want}",
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
    let mut rng = Rng(0x7e57_0001 ^ ty as u64);
    for n_tok in [1, 2, 3, 5, 8, 13, 64] {
        // 33 blocks of 256: longer than the rows the x86 K-quant tiles unpack once per
        // row tile (32 blocks) and the block-32 tiles' tables (4096 columns).
        for (rows, nb) in [(1, 1), (4, 2), (7, 3), (13, 1), (5, 33)] {
            let cols = nb * qk.max(256);
            let w = weights(&mut rng, ty, rows, cols);
            let (a, arb) = acts(&mut rng, ty, n_tok, cols);
            check(ty, &w, rows, &a, arb, &format!("{rows}x{cols} tok {n_tok}"));
        }
    }
}

#[test]
fn q4_k_tiles_match_scalar_exactly() {
    check_type(GgmlType::Q4_K);
}

#[test]
fn q6_k_tiles_match_scalar_exactly() {
    check_type(GgmlType::Q6_K);
}

#[test]
fn q8_0_tiles_match_scalar_exactly() {
    check_type(GgmlType::Q8_0);
}

#[test]
fn q5_0_tiles_match_scalar_exactly() {
    check_type(GgmlType::Q5_0);
}

#[test]
fn q4_0_tiles_match_scalar_exactly() {
    check_type(GgmlType::Q4_0);
}

/// x86 only: `vec_dot_reference` has no NEON order for IQ4_NL (its NEON kernel's order is
/// checked against `iq4_nl::vec_dot_in(BlockSum)` in `iq_simd.rs`), and only x86 tiles it.
#[cfg(target_arch = "x86_64")]
#[test]
fn iq4_nl_tiles_match_scalar_exactly() {
    check_type(GgmlType::IQ4_NL);
}

#[test]
fn q4_1_tiles_match_scalar_exactly() {
    check_type(GgmlType::Q4_1);
}

#[test]
fn q5_1_tiles_match_scalar_exactly() {
    check_type(GgmlType::Q5_1);
}

/// Q8_0/Q5_0 on every token remainder of the x86 tiles (`arch::x86_gemm_lanes`: 2 rows
/// x 8 tokens with VNNI, 1 x 8 with AVX2; tables per token tile) and of the 4 x 4
/// tiles (Q4_1/Q5_1: `arch::x86_min`'s 4 x 1, 2 x 8 and 1 x 8 tiles), row counts that leave 0 to 3 rows past the last 2- or 4-row tile, Gemma 3
/// 270M's 20-block rows, and rows longer than the tiles' tables (130 blocks: the 4 x 4
/// fallback).
#[test]
fn block32_tiles_cover_every_remainder() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
    ] {
        let mut rng = Rng(0xb10c_0032 ^ ty as u64);
        for n_tok in (2..=17).chain([22, 64]) {
            for (rows, nb) in [(3, 1), (5, 20), (8, 2), (7, 1)] {
                let cols = nb * 32;
                let w = weights(&mut rng, ty, rows, cols);
                let (a, arb) = acts(&mut rng, ty, n_tok, cols);
                check(ty, &w, rows, &a, arb, &format!("{rows}x{cols} tok {n_tok}"));
            }
        }
        for n_tok in [2, 9] {
            let (rows, cols) = (4, 130 * 32);
            let w = weights(&mut rng, ty, rows, cols);
            let (a, arb) = acts(&mut rng, ty, n_tok, cols);
            check(ty, &w, rows, &a, arb, &format!("{rows}x{cols} tok {n_tok}"));
        }
    }
}

/// Q8_K activation blocks with arbitrary quant bytes (including -128 and 127, which
/// the quantizer never writes together with inconsistent bsums) and arbitrary bsums: the
/// K-quant kernels' integer sums are exact (or wrap alike) for any bytes, so the tiles
/// still give the reference's bits.
#[test]
fn k_quant_tiles_are_exact_for_any_activation_bytes() {
    let mut rng = Rng(0xb17e5);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for (rows, n_tok) in [(5, 7), (9, 13)] {
            let nb = 2;
            let cols = nb * 256;
            let w = weights(&mut rng, ty, rows, cols);
            let arb = GgmlType::Q8_K.row_bytes(cols as u64).unwrap() as usize;
            let mut a: Vec<u8> = (0..arb * n_tok).map(|_| rng.next() as u8).collect();
            for (i, blk) in a.chunks_mut(292).enumerate() {
                blk[..4].copy_from_slice(&(0.01f32 + i as f32 * 0.003).to_le_bytes());
                if i % 3 == 0 {
                    // Extreme quants: alternately -128 and 127.
                    for (j, q) in blk[4..260].iter_mut().enumerate() {
                        *q = if j % 2 == 0 { 0x80 } else { 0x7f };
                    }
                }
            }
            check(
                ty,
                &w,
                rows,
                &a,
                arb,
                &format!("raw acts {rows}x{cols} tok {n_tok}"),
            );
        }
    }
}

/// Q4_0 blocks whose integer sum is large (all weights -8 or 7 against activations of
/// ±127: |sumi| up to 32,512), where `(sumi * d_w) * d_a`, the reference's two roundings,
/// differs from `sumi * (d_w * d_a)`: the tiles must keep the reference's order.
#[test]
fn q4_0_tiles_round_large_block_sums_as_the_reference() {
    let ty = GgmlType::Q4_0;
    let mut rng = Rng(0x0440_0008);
    let (rows, nb) = (19usize, 6usize);
    let cols = nb * 32;
    let mut w = weights(&mut rng, ty, rows, cols);
    for (i, blk) in w.chunks_mut(18).enumerate() {
        blk[2..].fill(if i % 3 == 0 { 0x00 } else { 0xff });
    }
    for n_tok in [1usize, 2, 5, 8] {
        let x: Vec<f32> = (0..n_tok * cols)
            .map(|j| if (j / 32 + j / cols) % 2 == 0 { 1.0 } else { -1.0 } * (1.0 + (j % 7) as f32 * 1e-3))
            .collect();
        let fmt = ty.act_format().unwrap();
        let arb = fmt.row_bytes(cols).unwrap();
        let mut a = vec![0u8; n_tok * arb];
        for (xr, ar) in x.chunks(cols).zip(a.chunks_mut(arb)) {
            pinch_kernels::matvec::quantize_activation(fmt, xr, ar).unwrap();
        }
        check(ty, &w, rows, &a, arb, &format!("large sums tok {n_tok}"));
    }
}

/// Odd block counts (IQ4_NL's x86 order adds an odd last block on its own; Q4_0 has no
/// pairing but the tiles must not assume one), one token and several.
#[test]
fn block32_tiles_take_odd_block_counts() {
    // IQ4_NL on x86 only (see `iq4_nl_tiles_match_scalar_exactly`).
    let types: &[GgmlType] = if cfg!(target_arch = "x86_64") {
        &[GgmlType::IQ4_NL, GgmlType::Q4_0]
    } else {
        &[GgmlType::Q4_0]
    };
    for &ty in types {
        let mut rng = Rng(0x0dd0_b10c ^ ty as u64);
        for nb in [1usize, 3, 5, 21] {
            for (rows, n_tok) in [(1usize, 1usize), (5, 1), (9, 3), (6, 8)] {
                let cols = nb * 32;
                let w = weights(&mut rng, ty, rows, cols);
                let (a, arb) = acts(&mut rng, ty, n_tok, cols);
                check(ty, &w, rows, &a, arb, &format!("{rows}x{cols} tok {n_tok}"));
            }
        }
    }
}
