//! Writing GGUF files into a caller's [`Sink`], without allocation.
//!
//! GGUF puts counts before items and tensor offsets before data, so the writer is told
//! the counts up front and then checks that the caller keeps to them, in order: metadata,
//! tensor infos (offsets assigned here, aligned), tensor data (padding inserted here).
//! Nested arrays are written element by element (`begin_array`, `elem`,
//! `begin_nested_array`); arrays taken from a parsed file are copied as they are.
use core::fmt;

use pinch_kernels::GgmlType;

use super::error::Name;
use super::value::{ArrayView, Value, ValueType};
use super::{Gguf, TensorInfo, DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MAX_ARRAY_DEPTH};

/// Where the writer's bytes go (a file, a buffer, a counter).
pub trait Sink {
    type Error;
    /// Writes all of `bytes` or fails.
    fn write(&mut self, bytes: &[u8]) -> Result<(), Self::Error>;
}

/// A sink over a caller's buffer.
pub struct SliceSink<'b> {
    buf: &'b mut [u8],
    pos: usize,
}

/// The buffer of a [`SliceSink`] is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceSinkFull {
    pub capacity: usize,
}

impl<'b> SliceSink<'b> {
    pub fn new(buf: &'b mut [u8]) -> SliceSink<'b> {
        SliceSink { buf, pos: 0 }
    }

    /// The bytes written so far.
    pub fn written(&self) -> &[u8] {
        &self.buf[..self.pos]
    }
}

impl Sink for SliceSink<'_> {
    type Error = SliceSinkFull;
    fn write(&mut self, bytes: &[u8]) -> Result<(), SliceSinkFull> {
        let full = SliceSinkFull {
            capacity: self.buf.len(),
        };
        let end = self.pos.checked_add(bytes.len()).ok_or(full)?;
        self.buf
            .get_mut(self.pos..end)
            .ok_or(full)?
            .copy_from_slice(bytes);
        self.pos = end;
        Ok(())
    }
}

/// A sink that only counts bytes: run a writer into it first to size a buffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountSink {
    pub bytes: u64,
}

impl Sink for CountSink {
    type Error = core::convert::Infallible;
    fn write(&mut self, bytes: &[u8]) -> Result<(), Self::Error> {
        self.bytes += bytes.len() as u64;
        Ok(())
    }
}

/// Why the writer refused (the caller broke the declared counts or order), or the sink's
/// own error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteError<E> {
    Sink(E),
    /// More keys or tensors than declared in `GgufWriter::new`.
    TooMany {
        what: &'static str,
        declared: u64,
    },
    /// `finish` (or the next section) came before all declared items were written.
    TooFew {
        what: &'static str,
        declared: u64,
        written: u64,
    },
    /// A call that belongs to another section (e.g. a key after a tensor info).
    OutOfOrder {
        call: &'static str,
    },
    /// An array element of the wrong type.
    ElementType {
        expected: ValueType,
        found: ValueType,
    },
    /// An array was left unfinished, or an element was written with no open array.
    ArrayState {
        open: u32,
    },
    /// Arrays nested deeper than the reader accepts.
    ArrayTooDeep,
    /// `general.alignment` is not an integer power of two up to 1 MiB.
    BadAlignment {
        found: u64,
    },
    /// A tensor shape the reader would reject (dims, block multiple, overflow).
    BadShape {
        tensor: Name,
    },
    /// Tensor data longer or shorter than its info said.
    DataSize {
        expected: u64,
        written: u64,
    },
}

