//! Every SIMD kernel of the legacy formats against the scalar reference, on random
//! blocks and several row lengths, for every feature set the running CPU has
//! (x86: AVX2; aarch64: NEON, and NEON+dotprod when present; under qemu
//! `-cpu cortex-a53` only the NEON baseline runs).
//!
//! Tolerances:
//! - Quantized types and F16: **exact** (`to_bits` equality). The kernels compute each
//!   integer sum exactly (no saturating step can be reached, even for a `-128`
//!   activation) and then do the float arithmetic of the reference step for step (the
//!   same lanes, fused where the reference fuses, the same reduction tree), so there is
//!   no reassociation at all. The reference is `vec_dot_reference`: the scalar code of
//!   the order the CPU's kernels use (Q8_0/Q5_0 on NEON sum per block; elsewhere
//!   llama.cpp's x86 lanes).
//! - F32: the products are the same f32 values, but the f64 accumulator is split over
//!   SIMD lanes; the f64 sums differ by at most ~n * 2^-53 * sum|terms| and the final
//!   rounding to f32 can move by one f32 ulp, so we allow `1e-6 * sum|x*a|` (plus 1e-30).
mod common;

use pinch_kernels::arch::has_fast_kernel;
use pinch_kernels::matvec::{vec_dot, vec_dot_reference};
use pinch_kernels::{CpuFeatures, GgmlType};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    pinch_kernels::f16::f32_to_f16(v).to_le_bytes()
}

/// Feature sets to try on this CPU (each one a real SIMD path).
fn feature_sets() -> Vec<CpuFeatures> {
    let v: Vec<CpuFeatures> = CpuFeatures::detect().levels().skip(1).collect();
    if v.is_empty() {
        eprintln!("no SIMD feature on this CPU: nothing to compare");
    }
    for f in &v {
        eprintln!("feature set: {}", f.describe());
    }
    v
}

/// Random weight row of `nb` blocks: scale fields get a plausible f16, the rest random.
fn weights(rng: &mut Rng, ty: GgmlType, nb: usize) -> Vec<u8> {
    let (_, bytes) = ty.block_geometry();
    let mut w = rng.bytes(nb * bytes);
    for blk in w.chunks_mut(bytes) {
        let d = f16_bytes(0.01 + 0.05 * rng.f32().abs());
        match ty {
            // Scale at the end of the block.
            GgmlType::TQ1_0 | GgmlType::TQ2_0 => blk[bytes - 2..].copy_from_slice(&d),
            // Q4_1/Q5_1: d, then a minimum of either sign.
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                blk[..2].copy_from_slice(&d);
                blk[2..4].copy_from_slice(&f16_bytes(0.3 * rng.f32()));
            }
            _ => blk[..2].copy_from_slice(&d),
        }
    }
    w
}

/// Random activation row for `ty` with `n` values. Quants are raw random bytes
/// (including -128) since the kernels must be exact for any i8.
fn activations(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 | GgmlType::F16 => {
            let mut out = Vec::with_capacity(4 * n);
            for _ in 0..n {
                let mut v = rng.f32() * 4.0;
                if ty == GgmlType::F16 {
                    v = pinch_kernels::f16::f16_to_f32(pinch_kernels::f16::f32_to_f16(v));
                }
                out.extend_from_slice(&v.to_le_bytes());
            }
            out
        }
        GgmlType::TQ1_0 | GgmlType::TQ2_0 => {
            let mut a = rng.bytes(n / 256 * 292);
            for blk in a.chunks_mut(292) {
                blk[..4].copy_from_slice(&(0.001 + 0.01 * rng.f32().abs()).to_le_bytes());
            }
            a
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            // Q8_1: d, then s (any f16 of either sign), then the quants.
            let mut a = rng.bytes(n / 32 * 36);
            for blk in a.chunks_mut(36) {
                blk[..2].copy_from_slice(&f16_bytes(0.001 + 0.01 * rng.f32().abs()));
                blk[2..4].copy_from_slice(&f16_bytes(rng.f32() * 2.0));
            }
            a
        }
        _ => {
            let mut a = rng.bytes(n / 32 * 34);
            for blk in a.chunks_mut(34) {
                blk[..2].copy_from_slice(&f16_bytes(0.001 + 0.01 * rng.f32().abs()));
            }
            a
        }
    }
}

fn float_abs_sum(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    let a = act
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    match ty {
        GgmlType::F32 => w
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .zip(a)
            .map(|(x, y)| (x * y).abs())
            .sum(),
        _ => w
            .chunks_exact(2)
            .map(|c| pinch_kernels::f16::read_f16([c[0], c[1]]))
            .zip(a)
            .map(|(x, y)| (x * y).abs())
            .sum(),
    }
}

