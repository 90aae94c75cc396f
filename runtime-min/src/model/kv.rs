//! One attention layer's keys or values: a row per position of the context, or, for a
//! sliding-window layer, a ring of the last positions.
//!
//! The ring keeps every row twice, at `pos % ring` and `pos % ring + ring`: any run of at
//! most `ring` consecutive positions is then one contiguous slice, so attention reads a
//! window exactly as it reads a full cache (same values, same order, same bits).
//!
//! A plane holds one region of rows per sequence (`--parallel`); reads and writes go to
//! the region [`KvPlane::select`] chose, so a sequence sees exactly the rows it would
//! see alone.
use pinch_kernels::attn::{KvRow, KvRows};
use pinch_kernels::attn_q8::{self, Q8Rows};
use pinch_kernels::f16::narrow_slice;
use pinch_kernels::quant::q8_0::{BLOCK_BYTES, QK};
use pinch_kernels::CpuFeatures;

use crate::arena::{Arena, ArenaError};

/// Storage type of cached keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    /// llama.cpp's Q8_0 blocks (32 int8 values along the head dimension, one f16
    /// scale: 34 bytes per 32 values); needs a head dimension that is a multiple of 32.
    Q8_0,
}

impl KvType {
    /// Bytes of a row of `values` values (`None` for Q8_0 when `values` is not a
    /// multiple of 32).
    pub fn row_bytes(self, values: usize) -> Option<usize> {
        match self {
            KvType::F32 => values.checked_mul(4),
            KvType::F16 => values.checked_mul(2),
            KvType::Q8_0 => attn_q8::row_bytes(values),
        }
    }

    /// The name llama.cpp's `--cache-type-k/v` uses.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// The type `name` (one of [`Self::name`]'s) names.
    pub fn parse(name: &str) -> Option<KvType> {
        [KvType::F32, KvType::F16, KvType::Q8_0]
            .into_iter()
            .find(|t| t.name() == name)
    }
}

enum Store<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [u16]),
    /// `dim / 32` Q8_0 blocks per row.
    Q8(&'a mut [u8]),
}

/// Rows of one KV head over a span of positions, in the plane's storage type.
pub enum Rows<'k> {
    Float(KvRows<'k>),
    Q8(Q8Rows<'k>),
}

/// One layer's K or V: per sequence, `n_ctx` rows of `dim` values, or a doubled ring
/// of `ring` rows.
pub struct KvPlane<'a> {
    store: Store<'a>,
    dim: usize,
    /// Ring length in positions (0: one row per position of the context).
    ring: usize,
    /// Rows of one sequence's region.
    region: usize,
    /// The sequence whose region reads and writes use.
    seq: usize,
}

