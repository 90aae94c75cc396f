//! GGUF: the file format of llama.cpp models, read and written without allocation.
//!
//! Reader: zero-copy over a byte prefix of the file ([`Gguf::parse`]). Every count,
//! length and offset is checked against the bytes and the file size once, in `parse`;
//! afterwards the accessors re-decode the validated bytes on demand (linear scans, no
//! index, because there is no heap to keep one in). If the prefix is too short, `parse`
//! says how many bytes it needs ([`GgufError::NeedMore`]) and the caller retries.
//!
//! Writer ([`GgufWriter`]): streams a file into a [`Sink`]: header, metadata (any value,
//! including values copied from a parsed file), tensor infos with computed aligned
//! offsets, then tensor data with padding.
//!
//! Layout (v2/v3, little-endian): magic `GGUF`, u32 version, u64 n_tensors, u64 n_kv,
//! n_kv × (string key, u32 type, value), n_tensors × (string name, u32 n_dims,
//! n_dims × u64 ne, u32 ggml type, u64 offset relative to the data section), padding to
//! `general.alignment` (default 32), data section.
use pinch_kernels::GgmlType;

mod error;
mod value;
mod writer;

pub use error::{GgufError, Name};
pub use value::{ArrayIter, ArrayView, Value, ValueType};
pub use writer::{CountSink, GgufWriter, Sink, SliceSink, SliceSinkFull, WriteError};

use value::Cursor;

/// Arrays may nest (arrays of arrays); deeper nesting than this is rejected so that
/// decoding recursion stays small.
pub const MAX_ARRAY_DEPTH: u32 = 8;
/// Largest `general.alignment` accepted.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Default alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most tensors a file may declare. The largest real models have about 1,000-2,000
/// (experts are stored merged); the bound keeps the heap-free duplicate check fast.
pub const MAX_TENSORS: u64 = 1 << 14;
/// Most metadata keys a file may declare (real files have 20-100).
pub const MAX_KV: u64 = 1 << 12;

const MAGIC: [u8; 4] = *b"GGUF";
const FIXED_HEADER: u64 = 24;
/// Smallest encodings: key (8-byte length) + type + 1-byte value; tensor info with
/// empty name and zero dims: name length + n_dims + type + offset.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_BYTES: u64 = 8 + 4 + 4 + 8;

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

impl TensorInfo<'_> {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Number of rows (all dims but the first).
    pub fn rows(&self) -> u64 {
        self.dims[1] * self.dims[2] * self.dims[3]
    }

    /// The used dimensions, `dims[..n_dims]`.
    pub fn shape(&self) -> &[u64] {
        &self.dims[..self.n_dims as usize]
    }
}

/// A parsed GGUF header.
///
/// # Invariants
/// Everything reachable through the accessors was validated by [`Gguf::parse`]: keys and
/// tensor names are unique UTF-8, values decode, tensors' data lies inside the file and
/// has a known type with whole blocks per row. Tensors are laid out in info order, each
/// at the end of the previous one rounded up to the alignment (so offsets increase and
/// data never overlaps), as llama.cpp requires. Every tensor's byte and element counts fit
/// a `usize` (so on a 32-bit build, `as usize` on them, and on its dims, is lossless).
#[derive(Clone, Copy, Debug)]
pub struct Gguf<'a> {
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the data section (the header's length including padding).
    pub data_offset: u64,
    pub file_len: u64,
    /// Header bytes up to the end of the tensor infos.
    header: &'a [u8],
    n_kv: usize,
    n_tensors: usize,
    ti_start: usize,
}

