//! The SIMD GELU (`ops::geglu_with_table` on AVX2: `vcvtps2ph` + gather) against the
//! scalar loop, **bit for bit**, for every feature set of the running CPU, on inputs
//! chosen where a rounding to f16 can go wrong: every f16 value, its f32 neighbours, the
//! midpoints between adjacent f16 values (ties to even), f16 subnormals, the +-10 cut-offs,
//! infinities, NaN and random values.
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::f16::f16_to_f32;
use pinch_kernels::ops::{geglu_with_table, gelu_table_fill, GELU_TABLE_LEN};
use pinch_kernels::CpuFeatures;

fn inputs() -> Vec<f32> {
    let mut x = Vec::new();
    for h in 0..=u16::MAX {
        let v = f16_to_f32(h);
        let next = f16_to_f32(h.wrapping_add(1));
        x.push(v);
        if v.is_finite() {
            x.push(f32::from_bits(v.to_bits().wrapping_add(1)));
            x.push(f32::from_bits(v.to_bits().wrapping_sub(1)));
            if next.is_finite() && (h & 0x7fff) != 0x7bff {
                x.push(v + (next - v) / 2.0);
            }
        }
    }
    x.extend([
        10.0,
        -10.0,
        9.999_999,
        -9.999_999,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    x.extend([
        1e-8,
        -1e-8,
        2.0f32.powi(-25),
        2.0f32.powi(-24),
        3.0 * 2.0f32.powi(-26),
    ]);
    let mut rng = Rng(0x6e1);
    x.extend((0..10_000).map(|_| rng.f32() * 12.0));
    x
}

#[test]
fn simd_geglu_equals_scalar_bits() {
    let mut table = vec![0f32; GELU_TABLE_LEN];
    gelu_table_fill(&mut table);
    let x = inputs();
    let mut rng = Rng(5);
    let up: Vec<f32> = x.iter().map(|_| rng.f32() * 3.0).collect();
    let mut want = x.clone();
    geglu_with_table(&CpuFeatures::SCALAR, &mut want, &up, &table);
    for feat in feature_sets() {
        // Odd lengths leave a scalar tail after the vector loop.
        for len in [x.len(), x.len() - 3, 13] {
            let mut got = x[..len].to_vec();
            geglu_with_table(&feat, &mut got, &up[..len], &table);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{feat:?}: x = {:e} ({:#x}): {g} vs {w}",
                    x[i],
                    x[i].to_bits()
                );
            }
        }
    }
}

/// The AVX2 loop really runs (the comparison above would pass with scalar on both sides).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_geglu_runs() {
    let mut table = vec![0f32; GELU_TABLE_LEN];
    gelu_table_fill(&mut table);
    for feat in feature_sets().into_iter().filter(|f| f.avx2()) {
        let mut g = vec![0.5f32; 20];
        let done = pinch_kernels::arch::x86_act::geglu_table(&feat, &mut g, &[1.0; 20], &table);
        assert_eq!(done, 16);
    }
}

/// `ops::log_sum_exp_on` (perplexity's normalizer over a whole vocabulary) gives the same
/// bits on every feature set, including rows whose spread sends some exponentials below
/// the normal range (those chunks take the scalar path), `-inf` entries (a pruned head's
/// dropped ids) and a ragged tail; and it stays within 1e-6 of an f64 reference.
#[test]
fn log_sum_exp_is_the_same_on_every_feature_set_and_close_to_f64() {
    let mut rng = Rng(7);
    for (n, spread) in [
        (1usize, 1.0f32),
        (15, 3.0),
        (16, 3.0),
        (1000, 10.0),
        (262_147, 30.0),
        (4099, 120.0),
    ] {
        let mut x: Vec<f32> = (0..n).map(|_| rng.f32() * spread).collect();
        if n > 100 {
            for i in (0..n).step_by(37) {
                x[i] = f32::NEG_INFINITY;
            }
        }
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let want = x
            .iter()
            .map(|&v| ((v - max) as f64).exp())
            .sum::<f64>()
            .ln();
        let scalar = pinch_kernels::ops::log_sum_exp_on(&CpuFeatures::SCALAR, &x);
        assert_eq!(scalar.0, max);
        assert!(
            (scalar.1 - want).abs() < 1e-6 * want.abs().max(1.0),
            "n {n}: {} vs {want}",
            scalar.1
        );
        for feat in feature_sets() {
            let got = pinch_kernels::ops::log_sum_exp_on(&feat, &x);
            assert_eq!(got.0, scalar.0, "n {n} {feat:?}");
            assert_eq!(
                got.1.to_bits(),
                scalar.1.to_bits(),
                "n {n} {feat:?}: {} vs {}",
                got.1,
                scalar.1
            );
        }
    }
}
