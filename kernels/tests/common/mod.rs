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

/// The formats with a 32-bit ARM NEON kernel (`pinch_kernels::arch`'s armv7 table): the SIMD
/// tests compare these there and must find a kernel for each; other formats fall back to
/// scalar on armv7, which the scalar tests cover.
pub const ARM32_NEON_TYPES: [pinch_kernels::GgmlType; 5] = [
    pinch_kernels::GgmlType::Q8_0,
    pinch_kernels::GgmlType::Q4_0,
    pinch_kernels::GgmlType::Q5_0,
    pinch_kernels::GgmlType::Q1_0,
    pinch_kernels::GgmlType::Q4_K,
];

/// `n_tok` activation rows of `cols` random values in `fmt`, token `t` scaled by
/// `scales[t % scales.len()]`, row after row.
pub fn random_acts(
    rng: &mut Rng,
    fmt: pinch_kernels::ActFormat,
    n_tok: usize,
    cols: usize,
    scales: &[f32],
) -> Vec<u8> {
    let arb = fmt.row_bytes(cols).unwrap();
    let mut a = vec![0u8; n_tok * arb];
    for t in 0..n_tok {
        let scale = scales[t % scales.len()];
        let x: Vec<f32> = (0..cols).map(|_| rng.f32() * scale).collect();
        pinch_kernels::matvec::quantize_activation(fmt, &x, &mut a[t * arb..(t + 1) * arb])
            .unwrap();
    }
    a
}

/// A copy of the plain rows `w` (`rb` bytes each) of type `ty` repacked to `layout`.
pub fn repacked_as(
    layout: pinch_kernels::repack::Layout,
    ty: pinch_kernels::GgmlType,
    w: &[u8],
    rb: usize,
) -> Vec<u8> {
    let mut r = w.to_vec();
    let mut scratch = vec![0u8; layout.scratch_bytes(rb)];
    pinch_kernels::repack::repack_in_place(layout, ty, &mut r, rb, &mut scratch).unwrap();
    r
}

/// Activation values that reach the kernels' extremes: all +1, all -1, alternating, and
/// a first block of zeros before values growing to `-cols` (`pattern` 0..4).
pub fn extreme_values(pattern: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .map(|j| match pattern {
            0 => 1.0,
            1 => -1.0,
            2 => [1.0, -1.0][j % 2],
            _ if j < 256 => 0.0,
            _ => -(j as f32),
        })
        .collect()
}