fn check_type(ty: GgmlType, lengths: &[usize]) {
    if cfg!(target_arch = "arm") && !common::ARM32_NEON_TYPES.contains(&ty) {
        eprintln!("{}: no armv7 NEON kernel (scalar there)", ty.name());
        return;
    }
    let sets = feature_sets();
    for feat in &sets {
        assert!(
            has_fast_kernel(ty, feat),
            "{}: no SIMD kernel on {}: the test would compare scalar with scalar",
            ty.name(),
            feat.describe()
        );
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ty as u64);
        for &n in lengths {
            for rep in 0..4 {
                let (qk, _) = ty.block_geometry();
                let w = if matches!(ty, GgmlType::F32 | GgmlType::F16) {
                    let mut out = Vec::new();
                    for _ in 0..n {
                        let v = rng.f32();
                        if ty == GgmlType::F32 {
                            out.extend_from_slice(&v.to_le_bytes());
                        } else {
                            out.extend_from_slice(&f16_bytes(v));
                        }
                    }
                    out
                } else {
                    weights(&mut rng, ty, n / qk)
                };
                let act = activations(&mut rng, ty, n);
                let fast = vec_dot(ty, feat, &w, &act).unwrap();
                let slow = vec_dot_reference(ty, feat, &w, &act).unwrap();
                if ty == GgmlType::F32 {
                    let tol = 1e-6 * float_abs_sum(ty, &w, &act) + 1e-30;
                    assert!(
                        (fast - slow).abs() <= tol,
                        "{} on {}: n={n} rep={rep}: simd {fast} vs scalar {slow} (tol {tol})",
                        ty.name(),
                        feat.describe()
                    );
                } else {
                    assert_eq!(
                        fast.to_bits(),
                        slow.to_bits(),
                        "{} on {}: n={n} rep={rep}: simd {fast} vs scalar {slow}",
                        ty.name(),
                        feat.describe()
                    );
                }
            }
        }
    }
}

fn block_lengths(qk: usize) -> Vec<usize> {
    [1, 2, 3, 7, 33].iter().map(|b| b * qk).collect()
}

#[test]
fn q8_0_simd_matches_scalar_exactly() {
    check_type(GgmlType::Q8_0, &block_lengths(32));
}
#[test]
fn q4_0_simd_matches_scalar_exactly() {
    check_type(GgmlType::Q4_0, &block_lengths(32));
}
#[test]
fn q5_0_simd_matches_scalar_exactly() {
    check_type(GgmlType::Q5_0, &block_lengths(32));
}
#[test]
fn q4_1_simd_matches_scalar_exactly() {
    check_type(GgmlType::Q4_1, &block_lengths(32));
}
#[test]
fn q5_1_simd_matches_scalar_exactly() {
    check_type(GgmlType::Q5_1, &block_lengths(32));
}
#[test]
fn q1_0_simd_matches_scalar_exactly() {
    check_type(GgmlType::Q1_0, &block_lengths(128));
}
#[test]
fn q2_0_simd_matches_scalar_exactly() {
    check_type(GgmlType::Q2_0, &block_lengths(64));
}
#[test]
fn tq2_0_simd_matches_scalar_exactly() {
    check_type(GgmlType::TQ2_0, &block_lengths(256));
}
#[test]
fn f32_simd_matches_scalar_within_tolerance() {
    check_type(GgmlType::F32, &[1, 3, 17, 255, 1023]);
}
#[test]
fn f16_simd_matches_scalar_exactly() {
    check_type(GgmlType::F16, &[1, 3, 16, 17, 255, 256, 1023, 1024]);
}

#[test]
fn simd_kernel_declines_mismatched_shapes() {
    // A weight row of 2 blocks against 1 activation block must not be dotted by SIMD
    // (the scalar fallback then handles it without panicking).
    for feat in feature_sets() {
        let mut rng = Rng(5);
        let w = weights(&mut rng, GgmlType::Q8_0, 2);
        let act = activations(&mut rng, GgmlType::Q8_0, 32);
        assert_eq!(
            pinch_kernels::arch::vec_dot(GgmlType::Q8_0, &feat, &w, &act),
            None
        );
        let _ = vec_dot(GgmlType::Q8_0, &feat, &w, &act).unwrap();
    }
}

#[test]
fn scalar_features_never_take_a_simd_path() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q1_0,
        GgmlType::TQ2_0,
    ] {
        assert!(!has_fast_kernel(ty, &CpuFeatures::SCALAR));
    }
}

#[test]
#[ignore = "timing only: cargo test --release --test legacy_simd -- --ignored --nocapture"]
fn timing_scalar_vs_simd() {
    let n = 4096;
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
        GgmlType::TQ2_0,
        GgmlType::F32,
    ] {
        let mut rng = Rng(1);
        let (qk, _) = ty.block_geometry();
        let w = if ty == GgmlType::F32 {
            (0..n).flat_map(|_| rng.f32().to_le_bytes()).collect()
        } else {
            weights(&mut rng, ty, n / qk)
        };
        let act = activations(&mut rng, ty, n);
        let iters = 2000;
        let time = |feat: &CpuFeatures| {
            let t = std::time::Instant::now();
            let mut s = 0.0f32;
            for _ in 0..iters {
                s += vec_dot(ty, feat, std::hint::black_box(&w), &act).unwrap();
            }
            std::hint::black_box(s);
            t.elapsed().as_nanos() as f64 / iters as f64
        };
        let scalar = time(&CpuFeatures::SCALAR);
        for feat in feature_sets() {
            let fast = time(&feat);
            eprintln!(
                "{:6} n={n}: scalar {:8.0} ns, {:12} {:7.0} ns ({:.1}x)",
                ty.name(),
                scalar,
                feat.describe(),
                fast,
                scalar / fast
            );
        }
    }
}
