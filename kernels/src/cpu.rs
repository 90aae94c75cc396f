//! CPU features as a run-time value.
//!
//! The platform crate detects them (HWCAP, sysctl, cpuid) and passes a `CpuFeatures`
//! down; kernels pick their path from it. `CpuFeatures::default()` is the scalar
//! baseline and is always safe.

/// The instruction-set extensions a kernel may use. All `false` = scalar only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// Advanced SIMD: always present on aarch64 (but kept explicit); on 32-bit ARM only
    /// when the kernel reports `HWCAP_NEON` (see [`arm32_hwcap`]).
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

/// `HWCAP_NEON` in a 32-bit ARM Linux `AT_HWCAP` word.
pub const ARM32_HWCAP_NEON: u32 = 1 << 12;

/// The `AT_HWCAP` word of a 32-bit Linux process's auxiliary vector (the bytes of
/// `/proc/self/auxv`: little-endian `u32` pairs `type, value`, ended by type 0), or
/// `None` when there is none before the end. std has no stable feature detection for
/// 32-bit ARM, so the platform reads the vector itself.
pub fn arm32_hwcap(auxv: &[u8]) -> Option<u32> {
    const AT_NULL: u32 = 0;
    const AT_HWCAP: u32 = 16;
    for pair in auxv.chunks_exact(8) {
        let word = |i: usize| u32::from_le_bytes([pair[i], pair[i + 1], pair[i + 2], pair[i + 3]]);
        match word(0) {
            AT_NULL => return None,
            AT_HWCAP => return Some(word(4)),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pairs` as auxv bytes, in a fixed buffer (the crate has no allocator).
    fn auxv(pairs: &[(u32, u32)]) -> ([u8; 64], usize) {
        let mut b = [0u8; 64];
        for (i, &(t, v)) in pairs.iter().enumerate() {
            b[8 * i..8 * i + 4].copy_from_slice(&t.to_le_bytes());
            b[8 * i + 4..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        (b, 8 * pairs.len())
    }

    #[test]
    fn finds_hwcap_in_a_32_bit_auxv() {
        let (b, n) = auxv(&[(6, 4096), (16, 0x1000 | 0x40), (0, 0)]);
        assert_eq!(arm32_hwcap(&b[..n]), Some(0x1040));
        assert_ne!(0x1040 & ARM32_HWCAP_NEON, 0);
    }

    #[test]
    fn hwcap_after_the_terminator_or_a_truncated_vector_is_none() {
        let (b, n) = auxv(&[(0, 0), (16, 1)]);
        assert_eq!(arm32_hwcap(&b[..n]), None);
        let (b, _) = auxv(&[(6, 4096), (16, 7)]);
        assert_eq!(arm32_hwcap(&b[..12]), None);
        assert_eq!(arm32_hwcap(&[]), None);
    }
}
