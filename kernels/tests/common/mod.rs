//! Test helpers shared by the kernel test files: a small deterministic generator and
//! the feature sets of the running CPU (scalar first, then every SIMD level it has).
#![allow(dead_code)]
use pinch_kernels::CpuFeatures;

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

pub fn feature_sets() -> Vec<CpuFeatures> {
    #[allow(unused_mut)]
    let mut v = vec![CpuFeatures::SCALAR];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            v.push(CpuFeatures {
                avx2: true,
                ..CpuFeatures::SCALAR
            });
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                v.push(CpuFeatures {
                    avx2: true,
                    avx512vnni: true,
                    ..CpuFeatures::SCALAR
                });
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        v.push(CpuFeatures {
            neon: true,
            ..CpuFeatures::SCALAR
        });
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            v.push(CpuFeatures {
                neon: true,
                dotprod: true,
                ..CpuFeatures::SCALAR
            });
        }
    }
    if arm32_neon() {
        v.push(CpuFeatures {
            neon: true,
            ..CpuFeatures::SCALAR
        });
    }
    v
}

/// The formats with a 32-bit ARM NEON kernel (`pinch_kernels::arch::arm32_neon`): the SIMD
/// tests compare these there and must find a kernel for each; other formats fall back to
/// scalar on armv7, which the scalar tests cover.
pub const ARM32_NEON_TYPES: [pinch_kernels::GgmlType; 5] = [
    pinch_kernels::GgmlType::Q8_0,
    pinch_kernels::GgmlType::Q4_0,
    pinch_kernels::GgmlType::Q5_0,
    pinch_kernels::GgmlType::Q1_0,
    pinch_kernels::GgmlType::Q4_K,
];

/// Whether this is a 32-bit ARM process on a core with NEON (from `/proc/self/auxv`,
/// which qemu-user fills with the emulated core's HWCAPs).
pub fn arm32_neon() -> bool {
    cfg!(target_arch = "arm")
        && std::fs::read("/proc/self/auxv")
            .ok()
            .and_then(|v| pinch_kernels::cpu::arm32_hwcap(&v))
            .is_some_and(|h| h & pinch_kernels::cpu::ARM32_HWCAP_NEON != 0)
}
