//! No safe function reaches an ISA path the CPU was not proven to have.
//!
//! `CpuFeatures` cannot be built with a feature set by safe code (its field is private:
//! the `compile_fail` examples on `CpuFeatures` check that), so a forged feature set can
//! only be one that *removes* features from a detected one. These tests check that
//! every way safe code can shape a `CpuFeatures` without detection lands on the scalar
//! table, and that removing a feature really takes its kernels away.
use pinch_kernels::arch::{has_fast_kernel, table};
use pinch_kernels::cpu::Feature;
use pinch_kernels::{attn, repack, CpuFeatures, GgmlType};

const ALL: [Feature; 7] = [
    Feature::Neon,
    Feature::Dotprod,
    Feature::Fp16,
    Feature::I8mm,
    Feature::Avx2,
    Feature::Avx512Vnni,
    Feature::Avx512Vbmi,
];

#[test]
fn features_built_without_detection_never_reach_avx2() {
    for f in [
        CpuFeatures::SCALAR,
        CpuFeatures::default(),
        CpuFeatures::baseline(),
        CpuFeatures::SCALAR.only(&ALL),
        CpuFeatures::baseline().only(&ALL),
    ] {
        assert!(!f.avx2() && f.avx2_token().is_none(), "{f:?}");
        assert!(!f.avx512vnni() && !f.dotprod(), "{f:?}");
        assert!(matches!(table(&f).name, "scalar" | "neon"), "{f:?}");
        assert!(repack::Layout::preferred(GgmlType::Q8_0, &f) != Some(repack::Layout::Q8_0x4s));
    }
    assert_eq!(table(&CpuFeatures::SCALAR).name, "scalar");
    assert!(!has_fast_kernel(GgmlType::Q8_0, &CpuFeatures::SCALAR));
}

#[test]
fn a_cpu_without_avx2_takes_the_scalar_path() {
    // The detected features with AVX2 taken away stand for a CPU without it.
    let f = CpuFeatures::detect().without(Feature::Avx2);
    assert!(!f.avx2() && !f.avx512vnni() && f.avx2_token().is_none());
    assert!(!table(&f).name.starts_with("avx2"));
    if cfg!(target_arch = "x86_64") {
        assert_eq!(table(&f).name, "scalar");
        assert!(!has_fast_kernel(GgmlType::Q8_0, &f));
        assert_eq!(repack::Layout::preferred(GgmlType::Q8_0, &f), None);
    }
    // The attention entry points on such a value give the scalar reference's bits.
    let k: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin()).collect();
    let q: Vec<f32> = (0..67).map(|i| (i as f32 * 0.11).cos()).collect();
    let row = attn::KvRow::F32(&k);
    assert_eq!(
        attn::dot(&f, row, &q).to_bits(),
        attn::dot_scalar(row, &q).to_bits()
    );
}

#[test]
fn without_dotprod_the_neon_table_has_no_sdot_kernels() {
    let f = CpuFeatures::detect().without(Feature::Dotprod);
    assert!(f.neon_dot_token().is_none());
    assert_ne!(table(&f).name, "neon+dotprod");
    assert!(!repack::has_fast_kernel(repack::Layout::Q8_0x4s, &f));
}
