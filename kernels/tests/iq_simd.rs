//! IQ2_XXS SIMD one-row kernels against the scalar reference `iq2_xxs::vec_dot`, **bit
//! for bit** (exact integer sums, the reference's float steps), over random blocks
//! (every grid index, sign code and scale), 1 to 9 blocks, activations up to ±127 and
//! -128, for every feature set of the running CPU; on NEON the kernel must exist and run.
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{quantize_activation, vec_dot_scalar};
use pinch_kernels::{arch, ActFormat, GgmlType};

const TY: GgmlType = GgmlType::IQ2_XXS;

#[test]
fn iq2_xxs_simd_equals_scalar_bits() {
    let mut rng = Rng(0x1c2_ee55);
    for nb in [1usize, 2, 3, 9] {
        for rep in 0..20 {
            let mut w: Vec<u8> = (0..nb * 66).map(|_| rng.next() as u8).collect();
            for blk in w.chunks_mut(66) {
                let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs());
                blk[..2].copy_from_slice(&d.to_le_bytes());
            }
            let scale = if rep % 5 == 0 { 1e6 } else { 3.0 };
            let x: Vec<f32> = (0..nb * 256).map(|_| rng.f32() * scale).collect();
            let mut act = vec![0u8; nb * 292];
            quantize_activation(ActFormat::Q8_K, &x, &mut act).unwrap();
            if rep % 7 == 0 {
                // -128 and +127 activations.
                for blk in act.chunks_mut(292) {
                    for (j, q) in blk[4..260].iter_mut().enumerate() {
                        *q = if j % 3 == 0 { 0x80 } else { 0x7f };
                    }
                }
            }
            let want = vec_dot_scalar(TY, &w, &act).unwrap();
            for feat in feature_sets() {
                let simd = arch::vec_dot(TY, &feat, &w, &act);
                let expect = cfg!(target_arch = "aarch64") && feat.neon();
                assert_eq!(simd.is_some(), expect, "{feat:?}: kernel presence");
                if let Some(got) = simd {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{feat:?} nb {nb} rep {rep}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
