//! K-quant SIMD kernels (AVX2, NEON, NEON+dotprod) against the scalar references, on
//! random blocks and rows of 1, 2, 3, 5 and 11 super-blocks.
//!
//! # Tolerance
//! SIMD vs scalar: **exact** (`to_bits`). Every path computes the same exact integer
//! lanes (eight per block, four consecutive weights of each 32-weight chunk), applies the
//! block factor with one fused multiply-add per lane and reduces in the same tree
//! ([`q8_k::kquant_dot`]; aarch64 NEON one f32 fma per block, `kquant_dot_blocksum`),
//! each bit for bit its scalar code (`vec_dot_reference`).
//!
//! Scalar vs an f64 dot product of the dequantized rows (dequantization is bit-exact
//! with llama.cpp, see `kquant_dequant.rs`): each f32 operation errs by at most half an
//! ulp of its result, and every partial sum is bounded by
//! `B = sum_i (|d sc q| + |dmin m|) * |a_i|` (weights split into their scale and minimum
//! parts, activations dequantized), with at most `nb + 12` roundings on the longest chain
//! (one per block, the 8-lane reduction, the int->f32 conversions and products); the test
//! allows `(nb + 16) * eps * B` (eps = f32::EPSILON). A wrong quant, scale or offset moves
//! the result by about `|d * q8|`, far more.
mod common;

use pinch_kernels::quant::{q2_k, q3_k, q4_k, q5_k, q6_k, q8_k};
use pinch_kernels::{arch, matvec, CpuFeatures, GgmlType};

const TYPES: [GgmlType; 5] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];
const BLOCKS: [usize; 5] = [1, 2, 3, 5, 11];

struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// (bytes per block, offset of `d`, offset of `dmin` if the format has one).
fn layout(ty: GgmlType) -> (usize, usize, Option<usize>) {
    match ty {
        GgmlType::Q2_K => (q2_k::BLOCK_BYTES, 80, Some(82)),
        GgmlType::Q3_K => (q3_k::BLOCK_BYTES, 108, None),
        GgmlType::Q4_K => (q4_k::BLOCK_BYTES, 0, Some(2)),
        GgmlType::Q5_K => (q5_k::BLOCK_BYTES, 0, Some(2)),
        GgmlType::Q6_K => (q6_k::BLOCK_BYTES, 208, None),
        _ => unreachable!(),
    }
}

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&pinch_kernels::f16::f32_to_f16(v).to_le_bytes());
}

/// Random blocks: any byte pattern is a valid block, except that the f16 factors are made
/// finite and small (uniform in [-0.01, 0.01]).
fn random_weights(rng: &mut Rng, ty: GgmlType, nb: usize, fill: Option<u8>) -> Vec<u8> {
    let (bytes, d, dmin) = layout(ty);
    let mut w: Vec<u8> = (0..nb * bytes)
        .map(|_| fill.unwrap_or(rng.next_u64() as u8))
        .collect();
    for blk in w.chunks_exact_mut(bytes) {
        put_f16(blk, d, 0.01 * rng.f32());
        if let Some(m) = dmin {
            put_f16(blk, m, 0.01 * rng.f32());
        }
    }
    w
}

fn random_act(rng: &mut Rng, n: usize) -> Vec<u8> {
    // Activation-like rows: mostly small, a few outliers, magnitudes varying per block.
    let x: Vec<f32> = (0..n)
        .map(|i| {
            let v = rng.f32() * (1 + i / 256) as f32;
            if rng.next_u64().is_multiple_of(97) {
                v * 20.0
            } else {
                v
            }
        })
        .collect();
    let mut q = vec![0u8; n / 256 * q8_k::BLOCK_BYTES];
    q8_k::quantize_row(&x, &mut q);
    q
}

/// `B` of the tolerance: the weights' scale part and minimum part dequantized apart (by
/// zeroing `dmin`, then `d`), times the dequantized activations.
fn magnitude(ty: GgmlType, w: &[u8], act: &[u8]) -> (f64, f64) {
    let (bytes, d, dmin) = layout(ty);
    let n = w.len() / bytes * 256;
    let mut a = vec![0f32; n];
    q8_k::dequantize_row(act, &mut a);
    let deq = |w: &[u8]| {
        let mut out = vec![0f32; n];
        matvec::dequantize_row(ty, w, &mut out).unwrap();
        out
    };
    let full = deq(w);
    let exact: f64 = full
        .iter()
        .zip(&a)
        .map(|(x, y)| *x as f64 * *y as f64)
        .sum();
    let (scale_part, min_part) = match dmin {
        Some(m) => {
            let mut ws = w.to_vec();
            let mut wm = w.to_vec();
            for (bs, bm) in ws.chunks_exact_mut(bytes).zip(wm.chunks_exact_mut(bytes)) {
                put_f16(bs, m, 0.0);
                put_f16(bm, d, 0.0);
            }
            (deq(&ws), deq(&wm))
        }
        None => (full.clone(), vec![0f32; n]),
    };
    let b: f64 = (0..n)
        .map(|i| (scale_part[i].abs() as f64 + min_part[i].abs() as f64) * a[i].abs() as f64)
        .sum();
    (b, exact)
}

