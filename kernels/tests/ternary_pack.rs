//! TQ2_0, Q2_0 and TQ1_0 over the repacked `Tq2_0x4` / `Q2_0x4` / `Tq2_0x16d` / `Q2_0x16d` / `Tq1_0x4` layouts (`sdot`
//! by element on dotprod, widening multiplies without) against the plain scalar references
//! (`tq2_0::vec_dot`, `q2_0::vec_dot`, `tq1_0::vec_dot`), **bit for bit** per (row, token): the kernels
//! regroup exact integer sums and keep the reference's float steps. Every feature set of
//! the running CPU (on x86 the scalar loop runs and must agree too); odd row counts (plain
//! tail rows), unaligned ranges, several tokens, code 3 (level 2, which TQ2_0 files never
//! hold but the reference defines), extreme activations. Repacking and reading back, and
//! the kernels running on NEON, for every 2-bit layout (Q2Kx8 too).
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{quantize_activation, vec_dot_scalar};
use pinch_kernels::repack::{self, Layout};
use pinch_kernels::GgmlType;

/// The formats, their layouts, and where the f16 scale sits in a plain block.
const CASES: [(GgmlType, Layout, usize); 7] = [
    (GgmlType::TQ2_0, Layout::Tq2_0x4, 64),
    (GgmlType::Q2_0, Layout::Q2_0x4, 0),
    (GgmlType::TQ2_0, Layout::Tq2_0x16, 64),
    (GgmlType::Q2_0, Layout::Q2_0x16, 0),
    (GgmlType::Q2_0, Layout::Q2_0x16d, 0),
    (GgmlType::TQ2_0, Layout::Tq2_0x16d, 64),
    (GgmlType::TQ1_0, Layout::Tq1_0x4, 52),
];

/// Every 2-bit layout (Q2_K's kernels are checked in `q2k_pack.rs`) and its f16 scales.
const LAYOUTS: [(GgmlType, Layout, &[usize]); 8] = [
    (GgmlType::TQ2_0, Layout::Tq2_0x4, &[64]),
    (GgmlType::Q2_0, Layout::Q2_0x4, &[0]),
    (GgmlType::TQ2_0, Layout::Tq2_0x16, &[64]),
    (GgmlType::Q2_0, Layout::Q2_0x16, &[0]),
    (GgmlType::Q2_0, Layout::Q2_0x16d, &[0]),
    (GgmlType::TQ2_0, Layout::Tq2_0x16d, &[64]),
    (GgmlType::TQ1_0, Layout::Tq1_0x4, &[52]),
    (GgmlType::Q2_K, Layout::Q2Kx8, &[80, 82]),
];

fn weights(rng: &mut Rng, ty: GgmlType, d_at: usize, rows: usize, cols: usize) -> Vec<u8> {
    weights_with(rng, ty, &[d_at], rows, cols)
}

/// Random blocks of `ty` with small finite f16 scales at `scales` (byte offsets).
fn weights_with(
    rng: &mut Rng,
    ty: GgmlType,
    scales: &[usize],
    rows: usize,
    cols: usize,
) -> Vec<u8> {
    let (qk, bb) = ty.block_geometry();
    let mut w: Vec<u8> = (0..rows * cols / qk * bb)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in w.chunks_mut(bb) {
        for &at in scales {
            let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs()).to_le_bytes();
            blk[at..at + 2].copy_from_slice(&d);
        }
    }
    w
}

fn acts_of(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let fmt = ty.act_format().unwrap();
    let mut a = vec![0u8; fmt.row_bytes(x.len()).unwrap()];
    quantize_activation(fmt, x, &mut a).unwrap();
    a
}

fn acts(rng: &mut Rng, ty: GgmlType, n_tok: usize, cols: usize) -> Vec<u8> {
    (0..n_tok)
        .flat_map(|_| acts_of(ty, &(0..cols).map(|_| rng.f32() * 3.0).collect::<Vec<_>>()))
        .collect()
}

fn repacked(ty: GgmlType, l: Layout, w: &[u8], rb: usize) -> Vec<u8> {
    common::repacked_as(l, ty, w, rb)
}

#[allow(clippy::too_many_arguments)]
fn check(
    ty: GgmlType,
    l: Layout,
    w: &[u8],
    wr: &[u8],
    rb: usize,
    a: &[u8],
    n_tok: usize,
    range: std::ops::Range<usize>,
) {
    let arb = a.len() / n_tok;
    for feat in feature_sets() {
        let mut out = vec![f32::NAN; range.len() * n_tok];
        repack::matmul_rows(l, ty, &feat, wr, rb, range.clone(), a, arb, &mut out).unwrap();
        for (i, r) in range.clone().enumerate() {
            for t in 0..n_tok {
                let e = vec_dot_scalar(ty, &w[r * rb..(r + 1) * rb], &a[t * arb..(t + 1) * arb])
                    .unwrap();
                let g = out[i * n_tok + t];
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{ty:?} {feat:?} rows {} range {range:?} row {r} tok {t}: {g} vs {e}",
                    w.len() / rb
                );
            }
        }
    }
}