impl<E: fmt::Debug> fmt::Display for WriteError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteError::Sink(e) => write!(f, "GGUF writer: output failed: {e:?}"),
            WriteError::TooMany { what, declared } => {
                write!(f, "GGUF writer: more {what} than the {declared} declared")
            }
            WriteError::TooFew {
                what,
                declared,
                written,
            } => write!(
                f,
                "GGUF writer: {written} {what} written but {declared} declared"
            ),
            WriteError::OutOfOrder { call } => write!(
                f,
                "GGUF writer: {call} out of order (metadata, then tensor infos, then data)"
            ),
            WriteError::ElementType { expected, found } => write!(
                f,
                "GGUF writer: array element of type {} in an array of {}",
                found.name(),
                expected.name()
            ),
            WriteError::ArrayState { open } => write!(
                f,
                "GGUF writer: array elements do not match the declared lengths ({open} arrays open)"
            ),
            WriteError::ArrayTooDeep => write!(
                f,
                "GGUF writer: arrays nested deeper than {MAX_ARRAY_DEPTH}"
            ),
            WriteError::BadAlignment { found } => write!(
                f,
                "GGUF writer: general.alignment {found} is not a power of two up to {MAX_ALIGNMENT}"
            ),
            WriteError::BadShape { tensor } => write!(
                f,
                "GGUF writer: tensor '{tensor}' has a shape the format cannot hold"
            ),
            WriteError::DataSize { expected, written } => write!(
                f,
                "GGUF writer: tensor data has {written} bytes, its info said {expected}"
            ),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Kv,
    Infos,
    Data,
}

/// Streams a GGUF v3 file into a [`Sink`].
///
/// Order: `new` (counts) → `n_kv` metadata values (`kv`, `begin_array` ..., `copy_kvs`)
/// → `n_tensors` tensor infos (`tensor_info`) → the data of each tensor in the same
/// order (`tensor_data`, or `begin_tensor_data` + `write_data` in chunks) → `finish`.
pub struct GgufWriter<S: Sink> {
    sink: S,
    pos: u64,
    alignment: u64,
    n_kv: u64,
    kv_done: u64,
    n_tensors: u64,
    infos_done: u64,
    /// Relative offset the next tensor info gets.
    next_rel: u64,
    /// End (relative) of the last tensor info's data, what the data must add up to.
    end_rel: u64,
    data_started: u64,
    data_rel: u64,
    cur_left: u64,
    cur_size: u64,
    /// Open arrays: element type and elements still to write.
    stack: [(ValueType, u64); MAX_ARRAY_DEPTH as usize],
    depth: usize,
    phase: Phase,
}

type WResult<T, S> = Result<T, WriteError<<S as Sink>::Error>>;

const ZEROS: [u8; 256] = [0; 256];

