//! Repacked weights and the repack cache (`--repack-cache DIR`).
//!
//! Q8_0 matrices run faster row-interleaved ([`pinch_kernels::repack`]: on x86 the
//! 262144 x 640 head of Gemma 3 270M is 1.35-1.5x faster per token in the kernel
//! benchmark; inside `pinch run` the head's share fell ~4-10% (noisy shared machine),
//! generation +3-6%). Repacking is on whenever the CPU has a kernel for the layout
//! (`--no-repack` turns it off), with or without a cache. The loader reads
//! tensors through a [`Repacking`] platform: when a read is exactly a resident Q8_0
//! matrix (all its rows, or the resident first rows of a partly streamed head), the
//! bytes are repacked in place as they arrive (one group of rows of scratch, the tensor
//! never exists twice), or, with a valid cache, read already repacked from the cache
//! file instead of the model. Any other read passes through untouched, so streamed
//! tensors stay plain. [`Repacking::finish`] then marks the loaded tensors' layouts
//! and, when something was repacked afresh, writes the cache (atomically, through
//! [`Platform::write_file`]).
//!
//! # Cache file (`DIR/<model file stem>.pinch-repack`, little-endian)
//! ```text
//! 0    magic "PNCHRPK\0"
//! 8    format version u32            12   entry count n u32
//! 16   model size u64                24   model stamp u64 (mtime ns; 0: unknown)
//! 32   hash of the model's GGUF header (FNV-1a 64) u64
//! 40   hash of 16 samples of 4 KiB spread over the model's tensor data u64
//! 48   checksum (FNV-1a 64) of the whole header, this field read as 0 u64
//! 56   n entries of 96 bytes: name (64 bytes, zero-padded), type u32, layout u32,
//!      model offset u64, payload offset u64, payload length u64
//! ..   n payload hashes u64 ([`payload_hash`])
//! then the payloads, each starting on a 64-byte boundary; the file ends with the last.
//! ```
//! "Model changed" is detected cheaply without reading the model: size and stamp catch
//! a rewritten file, the header hash any change of metadata, tensor types, shapes or
//! offsets, and the sampled-bytes hash (64 KiB read) most same-size edits of the data
//! under a preserved stamp. The payload hashes catch a corrupt cache (checked as each
//! payload is read, at ~10 GB/s). Any mismatch, a truncated file or a bad magic is
//! reported in one line on stderr and the cache is rebuilt; the run never fails
//! because of the cache (a cache that cannot be written is reported and skipped).
//!
//! What the cache buys is small: repacking is a permutation at memory speed (~9 ms for
//! the 178 MB head on x86), about what checking the cached payload's hash costs, and
//! reading the cache replaces reading the same number of bytes from the model. Start-up
//! of Gemma 3 270M (whole process to one token, page cache warm, best of 7 alternating):
//! 282 ms plain, 290 ms repacked at load, 399 ms writing the cache (an fsync of 180 MB),
//! 283 ms reading it. It would pay where the platform maps the cache file (zero copy), which
//! the Linux platform does not do yet.
use core::fmt::Write;

use pinch_kernels::repack::{self, Layout};
use pinch_kernels::{CpuFeatures, GgmlType};

use crate::arena::{Arena, ArenaError};
use crate::commands::out::Out;
use crate::gguf::Gguf;
use crate::model::weights::{name_buf, NameBuf, Tensor};
use crate::model::{ModelError, Weights};
use crate::platform::{Platform, PlatformError, Recv, Socket};

/// First bytes of a cache file.
pub const MAGIC: [u8; 8] = *b"PNCHRPK\0";
/// Format version; bump when the file or a layout changes.
pub const VERSION: u32 = 1;
/// Most tensors one cache holds.
pub const MAX_ENTRIES: usize = 512;
const FIXED: usize = 56;
const ENTRY: usize = 96;
const ALIGN: u64 = 64;
const SAMPLES: u64 = 16;
const SAMPLE_BYTES: usize = 4096;

/// What identifies the model a cache was made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelId {
    pub size: u64,
    pub stamp: u64,
    pub header_hash: u64,
    pub sample_hash: u64,
}

impl ModelId {
    /// The identity of `file` (parsed as `g`): size, stamp, header hash, sampled bytes.
    pub fn of<P: Platform>(p: &P, file: &P::File, g: &Gguf) -> Result<ModelId, PlatformError> {
        let size = p.file_size(file);
        let mut h = Fnv::new();
        let data = g.data_offset.min(size);
        let span = size - data;
        let mut buf = [0u8; SAMPLE_BYTES];
        for i in 0..SAMPLES {
            let off = data + span / SAMPLES * i;
            let n = read_full(p, file, off, &mut buf)?;
            h.bytes(&buf[..n]);
        }
        Ok(ModelId {
            size,
            stamp: p.file_stamp(file).unwrap_or(0),
            header_hash: Fnv::hash(g.header_bytes()),
            sample_hash: h.0,
        })
    }
}