impl<'a> Gguf<'a> {
    /// Parses and validates the header from `header`, a prefix of a file of `file_len`
    /// bytes (the whole file is fine).
    ///
    /// # Errors
    /// [`GgufError::NeedMore`] if the prefix is too short (read `need` bytes and retry;
    /// `need` grows with every retry and never exceeds `file_len`), any other variant if
    /// the file is invalid.
    pub fn parse(header: &'a [u8], file_len: u64) -> Result<Gguf<'a>, GgufError> {
        let header = match usize::try_from(file_len) {
            Ok(n) if n < header.len() => &header[..n],
            _ => header,
        };
        let mut c = Cursor::new(header, 0, file_len);
        let magic: [u8; 4] = c
            .take(4, "magic")?
            .try_into()
            .map_err(|_| GgufError::BadMagic { found: [0; 4] })?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion { found: version });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata key count")?;
        let room = file_len.saturating_sub(FIXED_HEADER);
        let max_kv = MAX_KV.min(room / MIN_KV_BYTES);
        if n_kv > max_kv {
            return Err(GgufError::TooManyKeys {
                count: n_kv,
                max: max_kv,
            });
        }
        let max_tensors = MAX_TENSORS.min((room - n_kv * MIN_KV_BYTES) / MIN_TENSOR_BYTES);
        if n_tensors > max_tensors {
            return Err(GgufError::TooManyTensors {
                count: n_tensors,
                max: max_tensors,
            });
        }

        let mut alignment = DEFAULT_ALIGNMENT;
        for _ in 0..n_kv {
            let key = c.str("key")?;
            let at = c.offset();
            let id = c.u32("value type")?;
            let ty = ValueType::from_u32(id).ok_or_else(|| GgufError::UnknownValueType {
                key: Name::new(key),
                offset: at,
                found: id,
            })?;
            let v = c.value(ty, key, 0)?;
            if key == "general.alignment" {
                let a = v.as_u64().ok_or(GgufError::WrongKeyType {
                    key: "general.alignment",
                    expected: "unsigned integer",
                    found: ty.name(),
                })?;
                if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                    return Err(GgufError::BadAlignment {
                        found: a,
                        max: MAX_ALIGNMENT,
                    });
                }
                alignment = a;
            }
        }

        let ti_start = c.pos();
        // llama.cpp requires the data in info order, each tensor where the previous one
        // ends, rounded up to the alignment; that also rules out overlapping tensors.
        let mut expected = 0u64;
        for _ in 0..n_tensors {
            let info = read_tensor_info(&mut c)?;
            if info.rel_offset % alignment != 0 {
                return Err(GgufError::MisalignedTensor {
                    tensor: Name::new(info.name),
                    offset: info.rel_offset,
                    alignment,
                });
            }
            if info.rel_offset != expected {
                return Err(GgufError::UnexpectedTensorOffset {
                    tensor: Name::new(info.name),
                    offset: info.rel_offset,
                    expected,
                });
            }
            // A sum past u64 is far past any file: report it as such.
            expected = info
                .bytes
                .checked_add(alignment - 1)
                .and_then(|b| expected.checked_add(b / alignment * alignment))
                .ok_or_else(|| GgufError::TensorPastEnd {
                    tensor: Name::new(info.name),
                    offset: info.rel_offset,
                    bytes: info.bytes,
                    file_len,
                })?;
        }
        let end = c.offset();
        // alignment <= 1 MiB and end <= file_len, so this cannot overflow u64.
        let data_offset = end.div_ceil(alignment) * alignment;
        let need = data_offset.min(file_len);
        if (header.len() as u64) < need {
            return Err(GgufError::NeedMore { need });
        }

