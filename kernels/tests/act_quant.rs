//! The SIMD activation quantizers (`matvec::quantize_activation_on`: AVX2 and NEON Q8_0 / Q8_1 / Q8_K)
//! against the scalar ones (`quantize_activation`), **byte for byte**, for every feature
//! set of the running CPU: random rows at many magnitudes, rounding ties, blocks of
//! zeros, a maximum that appears with both signs, subnormal and huge values, and blocks
//! holding NaN or an infinity (which the SIMD code hands to the scalar code).
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{quantize_activation, quantize_activation_on};
use pinch_kernels::ActFormat;

/// Rows of 512 values (two Q8_K blocks, sixteen Q8_0 blocks), one per case.
fn rows() -> Vec<Vec<f32>> {
    let mut rng = Rng(0x51ce_d00d);
    let mut out = Vec::new();
    for scale in [1e-30f32, 1e-6, 0.01, 1.0, 37.5, 1e4, 1e30] {
        out.push((0..512).map(|_| rng.f32() * scale).collect());
    }
    // Rounding ties: a maximum of 127 makes the scale exactly 1 (Q8_0) / -1 (Q8_K), so
    // values k + 0.5 are exact halfway cases.
    out.push(
        (0..512)
            .map(|j| {
                if j % 32 == 0 {
                    127.0
                } else {
                    (j % 64) as f32 - 31.5
                }
            })
            .collect(),
    );
    out.push(
        (0..512)
            .map(|j| {
                if j % 32 == 0 {
                    -127.0
                } else {
                    (j % 50) as f32 * 0.5 - 12.25
                }
            })
            .collect(),
    );
    // The first Q8_K block all zeros; the largest magnitude with both signs, the
    // negative one first in one row and last in the other.
    out.push(
        (0..512)
            .map(|j| if j < 256 { 0.0 } else { rng.f32() })
            .collect(),
    );
    let mut both: Vec<f32> = (0..512).map(|_| rng.f32() * 0.5).collect();
    both[3] = -2.0;
    both[200] = 2.0;
    both[300] = 2.0;
    both[500] = -2.0;
    out.push(both);
    // Subnormal maxima (scales that overflow) and values next to the float limits.
    out.push((0..512).map(|_| rng.f32() * 1e-40).collect());
    out.push(vec![f32::from_bits(1); 512]);
    out.push((0..512).map(|_| rng.f32() * f32::MAX).collect());
    // NaN and infinities in single blocks, finite values elsewhere.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut r: Vec<f32> = (0..512).map(|_| rng.f32()).collect();
        r[5] = bad;
        r[300] = bad;
        out.push(r);
    }
    for seed in 1..200u64 {
        let mut g = Rng(seed);
        let mag = 10f32.powi((seed % 13) as i32 - 6);
        out.push((0..512).map(|_| g.f32() * mag).collect());
    }
    out
}

#[test]
fn simd_quantizers_write_the_scalar_bytes() {
    for feat in feature_sets() {
        for fmt in [ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K] {
            let bytes = fmt.row_bytes(512).unwrap();
            for (i, x) in rows().iter().enumerate() {
                let (mut want, mut got) = (vec![0xa5u8; bytes], vec![0x5au8; bytes]);
                quantize_activation(fmt, x, &mut want).unwrap();
                quantize_activation_on(&feat, fmt, x, &mut got).unwrap();
                assert_eq!(got, want, "{fmt:?} row {i} on {feat:?}");
            }
        }
    }
}

#[test]
fn simd_quantizers_check_lengths_as_the_scalar_does() {
    for feat in feature_sets() {
        for fmt in [ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K] {
            let x = vec![0.5f32; 256];
            let bytes = fmt.row_bytes(256).unwrap();
            let mut short = vec![0u8; bytes - 1];
            assert!(quantize_activation_on(&feat, fmt, &x, &mut short).is_err());
            assert!(quantize_activation_on(&feat, fmt, &x[..255], &mut short).is_err());
        }
    }
}