/// Read as much of `buf` as the file holds at `off`; the count.
fn read_full<P: Platform>(
    p: &P,
    file: &P::File,
    off: u64,
    buf: &mut [u8],
) -> Result<usize, PlatformError> {
    let mut done = 0;
    while done < buf.len() {
        let n = p.read_at(file, off + done as u64, &mut buf[done..], false)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

/// FNV-1a, 64 bits (headers and samples).
struct Fnv(u64);
impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn hash(b: &[u8]) -> u64 {
        let mut h = Fnv::new();
        h.bytes(b);
        h.0
    }
}

/// A fast 64-bit checksum of payloads: four independent multiply-rotate lanes over
/// 32-byte steps, FNV over the tail, all folded with the length. Not cryptographic;
/// it detects corruption, not tampering.
pub fn payload_hash(b: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lanes = [K, K ^ 1, K ^ 2, K ^ 3];
    let mut chunks = b.chunks_exact(32);
    for c in &mut chunks {
        for (l, w) in lanes.iter_mut().zip(c.chunks_exact(8)) {
            let mut x = [0u8; 8];
            x.copy_from_slice(w);
            *l = (*l ^ u64::from_le_bytes(x))
                .wrapping_mul(0xff51_afd7_ed55_8ccd)
                .rotate_left(29);
        }
    }
    let mut h = Fnv(lanes[0] ^ lanes[1].rotate_left(16) ^ lanes[2].rotate_left(32));
    h.0 ^= lanes[3].rotate_left(48);
    h.bytes(chunks.remainder());
    h.bytes(&(b.len() as u64).to_le_bytes());
    h.0
}

/// One tensor in a cache file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: NameBuf,
    pub ty: GgmlType,
    pub layout: Layout,
    pub model_offset: u64,
    pub offset: u64,
    pub len: u64,
    pub hash: u64,
}

/// Why a cache file was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    Truncated,
    BadMagic,
    Version(u32),
    Checksum,
    ModelChanged(&'static str),
    BadEntry,
    /// A tensor was cached in another layout than this run's kernels take (`--lut8`
    /// given or dropped, or another CPU).
    Layout,
    Payload,
}

impl core::fmt::Display for Stale {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Stale::Truncated => write!(f, "truncated"),
            Stale::BadMagic => write!(f, "not a pinch repack cache (bad magic)"),
            Stale::Version(v) => write!(f, "format version {v}, this pinch writes {VERSION}"),
            Stale::Checksum => write!(f, "header checksum mismatch (corrupt)"),
            Stale::ModelChanged(what) => write!(f, "the model changed ({what})"),
            Stale::BadEntry => write!(f, "a tensor entry does not match the model"),
            Stale::Layout => write!(f, "it holds other kernel layouts (--lut8, or another CPU)"),
            Stale::Payload => write!(f, "a tensor's bytes do not match their checksum (corrupt)"),
        }
    }
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(x)
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(x)
}

/// Bytes of a cache header's fixed part and `n` entries (without the payload hashes).
fn header_len(n: usize) -> usize {
    FIXED + n * ENTRY
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Serialize a cache header for `id` and `entries` into `out` (exactly
/// [`full_header_len`] bytes).
pub fn encode_header(id: &ModelId, entries: &[Entry], out: &mut [u8]) {
    out.fill(0);
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    out[16..24].copy_from_slice(&id.size.to_le_bytes());
    out[24..32].copy_from_slice(&id.stamp.to_le_bytes());
    out[32..40].copy_from_slice(&id.header_hash.to_le_bytes());
    out[40..48].copy_from_slice(&id.sample_hash.to_le_bytes());
    for (e, o) in entries.iter().zip(out[FIXED..].chunks_exact_mut(ENTRY)) {
        o[..e.name.len()].copy_from_slice(e.name.as_bytes());
        o[64..68].copy_from_slice(&(e.ty as u32).to_le_bytes());
        o[68..72].copy_from_slice(&e.layout.id().to_le_bytes());
        o[72..80].copy_from_slice(&e.model_offset.to_le_bytes());
        o[80..88].copy_from_slice(&e.offset.to_le_bytes());
        o[88..96].copy_from_slice(&e.len.to_le_bytes());
    }
    let base = FIXED + entries.len() * ENTRY;
    for (i, e) in entries.iter().enumerate() {
        out[base + 8 * i..base + 8 * i + 8].copy_from_slice(&e.hash.to_le_bytes());
    }
    let sum = Fnv::hash(out);
    out[48..56].copy_from_slice(&sum.to_le_bytes());
}

/// Bytes of a complete header (entries and their payload hashes) for `n` entries.
pub fn full_header_len(n: usize) -> usize {
    header_len(n) + 8 * n
}

/// Parse and check a cache header against the model (`id`, `g`) and the cache file's
/// size; the entries on success.
pub fn decode_header(
    bytes: &[u8],
    file_size: u64,
    id: &ModelId,
    g: &Gguf,
) -> Result<heapless::Vec<Entry, MAX_ENTRIES>, Stale> {
    if bytes.len() < FIXED {
        return Err(Stale::Truncated);
    }
    if bytes[0..8] != MAGIC {
        return Err(Stale::BadMagic);
    }
    let v = u32_at(bytes, 8);
    if v != VERSION {
        return Err(Stale::Version(v));
    }
    let n = u32_at(bytes, 12) as usize;
    if n > MAX_ENTRIES {
        return Err(Stale::BadEntry);
    }
    let hl = full_header_len(n);
    if bytes.len() < hl {
        return Err(Stale::Truncated);
    }
    let mut h = Fnv::new();
    h.bytes(&bytes[..48]);
    h.bytes(&[0u8; 8]);
    h.bytes(&bytes[FIXED..hl]);
    if h.0 != u64_at(bytes, 48) {
        return Err(Stale::Checksum);
    }
    if u64_at(bytes, 16) != id.size {
        return Err(Stale::ModelChanged("size"));
    }
    if u64_at(bytes, 24) != id.stamp {
        return Err(Stale::ModelChanged("modification time"));
    }
    if u64_at(bytes, 32) != id.header_hash {
        return Err(Stale::ModelChanged("GGUF header"));
    }
    if u64_at(bytes, 40) != id.sample_hash {
        return Err(Stale::ModelChanged("tensor data"));
    }
    let mut out = heapless::Vec::new();
    let mut end = align(hl as u64);
    for i in 0..n {
        let e = &bytes[FIXED + i * ENTRY..FIXED + (i + 1) * ENTRY];
        let name_len = e[..64].iter().position(|&c| c == 0).unwrap_or(64);
        let name = core::str::from_utf8(&e[..name_len]).map_err(|_| Stale::BadEntry)?;
        let info = g.tensor(name).ok_or(Stale::BadEntry)?;
        let layout = Layout::from_id(u32_at(e, 68)).ok_or(Stale::BadEntry)?;
        let entry = Entry {
            name: name_buf(name),
            ty: info.ty,
            layout,
            model_offset: u64_at(e, 72),
            offset: u64_at(e, 80),
            len: u64_at(e, 88),
            hash: u64_at(bytes, FIXED + n * ENTRY + 8 * i),
        };
        if u32_at(e, 64) != info.ty as u32
            || !layout.fits(info.ty)
            || entry.model_offset != info.offset
            || entry.len > info.bytes
            || entry.offset != end
        {
            return Err(Stale::BadEntry);
        }
        end = align(entry.offset + entry.len);
        out.push(entry).map_err(|_| Stale::BadEntry)?;
    }
    let last = out.last().map_or(hl as u64, |e| e.offset + e.len);
    if file_size != last {
        return Err(if file_size < last {
            Stale::Truncated
        } else {
            Stale::BadEntry
        });
    }
    Ok(out)
}

/// A matrix the loader may repack: where it is in the model and its geometry.
#[derive(Clone, Copy, Debug)]
struct Eligible {
    offset: u64,
    bytes: u64,
    row_bytes: usize,
    ty: GgmlType,
    layout: Layout,
}

/// What happened to one eligible read.
#[derive(Clone, Copy, Debug)]
struct Done {
    offset: u64,
    len: u64,
    layout: Layout,
    from_cache: bool,
}

struct State<'s> {
    scratch: &'s mut [u8],
    done: heapless::Vec<Done, MAX_ENTRIES>,
    /// Why the cache on disk cannot be used as it is (reported once).
    stale: Option<Stale>,
    reported: bool,
}

/// A loaded tensor as [`Repacking::finish`] sees it: its GGUF name, type and bytes,
/// and the layout `finish` found it in.
#[derive(Clone, Debug)]
pub struct Slot<'t> {
    pub name: NameBuf,
    pub ty: GgmlType,
    pub data: &'t [u8],
    pub layout: Layout,
}

