//! IQ4_NL: blocks of 32 weights, 4-bit indices into a fixed non-linear table of 16
//! levels, with an f16 scale. Dotted with Q8_0.
use super::q8_0::act_blocks;
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

/// Scalar reference dot product with one Q8_0 activation row, as
/// `ggml_vec_dot_iq4_nl_q8_0` (generic): `sum += (d_w * d_a) * (sumi1 + sumi2)`.
pub fn vec_dot(w: &[u8], act: &[u8]) -> f32 {
    let w = cast::<BlockIq4Nl>(w).unwrap_or(&[]);
    let a = act_blocks(act);
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let v = x.values();
        let sumi: i32 = (0..QK).map(|j| v[j] * y.q(j)).sum();
        sum += (read_f16(x.d) * y.scale()) * sumi as f32;
    }
    sum
}
