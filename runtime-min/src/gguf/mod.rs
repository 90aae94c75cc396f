//! GGUF: the file format of llama.cpp models. STUB API (the reader is being written).
//!
//! Reader: zero-copy over a byte prefix of the file (`Gguf::parse`); every count, length
//! and offset is checked against the bytes and the file size before use.
use pinch_kernels::GgmlType;

/// What is wrong with a GGUF file. Each variant names the field and the values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GgufError {
    /// The prefix given to `parse` ends before the header does; read at least `need`
    /// bytes of the file and call again.
    NeedMore {
        need: u64,
    },
    /// The file itself ends before `field` does.
    Truncated {
        field: &'static str,
        offset: u64,
        need: u64,
        file_len: u64,
    },
    BadMagic {
        found: [u8; 4],
    },
    UnsupportedVersion {
        found: u32,
    },
}

/// GGUF metadata value types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    Str = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

/// A metadata value, borrowed from the header bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(&'a str),
    Array(ArrayView<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value: element type, count, and its encoded bytes (already validated).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArrayView<'a> {
    pub elem: ValueType,
    pub len: u64,
    pub bytes: &'a [u8],
}

/// One tensor's entry in the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorInfo<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub n_dims: u32,
    /// ne[0] (row length) first; unused dims are 1.
    pub dims: [u64; 4],
    /// Absolute offset in the file (data_offset + relative offset).
    pub offset: u64,
    /// Bytes of tensor data.
    pub bytes: u64,
}

/// A parsed GGUF header.
pub struct Gguf<'a> {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub file_len: u64,
    _header: &'a [u8],
}
