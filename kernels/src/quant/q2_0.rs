//! Q2_0: STUB, to be written (block struct, scalar dequantize and vec_dot).

/// Weights per block.
pub const QK: usize = 64;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// Scalar reference dequantization of whole blocks.
pub fn dequantize_row(_src: &[u8], dst: &mut [f32]) {
    dst.fill(0.0);
}

/// Scalar reference dot product of one weight row with one Q8_0 activation row.
pub fn vec_dot(_w: &[u8], _act: &[u8]) -> f32 {
    0.0
}
