//! The IQ SIMD one-row kernels (IQ2_XXS, IQ4_XS, IQ4_NL) against their scalar
//! references (`iq2_xxs::vec_dot`; `iq4_xs::vec_dot_in` / `iq4_nl::vec_dot_in` in the
//! order of the feature set), **bit for bit** (exact integer sums, the reference's float
//! steps), over random blocks (every grid index, sign code, table index and sub-block
//! scale), block counts odd and even (IQ4_NL's kernels take blocks in pairs), activations
//! up to ±127 and -128, for every feature set of the running CPU. On NEON every kernel
//! must exist and run, on AVX2 the IQ4 ones; armv7 has none (its table falls back to the
//! scalar reference, which `arch::vec_dot` reports as `None`).
mod common;
use common::{feature_sets, Rng};
use pinch_kernels::matvec::{quantize_activation, vec_dot_scalar};
use pinch_kernels::quant::{iq4_nl, iq4_xs, q8_0::Order};
use pinch_kernels::{arch, ActFormat, CpuFeatures, GgmlType};

/// Random blocks of `ty` (a format with its f16 scale first) against its activations
/// (Q8_K for 256-weight blocks, Q8_0 for 32); `has_kernel(feat)` says where the SIMD kernel must exist and
/// `reference(feat, w, act)` is the scalar result it must equal.
fn check(
    ty: GgmlType,
    seed: u64,
    has_kernel: fn(&CpuFeatures) -> bool,
    reference: fn(&CpuFeatures, &[u8], &[u8]) -> f32,
) {
    let (qk, bytes) = ty.block_geometry();
    // The activation format and its block: bytes, offset and count of the quants.
    let (fmt, abytes, aq) = if qk == 256 {
        (ActFormat::Q8_K, 292, 4..260)
    } else {
        (ActFormat::Q8_0, 34, 2..34)
    };
    let mut rng = Rng(seed);
    let counts: &[usize] = if qk == 256 {
        &[1, 2, 3, 9]
    } else {
        &[1, 2, 3, 8, 17, 40]
    };
    for &nb in counts {
        for rep in 0..20 {
            let mut w: Vec<u8> = (0..nb * bytes).map(|_| rng.next() as u8).collect();
            for blk in w.chunks_mut(bytes) {
                let d = pinch_kernels::f16::f32_to_f16(0.01 + 0.05 * rng.f32().abs());
                blk[..2].copy_from_slice(&d.to_le_bytes());
            }
            let scale = if rep % 5 == 0 { 1e6 } else { 3.0 };
            let x: Vec<f32> = (0..nb * qk).map(|_| rng.f32() * scale).collect();
            let mut act = vec![0u8; nb * abytes];
            quantize_activation(fmt, &x, &mut act).unwrap();
            if rep % 7 == 0 {
                // -128 and +127 activations.
                for blk in act.chunks_mut(abytes) {
                    for (j, q) in blk[aq.clone()].iter_mut().enumerate() {
                        *q = if j % 3 == 0 { 0x80 } else { 0x7f };
                    }
                }
            }
            for feat in feature_sets() {
                let want = reference(&feat, &w, &act);
                let simd = arch::vec_dot(ty, &feat, &w, &act);
                assert_eq!(
                    simd.is_some(),
                    has_kernel(&feat),
                    "{ty:?} {feat:?}: kernel presence"
                );
                if let Some(got) = simd {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty:?} {feat:?} nb {nb} rep {rep}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn iq2_xxs_simd_equals_scalar_bits() {
    check(
        GgmlType::IQ2_XXS,
        0x1c2_ee55,
        |feat| cfg!(target_arch = "aarch64") && feat.neon(),
        |_, w, act| vec_dot_scalar(GgmlType::IQ2_XXS, w, act).unwrap(),
    );
}

#[test]
fn iq4_xs_simd_equals_scalar_bits() {
    // NEON sums one integer per block (llama.cpp's NEON order), AVX2 keeps x86 lanes.
    check(
        GgmlType::IQ4_XS,
        0x1c4_0a55,
        |feat| {
            (cfg!(target_arch = "aarch64") && feat.neon())
                || (cfg!(target_arch = "x86_64") && feat.avx2())
        },
        |feat, w, act| iq4_xs::vec_dot_in(Order::of(feat), w, act),
    );
}

#[test]
fn iq4_nl_simd_equals_scalar_bits() {
    // NEON sums one integer per block (pairs as llama.cpp's NEON), AVX2 keeps x86 lanes.
    check(
        GgmlType::IQ4_NL,
        0x1c4_0a1e,
        |feat| {
            (cfg!(target_arch = "aarch64") && feat.neon())
                || (cfg!(target_arch = "x86_64") && feat.avx2())
        },
        |feat, w, act| iq4_nl::vec_dot_in(Order::of(feat), w, act),
    );
}