/// Counts for the caller's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Tensors read repacked from the cache.
    pub from_cache: usize,
    /// Tensors repacked at load.
    pub repacked: usize,
    /// Bytes written to a new cache file (0: none written).
    pub written: u64,
    /// Repacked reads that matched no slot (a loader bug: that tensor's layout is
    /// unknown, so the caller must not run the model).
    pub unmatched: usize,
}

/// A platform that repacks (or reads from the cache) the loader's reads of resident
/// Q8_0 matrices, and passes everything else to `inner`. See the module doc.
pub struct Repacking<'p, 's, P: Platform> {
    inner: &'p P,
    id: ModelId,
    path: heapless::String<512>,
    writable: bool,
    eligible: heapless::Vec<Eligible, MAX_ENTRIES>,
    cache: Option<(P::File, heapless::Vec<Entry, MAX_ENTRIES>)>,
    state: spin::Mutex<State<'s>>,
}

/// `DIR/<stem of model_path>.pinch-repack`.
pub fn cache_path(dir: &str, model_path: &str) -> Option<heapless::String<512>> {
    let file = model_path.rsplit('/').next().unwrap_or(model_path);
    let stem = file.strip_suffix(".gguf").unwrap_or(file);
    let mut s = heapless::String::new();
    let dir = dir.trim_end_matches('/');
    write!(
        s,
        "{}/{stem}.pinch-repack",
        if dir.is_empty() { "." } else { dir }
    )
    .ok()?;
    Some(s)
}

/// Which layouts the loader repacks matrices into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repack {
    /// None: every read passes through (reference arithmetic, `--no-repack`).
    Off,
    /// Each type's preferred layout (`Layout::preferred`): the exact kernels.
    Exact,
    /// As `Exact`, but Q1_0 and Q2_0 in the inexact 8-bit table layouts where the CPU
    /// has their kernels (`--lut8`, `Layout::Q1_0x16Lut8` / `Q2_0x16Lut8`).
    Lut8,
}

impl From<bool> for Repack {
    fn from(on: bool) -> Repack {
        if on {
            Repack::Exact
        } else {
            Repack::Off
        }
    }
}

