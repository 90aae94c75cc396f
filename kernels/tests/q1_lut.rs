//! Q1_0 over the repacked `Q1_0x16` layout (the lookup-table kernels: NEON `tbl`, AVX2
//! `vpshufb`) against the plain scalar reference `q1_0::vec_dot`, **bit for bit** per
//! (row, token): the tables only regroup exact integer sums, and the float steps are
//! the reference's (the one fused multiply-add has an exact product). Odd row counts
//! (plain tail rows after the last group of 16, which the kernels run as one padded
//! group), unaligned row ranges, ranges inside the tail, several tokens, rows longer
//! than one table chunk (16 blocks), and extreme activations (±127, and -128 from a
//! zero-scale block). Every feature set of the running CPU; the scalar loop (no SIMD)
//! must agree too.
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{quantize_activation, vec_dot_scalar};
use pinch_kernels::repack::{self, Layout};
use pinch_kernels::{ActFormat, GgmlType};

const TY: GgmlType = GgmlType::Q1_0;

fn weights(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..rows * cols / 128 * 18)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_mut(18) {
        let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs()).to_le_bytes();
        blk[..2].copy_from_slice(&d);
    }
    w
}

fn acts(rng: &mut Rng, n_tok: usize, cols: usize, scale: f32) -> Vec<u8> {
    common::random_acts(rng, ActFormat::Q8_0, n_tok, cols, &[scale])
}

fn repacked(w: &[u8], rb: usize) -> Vec<u8> {
    common::repacked_as(Layout::Q1_0x16, TY, w, rb)
}

/// `matmul_rows` over the repacked `wr` for `range` equals the plain reference.
fn check(w: &[u8], wr: &[u8], rb: usize, a: &[u8], n_tok: usize, range: std::ops::Range<usize>) {
    let arb = a.len() / n_tok;
    for feat in feature_sets() {
        let mut out = vec![f32::NAN; range.len() * n_tok];
        repack::matmul_rows(
            Layout::Q1_0x16,
            TY,
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
                let e = vec_dot_scalar(TY, &w[r * rb..(r + 1) * rb], &a[t * arb..(t + 1) * arb])
                    .unwrap();
                let g = out[i * n_tok + t];
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{feat:?} rows {} cols {} range {range:?} row {r} tok {t}: {g} vs {e}",
                    w.len() / rb,
                    rb / 18 * 128
                );
            }
        }
    }
}

#[test]
fn lut_on_repacked_rows_equals_plain_scalar_bits() {
    let mut rng = Rng(0x0151_0c0d);
    for rows in [1usize, 15, 16, 17, 33, 48, 50] {
        for cols in [128usize, 256, 1152, 2560] {
            let rb = TY.row_bytes(cols as u64).unwrap() as usize;
            let w = weights(&mut rng, rows, cols);
            let wr = repacked(&w, rb);
            for n_tok in [1usize, 2, 3] {
                let a = acts(&mut rng, n_tok, cols, 3.0);
                for range in [
                    0..rows,
                    1.min(rows)..rows,
                    0..rows.saturating_sub(1),
                    rows / 2..rows,
                    (rows / 16 * 16).min(rows)..rows,
                    3.min(rows)..rows.min(20),
                    (rows / 16 * 16 + 1).min(rows)..rows,
                    rows..rows,
                ] {
                    check(&w, &wr, rb, &a, n_tok, range);
                }
            }
        }
    }
}

/// ±127 everywhere (the largest subset sums), alternating signs, and a zero block whose
/// quantizer writes -128 (scale 0).
#[test]
fn lut_on_extreme_activations_equals_plain_scalar_bits() {
    let (rows, cols) = (40usize, 512usize);
    let rb = TY.row_bytes(cols as u64).unwrap() as usize;
    let mut rng = Rng(7);
    let mut w = weights(&mut rng, rows, cols);
    // All-ones and all-zeros sign bytes in some blocks.
    for (i, blk) in w.chunks_mut(18).enumerate() {
        match i % 3 {
            0 => blk[2..].fill(0xff),
            1 => blk[2..].fill(0),
            _ => {}
        }
    }
    let wr = repacked(&w, rb);
    for pattern in 0..4 {
        let x: Vec<f32> = (0..cols)
            .map(|j| match pattern {
                0 => 1.0,
                1 => -1.0,
                2 => {
                    if j % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    }
                }
                _ => {
                    if j < 64 {
                        0.0
                    } else {
                        -(j as f32)
                    }
                }
            })
            .collect();
        let arb = cols / 32 * 34;
        let mut a = vec![0u8; arb];
        quantize_activation(ActFormat::Q8_0, &x, &mut a).unwrap();
        check(&w, &wr, rb, &a, 1, 0..rows);
    }
}

#[test]
fn q1_0x16_repacks_and_reads_back() {
    let mut rng = Rng(11);
    for rows in [3usize, 16, 17, 35] {
        let cols = 384;
        let rb = TY.row_bytes(cols as u64).unwrap() as usize;
        let w = weights(&mut rng, rows, cols);
        let mut wr = repacked(&w, rb);
        if rows >= 16 {
            assert_ne!(w, wr, "rows {rows}: nothing changed");
        }
        let whole = rows / 16 * 16;
        assert_eq!(&w[whole * rb..], &wr[whole * rb..], "tail rows stay plain");
        let mut row = vec![0u8; rb];
        for r in 0..rows {
            repack::row_to_plain(Layout::Q1_0x16, TY, &wr, rb, r, &mut row).unwrap();
            assert_eq!(row, &w[r * rb..(r + 1) * rb], "rows {rows} row {r}");
        }
        let mut scratch = vec![0u8; Layout::Q1_0x16.scratch_bytes(rb)];
        repack::unpack_in_place(Layout::Q1_0x16, TY, &mut wr, rb, &mut scratch).unwrap();
        assert_eq!(w, wr);
    }
}

/// With aarch64 NEON or AVX2 the layout is the preferred one and its kernel runs (not the
/// scalar loop); armv7's table has one-row kernels only.
#[test]
fn the_lut_kernel_runs_on_neon_and_avx2() {
    for feat in feature_sets() {
        let expect = (cfg!(target_arch = "aarch64") && feat.neon()) || feat.avx2();
        assert_eq!(
            Layout::preferred(TY, &feat) == Some(Layout::Q1_0x16),
            expect,
            "{feat:?}"
        );
        let (rows, cols) = (32usize, 256usize);
        let rb = TY.row_bytes(cols as u64).unwrap() as usize;
        let mut rng = Rng(5);
        let wr = repacked(&weights(&mut rng, rows, cols), rb);
        let a = acts(&mut rng, 1, cols, 2.0);
        let mut out = vec![0.0f32; rows];
        let ran = pinch_kernels::arch::repack_matmul_rows(
            Layout::Q1_0x16,
            &feat,
            &wr,
            rb,
            0..rows,
            &a,
            &mut out,
        );
        assert_eq!(ran, expect, "{feat:?}");
    }
}
