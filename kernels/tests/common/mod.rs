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
    CpuFeatures::detect().levels().collect()
}
