//! CPU features as a run-time value that only detection can make.
//!
//! A kernel that uses AVX2 or `sdot` on a CPU without it dies of an illegal instruction,
//! so the ISA paths must be unreachable from safe code unless the CPU was proven to have
//! them. `CpuFeatures` is that proof (memchr's shape): its fields are private, and a value
//! with a feature set comes only from
//! - [`CpuFeatures::detect`] (feature `std`: the OS's own report through
//!   `is_x86_feature_detected!` / `is_aarch64_feature_detected!`, i.e. cpuid and xgetbv
//!   on x86, HWCAP on Linux, sysctl on Apple), or
//! - [`CpuFeatures::baseline`]: what the build target guarantees (Advanced SIMD on every
//!   aarch64 target pinch builds for), for no_std callers.
//!
//! Everything else can only *remove* features ([`CpuFeatures::only`],
//! [`CpuFeatures::without`]), so `PINCH_CPU=neon-nodot` or a test that wants the A53 path
//! cannot enable an instruction the CPU lacks. `CpuFeatures::default()` is the scalar
//! baseline and is always safe.
//!
//! The ISA tables of [`crate::arch`] are chosen from these bits, and the public ISA entry
//! points that are not behind a table take a zero-sized token ([`Avx2`], [`Neon`],
//! [`NeonDot`]) that only a `CpuFeatures` with the feature hands out.

/// One instruction-set extension a kernel may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Feature {
    /// Advanced SIMD: architectural on aarch64 (but kept explicit); on 32-bit ARM only
    /// when the kernel reports `HWCAP_NEON` (see [`arm32_hwcap`]) or the target's
    /// baseline has it (Apple's armv7s).
    Neon = 1,
    /// aarch64 `sdot`/`udot` (ARMv8.2 dotprod): Cortex-A55 yes, A53 and Apple A7 no.
    Dotprod = 2,
    /// aarch64 half-precision arithmetic.
    Fp16 = 4,
    /// aarch64 int8 matrix multiply (`smmla`).
    I8mm = 8,
    /// x86 AVX2 together with FMA and F16C (every AVX2 CPU pinch targets has all three).
    Avx2 = 16,
    /// x86 AVX-512 F/BW/VL with VNNI (only ever set together with [`Feature::Avx2`]).
    Avx512Vnni = 32,
    /// x86 AVX-512 VBMI (`vpermb`, `vpmultishiftqb`; only ever set together with
    /// [`Feature::Avx512Vnni`]): Ice Lake and later, Zen 4 and later.
    Avx512Vbmi = 64,
}

/// The instruction-set extensions this CPU was proven to have. All off = scalar only.
///
/// # Invariants
/// Every bit set was reported by the CPU/OS ([`CpuFeatures::detect`]) or is guaranteed by
/// the build target ([`CpuFeatures::baseline`]); `Avx512Vnni` implies `Avx2`, `Avx512Vbmi`
/// implies `Avx512Vnni`, and `Dotprod`/`Fp16`/`I8mm` imply `Neon`. Safe code cannot set a bit (the field is
/// private and every public method only clears bits):
///
/// ```compile_fail
/// // A forged feature set does not compile: the field is private.
/// let f = pinch_kernels::CpuFeatures { bits: 0xff };
/// ```
/// ```compile_fail
/// // Nor does a forged token.
/// let t = pinch_kernels::cpu::Avx2(());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuFeatures {
    bits: u8,
}

/// Proof that the CPU runs AVX2 with FMA and F16C (from [`CpuFeatures::avx2_token`]).
#[derive(Clone, Copy, Debug)]
pub struct Avx2(());

/// Proof that the CPU runs Advanced SIMD (from [`CpuFeatures::neon_token`]).
#[derive(Clone, Copy, Debug)]
pub struct Neon(());

/// Proof that the CPU runs Advanced SIMD with `sdot` (from
/// [`CpuFeatures::neon_dot_token`]).
#[derive(Clone, Copy, Debug)]
pub struct NeonDot(());

impl CpuFeatures {
    /// Scalar only: the reference path.
    pub const SCALAR: CpuFeatures = CpuFeatures { bits: 0 };

