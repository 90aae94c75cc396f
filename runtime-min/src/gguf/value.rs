//! Metadata values: the type ids, the borrowed `Value`, array views, and the one checked
//! decoder (`Cursor`) that both the validating parse and the later iterations go through,
//! so a value is never decoded by two different pieces of code.
use super::error::{GgufError, Name};
use super::MAX_ARRAY_DEPTH;

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

impl ValueType {
    /// The type with GGUF id `id`, if GGUF defines it.
    pub fn from_u32(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => Str,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Encoded size of one value, `None` for strings and arrays (variable length).
    pub const fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            Str | Array => None,
        }
    }

    /// Smallest encoded size of one value: a string is at least its 8-byte length, an
    /// array its 4-byte type and 8-byte count. Bounds element counts before looping.
    pub const fn min_size(self) -> u64 {
        match self.fixed_size() {
            Some(n) => n as u64,
            None => match self {
                ValueType::Str => 8,
                _ => 12,
            },
        }
    }

    /// The name GGUF's spec uses (`"uint32"`), for messages.
    pub const fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "uint8",
            I8 => "int8",
            U16 => "uint16",
            I16 => "int16",
            U32 => "uint32",
            I32 => "int32",
            F32 => "float32",
            Bool => "bool",
            Str => "string",
            Array => "array",
            U64 => "uint64",
            I64 => "int64",
            F64 => "float64",
        }
    }
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

impl<'a> Value<'a> {
    /// The value's GGUF type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::Str,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type, widened; `None` for non-integers.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer type whose value fits a `u32` (files disagree on widths).
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// Any integer type whose value fits a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type whose value fits an `i32`.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| i32::try_from(v).ok())
    }

    /// Any integer type whose value fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// `f32` or `f64` (rounded to f32).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An array.
    pub fn as_array(&self) -> Option<ArrayView<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// An array value: element type, count, and its encoded bytes (already validated when it
/// came from [`super::Gguf`]). For strings and nested arrays `bytes` holds the elements
/// back to back in file encoding (length-prefixed strings, typed arrays).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArrayView<'a> {
    pub elem: ValueType,
    pub len: u64,
    pub bytes: &'a [u8],
}

impl<'a> ArrayView<'a> {
    /// Number of elements. Every element takes at least one byte of `bytes`, so a
    /// validated count always fits a `usize`.
    pub fn len(&self) -> usize {
        usize::try_from(self.len).unwrap_or(usize::MAX)
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All elements in order. Stops early if the bytes are inconsistent (only possible
    /// for a hand-made view; parsed views were checked).
    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter {
            cur: Cursor::new(self.bytes, 0, self.bytes.len() as u64),
            elem: self.elem,
            left: self.len,
        }
    }

    /// The elements as strings; empty if the elements are not strings.
    pub fn iter_str(&self) -> impl Iterator<Item = &'a str> + 'a {
        let it = self.iter();
        let left = if self.elem == ValueType::Str {
            self.len
        } else {
            0
        };
        it.take(usize::try_from(left).unwrap_or(usize::MAX))
            .filter_map(|v| v.as_str())
    }

    /// Element `i` of a string array (walks the array: O(i)).
    pub fn str_at(&self, i: usize) -> Option<&'a str> {
        if self.elem != ValueType::Str {
            return None;
        }
        self.iter().nth(i).and_then(|v| v.as_str())
    }

    /// Element `i` of any type (O(1) for fixed-size elements, O(i) otherwise).
    pub fn at(&self, i: usize) -> Option<Value<'a>> {
        match self.elem.fixed_size() {
            Some(sz) => {
                if (i as u64) >= self.len {
                    return None;
                }
                let start = i.checked_mul(sz)?;
                let b = self.bytes.get(start..start.checked_add(sz)?)?;
                decode_fixed(self.elem, b)
            }
            None => self.iter().nth(i),
        }
    }

    /// Element `i` as `f32` (float32 or float64 arrays).
    pub fn f32_at(&self, i: usize) -> Option<f32> {
        self.fixed_at(i)?.as_f32()
    }

    /// Element `i` as `i32` (any integer array whose element fits).
    pub fn i32_at(&self, i: usize) -> Option<i32> {
        self.fixed_at(i)?.as_i32()
    }

    /// Element `i` as `u32` (any integer array whose element fits).
    pub fn u32_at(&self, i: usize) -> Option<u32> {
        self.fixed_at(i)?.as_u32()
    }

    fn fixed_at(&self, i: usize) -> Option<Value<'a>> {
        self.elem.fixed_size()?;
        self.at(i)
    }
}