impl<'p, 's, P: Platform> Repacking<'p, 's, P> {
    /// Prepare repacking for the model `file` (`g`, at `model_path`): find the eligible
    /// matrices, take their scratch from `arena`, and, with `dir`, open and check the
    /// cache (a stale one is reported on stderr and will be rebuilt). Without `dir`
    /// tensors are repacked at load and nothing is written. With [`Repack::Off`]
    /// (reference arithmetic) every read passes through.
    pub fn new(
        inner: &'p P,
        file: &P::File,
        g: &Gguf,
        model_path: &str,
        dir: Option<&str>,
        mode: impl Into<Repack>,
        arena: &mut Arena<'s>,
    ) -> Result<Repacking<'p, 's, P>, ArenaError> {
        let mode = mode.into();
        let mut eligible = heapless::Vec::new();
        let mut scratch = 0usize;
        let cpu = inner.cpu();
        for t in g.tensors() {
            let Some(layout) = Layout::preferred_with(t.ty, &cpu, mode == Repack::Lut8) else {
                continue;
            };
            // Without a SIMD kernel for the layout, plain rows are faster.
            if mode == Repack::Off || !repack::has_fast_kernel(layout, &cpu) {
                continue;
            }
            let rows = t.rows() as usize;
            // A 3-D stack of experts is repacked as one matrix of all their rows when each
            // expert is whole groups, so every expert's rows stay a byte range of it.
            let stack_ok =
                t.dims[2] == 1 || (t.dims[1] as usize).is_multiple_of(layout.group_rows());
            if rows < layout.group_rows() || !stack_ok || t.dims[3] != 1 {
                continue;
            }
            let row_bytes = t.bytes as usize / rows;
            scratch = scratch.max(layout.scratch_bytes(row_bytes));
            let e = Eligible {
                offset: t.offset,
                bytes: t.bytes,
                row_bytes,
                ty: t.ty,
                layout,
            };
            if eligible.push(e).is_err() {
                break;
            }
        }
        let scratch = arena.bytes("repack scratch", scratch)?;
        let mut r = Repacking {
            inner,
            id: ModelId {
                size: 0,
                stamp: 0,
                header_hash: 0,
                sample_hash: 0,
            },
            path: heapless::String::new(),
            writable: false,
            eligible,
            cache: None,
            state: spin::Mutex::new(State {
                scratch,
                done: heapless::Vec::new(),
                stale: None,
                reported: false,
            }),
        };
        let Some(dir) = dir else {
            return Ok(r);
        };
        if r.eligible.is_empty() {
            // Nothing to repack (no Q8_0 matrix, no SIMD kernel, or reference math).
            return Ok(r);
        }
        let Some(path) = cache_path(dir, model_path) else {
            r.say(format_args!("repack cache: path too long under {dir}"));
            return Ok(r);
        };
        r.path = path;
        r.id = match ModelId::of(inner, file, g) {
            Ok(id) => id,
            Err(e) => {
                r.say(format_args!("repack cache: cannot read the model: {e}"));
                return Ok(r);
            }
        };
        r.writable = true;
        let Ok(cf) = inner.open(&r.path) else {
            // No cache yet: the first run writes it.
            return Ok(r);
        };
        let size = inner.file_size(&cf);
        let mut head = [0u8; FIXED];
        let n = read_full(inner, &cf, 0, &mut head).unwrap_or(0);
        let checked = if n < FIXED {
            Err(Stale::Truncated)
        } else {
            let count = (u32_at(&head, 12) as usize).min(MAX_ENTRIES + 1);
            let hl = full_header_len(count);
            match arena.bytes("repack cache header", hl) {
                Ok(buf) => {
                    let got = read_full(inner, &cf, 0, buf).unwrap_or(0);
                    decode_header(&buf[..got], size, &r.id, g)
                }
                Err(_) => Err(Stale::BadEntry),
            }
        };
        match checked {
            Ok(entries) => r.cache = Some((cf, entries)),
            Err(why) => r.state.lock().stale = Some(why),
        }
        Ok(r)
    }

    fn say(&self, args: core::fmt::Arguments) {
        let mut err = Out::stderr(self.inner);
        let _ = writeln!(err, "pinch: {args}");
    }

    fn report_stale(&self, st: &mut State) {
        if let (Some(why), false) = (st.stale, st.reported) {
            st.reported = true;
            self.say(format_args!(
                "repack cache {} is stale: {why}; rebuilding it",
                self.path
            ));
        }
    }

    /// The eligible matrix a read of `len` bytes at `offset` is, if any: it starts at
    /// the matrix and covers whole rows of it (a group or more).
    fn eligible_read(&self, offset: u64, len: usize) -> Option<Eligible> {
        let e = *self.eligible.iter().find(|e| e.offset == offset)?;
        let ok = len as u64 <= e.bytes
            && len.is_multiple_of(e.row_bytes)
            && len / e.row_bytes >= e.layout.group_rows();
        ok.then_some(e)
    }

    /// Serve an eligible read from the cache if it holds exactly these bytes.
    fn read_cached(&self, e: &Eligible, buf: &mut [u8], st: &mut State) -> bool {
        let Some((cf, entries)) = &self.cache else {
            return false;
        };
        let Some(c) = entries.iter().find(|c| c.model_offset == e.offset) else {
            st.stale.get_or_insert(Stale::BadEntry);
            return false;
        };
        if c.layout != e.layout {
            st.stale.get_or_insert(Stale::Layout);
            return false;
        }
        if c.len != buf.len() as u64 {
            // Another residency (a head with more or fewer resident rows): rebuild.
            st.stale.get_or_insert(Stale::BadEntry);
            return false;
        }
        match read_full(self.inner, cf, c.offset, buf) {
            Ok(n) if n == buf.len() && payload_hash(buf) == c.hash => true,
            Ok(n) if n < buf.len() => {
                st.stale.get_or_insert(Stale::Truncated);
                false
            }
            _ => {
                st.stale.get_or_insert(Stale::Payload);
                false
            }
        }
    }