        let g = Gguf {
            version,
            alignment,
            data_offset,
            file_len,
            header: &header[..c.pos()],
            // Both counts are at most MAX_KV / MAX_TENSORS (2^12, 2^14): they fit a usize.
            n_kv: n_kv as usize,
            n_tensors: n_tensors as usize,
            ti_start,
        };
        for t in g.tensors() {
            // `tensors()` saturates on overflow, so an overflowing offset also lands here.
            if t.offset.checked_add(t.bytes).is_none_or(|e| e > file_len) {
                return Err(GgufError::TensorPastEnd {
                    tensor: Name::new(t.name),
                    offset: t.offset,
                    bytes: t.bytes,
                    file_len,
                });
            }
            if usize::try_from(t.bytes).is_err() || usize::try_from(t.elements()).is_err() {
                return Err(GgufError::TensorTooLarge {
                    tensor: Name::new(t.name),
                    bytes: t.bytes,
                    elements: t.elements(),
                });
            }
        }
        if let Some((first, second, name)) = find_duplicate(|| g.keys(), g.n_kv) {
            return Err(GgufError::DuplicateKey {
                key: Name::new(name),
                first: first as u64,
                second: second as u64,
            });
        }
        if let Some((first, second, name)) =
            find_duplicate(|| g.tensors().map(|t| t.name), g.n_tensors)
        {
            return Err(GgufError::DuplicateTensor {
                tensor: Name::new(name),
                first: first as u64,
                second: second as u64,
            });
        }
        Ok(g)
    }

    /// Number of metadata keys.
    pub fn kv_count(&self) -> usize {
        self.n_kv
    }

    /// Number of tensors.
    pub fn tensor_count(&self) -> usize {
        self.n_tensors
    }

    /// The header bytes up to the end of the tensor infos (without padding).
    pub fn header_bytes(&self) -> &'a [u8] {
        self.header
    }

    /// All keys in file order; values are stepped over, not decoded.
    pub fn keys(&self) -> impl Iterator<Item = &'a str> + 'a {
        let mut it = self.kv();
        (0..self.n_kv).map_while(move |_| {
            let key = it.cur.str("key").ok()?;
            let ty = ValueType::from_u32(it.cur.u32("value type").ok()?)?;
            it.cur.skip(ty).ok()?;
            Some(key)
        })
    }

    /// All metadata in file order.
    pub fn kv(&self) -> KvIter<'a> {
        KvIter {
            cur: Cursor::new(
                &self.header[FIXED_HEADER as usize..self.ti_start],
                FIXED_HEADER,
                self.ti_start as u64,
            ),
            left: self.n_kv,
        }
    }

    /// The value of `key` (linear scan).
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        self.find_kv(|k| k == key)
    }

    /// The value of the first key for which `pred` holds. Values of other keys are
    /// stepped over, not decoded, so a lookup past the vocabulary stays cheap.
    pub fn find_kv(&self, pred: impl Fn(&str) -> bool) -> Option<Value<'a>> {
        let mut it = self.kv();
        for _ in 0..self.n_kv {
            let key = it.cur.str("key").ok()?;
            let id = it.cur.u32("value type").ok()?;
            let ty = ValueType::from_u32(id)?;
            if pred(key) {
                return it.cur.value(ty, key, 0).ok();
            }
            it.cur.skip(ty).ok()?;
        }
        None
    }

    /// An integer value that fits a u32, whatever integer type the file used.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }

    /// An integer value that fits a u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// An integer value that fits an i64.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// A float32 or float64 value.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&'a str> {
        self.get(key)?.as_str()
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Option<ArrayView<'a>> {
        self.get(key)?.as_array()
    }

    /// `general.architecture` (`"llama"`, `"qwen3"` ...).
    pub fn architecture(&self) -> Option<&'a str> {
        self.get_str("general.architecture")
    }

    /// The value of `"{architecture}.{suffix}"` (e.g. `arch_get("context_length")`),
    /// without formatting the key into a buffer.
    pub fn arch_get(&self, suffix: &str) -> Option<Value<'a>> {
        let arch = self.architecture()?;
        self.find_kv(|k| {
            k.strip_prefix(arch)
                .and_then(|r| r.strip_prefix('.'))
                .is_some_and(|r| r == suffix)
        })
    }

    /// `"{architecture}.{suffix}"` as a u32.
    pub fn arch_u32(&self, suffix: &str) -> Option<u32> {
        self.arch_get(suffix)?.as_u32()
    }

    /// `"{architecture}.{suffix}"` as an f32.
    pub fn arch_f32(&self, suffix: &str) -> Option<f32> {
        self.arch_get(suffix)?.as_f32()
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> TensorIter<'a> {
        TensorIter {
            cur: Cursor::new(
                &self.header[self.ti_start..],
                self.ti_start as u64,
                self.header.len() as u64,
            ),
            left: self.n_tensors,
            data_offset: self.data_offset,
        }
    }

    /// The tensor called `name` (linear scan).
    pub fn tensor(&self, name: &str) -> Option<TensorInfo<'a>> {
        self.tensors().find(|t| t.name == name)
    }

    /// Bytes of all tensor data (without padding).
    pub fn tensor_bytes_total(&self) -> u64 {
        self.tensors().map(|t| t.bytes).sum()
    }
}

/// Iterator over a file's metadata: `(key, value)` in file order.
#[derive(Clone)]
pub struct KvIter<'a> {
    cur: Cursor<'a>,
    left: usize,
}

impl<'a> Iterator for KvIter<'a> {
    type Item = (&'a str, Value<'a>);
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = (|| {
            let key = self.cur.str("key")?;
            let id = self.cur.u32("value type")?;
            let ty = ValueType::from_u32(id).ok_or(GgufError::NeedMore { need: 0 })?;
            Ok::<_, GgufError>((key, self.cur.value(ty, key, 0)?))
        })();
        if r.is_err() {
            self.left = 0;
        }
        r.ok()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// Iterator over a file's tensor infos in file order.
#[derive(Clone)]
pub struct TensorIter<'a> {
    cur: Cursor<'a>,
    left: usize,
    data_offset: u64,
}

