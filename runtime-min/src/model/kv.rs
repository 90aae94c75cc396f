//! One attention layer's keys or values: a row per position of the context, or, for a
//! sliding-window layer, a ring of the last positions.
//!
//! The ring keeps every row twice, at `pos % ring` and `pos % ring + ring`: any run of at
//! most `ring` consecutive positions is then one contiguous slice, so attention reads a
//! window exactly as it reads a full cache (same values, same order, same bits).
use pinch_kernels::attn::KvRow;
use pinch_kernels::f16::f32_to_f16;

use crate::arena::{Arena, ArenaError};

/// Storage type of cached keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    pub fn bytes_per_value(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

enum Store<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [u16]),
}

/// One layer's K or V: `n_ctx` rows of `dim` values, or a doubled ring of `ring` rows.
pub struct KvPlane<'a> {
    store: Store<'a>,
    dim: usize,
    /// Ring length in positions (0: one row per position of the context).
    ring: usize,
}

impl<'a> KvPlane<'a> {
    pub fn new(
        arena: &mut Arena<'a>,
        ty: KvType,
        n_ctx: usize,
        dim: usize,
    ) -> Result<KvPlane<'a>, ArenaError> {
        let n = n_ctx.checked_mul(dim).ok_or(ArenaError::Overflow {
            account: "kv cache",
        })?;
        let store = match ty {
            KvType::F32 => Store::F32(arena.slice("kv cache", n)?),
            KvType::F16 => Store::F16(arena.slice("kv cache", n)?),
        };
        Ok(KvPlane {
            store,
            dim,
            ring: 0,
        })
    }

    /// A plane that keeps only the last `ring` positions (as a doubled ring: `2 * ring`
    /// rows). Reads of up to `ring` consecutive positions ending at the newest are valid.
    pub fn new_ring(
        arena: &mut Arena<'a>,
        ty: KvType,
        ring: usize,
        dim: usize,
    ) -> Result<KvPlane<'a>, ArenaError> {
        let mut plane = KvPlane::new(arena, ty, 2 * ring, dim)?;
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
        if self.ring == 0 {
            pos
        } else {
            pos % self.ring
        }
    }

    fn put(&mut self, slot: usize, x: &[f32]) {
        let d = self.dim;
        match &mut self.store {
            Store::F32(s) => s[slot * d..(slot + 1) * d].copy_from_slice(x),
            Store::F16(s) => {
                for (o, v) in s[slot * d..(slot + 1) * d].iter_mut().zip(x) {
                    *o = f32_to_f16(*v);
                }
            }
        }
    }

    /// Store `x` (len dim) at position `pos`.
    pub fn write(&mut self, pos: usize, x: &[f32]) {
        let slot = self.slot(pos);
        self.put(slot, x);
        if self.ring > 0 {
            self.put(slot + self.ring, x);
        }
    }

    /// The bytes of positions `from..` (nothing there is needed once `from` is the
    /// number of positions in use). A ring has no such tail: it is small, and reused.
    pub fn tail_bytes_mut(&mut self, from: usize) -> &mut [u8] {
        let from = if self.ring > 0 { usize::MAX / 2 } else { from };
        let start = from.saturating_mul(self.dim).min(match &self.store {
            Store::F32(s) => s.len(),
            Store::F16(s) => s.len(),
        });
        match &mut self.store {
            Store::F32(s) => pinch_kernels::blocks::bytes_of_mut(&mut s[start..]),
            Store::F16(s) => pinch_kernels::blocks::bytes_of_mut(&mut s[start..]),
        }
    }

    /// `len` values from position `pos`, column `off` on (`len` may run over the
    /// following positions' rows: in a ring, at most `ring` positions).
    #[inline]
    pub fn row(&self, pos: usize, off: usize, len: usize) -> KvRow<'_> {
        let start = self.slot(pos) * self.dim + off;
        match &self.store {
            Store::F32(s) => KvRow::F32(&s[start..start + len]),
            Store::F16(s) => KvRow::F16(&s[start..start + len]),
        }
    }
}
