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