    /// What the build target guarantees without asking the OS: Advanced SIMD on aarch64
    /// targets compiled with it (all of pinch's), nothing on x86.
    pub const fn baseline() -> CpuFeatures {
        if cfg!(all(
            any(target_arch = "aarch64", target_arch = "arm"),
            target_feature = "neon"
        )) {
            CpuFeatures {
                bits: Feature::Neon as u8,
            }
        } else {
            CpuFeatures::SCALAR
        }
    }

    /// The features of the CPU running this, as the OS reports them.
    #[cfg(any(test, feature = "std"))]
    pub fn detect() -> CpuFeatures {
        #[allow(unused_mut)]
        let mut bits = CpuFeatures::baseline().bits;
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                bits |= Feature::Neon as u8;
                if std::arch::is_aarch64_feature_detected!("dotprod") {
                    bits |= Feature::Dotprod as u8;
                }
                if std::arch::is_aarch64_feature_detected!("fp16") {
                    bits |= Feature::Fp16 as u8;
                }
                if std::arch::is_aarch64_feature_detected!("i8mm") {
                    bits |= Feature::I8mm as u8;
                }
            }
        }
        // std has no stable feature detection for 32-bit ARM: read the auxiliary vector
        // the kernel gave the process (Linux, Android; qemu-user fills it with the
        // emulated core's HWCAPs). Elsewhere (no such file) the baseline stands.
        #[cfg(target_arch = "arm")]
        {
            let hw = std::fs::read("/proc/self/auxv")
                .ok()
                .and_then(|v| arm32_hwcap(&v));
            if hw.is_some_and(|h| h & ARM32_HWCAP_NEON != 0) {
                bits |= Feature::Neon as u8;
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                bits |= Feature::Avx2 as u8;
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
                {
                    bits |= Feature::Avx512Vnni as u8;
                    if std::arch::is_x86_feature_detected!("avx512vbmi") {
                        bits |= Feature::Avx512Vbmi as u8;
                    }
                }
            }
        }
        CpuFeatures { bits }
    }

    /// Whether `f` is available.
    #[inline]
    pub const fn has(self, f: Feature) -> bool {
        self.bits & f as u8 != 0
    }

    /// These features minus `f` (and what depends on it: no `Dotprod` without `Neon`, no
    /// `Avx512Vnni` without `Avx2`, no `Avx512Vbmi` without `Avx512Vnni`).
    pub const fn without(self, f: Feature) -> CpuFeatures {
        let mut bits = self.bits & !(f as u8);
        if bits & Feature::Neon as u8 == 0 {
            bits &= !(Feature::Dotprod as u8 | Feature::Fp16 as u8 | Feature::I8mm as u8);
        }
        if bits & Feature::Avx2 as u8 == 0 {
            bits &= !(Feature::Avx512Vnni as u8);
        }
        if bits & Feature::Avx512Vnni as u8 == 0 {
            bits &= !(Feature::Avx512Vbmi as u8);
        }
        CpuFeatures { bits }
    }

    /// These features restricted to `keep` (never more than `self`).
    pub fn only(self, keep: &[Feature]) -> CpuFeatures {
        let mut out = self;
        for f in [
            Feature::Neon,
            Feature::Dotprod,
            Feature::Fp16,
            Feature::I8mm,
            Feature::Avx2,
            Feature::Avx512Vnni,
            Feature::Avx512Vbmi,
        ] {
            if !keep.contains(&f) {
                out = out.without(f);
            }
        }
        out
    }

    /// Every SIMD level these features allow, scalar first, each a real path of the
    /// kernel tables (for tests that compare every path with the scalar reference):
    /// scalar, then NEON and NEON + dotprod, or AVX2, AVX2 + AVX-512 VNNI and that + VBMI.
    pub fn levels(self) -> impl Iterator<Item = CpuFeatures> {
        let steps = [
            CpuFeatures::SCALAR,
            self.only(&[Feature::Neon, Feature::Avx2]),
            self.only(&[
                Feature::Neon,
                Feature::Dotprod,
                Feature::Avx2,
                Feature::Avx512Vnni,
            ]),
            self.only(&[
                Feature::Neon,
                Feature::Dotprod,
                Feature::Avx2,
                Feature::Avx512Vnni,
                Feature::Avx512Vbmi,
            ]),
        ];
        steps
            .into_iter()
            .enumerate()
            .filter(move |&(i, f)| i == 0 || f != steps[i - 1])
            .map(|(_, f)| f)
    }

    /// aarch64 Advanced SIMD.
    #[inline]
    pub const fn neon(&self) -> bool {
        self.has(Feature::Neon)
    }
    /// aarch64 `sdot` (ARMv8.2 dotprod).
    #[inline]
    pub const fn dotprod(&self) -> bool {
        self.has(Feature::Dotprod)
    }
    /// aarch64 half-precision arithmetic.
    #[inline]
    pub const fn fp16(&self) -> bool {
        self.has(Feature::Fp16)
    }
    /// aarch64 `smmla`.
    #[inline]
    pub const fn i8mm(&self) -> bool {
        self.has(Feature::I8mm)
    }
    /// x86 AVX2 with FMA and F16C.
    #[inline]
    pub const fn avx2(&self) -> bool {
        self.has(Feature::Avx2)
    }
    /// x86 AVX-512 F/BW/VL + VNNI (implies [`CpuFeatures::avx2`]).
    #[inline]
    pub const fn avx512vnni(&self) -> bool {
        self.has(Feature::Avx512Vnni)
    }

    /// x86 AVX-512 VBMI (implies [`CpuFeatures::avx512vnni`]).
    #[inline]
    pub const fn avx512vbmi(&self) -> bool {
        self.has(Feature::Avx512Vbmi)
    }

    /// The AVX2 token, if the CPU has AVX2 (with FMA and F16C).
    #[inline]
    pub const fn avx2_token(&self) -> Option<Avx2> {
        if self.avx2() {
            Some(Avx2(()))
        } else {
            None
        }
    }
    /// The Advanced SIMD token, if the CPU has it.
    #[inline]
    pub const fn neon_token(&self) -> Option<Neon> {
        if self.neon() {
            Some(Neon(()))
        } else {
            None
        }
    }
    /// The dotprod token, if the CPU has Advanced SIMD with `sdot`.
    #[inline]
    pub const fn neon_dot_token(&self) -> Option<NeonDot> {
        if self.neon() && self.dotprod() {
            Some(NeonDot(()))
        } else {
            None
        }
    }

    /// A short human-readable list, e.g. `"neon dotprod"` or `"scalar"`.
    pub fn describe(&self) -> &'static str {
        match (self.avx2(), self.neon(), self.dotprod()) {
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

    #[test]
    fn restricting_never_adds_a_feature() {
        // The only features safe code can start from without detection.
        for start in [CpuFeatures::SCALAR, CpuFeatures::baseline()] {
            let all = start.only(&[
                Feature::Neon,
                Feature::Dotprod,
                Feature::Fp16,
                Feature::I8mm,
                Feature::Avx2,
                Feature::Avx512Vnni,
                Feature::Avx512Vbmi,
            ]);
            assert_eq!(all, start);
            assert!(!all.avx2() && all.avx2_token().is_none());
            assert!(!all.dotprod() && all.neon_dot_token().is_none());
        }
        assert!(!CpuFeatures::default().neon());
    }

    #[test]
    fn without_drops_what_depends_on_the_feature() {
        let f = CpuFeatures {
            bits: Feature::Neon as u8 | Feature::Dotprod as u8,
        };
        assert_eq!(f.without(Feature::Neon), CpuFeatures::SCALAR);
        let x = CpuFeatures {
            bits: Feature::Avx2 as u8 | Feature::Avx512Vnni as u8,
        };
        assert_eq!(x.without(Feature::Avx2), CpuFeatures::SCALAR);
        assert_eq!(x.levels().count(), 3);
        let v = CpuFeatures {
            bits: x.bits | Feature::Avx512Vbmi as u8,
        };
        assert_eq!(
            v.without(Feature::Avx512Vnni),
            x.without(Feature::Avx512Vnni)
        );
        assert!(!v.without(Feature::Avx2).avx512vbmi());
        assert_eq!(v.levels().count(), 4);
    }

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
