//! CPU features as a run-time value.
//!
//! The platform crate detects them (HWCAP, sysctl, cpuid) and passes a `CpuFeatures`
//! down; kernels pick their path from it. `CpuFeatures::default()` is the scalar
//! baseline and is always safe.

/// The instruction-set extensions a kernel may use. All `false` = scalar only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// aarch64 Advanced SIMD (always present on aarch64, but kept explicit).
    pub neon: bool,
    /// aarch64 `sdot`/`udot` (ARMv8.2 dotprod): Cortex-A55 yes, A53 and Apple A7 no.
    pub dotprod: bool,
    /// aarch64 half-precision arithmetic.
    pub fp16: bool,
    /// aarch64 int8 matrix multiply (`smmla`).
    pub i8mm: bool,
    /// x86 AVX2 (with FMA and F16C, which every AVX2 CPU we target has).
    pub avx2: bool,
    /// x86 AVX-512 VNNI.
    pub avx512vnni: bool,
}

impl CpuFeatures {
    /// Scalar only: the reference path.
    pub const SCALAR: CpuFeatures = CpuFeatures {
        neon: false,
        dotprod: false,
        fp16: false,
        i8mm: false,
        avx2: false,
        avx512vnni: false,
    };

    /// A short human-readable list, e.g. `"neon dotprod"` or `"scalar"`.
    pub fn describe(&self) -> &'static str {
        match (self.avx2, self.neon, self.dotprod) {
            (true, _, _) => "avx2",
            (false, true, true) => "neon+dotprod",
            (false, true, false) => "neon",
            _ => "scalar",
        }
    }
}