/// Iterator over an [`ArrayView`]'s elements.
#[derive(Clone)]
pub struct ArrayIter<'a> {
    cur: Cursor<'a>,
    elem: ValueType,
    left: u64,
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Value<'a>;
    fn next(&mut self) -> Option<Value<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match self.cur.value(self.elem, "", 1) {
            Ok(v) => Some(v),
            Err(_) => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, usize::try_from(self.left).ok())
    }
}

fn decode_fixed<'a>(ty: ValueType, b: &[u8]) -> Option<Value<'a>> {
    fn a<const N: usize>(b: &[u8]) -> Option<[u8; N]> {
        b.get(..N)?.try_into().ok()
    }
    Some(match ty {
        ValueType::U8 => Value::U8(*b.first()?),
        ValueType::I8 => Value::I8(i8::from_le_bytes(a(b)?)),
        ValueType::Bool => Value::Bool(*b.first()? != 0),
        ValueType::U16 => Value::U16(u16::from_le_bytes(a(b)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(a(b)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(a(b)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(a(b)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(a(b)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(a(b)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(a(b)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(a(b)?)),
        ValueType::Str | ValueType::Array => return None,
    })
}

/// A checked reader over `buf`, which holds the file bytes starting at absolute offset
/// `base`; `file_len` is where the file (not the buffer) ends. Reading past `file_len`
/// is `Truncated`; reading past the buffer but inside the file is `NeedMore`.
#[derive(Clone)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    base: u64,
    file_len: u64,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8], base: u64, file_len: u64) -> Cursor<'a> {
        Cursor {
            buf,
            pos: 0,
            base,
            file_len,
        }
    }

    /// Absolute offset of the next byte.
    pub(crate) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes from the cursor to the end of the file.
    pub(crate) fn file_left(&self) -> u64 {
        self.file_len.saturating_sub(self.offset())
    }

    pub(crate) fn take(&mut self, n: u64, field: &'static str) -> Result<&'a [u8], GgufError> {
        let offset = self.offset();
        let truncated = GgufError::Truncated {
            field,
            offset,
            need: n,
            file_len: self.file_len,
        };
        let end = offset.checked_add(n).ok_or(truncated)?;
        if end > self.file_len {
            return Err(truncated);
        }
        let avail = (self.buf.len() - self.pos) as u64;
        if n > avail {
            return Err(GgufError::NeedMore { need: end });
        }
        // n <= avail, which is a usize, so the cast is lossless.
        let n = n as usize;
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, GgufError> {
        self.array(field).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, GgufError> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// A length-prefixed UTF-8 string.
    pub(crate) fn str(&mut self, field: &'static str) -> Result<&'a str, GgufError> {
        let len = self.u64(field)?;
        let offset = self.offset();
        if len > self.file_left() {
            return Err(GgufError::StringTooLong {
                field,
                offset,
                len,
                file_len: self.file_len,
            });
        }
        let b = self.take(len, field)?;
        core::str::from_utf8(b).map_err(|_| GgufError::InvalidUtf8 { field, offset })
    }

    /// One value of type `ty`; `depth` counts the arrays this value is inside.
    pub(crate) fn value(
        &mut self,
        ty: ValueType,
        key: &str,
        depth: u32,
    ) -> Result<Value<'a>, GgufError> {
        if let Some(sz) = ty.fixed_size() {
            let b = self.take(sz as u64, "value")?;
            // `b` has exactly the size of `ty`, so decoding cannot fail.
            return decode_fixed(ty, b).ok_or(GgufError::Truncated {
                field: "value",
                offset: self.offset(),
                need: sz as u64,
                file_len: self.file_len,
            });
        }
        match ty {
            ValueType::Str => self.str("string value").map(Value::Str),
            _ => self.array_value(key, depth + 1).map(Value::Array),
        }
    }

    /// Steps over a value without decoding it (no UTF-8 checks): for lookups that pass
    /// over tokenizer arrays of 100k+ strings. Only for bytes `parse` already checked;
    /// on anything else it still stops with an error instead of misreading.
    pub(crate) fn skip(&mut self, ty: ValueType) -> Result<(), GgufError> {
        if let Some(sz) = ty.fixed_size() {
            return self.take(sz as u64, "value").map(drop);
        }
        if ty == ValueType::Str {
            let len = self.u64("string value")?;
            return self.take(len, "string value").map(drop);
        }
        let id = self.u32("array element type")?;
        let elem = ValueType::from_u32(id).ok_or(GgufError::UnknownValueType {
            key: Name::new(""),
            offset: self.offset(),
            found: id,
        })?;
        let len = self.u64("array length")?;
        match elem.fixed_size() {
            Some(sz) => {
                let n = len
                    .checked_mul(sz as u64)
                    .ok_or(GgufError::NeedMore { need: u64::MAX })?;
                self.take(n, "array data").map(drop)
            }
            None => {
                // Validated data nests at most MAX_ARRAY_DEPTH deep, and every element
                // consumes bytes, so recursion and the loop are bounded.
                for _ in 0..len {
                    self.skip(elem)?;
                }
                Ok(())
            }
        }
    }

    fn array_value(&mut self, key: &str, depth: u32) -> Result<ArrayView<'a>, GgufError> {
        let at = self.offset();
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::ArrayTooDeep {
                key: Name::new(key),
                offset: at,
                depth,
            });
        }
        let id = self.u32("array element type")?;
        let elem = ValueType::from_u32(id).ok_or_else(|| GgufError::UnknownValueType {
            key: Name::new(key),
            offset: at,
            found: id,
        })?;
        let len = self.u64("array length")?;
        let start = self.pos;
        let min = elem.min_size();
        let file_len = self.file_len;
        let too_long = || GgufError::ArrayTooLong {
            key: Name::new(key),
            offset: at,
            len,
            elem_size: min,
            file_len,
        };
        let least = len.checked_mul(min).ok_or_else(too_long)?;
        if least > self.file_left() {
            return Err(too_long());
        }
        if elem.fixed_size().is_some() {
            self.take(least, "array data")?;
        } else {
            // Each element consumes at least one byte, so this loop ends within the
            // buffer; `least <= file_left` already bounded `len` by the file size.
            for _ in 0..len {
                self.value(elem, key, depth)?;
            }
        }
        Ok(ArrayView {
            elem,
            len,
            bytes: &self.buf[start..self.pos],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_accessors_accept_any_width_that_fits() {
        assert_eq!(Value::U8(7).as_u32(), Some(7));
        assert_eq!(Value::I64(7).as_u32(), Some(7));
        assert_eq!(Value::I32(-1).as_u32(), None);
        assert_eq!(Value::U64(u64::MAX).as_u32(), None);
        assert_eq!(Value::U64(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(Value::F32(1.0).as_u32(), None);
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
    }

    #[test]
    fn fixed_arrays_index_in_constant_time_and_check_bounds() {
        let bytes = [1u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
        let a = ArrayView {
            elem: ValueType::I32,
            len: 2,
            bytes: &bytes,
        };
        assert_eq!(a.i32_at(0), Some(1));
        assert_eq!(a.i32_at(1), Some(-1));
        assert_eq!(a.u32_at(1), None);
        assert_eq!(a.i32_at(2), None);
        assert_eq!(a.f32_at(0), None);
        assert_eq!(a.iter().count(), 2);
    }

    #[test]
    fn inconsistent_hand_made_view_stops_iteration() {
        let bytes = [3u8, 0, 0, 0, 0, 0, 0, 0, b'a'];
        let a = ArrayView {
            elem: ValueType::Str,
            len: 5,
            bytes: &bytes,
        };
        assert_eq!(a.iter().count(), 0);
        assert_eq!(a.str_at(0), None);
    }
}