impl<'a> KvPlane<'a> {
    /// A plane of `n_ctx` rows for each of `n_seq` sequences.
    pub fn new(
        arena: &mut Arena<'a>,
        ty: KvType,
        n_ctx: usize,
        dim: usize,
        n_seq: usize,
    ) -> Result<KvPlane<'a>, ArenaError> {
        const OVERFLOW: ArenaError = ArenaError::Overflow {
            account: "kv cache",
        };
        let n = n_ctx
            .checked_mul(n_seq.max(1))
            .and_then(|r| r.checked_mul(dim))
            .ok_or(OVERFLOW)?;
        let store = match ty {
            KvType::F32 => Store::F32(arena.slice("kv cache", n)?),
            KvType::F16 => Store::F16(arena.slice("kv cache", n)?),
            // Callers check the row length (Session::new); a partial block is an overflow.
            KvType::Q8_0 => Store::Q8(arena.slice("kv cache", ty.row_bytes(n).ok_or(OVERFLOW)?)?),
        };
        Ok(KvPlane {
            store,
            dim,
            ring: 0,
            region: n_ctx,
            seq: 0,
        })
    }

    /// Reads and writes go to sequence `seq`'s region from now on (`seq` below the
    /// plane's sequence count).
    pub fn select(&mut self, seq: usize) {
        self.seq = seq;
    }

    /// A plane that keeps only the last `ring` positions (as a doubled ring: `2 * ring`
    /// rows) in each of `n_seq` regions. Reads of up to `ring` consecutive positions
    /// ending at the newest are valid.
    pub fn new_ring(
        arena: &mut Arena<'a>,
        ty: KvType,
        ring: usize,
        dim: usize,
        n_seq: usize,
    ) -> Result<KvPlane<'a>, ArenaError> {
        let mut plane = KvPlane::new(arena, ty, 2 * ring, dim, n_seq)?;
        plane.ring = ring;
        Ok(plane)
    }

    /// Rows a plane for `n_ctx` positions needs: a ring when a window of `window`
    /// positions (0: none) seen by a batch of `n_batch` is much shorter than the context.
    pub fn rows_needed(n_ctx: usize, window: usize, n_batch: usize) -> (usize, usize) {
        let ring = window + n_batch;
        if window > 0 && 2 * ring < n_ctx {
            (2 * ring, ring)
        } else {
            (n_ctx, 0)
        }
    }

    /// Physical row of position `pos`.
    #[inline]
    fn slot(&self, pos: usize) -> usize {
        let base = self.seq * self.region;
        if self.ring == 0 {
            base + pos
        } else {
            base + pos % self.ring
        }
    }

    fn put(&mut self, feat: &CpuFeatures, slot: usize, x: &[f32]) {
        let d = self.dim;
        match &mut self.store {
            Store::F32(s) => s[slot * d..(slot + 1) * d].copy_from_slice(x),
            Store::F16(s) => narrow_slice(feat, x, &mut s[slot * d..(slot + 1) * d]),
            Store::Q8(s) => {
                let rb = d / QK * BLOCK_BYTES;
                attn_q8::quantize(x, &mut s[slot * rb..(slot + 1) * rb]);
            }
        }
    }

    /// Store `x` (len dim) at position `pos` (f16 conversions on the fastest path
    /// `feat` allows, same bits).
    pub fn write(&mut self, feat: &CpuFeatures, pos: usize, x: &[f32]) {
        let slot = self.slot(pos);
        self.put(feat, slot, x);
        if self.ring > 0 {
            self.put(feat, slot + self.ring, x);
        }
    }

    /// The bytes of the selected sequence's positions `from..` (nothing there is
    /// needed once `from` is the number of positions in use). A ring has no such tail:
    /// it is small, and reused.
    pub fn tail_bytes_mut(&mut self, from: usize) -> &mut [u8] {
        let end = (self.seq + 1) * self.region;
        let from = if self.ring > 0 {
            end
        } else {
            (self.seq * self.region + from).min(end)
        };
        let (start, end) = (from.saturating_mul(self.dim), end.saturating_mul(self.dim));
        match &mut self.store {
            Store::F32(s) => {
                let end = end.min(s.len());
                pinch_kernels::blocks::bytes_of_mut(&mut s[start.min(end)..end])
            }
            Store::F16(s) => {
                let end = end.min(s.len());
                pinch_kernels::blocks::bytes_of_mut(&mut s[start.min(end)..end])
            }
            Store::Q8(s) => {
                let b = |v: usize| (v / QK).saturating_mul(BLOCK_BYTES).min(s.len());
                let (start, end) = (b(start), b(end));
                &mut s[start..end]
            }
        }
    }

    /// Columns `off..off + len` of the `n` positions from `first` on (in a ring, at
    /// most `ring` positions). For Q8_0, `off` and `len` are multiples of 32.
    #[inline]
    pub fn rows(&self, first: usize, n: usize, off: usize, len: usize) -> Rows<'_> {
        let d = self.dim;
        let start = self.slot(first) * d + off;
        let flat = n.saturating_sub(1) * d + len;
        match &self.store {
            Store::F32(s) => {
                Rows::Float(KvRows::new(KvRow::F32(&s[start..start + flat]), d, len, n))
            }
            Store::F16(s) => {
                Rows::Float(KvRows::new(KvRow::F16(&s[start..start + flat]), d, len, n))
            }
            Store::Q8(s) => {
                let b = |v: usize| v / QK * BLOCK_BYTES;
                Rows::Q8(Q8Rows::new(
                    &s[b(start)..b(start + flat)],
                    d / QK,
                    len / QK,
                    n,
                ))
            }
        }
    }
}