impl<'a> Iterator for TensorIter<'a> {
    type Item = TensorInfo<'a>;
    fn next(&mut self) -> Option<TensorInfo<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match read_tensor_info(&mut self.cur) {
            Ok(r) => Some(TensorInfo {
                name: r.name,
                ty: r.ty,
                n_dims: r.n_dims,
                dims: r.dims,
                offset: self.data_offset.saturating_add(r.rel_offset),
                bytes: r.bytes,
            }),
            Err(_) => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

struct RawTensor<'a> {
    name: &'a str,
    ty: GgmlType,
    n_dims: u32,
    dims: [u64; 4],
    rel_offset: u64,
    bytes: u64,
}

fn read_tensor_info<'a>(c: &mut Cursor<'a>) -> Result<RawTensor<'a>, GgufError> {
    let name = c.str("tensor name")?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims > 4 {
        return Err(GgufError::TooManyDims {
            tensor: Name::new(name),
            n_dims,
        });
    }
    let mut dims = [1u64; 4];
    for (i, d) in dims.iter_mut().enumerate().take(n_dims as usize) {
        *d = c.u64("tensor dimension")?;
        if *d == 0 {
            return Err(GgufError::ZeroDim {
                tensor: Name::new(name),
                dim: i as u32,
            });
        }
    }
    let id = c.u32("tensor type")?;
    let rel_offset = c.u64("tensor data offset")?;
    let overflow = || GgufError::ShapeOverflow {
        tensor: Name::new(name),
        dims,
    };
    // ggml keeps element counts in int64.
    let fits = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .is_some_and(|n| n <= i64::MAX as u64);
    if !fits {
        return Err(overflow());
    }
    let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: Name::new(name),
        found: id,
    })?;
    let (qk, _) = ty.block_geometry();
    if dims[0] % qk as u64 != 0 {
        return Err(GgufError::RowNotBlockMultiple {
            tensor: Name::new(name),
            row: dims[0],
            block: qk as u64,
            type_name: ty.name(),
        });
    }
    let bytes = ty
        .row_bytes(dims[0])
        .and_then(|r| r.checked_mul(dims[1] * dims[2] * dims[3]))
        .ok_or_else(overflow)?;
    Ok(RawTensor {
        name,
        ty,
        n_dims,
        dims,
        rel_offset,
        bytes,
    })
}

/// 64-bit FNV-1a: enough to spread names; equal hashes are confirmed by comparing names.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Finds two equal names among the `n` produced by `names()` without a heap: names are
/// taken in chunks whose hashes are sorted on the stack, and each chunk is checked
/// against itself and against one pass over the names before it. That is n/CHUNK passes
/// instead of the n passes of a plain pairwise comparison.
fn find_duplicate<'a, I, F>(names: F, n: usize) -> Option<(usize, usize, &'a str)>
where
    I: Iterator<Item = &'a str>,
    F: Fn() -> I,
{
    // 256 names + hashes: 8 KiB of stack on 64-bit.
    const CHUNK: usize = 256;
    let mut start = 0;
    while start < n {
        let mut chunk = [""; CHUNK];
        let mut hashes = [(0u64, 0usize); CHUNK];
        let mut k = 0;
        for name in names().skip(start).take(CHUNK) {
            chunk[k] = name;
            hashes[k] = (fnv1a(name), k);
            k += 1;
        }
        if k == 0 {
            break;
        }
        let hashes = &mut hashes[..k];
        hashes.sort_unstable();
        for i in 0..k {
            let mut j = i + 1;
            while j < k && hashes[j].0 == hashes[i].0 {
                let (a, b) = (hashes[i].1, hashes[j].1);
                if chunk[a] == chunk[b] {
                    return Some((start + a.min(b), start + a.max(b), chunk[a]));
                }
                j += 1;
            }
        }
        for (p, name) in names().take(start).enumerate() {
            let h = fnv1a(name);
            let mut i = hashes.partition_point(|e| e.0 < h);
            while i < k && hashes[i].0 == h {
                if chunk[hashes[i].1] == name {
                    return Some((p, start + hashes[i].1, name));
                }
                i += 1;
            }
        }
        start += k;
    }
    None
}