fn tolerance(nb: usize, b: f64) -> f64 {
    (nb + 16) as f64 * f32::EPSILON as f64 * b
}

/// The SIMD feature sets this machine can run, each named.
fn feature_sets() -> Vec<(&'static str, CpuFeatures)> {
    let v: Vec<_> = CpuFeatures::detect()
        .levels()
        .skip(1)
        .map(|f| (f.describe(), f))
        .collect();
    if v.is_empty() {
        eprintln!("note: no SIMD feature set on this machine; nothing to compare");
    }
    v
}

/// Largest `|fast - scalar| / tol` seen, in millionths (for the report printed by the
/// tests; `--nocapture` shows it).
static WORST_PPM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn note_ratio(diff: f64, tol: f64) {
    let ppm = (diff / tol * 1e6) as u64;
    WORST_PPM.fetch_max(ppm, std::sync::atomic::Ordering::Relaxed);
}

fn check(ty: GgmlType, seed: u64, fill: Option<u8>) -> usize {
    let mut rng = Rng(seed);
    let mut compared = 0;
    for &nb in &BLOCKS {
        for _trial in 0..4 {
            let w = random_weights(&mut rng, ty, nb, fill);
            let act = random_act(&mut rng, nb * 256);
            let scalar = matvec::vec_dot_scalar(ty, &w, &act).unwrap();
            let (b, exact) = magnitude(ty, &w, &act);
            let tol = tolerance(nb, b);
            assert!(
                (scalar as f64 - exact).abs() <= tol,
                "{ty:?} nb={nb}: scalar {scalar} vs f64 dot of dequantized rows {exact} (tol {tol:e})"
            );
            for (name, feat) in feature_sets() {
                if cfg!(target_arch = "arm") && !common::ARM32_NEON_TYPES.contains(&ty) {
                    continue;
                }
                assert!(
                    arch::has_fast_kernel(ty, &feat),
                    "{ty:?} has no {name} kernel: the test would compare scalar with scalar"
                );
                let fast = matvec::vec_dot(ty, &feat, &w, &act).unwrap();
                note_ratio((fast as f64 - scalar as f64).abs(), tol);
                // The scalar code of the kernels' order (aarch64 NEON: block sums).
                let scalar = matvec::vec_dot_reference(ty, &feat, &w, &act).unwrap();
                assert_eq!(
                    fast.to_bits(),
                    scalar.to_bits(),
                    "{ty:?} {name} nb={nb}: {fast} vs scalar {scalar} (must be bit-identical)"
                );
                compared += 1;
            }
        }
    }
    compared
}

#[test]
fn kquant_simd_matches_scalar_on_random_blocks() {
    let mut compared = 0;
    for (i, ty) in TYPES.iter().enumerate() {
        compared += check(*ty, 0x9e37_79b9 + i as u64, None);
    }
    eprintln!(
        "{compared} SIMD results compared; worst |fast - scalar| / tol = {:.3}",
        WORST_PPM.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6
    );
}

/// The integer decomposition the SIMD kernels rely on ([`q8_k::KTerms`] plus the quants
/// made unsigned) reassembles the scalar dot product. Checked on every machine, so a
/// wrong offset or minimum shows up even where no SIMD kernel runs.
#[test]
fn kterms_reassemble_the_scalar_dot() {
    let mut rng = Rng(4242);
    for ty in TYPES {
        for &nb in &BLOCKS {
            let w = random_weights(&mut rng, ty, nb, None);
            let act = random_act(&mut rng, nb * 256);
            let ys = q8_k::act_blocks(&act);
            let (bytes, _, _) = layout(ty);
            let mut total = 0f64;
            for (xb, y) in w.chunks_exact(bytes).zip(ys) {
                let (t, q): (q8_k::KTerms, [i8; 256]) = match ty {
                    GgmlType::Q2_K => {
                        let x = &q2_k::blocks(xb)[0];
                        (q2_k::terms(x, y), x.quants())
                    }
                    GgmlType::Q3_K => {
                        let x = &q3_k::blocks(xb)[0];
                        (q3_k::terms(x, y), x.quants().map(|v| v + 4))
                    }
                    GgmlType::Q4_K => {
                        let x = &q4_k::blocks(xb)[0];
                        (q4_k::terms(x, y), x.quants())
                    }
                    GgmlType::Q5_K => {
                        let x = &q5_k::blocks(xb)[0];
                        (q5_k::terms(x, y), x.quants())
                    }
                    _ => {
                        let x = &q6_k::blocks(xb)[0];
                        (q6_k::terms(x, y), x.quants().map(|v| v + 32))
                    }
                };
                assert!(
                    q.iter().all(|&u| (0..64).contains(&u)),
                    "{ty:?}: quants not unsigned"
                );
                let mut isum = 0i64;
                for (i, &u) in q.iter().enumerate() {
                    isum += t.scales[i / 16] as i64 * u as i64 * y.q(i) as i64;
                }
                isum -= t.offset as i64;
                total += t.d as f64 * isum as f64 - t.dmin as f64 * t.mins as f64;
            }
            let scalar = matvec::vec_dot_scalar(ty, &w, &act).unwrap();
            let (b, _) = magnitude(ty, &w, &act);
            assert!(
                (total - scalar as f64).abs() <= tolerance(nb, b),
                "{ty:?} nb={nb}: terms give {total}, scalar {scalar}"
            );
        }
    }
}

