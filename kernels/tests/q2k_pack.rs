//! Q2_K over the repacked `Q2Kx8` layout (eight rows, `sdot` by element on dotprod, widening
//! multiplies without) against the scalar reference of its arithmetic
//! (`repack::dot_row_scalar`: `q2_k::vec_dot_block_sum` for rows in whole groups, the plain
//! `q2_k::vec_dot` for the tail rows), **bit for bit** per (row, token), for every feature
//! set of the running CPU (on x86 the scalar loop runs and must agree too). Odd row counts,
//! unaligned ranges, several tokens, extreme activations. The block-sum arithmetic itself
//! is checked against the plain x86-order reference within a tolerance (other float
//! roundings), and against the plain kernels bit for bit wherever the layout has kernels
//! (aarch64 NEON, whose plain K-quant kernels sum blocks the same way), one token and
//! prompt tiles: so paged experts repacked into their slots and resident stacks repacked
//! at load compute the plain run's bits.
//! Repacking, reading rows back and the kernel running on NEON are checked with the other
//! 2-bit layouts in `ternary_pack.rs`.
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{self, quantize_activation, vec_dot_scalar};
use pinch_kernels::quant::q8_0::Order;
use pinch_kernels::quant::q8_k::order_of;
use pinch_kernels::repack::{self, Layout};
use pinch_kernels::{ActFormat, GgmlType};

const TY: GgmlType = GgmlType::Q2_K;
const L: Layout = Layout::Q2Kx8;
const BB: usize = 84;

fn weights(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..rows * cols / 256 * BB)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_mut(BB) {
        let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs()).to_le_bytes();
        let m = pinch_kernels::f16::f32_to_f16(0.002 + 0.01 * rng.f32().abs()).to_le_bytes();
        blk[80..82].copy_from_slice(&d);
        blk[82..84].copy_from_slice(&m);
    }
    w
}

fn acts(rng: &mut Rng, n_tok: usize, cols: usize, scale: f32) -> Vec<u8> {
    common::random_acts(rng, ActFormat::Q8_K, n_tok, cols, &[scale])
}

fn repacked(w: &[u8], rb: usize) -> Vec<u8> {
    common::repacked_as(L, TY, w, rb)
}

/// `matmul_rows` over the repacked `wr` for `range` equals the layout's scalar reference.
fn check(wr: &[u8], rb: usize, a: &[u8], n_tok: usize, range: std::ops::Range<usize>) {
    let arb = a.len() / n_tok;
    for feat in feature_sets() {
        let mut out = vec![f32::NAN; range.len() * n_tok];
        repack::matmul_rows(L, TY, &feat, wr, rb, range.clone(), a, arb, &mut out).unwrap();
        for (i, r) in range.clone().enumerate() {
            for t in 0..n_tok {
                let act = &a[t * arb..(t + 1) * arb];
                let e = repack::dot_row_scalar(L, order_of(&feat), wr, rb, r, act);
                let g = out[i * n_tok + t];
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{feat:?} rows {} cols {} range {range:?} row {r} tok {t}: {g} vs {e}",
                    wr.len() / rb,
                    rb / BB * 256
                );
            }
        }
    }
}

#[test]
fn repacked_q2_k_equals_its_scalar_reference_bits() {
    let mut rng = Rng(0x02c2_8a11);
    for rows in [1usize, 7, 8, 9, 16, 21, 40] {
        for cols in [256usize, 768, 2048] {
            let rb = TY.row_bytes(cols as u64).unwrap() as usize;
            let wr = repacked(&weights(&mut rng, rows, cols), rb);
            for n_tok in [1usize, 2, 3] {
                let a = acts(&mut rng, n_tok, cols, 3.0);
                for range in [
                    0..rows,
                    1.min(rows)..rows,
                    0..rows.saturating_sub(1),
                    rows / 2..rows,
                    (rows / 8 * 8).min(rows)..rows,
                    3.min(rows)..rows.min(13),
                    rows..rows,
                ] {
                    check(&wr, rb, &a, n_tok, range);
                }
            }
        }
    }
}

/// ±127 everywhere (the largest sums), alternating signs, and an all-zero block (scale 0).
#[test]
fn repacked_q2_k_on_extreme_activations_equals_its_scalar_reference_bits() {
    let (rows, cols) = (24usize, 1024usize);
    let rb = TY.row_bytes(cols as u64).unwrap() as usize;
    let mut rng = Rng(9);
    let mut w = weights(&mut rng, rows, cols);
    // All-3 quants with scale and minimum 15 in some blocks, all-zero in others.
    for (i, blk) in w.chunks_mut(BB).enumerate() {
        match i % 3 {
            0 => blk[..80].fill(0xff),
            1 => blk[..80].fill(0),
            _ => {}
        }
    }
    let wr = repacked(&w, rb);
    for pattern in 0..4 {
        let x = common::extreme_values(pattern, cols);
        let mut a = vec![0u8; cols / 256 * 292];
        quantize_activation(ActFormat::Q8_K, &x, &mut a).unwrap();
        check(&wr, rb, &a, 1, 0..rows);
    }
}

