//! Q8_K: STUB (activation format of K-quants).
pub const QK: usize = 256;
pub const BLOCK_BYTES: usize = 292;
/// Quantize f32 activations to Q8_K blocks exactly as llama.cpp's `quantize_row_q8_K`.
pub fn quantize_row(_x: &[f32], dst: &mut [u8]) {
    dst.fill(0);
}
/// Dequantize Q8_K blocks (for tests).
pub fn dequantize_row(_src: &[u8], dst: &mut [f32]) {
    dst.fill(0.0);
}
