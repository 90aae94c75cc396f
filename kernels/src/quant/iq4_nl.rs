//! IQ4_NL: blocks of 32 weights, 4-bit indices into a fixed non-linear table of 16
//! levels, with an f16 scale. Dotted with Q8_0.
use super::q8_0::{self, act_blocks, Order};
use crate::blocks::cast;
use crate::f16::read_f16;

/// Weights per block.
pub const QK: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// llama.cpp's `kvalues_iq4nl`: the 16 levels an index selects.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL block, 4.5 bits per weight: `x[j] = d * KVALUES[qs[j] & 0xf]` and
/// `x[j + 16] = d * KVALUES[qs[j] >> 4]` for `j < 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIq4Nl {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK / 2],
}
crate::pod_block!(BlockIq4Nl);
static_assertions::const_assert_eq!(core::mem::size_of::<BlockIq4Nl>(), BLOCK_BYTES);

impl BlockIq4Nl {
    /// The 32 table values in weight order.
    #[inline]
    pub fn values(&self) -> [i32; QK] {
        let mut q = [0i32; QK];
        for j in 0..QK / 2 {
            q[j] = KVALUES[(self.qs[j] & 0x0f) as usize] as i32;
            q[j + QK / 2] = KVALUES[(self.qs[j] >> 4) as usize] as i32;
        }
        q
    }
}

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    let blocks = cast::<BlockIq4Nl>(src).unwrap_or(&[]);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b.d);
        for (o, q) in out.iter_mut().zip(b.values()) {
            *o = d * q as f32;
        }
    }
}

/// Scalar reference dot product with one Q8_0 activation row, with llama.cpp's x86
/// arithmetic (AVX2 `ggml_vec_dot_iq4_nl_q8_0`, [`vec_dot_in`] in [`Order::Lanes8`]).
///
/// llama.cpp's generic C fallback instead rounds `d * sum` and the sum block after
/// block, which differs in the last bits only.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    vec_dot_in(Order::Lanes8, w, act)
}

/// [`vec_dot`] in either [`Order`]; both take blocks in pairs, as llama.cpp's SIMD
/// kernels do, and an odd last block as its tail loop does, `sum = fma(d, sumi, sum)`
/// (its C compiled with FMA contraction). `d = d_w * d_a` is exact (two f16) and a
/// block's integer sum `sumi` (|sumi| <= 32 * 127 * 128 < 2^24) converts exactly.
///
/// - [`Order::Lanes8`] (AVX2): each block's eight exact lane sums ([`q8_0::lane_sums`])
///   feed `acc[l] = fma(d, lane[l], acc[l])` in one of two lane accumulators (even
///   blocks, odd blocks), reduced as [`q8_0::hsum8`]`(acc_even + acc_odd)`.
/// - [`Order::BlockSum`] (NEON): per pair `sum += fma(d0, sumi0, d1 * sumi1)`, the
///   contraction clang makes of llama.cpp's `sumf += d0 * sumi0 + d1 * sumi1`.
pub fn vec_dot_in(order: Order, w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockIq4Nl>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    let n = w.len().min(a.len());
    let lanes = |i: usize| {
        let d = read_f16(w[i].d) * a[i].scale();
        (d, q8_0::lane_sums(&w[i].values(), &a[i]))
    };
    let pairs = n / 2;
    let mut sum = match order {
        Order::Lanes8 => {
            let (mut even, mut odd) = ([0.0f32; 8], [0.0f32; 8]);
            for p in 0..pairs {
                for (acc, i) in [(&mut even, 2 * p), (&mut odd, 2 * p + 1)] {
                    let (d, l) = lanes(i);
                    for (x, s) in acc.iter_mut().zip(l) {
                        *x = libm::fmaf(d, s as f32, *x);
                    }
                }
            }
            q8_0::hsum8(core::array::from_fn(|l| even[l] + odd[l]))
        }
        Order::BlockSum => (0..pairs).fold(0.0f32, |sum, p| {
            let (d0, l0) = lanes(2 * p);
            let (d1, l1) = lanes(2 * p + 1);
            let (s0, s1) = (l0.iter().sum::<i32>(), l1.iter().sum::<i32>());
            sum + libm::fmaf(d0, s0 as f32, d1 * s1 as f32)
        }),
    };
    if n % 2 == 1 {
        let (d, l) = lanes(n - 1);
        sum = libm::fmaf(d, l.iter().sum::<i32>() as f32, sum);
    }
    sum
}
