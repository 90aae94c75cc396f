//! The reader's error type: one variant per check, each carrying the values a user needs
//! to see what is wrong (field, offset, found vs allowed), and no heap.
use core::fmt;

/// A short, `Copy` copy of a key or tensor name for error messages. Names longer than
/// the buffer are cut at a character boundary and marked as cut when printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Name {
    bytes: [u8; Name::CAP],
    len: u8,
    cut: bool,
}

impl Name {
    /// Bytes kept: enough for the usual tensor names and keys
    /// (`blk.12.ffn_down_exps.weight`, `llama.attention.layer_norm_rms_epsilon`), small
    /// enough that errors which wrap a `GgufError` stay cheap to return.
    pub const CAP: usize = 40;

    /// Copies `s`, cutting it to at most [`Name::CAP`] bytes on a character boundary.
    pub fn new(s: &str) -> Name {
        let mut end = s.len().min(Name::CAP);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0u8; Name::CAP];
        bytes[..end].copy_from_slice(&s.as_bytes()[..end]);
        Name {
            bytes,
            len: end as u8,
            cut: end < s.len(),
        }
    }

    /// The (possibly cut) name.
    pub fn as_str(&self) -> &str {
        // The bytes were copied from a `str` up to a char boundary, so this never fails;
        // the fallback only keeps the function total.
        core::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }

    /// Whether the original name was longer than what is kept.
    pub fn is_cut(&self) -> bool {
        self.cut
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())?;
        if self.cut {
            f.write_str("...")?;
        }
        Ok(())
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())?;
        if self.cut {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// What is wrong with a GGUF file. Each variant names the field and the values.
///
/// Offsets are absolute byte offsets in the file. `key` is the metadata key being read
/// (empty while the key itself is read), `tensor` the tensor's name or its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GgufError {
    /// The prefix given to `parse` ends before the header does; read at least `need`
    /// bytes of the file and call again. `need` only grows between retries and never
    /// exceeds the file length.
    NeedMore { need: u64 },
    /// The file itself ends before `field` does.
    Truncated {
        field: &'static str,
        offset: u64,
        need: u64,
        file_len: u64,
    },
    /// The first four bytes are not `GGUF`.
    BadMagic { found: [u8; 4] },
    /// Only versions 2 and 3 are read (v1 used 32-bit counts and lengths).
    UnsupportedVersion { found: u32 },
    /// `n_tensors` is larger than the file could hold or than the reader supports.
    TooManyTensors { count: u64, max: u64 },
    /// `n_kv` is larger than the file could hold or than the reader supports.
    TooManyKeys { count: u64, max: u64 },
    /// A string's length runs past the end of the file.
    StringTooLong {
        field: &'static str,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    /// A key, string value or tensor name is not UTF-8.
    InvalidUtf8 { field: &'static str, offset: u64 },
    /// A metadata value type id that GGUF does not define.
    UnknownValueType { key: Name, offset: u64, found: u32 },
    /// Arrays nested deeper than [`super::MAX_ARRAY_DEPTH`].
    ArrayTooDeep { key: Name, offset: u64, depth: u32 },
    /// An array's length times its element size overflows or runs past the file.
    ArrayTooLong {
        key: Name,
        offset: u64,
        len: u64,
        elem_size: u64,
        file_len: u64,
    },
    /// A key appears twice.
    DuplicateKey { key: Name, first: u64, second: u64 },
    /// A well-known key has the wrong value type (e.g. `general.alignment` as a string).
    WrongKeyType {
        key: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    /// `general.alignment` is zero, not a power of two, or above the supported maximum.
    BadAlignment { found: u64, max: u64 },
    /// A tensor has more dimensions than ggml supports (4).
    TooManyDims { tensor: Name, n_dims: u32 },
    /// A tensor dimension is zero.
    ZeroDim { tensor: Name, dim: u32 },
    /// The product of a tensor's dimensions (or its byte size) overflows.
    ShapeOverflow { tensor: Name, dims: [u64; 4] },
    /// A tensor type id that this build does not know.
    UnknownTensorType { tensor: Name, found: u32 },
    /// A tensor's row length is not a whole number of its type's blocks.
    RowNotBlockMultiple {
        tensor: Name,
        row: u64,
        block: u64,
        type_name: &'static str,
    },
    /// A tensor's data offset is not a multiple of the alignment.
    MisalignedTensor {
        tensor: Name,
        offset: u64,
        alignment: u64,
    },
    /// A tensor's data is not where the previous tensor's data ends (rounded up to the
    /// alignment); llama.cpp rejects such files too.
    UnexpectedTensorOffset {
        tensor: Name,
        offset: u64,
        expected: u64,
    },
    /// A tensor's data ends past the end of the file.
    TensorPastEnd {
        tensor: Name,
        offset: u64,
        bytes: u64,
        file_len: u64,
    },
    /// A tensor's bytes or elements do not fit this build's address space (`usize`): a
    /// 32-bit device cannot hold it, whatever the budget. Checked once at parse, so every
    /// later `u64` to `usize` conversion of a tensor's sizes is lossless.
    TensorTooLarge {
        tensor: Name,
        bytes: u64,
        elements: u64,
    },
    /// Two tensors have the same name.
    DuplicateTensor {
        tensor: Name,
        first: u64,
        second: u64,
    },
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufError::*;
        match self {
            NeedMore { need } => write!(
                f,
                "GGUF header is longer than the bytes read so far: read at least {need} bytes and parse again"
            ),
            Truncated { field, offset, need, file_len } => write!(
                f,
                "GGUF file is truncated: {field} at offset {offset} needs {need} bytes but the file has {file_len} bytes (incomplete download or copy?)"
            ),
            BadMagic { found } => write!(
                f,
                "not a GGUF file: the first bytes are {found:02x?}, expected \"GGUF\" (47 47 55 46)"
            ),
            UnsupportedVersion { found } if matches!(found.swap_bytes(), 2 | 3) => write!(
                f,
                "GGUF version {found} looks like a big-endian file (version {} byte-swapped); pinch reads little-endian GGUF only",
                found.swap_bytes()
            ),
            UnsupportedVersion { found } => write!(
                f,
                "GGUF version {found} is not supported (only 2 and 3); re-convert the model with a current llama.cpp"
            ),
            TooManyTensors { count, max } => write!(
                f,
                "GGUF header claims {count} tensors, more than the file can hold or pinch supports ({max}); the file is corrupt"
            ),
            TooManyKeys { count, max } => write!(
                f,
                "GGUF header claims {count} metadata keys, more than the file can hold or pinch supports ({max}); the file is corrupt"
            ),
            StringTooLong { field, offset, len, file_len } => write!(
                f,
                "GGUF {field} at offset {offset} claims a length of {len} bytes, past the end of the {file_len}-byte file"
            ),
            InvalidUtf8 { field, offset } => {
                write!(f, "GGUF {field} at offset {offset} is not valid UTF-8")
            }
            UnknownValueType { key, offset, found } => write!(
                f,
                "GGUF key '{key}': unknown value type {found} at offset {offset} (valid types are 0..=12)"
            ),
            ArrayTooDeep { key, offset, depth } => write!(
                f,
                "GGUF key '{key}': arrays nested {depth} deep at offset {offset}, more than the {} pinch reads",
                super::MAX_ARRAY_DEPTH
            ),
            ArrayTooLong { key, offset, len, elem_size, file_len } => write!(
                f,
                "GGUF key '{key}': array at offset {offset} claims {len} elements of at least {elem_size} bytes, more than the {file_len}-byte file holds"
            ),
            DuplicateKey { key, first, second } => write!(
                f,
                "GGUF key '{key}' appears twice (key #{first} and #{second}); the file is corrupt"
            ),
            WrongKeyType { key, expected, found } => write!(
                f,
                "GGUF key '{key}' has type {found}, expected {expected}"
            ),
            BadAlignment { found, max } => write!(
                f,
                "GGUF general.alignment is {found}; it must be a power of two between 1 and {max}"
            ),
            TooManyDims { tensor, n_dims } => write!(
                f,
                "tensor '{tensor}' has {n_dims} dimensions; ggml supports at most 4"
            ),
            ZeroDim { tensor, dim } => {
                write!(f, "tensor '{tensor}' has size 0 in dimension {dim}")
            }
            ShapeOverflow { tensor, dims } => write!(
                f,
                "tensor '{tensor}' shape {dims:?} is too large (element or byte count overflows)"
            ),
            UnknownTensorType { tensor, found } => write!(
                f,
                "tensor '{tensor}' has type id {found}, which this build of pinch does not know; use a more common quantization (e.g. Q4_K_M)"
            ),
            RowNotBlockMultiple { tensor, row, block, type_name } => write!(
                f,
                "tensor '{tensor}': row length {row} is not a multiple of the {type_name} block size {block}"
            ),
            MisalignedTensor { tensor, offset, alignment } => write!(
                f,
                "tensor '{tensor}': data offset {offset} is not a multiple of the file's alignment {alignment}"
            ),
            UnexpectedTensorOffset { tensor, offset, expected } => write!(
                f,
                "tensor '{tensor}': data offset {offset} (relative to the data section) should be {expected}, where the previous tensor ends; the file is corrupt or was written by a broken tool"
            ),
            TensorPastEnd { tensor, offset, bytes, file_len } => write!(
                f,
                "tensor '{tensor}': data at offset {offset} with {bytes} bytes runs past the end of the {file_len}-byte file (truncated download?)"
            ),
            TensorTooLarge { tensor, bytes, elements } => write!(
                f,
                "tensor '{tensor}': {bytes} bytes ({elements} elements) do not fit this {}-bit build's address space; use a 64-bit build or a smaller model",
                usize::BITS
            ),
            DuplicateTensor { tensor, first, second } => write!(
                f,
                "tensor '{tensor}' appears twice (tensor #{first} and #{second}); the file is corrupt"
            ),
        }
    }
}

impl core::error::Error for GgufError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_stays_small_enough_to_wrap() {
        // clippy's `result_large_err` starts at 128 bytes; leave room for wrappers.
        assert!(core::mem::size_of::<GgufError>() <= 96);
    }

    #[test]
    fn names_are_cut_on_char_boundaries() {
        let s = "é".repeat(30);
        let n = Name::new(&s);
        assert!(n.is_cut());
        assert_eq!(n.as_str(), "é".repeat(20));
        assert_eq!(
            Name::new("blk.0.attn_q.weight").as_str(),
            "blk.0.attn_q.weight"
        );
        assert!(!Name::new("").is_cut());
    }
}
