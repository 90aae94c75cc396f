//! GGUF tensor types: ids as llama.cpp numbers them, block geometry, and pairing.

/// A tensor element type as stored in GGUF (`ggml_type`). Ids match llama.cpp at commit
/// 0c1e570 (Q1_0 = 41 and Q2_0 = 42 are the 1- and 2-bit formats of that tree).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// The activation format a weight type is dotted with (llama.cpp's `vec_dot_type`).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// Plain f32 activations (F32 weights).
    F32,
    /// Activations rounded to f16 (F16 weights), stored as f32 values.
    F16,
    /// Activations rounded to bf16 (BF16 weights), stored as f32 values.
    BF16,
    /// Blocks of 32: f16 scale + 32 int8 (`BlockQ8_0`).
    Q8_0,
    /// Blocks of 32: f16 scale, f16 scaled sum + 32 int8 (`BlockQ8_1`; Q4_1, Q5_1).
    Q8_1,
    /// Blocks of 256: f32 scale + 256 int8 + 16 block sums (`BlockQ8K`).
    Q8_K,
}

impl ActFormat {
    /// Bytes of one activation row of `n` values, `None` if `n` does not fit the blocks.
    pub const fn row_bytes(self, n: usize) -> Option<usize> {
        match self {
            ActFormat::F32 | ActFormat::F16 | ActFormat::BF16 => Some(n * 4),
            ActFormat::Q8_0 => {
                if n.is_multiple_of(32) {
                    Some(n / 32 * 34)
                } else {
                    None
                }
            }
            ActFormat::Q8_1 => {
                if n.is_multiple_of(32) {
                    Some(n / 32 * 36)
                } else {
                    None
                }
            }
            ActFormat::Q8_K => {
                if n.is_multiple_of(256) {
                    Some(n / 256 * 292)
                } else {
                    None
                }
            }
        }
    }
}

impl GgmlType {
    /// Every type id this crate knows, for parsers and tables.
    pub const ALL: [GgmlType; 34] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ];

    /// The type with GGUF id `id`, if known.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    /// llama.cpp's name for the type (`"Q4_K"`).
    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::IQ2_XXS => "IQ2_XXS",
            GgmlType::IQ2_XS => "IQ2_XS",
            GgmlType::IQ3_XXS => "IQ3_XXS",
            GgmlType::IQ1_S => "IQ1_S",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ3_S => "IQ3_S",
            GgmlType::IQ2_S => "IQ2_S",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::I8 => "I8",
            GgmlType::I16 => "I16",
            GgmlType::I32 => "I32",
            GgmlType::I64 => "I64",
            GgmlType::F64 => "F64",
            GgmlType::IQ1_M => "IQ1_M",
            GgmlType::BF16 => "BF16",
            GgmlType::TQ1_0 => "TQ1_0",
            GgmlType::TQ2_0 => "TQ2_0",
            GgmlType::MXFP4 => "MXFP4",
            GgmlType::Q1_0 => "Q1_0",
            GgmlType::Q2_0 => "Q2_0",
        }
    }

    /// (weights per block, bytes per block). Formats pinch implements take the numbers
    /// from their module in [`crate::quant`]; the others (listed, not computed) are
    /// llama.cpp's.
    pub const fn block_geometry(self) -> (usize, usize) {
        use crate::quant as q;
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (q::q4_0::QK, q::q4_0::BLOCK_BYTES),
            GgmlType::Q4_1 => (q::q4_1::QK, q::q4_1::BLOCK_BYTES),
            GgmlType::Q5_0 => (q::q5_0::QK, q::q5_0::BLOCK_BYTES),
            GgmlType::Q5_1 => (q::q5_1::QK, q::q5_1::BLOCK_BYTES),
            GgmlType::Q8_0 => (q::q8_0::QK, q::q8_0::BLOCK_BYTES),
            GgmlType::Q8_1 => (32, 36),
            GgmlType::Q2_K => (q::q2_k::QK, q::q2_k::BLOCK_BYTES),
            GgmlType::Q3_K => (q::q3_k::QK, q::q3_k::BLOCK_BYTES),
            GgmlType::Q4_K => (q::q4_k::QK, q::q4_k::BLOCK_BYTES),
            GgmlType::Q5_K => (q::q5_k::QK, q::q5_k::BLOCK_BYTES),
            GgmlType::Q6_K => (q::q6_k::QK, q::q6_k::BLOCK_BYTES),
            GgmlType::Q8_K => (q::q8_k::QK, q::q8_k::BLOCK_BYTES),
            GgmlType::IQ2_XXS => (q::iq2_xxs::QK, q::iq2_xxs::BLOCK_BYTES),
            GgmlType::IQ2_XS => (256, 74),
            GgmlType::IQ3_XXS => (256, 98),
            GgmlType::IQ1_S => (256, 50),
            GgmlType::IQ4_NL => (q::iq4_nl::QK, q::iq4_nl::BLOCK_BYTES),
            GgmlType::IQ3_S => (256, 110),
            GgmlType::IQ2_S => (256, 82),
            GgmlType::IQ4_XS => (q::iq4_xs::QK, q::iq4_xs::BLOCK_BYTES),
            GgmlType::I8 => (1, 1),
            GgmlType::I16 => (1, 2),
            GgmlType::I32 => (1, 4),
            GgmlType::I64 | GgmlType::F64 => (1, 8),
            GgmlType::IQ1_M => (256, 56),
            GgmlType::TQ1_0 => (q::tq1_0::QK, q::tq1_0::BLOCK_BYTES),
            GgmlType::TQ2_0 => (q::tq2_0::QK, q::tq2_0::BLOCK_BYTES),
            GgmlType::MXFP4 => (32, 17),
            GgmlType::Q1_0 => (q::q1_0::QK, q::q1_0::BLOCK_BYTES),
            GgmlType::Q2_0 => (q::q2_0::QK, q::q2_0::BLOCK_BYTES),
        }
    }

    /// Bytes of a row of `n` weights, `None` if `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let (qk, bytes) = self.block_geometry();
        if !n.is_multiple_of(qk as u64) {
            return None;
        }
        (n / qk as u64).checked_mul(bytes as u64)
    }

    /// The activation format this weight type is dotted with, `None` if pinch has no
    /// kernel for it (it can still be listed and, for F64/I*, read).
    pub const fn act_format(self) -> Option<ActFormat> {
        match self {
            GgmlType::F32 => Some(ActFormat::F32),
            GgmlType::F16 => Some(ActFormat::F16),
            GgmlType::BF16 => Some(ActFormat::BF16),
            GgmlType::Q4_1 | GgmlType::Q5_1 => Some(ActFormat::Q8_1),
            GgmlType::Q4_0
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
            | GgmlType::Q1_0
            | GgmlType::Q2_0 => Some(ActFormat::Q8_0),
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0
            | GgmlType::IQ2_XXS
            | GgmlType::IQ4_XS => Some(ActFormat::Q8_K),
            _ => None,
        }
    }

    /// Whether pinch can dequantize this type (and so use it as a weight at all).
    pub const fn can_dequantize(self) -> bool {
        self.act_format().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t as u32), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None); // removed Q4_2
        assert_eq!(GgmlType::from_id(u32::MAX), None);
    }

    #[test]
    fn row_bytes_rejects_partial_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