impl<S: Sink> GgufWriter<S> {
    /// Writes the fixed header (magic, version 3, counts).
    pub fn new(sink: S, n_tensors: u64, n_kv: u64) -> WResult<GgufWriter<S>, S> {
        let mut w = GgufWriter {
            sink,
            pos: 0,
            alignment: DEFAULT_ALIGNMENT,
            n_kv,
            kv_done: 0,
            n_tensors,
            infos_done: 0,
            next_rel: 0,
            end_rel: 0,
            data_started: 0,
            data_rel: 0,
            cur_left: 0,
            cur_size: 0,
            stack: [(ValueType::U8, 0); MAX_ARRAY_DEPTH as usize],
            depth: 0,
            phase: Phase::Kv,
        };
        w.put(b"GGUF")?;
        w.put(&3u32.to_le_bytes())?;
        w.put(&n_tensors.to_le_bytes())?;
        w.put(&n_kv.to_le_bytes())?;
        Ok(w)
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The data alignment in force (32 unless `general.alignment` was written).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    fn put(&mut self, b: &[u8]) -> WResult<(), S> {
        self.sink.write(b).map_err(WriteError::Sink)?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn put_str(&mut self, s: &str) -> WResult<(), S> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    fn pad(&mut self, mut n: u64) -> WResult<(), S> {
        while n > 0 {
            let k = n.min(ZEROS.len() as u64) as usize;
            self.put(&ZEROS[..k])?;
            n -= k as u64;
        }
        Ok(())
    }

    /// Encodes a value's payload (no type id).
    fn put_payload(&mut self, v: &Value<'_>) -> WResult<(), S> {
        match *v {
            Value::U8(x) => self.put(&[x]),
            Value::I8(x) => self.put(&x.to_le_bytes()),
            Value::U16(x) => self.put(&x.to_le_bytes()),
            Value::I16(x) => self.put(&x.to_le_bytes()),
            Value::U32(x) => self.put(&x.to_le_bytes()),
            Value::I32(x) => self.put(&x.to_le_bytes()),
            Value::F32(x) => self.put(&x.to_le_bytes()),
            Value::Bool(x) => self.put(&[x as u8]),
            Value::Str(s) => self.put_str(s),
            Value::Array(a) => self.put_array_view(&a),
            Value::U64(x) => self.put(&x.to_le_bytes()),
            Value::I64(x) => self.put(&x.to_le_bytes()),
            Value::F64(x) => self.put(&x.to_le_bytes()),
        }
    }

    fn put_array_view(&mut self, a: &ArrayView<'_>) -> WResult<(), S> {
        self.put(&(a.elem as u32).to_le_bytes())?;
        self.put(&a.len.to_le_bytes())?;
        // A view from a parsed file is already in file encoding.
        self.put(a.bytes)
    }

    fn start_kv(&mut self, key: &str, ty: ValueType) -> WResult<(), S> {
        if self.phase != Phase::Kv {
            return Err(WriteError::OutOfOrder { call: "metadata" });
        }
        if self.depth != 0 {
            return Err(WriteError::ArrayState {
                open: self.depth as u32,
            });
        }
        if self.kv_done >= self.n_kv {
            return Err(WriteError::TooMany {
                what: "metadata keys",
                declared: self.n_kv,
            });
        }
        self.kv_done += 1;
        self.put_str(key)?;
        self.put(&(ty as u32).to_le_bytes())
    }

    /// One metadata key with any value (arrays from a parsed file included).
    /// `general.alignment` sets the alignment of the data section.
    pub fn kv(&mut self, key: &str, v: Value<'_>) -> WResult<(), S> {
        if key == "general.alignment" {
            let a = v.as_u64().ok_or(WriteError::BadAlignment { found: 0 })?;
            if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                return Err(WriteError::BadAlignment { found: a });
            }
            self.alignment = a;
        }
        self.start_kv(key, v.value_type())?;
        self.put_payload(&v)
    }

    /// Starts an array value of `len` elements of type `elem`; follow with `len` calls
    /// of [`Self::elem`] (or [`Self::begin_nested_array`] when `elem` is `Array`).
    pub fn begin_array(&mut self, key: &str, elem: ValueType, len: u64) -> WResult<(), S> {
        self.start_kv(key, ValueType::Array)?;
        self.open_array(elem, len)
    }

    fn open_array(&mut self, elem: ValueType, len: u64) -> WResult<(), S> {
        self.put(&(elem as u32).to_le_bytes())?;
        self.put(&len.to_le_bytes())?;
        if len > 0 {
            if self.depth >= MAX_ARRAY_DEPTH as usize {
                return Err(WriteError::ArrayTooDeep);
            }
            self.stack[self.depth] = (elem, len);
            self.depth += 1;
        }
        Ok(())
    }

    fn take_slot(&mut self, ty: ValueType) -> WResult<(), S> {
        let Some(top) = self.depth.checked_sub(1) else {
            return Err(WriteError::ArrayState { open: 0 });
        };
        let (elem, left) = self.stack[top];
        if elem != ty {
            return Err(WriteError::ElementType {
                expected: elem,
                found: ty,
            });
        }
        self.stack[top].1 = left - 1;
        Ok(())
    }

    /// Closes every array whose elements are all written.
    fn close_full(&mut self) {
        while self.depth > 0 && self.stack[self.depth - 1].1 == 0 {
            self.depth -= 1;
        }
    }

    /// The next element of the innermost open array.
    pub fn elem(&mut self, v: Value<'_>) -> WResult<(), S> {
        self.take_slot(v.value_type())?;
        self.put_payload(&v)?;
        self.close_full();
        Ok(())
    }

    /// The next element of the innermost open array is itself an array of `len` `elem`s.
    pub fn begin_nested_array(&mut self, elem: ValueType, len: u64) -> WResult<(), S> {
        match self.depth.checked_sub(1).map(|top| self.stack[top].0) {
            Some(ValueType::Array) | None => {}
            Some(expected) => {
                return Err(WriteError::ElementType {
                    expected,
                    found: ValueType::Array,
                })
            }
        }
        if self.depth >= MAX_ARRAY_DEPTH as usize {
            return Err(WriteError::ArrayTooDeep);
        }
        self.take_slot(ValueType::Array)?;
        self.open_array(elem, len)?;
        self.close_full();
        Ok(())
    }

    /// An array of strings.
    pub fn kv_str_array(&mut self, key: &str, items: &[&str]) -> WResult<(), S> {
        self.begin_array(key, ValueType::Str, items.len() as u64)?;
        items.iter().try_for_each(|s| self.elem(Value::Str(s)))
    }

    /// An array of float32.
    pub fn kv_f32_array(&mut self, key: &str, items: &[f32]) -> WResult<(), S> {
        self.begin_array(key, ValueType::F32, items.len() as u64)?;
        items.iter().try_for_each(|&x| self.elem(Value::F32(x)))
    }

    /// An array of int32.
    pub fn kv_i32_array(&mut self, key: &str, items: &[i32]) -> WResult<(), S> {
        self.begin_array(key, ValueType::I32, items.len() as u64)?;
        items.iter().try_for_each(|&x| self.elem(Value::I32(x)))
    }

    /// An array of uint32.
    pub fn kv_u32_array(&mut self, key: &str, items: &[u32]) -> WResult<(), S> {
        self.begin_array(key, ValueType::U32, items.len() as u64)?;
        items.iter().try_for_each(|&x| self.elem(Value::U32(x)))
    }

    /// Copies the metadata of `g` for which `keep(key)` holds, in file order; returns
    /// how many keys were copied (count them first with the same filter to size `n_kv`).
    pub fn copy_kvs(
        &mut self,
        g: &Gguf<'_>,
        mut keep: impl FnMut(&str) -> bool,
    ) -> WResult<u64, S> {
        let mut n = 0;
        for (k, v) in g.kv() {
            if keep(k) {
                self.kv(k, v)?;
                n += 1;
            }
        }
        Ok(n)
    }

    fn end_kvs(&mut self) -> WResult<(), S> {
        if self.phase == Phase::Kv {
            if self.depth != 0 {
                return Err(WriteError::ArrayState {
                    open: self.depth as u32,
                });
            }
            if self.kv_done != self.n_kv {
                return Err(WriteError::TooFew {
                    what: "metadata keys",
                    declared: self.n_kv,
                    written: self.kv_done,
                });
            }
            self.phase = Phase::Infos;
        }
        Ok(())
    }

    /// A tensor info; its data offset is assigned here (aligned, in call order) and
    /// returned relative to the data section.
    pub fn tensor_info(&mut self, name: &str, ty: GgmlType, dims: &[u64]) -> WResult<u64, S> {
        self.end_kvs()?;
        if self.phase != Phase::Infos {
            return Err(WriteError::OutOfOrder {
                call: "tensor_info",
            });
        }
        if self.infos_done >= self.n_tensors {
            return Err(WriteError::TooMany {
                what: "tensors",
                declared: self.n_tensors,
            });
        }
        let bad = || WriteError::BadShape {
            tensor: Name::new(name),
        };
        if dims.len() > 4 || dims.contains(&0) {
            return Err(bad());
        }
        let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        if elements.is_none_or(|n| n > i64::MAX as u64) {
            return Err(bad());
        }
        let rows: u64 = dims.iter().skip(1).product();
        let bytes = ty
            .row_bytes(dims.first().copied().unwrap_or(1))
            .and_then(|r| r.checked_mul(rows))
            .ok_or_else(bad)?;
        let offset = self.next_rel;
        let end = offset.checked_add(bytes).ok_or_else(bad)?;
        self.put_str(name)?;
        self.put(&(dims.len() as u32).to_le_bytes())?;
        for d in dims {
            self.put(&d.to_le_bytes())?;
        }
        self.put(&(ty as u32).to_le_bytes())?;
        self.put(&offset.to_le_bytes())?;
        self.infos_done += 1;
        self.end_rel = end;
        self.next_rel = end.div_ceil(self.alignment) * self.alignment;
        Ok(offset)
    }

    /// Copies a tensor info from a parsed file (the offset is reassigned).
    pub fn copy_tensor_info(&mut self, t: &TensorInfo<'_>) -> WResult<u64, S> {
        self.tensor_info(t.name, t.ty, t.shape())
    }

    fn pad_to_alignment(&mut self) -> WResult<(), S> {
        let a = self.alignment;
        self.pad((a - self.pos % a) % a)
    }

    fn end_infos(&mut self) -> WResult<(), S> {
        self.end_kvs()?;
        if self.phase == Phase::Infos {
            if self.infos_done != self.n_tensors {
                return Err(WriteError::TooFew {
                    what: "tensors",
                    declared: self.n_tensors,
                    written: self.infos_done,
                });
            }
            self.pad_to_alignment()?;
            self.phase = Phase::Data;
        }
        Ok(())
    }

    /// Starts the data of the next tensor (`bytes` long, as its info said); follow with
    /// [`Self::write_data`] until all bytes are written.
    pub fn begin_tensor_data(&mut self, bytes: u64) -> WResult<(), S> {
        self.end_infos()?;
        if self.cur_left != 0 {
            return Err(WriteError::DataSize {
                expected: self.cur_size,
                written: self.cur_size - self.cur_left,
            });
        }
        if self.data_started >= self.n_tensors {
            return Err(WriteError::TooMany {
                what: "tensor data blocks",
                declared: self.n_tensors,
            });
        }
        let a = self.alignment;
        let padded = self.data_rel.div_ceil(a) * a;
        self.pad(padded - self.data_rel)?;
        self.data_rel = padded;
        self.data_started += 1;
        self.cur_left = bytes;
        self.cur_size = bytes;
        Ok(())
    }

    /// More bytes of the current tensor's data.
    pub fn write_data(&mut self, chunk: &[u8]) -> WResult<(), S> {
        let n = chunk.len() as u64;
        if n > self.cur_left {
            return Err(WriteError::DataSize {
                expected: self.cur_size,
                written: self.cur_size - self.cur_left + n,
            });
        }
        self.put(chunk)?;
        self.cur_left -= n;
        self.data_rel += n;
        Ok(())
    }

    /// The whole data of the next tensor.
    pub fn tensor_data(&mut self, bytes: &[u8]) -> WResult<(), S> {
        self.begin_tensor_data(bytes.len() as u64)?;
        self.write_data(bytes)
    }

    /// Checks that everything declared was written, pads the file to the alignment
    /// (as llama.cpp does) and returns the sink.
    pub fn finish(mut self) -> WResult<S, S> {
        self.end_infos()?;
        if self.cur_left != 0 || self.data_started != self.n_tensors {
            return Err(WriteError::TooFew {
                what: "tensor data blocks",
                declared: self.n_tensors,
                written: self.data_started - (self.cur_left != 0) as u64,
            });
        }
        if self.data_rel != self.end_rel {
            // The data blocks did not have the sizes of the infos, so offsets differ.
            return Err(WriteError::DataSize {
                expected: self.end_rel,
                written: self.data_rel,
            });
        }
        if self.n_tensors > 0 {
            self.pad_to_alignment()?;
        }
        Ok(self.sink)
    }
}