/// The block-sum arithmetic is the plain one up to float rounding: within
/// `1e-5 * sum over blocks of |d_w d_a isum| + |dmin_w d_a mins|` (a bound on the eight
/// lanes' roundings), checked here against `1e-5 * (1 + |plain|)` per block count.
#[test]
fn block_sum_arithmetic_is_the_plain_one_up_to_rounding() {
    let mut rng = Rng(31);
    let (rows, cols) = (16usize, 4096usize);
    let rb = TY.row_bytes(cols as u64).unwrap() as usize;
    let w = weights(&mut rng, rows, cols);
    let wr = repacked(&w, rb);
    let a = acts(&mut rng, 1, cols, 2.0);
    let mut worst = 0f32;
    for r in 0..rows {
        let plain = vec_dot_scalar(TY, &w[r * rb..(r + 1) * rb], &a).unwrap();
        let packed = repack::dot_row_scalar(L, Order::Lanes8, &wr, rb, r, &a);
        let mag: f32 = (0..cols / 256)
            .map(|b| {
                let wb = &w[r * rb + b * BB..r * rb + (b + 1) * BB];
                let ab = &a[b * 292..(b + 1) * 292];
                vec_dot_scalar(TY, wb, ab).unwrap().abs()
            })
            .sum();
        let err = (plain - packed).abs();
        assert!(
            err <= 1e-5 * (1.0 + mag),
            "row {r}: {packed} vs {plain} (block magnitudes {mag})"
        );
        worst = worst.max(err / (1.0 + mag));
    }
    assert!(
        worst > 0.0 || rows == 0,
        "not one rounding differed: is the test live?"
    );
}

/// Whole groups in `Order::BlockSum` are the plain Q2_K reference in that order, bit for
/// bit (the scalar side of the claim below, on every host).
#[test]
fn block_sum_reference_is_the_plain_block_sum_order_bits() {
    let mut rng = Rng(77);
    let (rows, cols) = (24usize, 2048usize);
    let rb = TY.row_bytes(cols as u64).unwrap() as usize;
    let w = weights(&mut rng, rows, cols);
    let wr = repacked(&w, rb);
    for n in 0..4 {
        let a = acts(&mut rng, 1, cols, 1.0 + n as f32);
        for r in 0..rows {
            let plain = pinch_kernels::quant::q2_k::vec_dot_in(
                Order::BlockSum,
                &w[r * rb..(r + 1) * rb],
                &a,
            );
            let packed = repack::dot_row_scalar(L, Order::BlockSum, &wr, rb, r, &a);
            assert_eq!(
                plain.to_bits(),
                packed.to_bits(),
                "row {r}: {plain} vs {packed}"
            );
        }
    }
}

/// Where Q2Kx8 has kernels (aarch64 NEON, with and without dotprod), its products are the
/// plain kernels' bit for bit, for one token and for prompt tiles, aligned and unaligned
/// row ranges; elsewhere it has none, so nothing repacks Q2_K there.
#[test]
fn repacked_q2_k_gives_the_plain_kernels_bits() {
    let mut rng = Rng(0x5eed_0013);
    let mut checked = 0;
    for feat in feature_sets() {
        if !repack::has_fast_kernel(L, &feat) {
            continue;
        }
        checked += 1;
        for (rows, cols) in [(8usize, 256usize), (21, 768), (40, 2048), (768, 2048)] {
            let rb = TY.row_bytes(cols as u64).unwrap() as usize;
            let w = weights(&mut rng, rows, cols);
            let wr = repacked(&w, rb);
            for n_tok in [1usize, 2, 4, 5, 9] {
                let a = acts(&mut rng, n_tok, cols, 3.0);
                let arb = a.len() / n_tok;
                for range in [0..rows, 3.min(rows)..rows, 8.min(rows)..rows.min(17)] {
                    let n = range.len() * n_tok;
                    let (mut plain, mut packed) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                    matvec::matmul_rows(TY, &feat, &w, rb, range.clone(), &a, arb, &mut plain)
                        .unwrap();
                    repack::matmul_rows(L, TY, &feat, &wr, rb, range.clone(), &a, arb, &mut packed)
                        .unwrap();
                    for (i, (p, q)) in plain.iter().zip(&packed).enumerate() {
                        assert_eq!(
                            p.to_bits(),
                            q.to_bits(),
                            "{feat:?} {rows}x{cols} {range:?} tokens {n_tok}: out {i}: {p} vs {q}"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(
        checked > 0,
        cfg!(target_arch = "aarch64"),
        "Q2Kx8 kernels exactly on aarch64 NEON"
    );
}