    /// Set the layouts of the loaded tensors `slots` (the ones read through this
    /// platform are repacked) and, when a cache directory was given and something was repacked
    /// afresh (or the cache was stale), write the cache from them.
    pub fn finish(&self, g: &Gguf, slots: &mut [Slot], arena: &mut Arena) -> Summary {
        let mut st = self.state.lock();
        let mut sum = Summary::default();
        let mut entries: heapless::Vec<Entry, MAX_ENTRIES> = heapless::Vec::new();
        let mut fresh = false;
        for t in slots.iter_mut() {
            let Some(d) = st
                .done
                .iter()
                .find(|d| {
                    d.len == t.data.len() as u64
                        && g.tensor(&t.name).map(|i| i.offset) == Some(d.offset)
                })
                .copied()
            else {
                continue;
            };
            t.layout = d.layout;
            if d.from_cache {
                sum.from_cache += 1;
            } else {
                sum.repacked += 1;
                fresh = true;
            }
            let _ = entries.push(Entry {
                name: t.name.clone(),
                ty: t.ty,
                layout: d.layout,
                model_offset: d.offset,
                offset: 0,
                len: d.len,
                hash: 0,
            });
        }
        sum.unmatched = st
            .done
            .iter()
            .filter(|d| !entries.iter().any(|e| e.model_offset == d.offset))
            .count();
        if !self.writable || (!fresh && st.stale.is_none()) {
            return sum;
        }
        if self.cache.is_some() || st.stale.is_some() {
            st.stale.get_or_insert(Stale::BadEntry);
            self.report_stale(&mut st);
        }
        drop(st);
        // Payload offsets and hashes.
        let hl = full_header_len(entries.len());
        let mut at = align(hl as u64);
        for e in entries.iter_mut() {
            e.offset = at;
            at = align(at + e.len);
            let data = slots
                .iter()
                .find(|t| t.name == e.name)
                .map_or(&[][..], |t| t.data);
            e.hash = payload_hash(data);
        }
        let Ok(header) = arena.bytes("repack cache header", hl) else {
            self.say(format_args!(
                "repack cache: no memory for the header; not written"
            ));
            return sum;
        };
        encode_header(&self.id, &entries, header);
        const PAD: [u8; ALIGN as usize] = [0; ALIGN as usize];
        let mut parts: heapless::Vec<&[u8], { 2 * MAX_ENTRIES + 2 }> = heapless::Vec::new();
        let _ = parts.push(header);
        let mut pos = hl as u64;
        for e in entries.iter() {
            let _ = parts.push(&PAD[..(e.offset - pos) as usize]);
            let data = slots
                .iter()
                .find(|t| t.name == e.name)
                .map_or(&[][..], |t| t.data);
            let _ = parts.push(data);
            pos = e.offset + e.len;
        }
        match self.inner.write_file(&self.path, &parts) {
            Ok(()) => {
                sum.written = pos;
                self.say(format_args!(
                    "repack cache: wrote {} ({} tensors, {} bytes)",
                    self.path,
                    entries.len(),
                    pos
                ));
            }
            Err(e) => self.say(format_args!(
                "repack cache: cannot write {}: {e}",
                self.path
            )),
        }
        sum
    }
}

impl<P: Platform> Platform for Repacking<'_, '_, P> {
    type File = P::File;

    fn open(&self, path: &str) -> Result<P::File, PlatformError> {
        self.inner.open(path)
    }
    fn file_size(&self, file: &P::File) -> u64 {
        self.inner.file_size(file)
    }
    fn read_at(
        &self,
        file: &P::File,
        offset: u64,
        buf: &mut [u8],
        direct: bool,
    ) -> Result<usize, PlatformError> {
        let Some(e) = self.eligible_read(offset, buf.len()) else {
            return self.inner.read_at(file, offset, buf, direct);
        };
        let mut st = self.state.lock();
        let from_cache = self.read_cached(&e, buf, &mut st);
        if !from_cache {
            let n = read_full(self.inner, file, offset, buf)?;
            if n < buf.len() {
                return Ok(n);
            }
            let st = &mut *st;
            if repack::repack_in_place(e.layout, e.ty, buf, e.row_bytes, st.scratch).is_err() {
                return Ok(n);
            }
        }
        let _ = st.done.push(Done {
            offset,
            len: buf.len() as u64,
            layout: e.layout,
            from_cache,
        });
        Ok(buf.len())
    }
    fn map<'f>(&self, file: &'f P::File, offset: u64, len: usize) -> Option<&'f [u8]> {
        // A mapped view of an eligible matrix would bypass the repacking.
        if self.eligible_read(offset, len).is_some() {
            return None;
        }
        self.inner.map(file, offset, len)
    }
    fn file_stamp(&self, file: &P::File) -> Option<u64> {
        self.inner.file_stamp(file)
    }
    fn write_file(&self, path: &str, parts: &[&[u8]]) -> Result<(), PlatformError> {
        self.inner.write_file(path, parts)
    }
    fn region(&self, bytes: usize) -> Result<&'static mut [u8], PlatformError> {
        self.inner.region(bytes)
    }
    fn available_memory(&self) -> Option<u64> {
        self.inner.available_memory()
    }
    fn rss(&self) -> Option<u64> {
        self.inner.rss()
    }
    fn peak_rss(&self) -> Option<u64> {
        self.inner.peak_rss()
    }
    fn workers(&self) -> usize {
        self.inner.workers()
    }
    fn parallel(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.inner.parallel(n, f)
    }
    fn cpu(&self) -> CpuFeatures {
        self.inner.cpu()
    }
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
    fn stdout(&self, bytes: &[u8]) {
        self.inner.stdout(bytes)
    }
    fn stderr(&self, bytes: &[u8]) {
        self.inner.stderr(bytes)
    }
    fn read_line(&self, buf: &mut [u8]) -> Option<usize> {
        self.inner.read_line(buf)
    }
    fn tcp_listen(&self, host: &str, port: u16) -> Result<(Socket, u16), PlatformError> {
        self.inner.tcp_listen(host, port)
    }
    fn tcp_accept(&self, listener: Socket) -> Result<Option<Socket>, PlatformError> {
        self.inner.tcp_accept(listener)
    }
    fn tcp_recv(&self, conn: Socket, buf: &mut [u8]) -> Result<Recv, PlatformError> {
        self.inner.tcp_recv(conn, buf)
    }
    fn tcp_send(&self, conn: Socket, bytes: &[u8]) -> Result<(), PlatformError> {
        self.inner.tcp_send(conn, bytes)
    }
    fn tcp_close(&self, sock: Socket) {
        self.inner.tcp_close(sock)
    }
    fn sleep_ms(&self, ms: u32) {
        self.inner.sleep_ms(ms)
    }
}

fn slot<'t>(name: &str, t: &Tensor<'t>) -> Slot<'t> {
    Slot {
        name: name_buf(name),
        ty: t.ty,
        data: t.data,
        layout: Layout::Plain,
    }
}

