//! Deterministic random data for kernel tests (no std, no dependencies).

/// xorshift64*: small, fast, reproducible.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn fill_f32(&mut self, x: &mut [f32], scale: f32) {
        for v in x {
            *v = self.f32() * scale;
        }
    }
    pub fn fill_bytes(&mut self, b: &mut [u8]) {
        for v in b {
            *v = self.next_u64() as u8;
        }
    }
}
