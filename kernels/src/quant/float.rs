//! F32, F16 and BF16 rows: STUB.
pub fn dequantize_row_f32(_src: &[u8], dst: &mut [f32]) {
    dst.fill(0.0);
}
pub fn dequantize_row_f16(_src: &[u8], dst: &mut [f32]) {
    dst.fill(0.0);
}
pub fn dequantize_row_bf16(_src: &[u8], dst: &mut [f32]) {
    dst.fill(0.0);
}
/// Dot of a float weight row (F32/F16/BF16 bytes) with f32 activations stored as bytes.
pub fn vec_dot_f32(_w: &[u8], _act: &[u8]) -> f32 {
    0.0
}
pub fn vec_dot_f16(_w: &[u8], _act: &[u8]) -> f32 {
    0.0
}
pub fn vec_dot_bf16(_w: &[u8], _act: &[u8]) -> f32 {
    0.0
}