#[test]
fn kquant_simd_matches_scalar_with_extreme_quants() {
    // All quant bytes 0xFF: the largest unsigned quants (and for Q3_K/Q6_K the largest
    // scales), the worst case for 16-bit intermediate products.
    for (i, ty) in TYPES.iter().enumerate() {
        check(*ty, 77 + i as u64, Some(0xFF));
        check(*ty, 177 + i as u64, Some(0x00));
    }
}

#[test]
fn kquant_simd_extreme_activations_do_not_saturate() {
    // q8 = -127 everywhere with all-ones quants: every i16 pair product is at its bound.
    for ty in TYPES {
        let mut rng = Rng(5);
        let w = random_weights(&mut rng, ty, 3, Some(0xFF));
        for sign in [-1.0f32, 1.0] {
            let x = vec![sign; 3 * 256];
            let mut act = vec![0u8; 3 * q8_k::BLOCK_BYTES];
            q8_k::quantize_row(&x, &mut act);
            let scalar = matvec::vec_dot_scalar(ty, &w, &act).unwrap();
            let (b, _) = magnitude(ty, &w, &act);
            for (name, feat) in feature_sets() {
                let fast = matvec::vec_dot(ty, &feat, &w, &act).unwrap();
                note_ratio((fast as f64 - scalar as f64).abs(), tolerance(3, b));
                assert!(
                    (fast as f64 - scalar as f64).abs() <= tolerance(3, b),
                    "{ty:?} {name} sign {sign}: {fast} vs {scalar}"
                );
            }
        }
    }
}

#[test]
fn kquant_kernels_are_reported_for_each_simd_feature_set() {
    for (name, feat) in feature_sets() {
        for ty in TYPES {
            // armv7 has NEON kernels only for the formats ARM32_NEON_TYPES lists.
            let expect = !cfg!(target_arch = "arm") || common::ARM32_NEON_TYPES.contains(&ty);
            assert_eq!(arch::has_fast_kernel(ty, &feat), expect, "{ty:?} on {name}");
        }
    }
    // And never for the scalar baseline.
    for ty in TYPES {
        assert!(arch::vec_dot(ty, &CpuFeatures::SCALAR, &[], &[]).is_none());
    }
}

/// Rough speed of each path (ns per 256-weight block); `cargo test --release --test
/// kquant_simd -- --ignored --nocapture`. Not a pass/fail test.
#[test]
#[ignore = "timing, run by hand"]
fn kquant_speed() {
    let nb = 64;
    let mut rng = Rng(1);
    for ty in TYPES {
        let w = random_weights(&mut rng, ty, nb, None);
        let act = random_act(&mut rng, nb * 256);
        let mut sets = vec![("scalar", CpuFeatures::SCALAR)];
        sets.extend(feature_sets());
        for (name, feat) in sets {
            let iters = 2000;
            let t = std::time::Instant::now();
            let mut s = 0f32;
            for _ in 0..iters {
                s += matvec::vec_dot(ty, &feat, std::hint::black_box(&w), &act).unwrap();
            }
            let ns = t.elapsed().as_nanos() as f64 / (iters * nb) as f64;
            eprintln!("{ty:?} {name:13} {ns:7.1} ns/block ({s:.1})");
        }
    }
}

#[test]
fn garbage_rows_do_not_panic() {
    // Bytes that no quantizer would write (activation bsums inconsistent with the quants,
    // -128 quants, NaN scales, Q6_K scales of -128 against bsums of -32768) and lengths
    // that are not whole blocks: every path returns a number (possibly NaN), never panics.
    let mut rng = Rng(99);
    for ty in TYPES {
        let (bytes, _, _) = layout(ty);
        for pattern in [None, Some(0x80u8), Some(0xFF), Some(0x00)] {
            let w: Vec<u8> = (0..2 * bytes)
                .map(|_| pattern.unwrap_or(rng.next_u64() as u8))
                .collect();
            let act: Vec<u8> = (0..2 * q8_k::BLOCK_BYTES)
                .map(|_| pattern.unwrap_or(rng.next_u64() as u8))
                .collect();
            let mut sets = vec![("scalar", CpuFeatures::SCALAR)];
            sets.extend(feature_sets());
            for (_, feat) in sets {
                let _ = matvec::vec_dot(ty, &feat, &w, &act);
                let _ = matvec::vec_dot(ty, &feat, &w[..bytes + 7], &act);
                let _ = matvec::vec_dot(ty, &feat, &w, &act[..100]);
            }
            let mut out = vec![0f32; 512];
            let _ = matvec::dequantize_row(ty, &w, &mut out);
        }
    }
}