/// After `Loader` read the weights through `rp`: record the layout of every resident
/// matrix in `w` (the tied embedding's resident rows share the head's), and write the
/// cache when `rp` has one to write. An error when a repacked read matches no tensor
/// (its layout would be unknown).
pub fn apply<P: Platform>(
    rp: &Repacking<'_, '_, P>,
    g: &Gguf,
    w: &mut Weights,
    arena: &mut Arena,
) -> Result<Summary, ModelError> {
    let tied = g.tensor("output.weight").is_none();
    let mut slots: heapless::Vec<Slot, MAX_ENTRIES> = heapless::Vec::new();
    let head = if tied {
        "token_embd.weight"
    } else {
        "output.weight"
    };
    let _ = slots.push(slot(head, &w.output));
    let mut name = NameBuf::new();
    for (il, lw) in w.layers.iter_mut().enumerate() {
        if lw.stream.is_some() {
            continue;
        }
        lw.visit_matrices(&mut |suffix, t| {
            name.clear();
            let _ = write!(name, "blk.{il}.{suffix}");
            let _ = slots.push(slot(&name, t));
        });
    }
    let sum = rp.finish(g, &mut slots, arena);
    if sum.unmatched > 0 {
        return Err(ModelError::BadShape(
            "repack: a repacked read matches no loaded tensor (a bug: run without --repack-cache)",
        ));
    }
    let mut layouts = slots.iter().map(|s| s.layout);
    let shares = core::ptr::eq(w.token_embd.resident.data, w.output.data);
    w.output.layout = layouts.next().unwrap_or_default();
    if shares {
        w.token_embd.resident.layout = w.output.layout;
    }
    for lw in w.layers.iter_mut() {
        if lw.stream.is_some() {
            continue;
        }
        lw.visit_matrices(&mut |_, t| t.layout = layouts.next().unwrap_or_default());
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::collections::BTreeMap;
    use std::string::{String, ToString};
    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::gguf::{GgufWriter, Sink, Value};

    /// Files in memory with a stamp each; stderr collected.
    #[derive(Default)]
    struct Fake {
        files: spin::Mutex<BTreeMap<String, (Vec<u8>, u64)>>,
        err: spin::Mutex<String>,
        clock: spin::Mutex<u64>,
    }

    /// An open file: its contents and stamp when opened.
    struct FakeFile(Vec<u8>, u64);

    impl Fake {
        fn put(&self, path: &str, bytes: Vec<u8>) {
            let mut c = self.clock.lock();
            *c += 1;
            self.files.lock().insert(path.to_string(), (bytes, *c));
        }
        fn get(&self, path: &str) -> Option<Vec<u8>> {
            self.files.lock().get(path).map(|f| f.0.clone())
        }
        /// Change a file's bytes but keep its stamp.
        fn poke(&self, path: &str, at: usize, v: u8) {
            self.files.lock().get_mut(path).unwrap().0[at] = v;
        }
        fn take_err(&self) -> String {
            core::mem::take(&mut *self.err.lock())
        }
    }

    impl Platform for Fake {
        type File = FakeFile;
        fn open(&self, path: &str) -> Result<FakeFile, PlatformError> {
            let f = self.files.lock();
            let (b, s) = f.get(path).ok_or(PlatformError::Open { code: 2 })?;
            Ok(FakeFile(b.clone(), *s))
        }
        fn file_size(&self, f: &FakeFile) -> u64 {
            f.0.len() as u64
        }
        fn read_at(
            &self,
            f: &FakeFile,
            offset: u64,
            buf: &mut [u8],
            _: bool,
        ) -> Result<usize, PlatformError> {
            let o = (offset as usize).min(f.0.len());
            let n = buf.len().min(f.0.len() - o);
            buf[..n].copy_from_slice(&f.0[o..o + n]);
            Ok(n)
        }
        fn map<'f>(&self, _: &'f FakeFile, _: u64, _: usize) -> Option<&'f [u8]> {
            None
        }
        fn file_stamp(&self, f: &FakeFile) -> Option<u64> {
            Some(f.1)
        }
        fn write_file(&self, path: &str, parts: &[&[u8]]) -> Result<(), PlatformError> {
            if path.starts_with("/readonly/") {
                return Err(PlatformError::Write { code: 30 });
            }
            self.put(path, parts.concat());
            Ok(())
        }
        fn region(&self, _: usize) -> Result<&'static mut [u8], PlatformError> {
            Err(PlatformError::Unsupported("region"))
        }
        fn available_memory(&self) -> Option<u64> {
            None
        }
        fn rss(&self) -> Option<u64> {
            None
        }
        fn peak_rss(&self) -> Option<u64> {
            None
        }
        fn workers(&self) -> usize {
            1
        }
        fn parallel(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            for i in 0..n {
                f(i)
            }
        }
        fn cpu(&self) -> CpuFeatures {
            // Repacking needs a SIMD kernel: what the test machine has, without dotprod
            // (the tests expect the Q8_0x4 layout).
            CpuFeatures::detect().without(pinch_kernels::cpu::Feature::Dotprod)
        }
        fn now_ns(&self) -> u64 {
            0
        }
        fn stdout(&self, _: &[u8]) {}
        fn stderr(&self, b: &[u8]) {
            self.err.lock().push_str(core::str::from_utf8(b).unwrap());
        }
    }

    #[derive(Default)]
    struct VecSink(Vec<u8>);
    impl Sink for VecSink {
        type Error = ();
        fn write(&mut self, b: &[u8]) -> Result<(), ()> {
            self.0.extend_from_slice(b);
            Ok(())
        }
    }

    const MODEL: &str = "/m/tiny.gguf";
    const CACHE: &str = "/c/tiny.pinch-repack";
    /// Q8_0 `a` (9 rows of 64: two groups and a plain row), Q8_0 `b` (4 rows of 32),
    /// F32 `c`.
    const TENSORS: [(&str, usize, usize); 2] = [("a.weight", 64, 9), ("b.weight", 32, 4)];

    fn model() -> Vec<u8> {
        let mut w = GgufWriter::new(VecSink::default(), 3, 1).unwrap();
        w.kv("general.architecture", Value::Str("llama")).unwrap();
        for (name, cols, rows) in TENSORS {
            w.tensor_info(name, GgmlType::Q8_0, &[cols as u64, rows as u64])
                .unwrap();
        }
        w.tensor_info("c.weight", GgmlType::F32, &[32]).unwrap();
        let mut seed = 1u32;
        for (_, cols, rows) in TENSORS {
            let mut d: Vec<u8> = (0..cols / 32 * 34 * rows)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (seed >> 16) as u8
                })
                .collect();
            for b in d.chunks_mut(34) {
                b[..2].copy_from_slice(&pinch_kernels::f16::f32_to_f16(0.03).to_le_bytes());
            }
            w.tensor_data(&d).unwrap();
        }
        w.tensor_data(&[0u8; 128]).unwrap();
        w.finish().unwrap().0
    }

    /// What a loader does: read every Q8_0 tensor (`rows_read` rows of `a`) through the
    /// repacking platform, then `finish`. Returns the loaded bytes, layouts and summary.
    fn load(p: &Fake, dir: Option<&str>, rows_read: usize) -> (Vec<(Vec<u8>, Layout)>, Summary) {
        let file = p.open(MODEL).unwrap();
        let hdr = p.get(MODEL).unwrap();
        let g = Gguf::parse(&hdr, hdr.len() as u64).unwrap();
        let mut region = vec![0u8; 1 << 16];
        let mut arena = Arena::new(&mut region);
        let r = Repacking::new(p, &file, &g, MODEL, dir, true, &mut arena).unwrap();
        let mut bufs = Vec::new();
        for (name, _, rows) in TENSORS {
            let info = g.tensor(name).unwrap();
            let rb = info.bytes as usize / rows;
            let n = if name == "a.weight" { rows_read } else { rows };
            let mut buf = vec![0u8; n * rb];
            let got = read_full(&r, &file, info.offset, &mut buf).unwrap();
            assert_eq!(got, buf.len());
            bufs.push(buf);
        }
        let mut slots: Vec<Slot> = TENSORS
            .iter()
            .zip(&bufs)
            .map(|((name, ..), b)| Slot {
                name: name_buf(name),
                ty: GgmlType::Q8_0,
                data: b,
                layout: Layout::Plain,
            })
            .collect();
        let sum = r.finish(&g, &mut slots, &mut arena);
        let layouts: Vec<Layout> = slots.iter().map(|s| s.layout).collect();
        (bufs.into_iter().zip(layouts).collect(), sum)
    }

    /// The expected loaded bytes: the model's tensors repacked.
    fn expected(m: &[u8], rows_read: usize) -> Vec<Vec<u8>> {
        let g = Gguf::parse(m, m.len() as u64).unwrap();
        TENSORS
            .iter()
            .map(|(name, _, rows)| {
                let info = g.tensor(name).unwrap();
                let rb = info.bytes as usize / rows;
                let n = if *name == "a.weight" {
                    rows_read
                } else {
                    *rows
                };
                let o = info.offset as usize;
                let mut t = m[o..o + n * rb].to_vec();
                let mut s = vec![0u8; 4 * rb];
                repack::repack_in_place(Layout::Q8_0x4, GgmlType::Q8_0, &mut t, rb, &mut s)
                    .unwrap();
                t
            })
            .collect()
    }

    fn check(p: &Fake, got: &[(Vec<u8>, Layout)], rows_read: usize) {
        for ((b, l), e) in got.iter().zip(expected(&p.get(MODEL).unwrap(), rows_read)) {
            assert_eq!(*l, Layout::Q8_0x4);
            assert!(*b == e, "loaded bytes differ from the repacked model");
        }
    }

    fn setup() -> Fake {
        let p = Fake::default();
        p.put(MODEL, model());
        p
    }

    #[test]
    fn first_run_writes_second_reads_and_both_load_the_same_bytes() {
        let p = setup();
        let (a, s1) = load(&p, Some("/c"), 9);
        check(&p, &a, 9);
        assert_eq!((s1.repacked, s1.from_cache), (2, 0));
        let file = p.get(CACHE).expect("cache written");
        assert_eq!(s1.written, file.len() as u64);
        assert_eq!(&file[..8], &MAGIC);
        assert!(p.take_err().contains("wrote /c/tiny.pinch-repack"));
        let (b, s2) = load(&p, Some("/c/"), 9);
        assert_eq!((s2.repacked, s2.from_cache, s2.written), (0, 2, 0));
        assert_eq!(a, b);
        assert_eq!(p.take_err(), "", "a valid cache is used silently");
        assert_eq!(
            p.get(CACHE).unwrap(),
            file,
            "a valid cache is not rewritten"
        );
    }

    #[test]
    fn without_a_directory_tensors_are_repacked_and_nothing_is_written() {
        let p = setup();
        let (a, s) = load(&p, None, 9);
        check(&p, &a, 9);
        assert_eq!((s.repacked, s.written), (2, 0));
        assert_eq!(p.files.lock().len(), 1);
    }

    /// Every kind of stale or corrupt cache is reported in one line and rebuilt, and the
    /// run loads the right bytes regardless.
    #[test]
    fn stale_or_corrupt_caches_are_reported_and_rebuilt() {
        type Damage = fn(&Fake);
        let cases: [(&str, Damage, &str); 9] = [
            (
                "model stamp",
                |p| p.put(MODEL, model()),
                "modification time",
            ),
            (
                "model size",
                |p| {
                    let mut m = model();
                    m.extend_from_slice(&[0; 32]);
                    p.put(MODEL, m)
                },
                "size",
            ),
            (
                "model data, same stamp",
                |p| {
                    let m = model();
                    let g = Gguf::parse(&m, m.len() as u64).unwrap();
                    p.poke(MODEL, g.data_offset as usize + 5, 0x55);
                },
                "tensor data",
            ),
            (
                "truncated cache",
                |p| {
                    let mut c = p.get(CACHE).unwrap();
                    c.truncate(c.len() - 7);
                    p.put(CACHE, c)
                },
                "truncated",
            ),
            (
                "header cut",
                |p| p.put(CACHE, p.get(CACHE).unwrap()[..20].to_vec()),
                "truncated",
            ),
            ("bad magic", |p| p.poke(CACHE, 0, b'X'), "bad magic"),
            (
                "version",
                |p| {
                    let mut c = p.get(CACHE).unwrap();
                    c[8] = 99;
                    p.put(CACHE, c)
                },
                "format version 99",
            ),
            ("corrupt entry", |p| p.poke(CACHE, FIXED + 70, 1), "corrupt"),
            (
                "corrupt payload",
                |p| {
                    let c = p.get(CACHE).unwrap();
                    let at = c.len() - 3;
                    p.poke(CACHE, at, c[at] ^ 1)
                },
                "checksum",
            ),
        ];
        for (what, damage, why) in cases {
            let p = setup();
            load(&p, Some("/c"), 9);
            p.take_err();
            damage(&p);
            let (a, s) = load(&p, Some("/c"), 9);
            check(&p, &a, 9);
            let err = p.take_err();
            let stale: Vec<&str> = err.lines().filter(|l| l.contains("stale")).collect();
            assert_eq!(stale.len(), 1, "{what}: {err}");
            assert!(stale[0].contains(why), "{what}: {err}");
            assert!(stale[0].contains("rebuilding"), "{what}: {err}");
            assert!(s.repacked >= 1 && s.written > 0, "{what}: {s:?}");
            // Rebuilt: the next run reads everything from the cache, silently.
            let (b, s) = load(&p, Some("/c"), 9);
            assert_eq!((s.repacked, s.from_cache), (0, 2), "{what}");
            assert_eq!(a, b, "{what}");
            assert_eq!(p.take_err(), "", "{what}");
        }
    }

    #[test]
    fn another_residency_of_a_tensor_rebuilds_the_cache() {
        let p = setup();
        load(&p, Some("/c"), 9);
        p.take_err();
        let (a, s) = load(&p, Some("/c"), 5);
        check(&p, &a, 5);
        assert_eq!((s.repacked, s.from_cache), (1, 1));
        assert!(p.take_err().contains("stale"));
        let (_, s) = load(&p, Some("/c"), 5);
        assert_eq!((s.repacked, s.from_cache), (0, 2));
    }

    #[test]
    fn reads_that_are_not_whole_eligible_tensors_pass_through() {
        let p = setup();
        let m = model();
        let g = Gguf::parse(&m, m.len() as u64).unwrap();
        let file = p.open(MODEL).unwrap();
        let mut region = vec![0u8; 1 << 16];
        let mut arena = Arena::new(&mut region);
        let r = Repacking::new(&p, &file, &g, MODEL, None, true, &mut arena).unwrap();
        let info = g.tensor("a.weight").unwrap();
        let o = info.offset as usize;
        // One row, three rows, a read starting one row in, the F32 tensor.
        for (start, len) in [(0usize, 68usize), (0, 3 * 68), (68, 4 * 68)] {
            let mut buf = vec![0u8; len];
            read_full(&r, &file, (o + start) as u64, &mut buf).unwrap();
            assert_eq!(buf, m[o + start..o + start + len]);
        }
        let c = g.tensor("c.weight").unwrap();
        let mut buf = vec![0u8; 128];
        read_full(&r, &file, c.offset, &mut buf).unwrap();
        assert_eq!(buf, m[c.offset as usize..c.offset as usize + 128]);
        let s = r.finish(&g, &mut [], &mut arena);
        assert_eq!(s, Summary::default());
    }

    #[test]
    fn an_unwritable_directory_is_reported_and_the_run_goes_on() {
        let p = setup();
        let (a, s) = load(&p, Some("/readonly"), 9);
        check(&p, &a, 9);
        assert_eq!(s.written, 0);
        assert!(p
            .take_err()
            .contains("cannot write /readonly/tiny.pinch-repack"));
    }

    #[test]
    fn cache_path_uses_the_model_stem() {
        assert_eq!(
            cache_path("/tmp/c/", "/x/y/gemma.gguf").unwrap().as_str(),
            "/tmp/c/gemma.pinch-repack"
        );
        assert_eq!(
            cache_path("", "m.bin").unwrap().as_str(),
            "./m.bin.pinch-repack"
        );
    }
}

#[cfg(test)]
mod speed {
    extern crate std;

    /// `cargo test --release -p pinch-runtime-min --lib payload_hash_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn payload_hash_speed() {
        let b: std::vec::Vec<u8> = (0..178_257_920u32)
            .map(|i| (i * 7 + (i >> 9)) as u8)
            .collect();
        let mut best = f64::MAX;
        let mut h = 0;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            h ^= super::payload_hash(std::hint::black_box(&b));
            best = best.min(t.elapsed().as_secs_f64());
        }
        std::println!(
            "payload_hash: {:.1} GB/s ({:.1} ms for 178 MB) {h:x}",
            b.len() as f64 / best / 1e9,
            best * 1e3
        );
    }
}