#[test]
fn repacked_ternary_equals_plain_scalar_bits() {
    let mut rng = Rng(0x7e2a_0001);
    for (ty, l, d_at) in CASES {
        for rows in [1usize, 3, 4, 5, 12, 17, 22, 33] {
            for cols in [256usize, 768, 2048] {
                let rb = ty.row_bytes(cols as u64).unwrap() as usize;
                let w = weights(&mut rng, ty, d_at, rows, cols);
                let wr = repacked(ty, l, &w, rb);
                for n_tok in [1usize, 2, 3] {
                    let a = acts(&mut rng, ty, n_tok, cols);
                    for range in [
                        0..rows,
                        1.min(rows)..rows,
                        0..rows.saturating_sub(1),
                        rows / 2..rows,
                        (rows / 4 * 4).min(rows)..rows,
                        3.min(rows)..rows.min(19),
                        rows..rows,
                    ] {
                        check(ty, l, &w, &wr, rb, &a, n_tok, range);
                    }
                }
            }
        }
    }
}

/// All-code-3 and all-code-0 blocks, ±127 activations, alternating signs, and a zero
/// block (scale 0; Q8_0 writes -128 there).
#[test]
fn repacked_ternary_on_extremes_equals_plain_scalar_bits() {
    for (ty, l, d_at) in CASES {
        let (rows, cols) = (36usize, 1024usize);
        let bb = ty.block_geometry().1;
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        let mut rng = Rng(3);
        let mut w = weights(&mut rng, ty, d_at, rows, cols);
        for (i, blk) in w.chunks_mut(bb).enumerate() {
            let q = if d_at == 0 { 2..bb } else { 0..d_at };
            match i % 3 {
                0 => blk[q].fill(0xff),
                1 => blk[q].fill(0),
                _ => {}
            }
        }
        let wr = repacked(ty, l, &w, rb);
        for pattern in 0..4 {
            let x = common::extreme_values(pattern, cols);
            check(ty, l, &w, &wr, rb, &acts_of(ty, &x), 1, 0..rows);
        }
    }
}

#[test]
fn two_bit_layouts_repack_and_read_back() {
    let mut rng = Rng(17);
    for (ty, l, scales) in LAYOUTS {
        for rows in [3usize, 4, 8, 9, 14, 19] {
            let cols = 512;
            let rb = ty.row_bytes(cols as u64).unwrap() as usize;
            let w = weights_with(&mut rng, ty, scales, rows, cols);
            let mut wr = repacked(ty, l, &w, rb);
            if rows >= l.group_rows() {
                assert_ne!(w, wr, "{ty:?} rows {rows}: nothing changed");
            }
            let whole = rows / l.group_rows() * l.group_rows();
            assert_eq!(&w[whole * rb..], &wr[whole * rb..], "tail rows stay plain");
            let mut row = vec![0u8; rb];
            let (mut f1, mut f2) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                repack::row_to_plain(l, ty, &wr, rb, r, &mut row).unwrap();
                assert_eq!(row, &w[r * rb..(r + 1) * rb], "{ty:?} rows {rows} row {r}");
                repack::dequantize_row(l, ty, &wr, rb, r, &mut f1).unwrap();
                repack::dequantize_row(Layout::Plain, ty, &w, rb, r, &mut f2).unwrap();
                assert_eq!(f1, f2);
            }
            let mut scratch = vec![0u8; l.scratch_bytes(rb)];
            repack::unpack_in_place(l, ty, &mut wr, rb, &mut scratch).unwrap();
            assert_eq!(w, wr);
        }
        assert_eq!(Layout::from_id(l.id()), Some(l));
    }
}

/// Whether `l` is the layout aarch64 prefers for its type on a CPU with `dotprod` (the
/// pair tables without dotprod, where `smlal` costs more instructions; `sdot` with it,
/// over the row-interleaved fields; the x4 layouts are listed but never preferred).
fn preferred_on_neon(l: Layout, dotprod: bool) -> bool {
    match l {
        Layout::Tq2_0x16 | Layout::Q2_0x16 => !dotprod,
        Layout::Tq2_0x16d | Layout::Q2_0x16d => dotprod,
        Layout::Tq2_0x4 | Layout::Q2_0x4 => false,
        _ => true,
    }
}

/// On aarch64 the layouts are the preferred ones and their kernels run.
#[test]
fn the_two_bit_kernels_run_on_neon() {
    for (ty, l, scales) in LAYOUTS {
        for feat in feature_sets() {
            let expect = cfg!(target_arch = "aarch64") && feat.neon();
            assert_eq!(
                Layout::preferred(ty, &feat) == Some(l),
                expect && preferred_on_neon(l, feat.dotprod()),
                "{ty:?} {feat:?}"
            );
            let (rows, cols) = (16usize, 256usize);
            let rb = ty.row_bytes(cols as u64).unwrap() as usize;
            let mut rng = Rng(5);
            let wr = repacked(ty, l, &weights_with(&mut rng, ty, scales, rows, cols), rb);
            let a = acts(&mut rng, ty, 1, cols);
            let mut out = vec![0.0f32; rows];
            let ran =
                pinch_kernels::arch::repack_matmul_rows(l, &feat, &wr, rb, 0..rows, &a, &mut out);
            // The pair-table layouts are in the baseline table only, the x16d ones
            // (`sdot`) in the dotprod table only.
            let listed = match l {
                Layout::Tq2_0x16 | Layout::Q2_0x16 => !feat.dotprod(),
                Layout::Q2_0x16d | Layout::Tq2_0x16d => feat.dotprod(),
                _ => true,
            };
            assert_eq!(ran, expect && listed, "{ty:?} {feat:?}");
        }
    }
}
