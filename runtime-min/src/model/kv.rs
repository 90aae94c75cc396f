//! One attention layer's keys or values: a row per position of the context.
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

/// One layer's K or V: `n_ctx` rows of `dim` values.
pub struct KvPlane<'a> {
    store: Store<'a>,
    dim: usize,
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
        Ok(KvPlane { store, dim })
    }

    /// Store `x` (len dim) at position `pos`.
    pub fn write(&mut self, pos: usize, x: &[f32]) {
        let d = self.dim;
        match &mut self.store {
            Store::F32(s) => s[pos * d..(pos + 1) * d].copy_from_slice(x),
            Store::F16(s) => {
                for (o, v) in s[pos * d..(pos + 1) * d].iter_mut().zip(x) {
                    *o = f32_to_f16(*v);
                }
            }
        }
    }

    /// The bytes of positions `from..` (nothing there is needed once `from` is the
    /// number of positions in use).
    pub fn tail_bytes_mut(&mut self, from: usize) -> &mut [u8] {
        let start = (from * self.dim).min(match &self.store {
            Store::F32(s) => s.len(),
            Store::F16(s) => s.len(),
        });
        match &mut self.store {
            Store::F32(s) => pinch_kernels::blocks::bytes_of_mut(&mut s[start..]),
            Store::F16(s) => pinch_kernels::blocks::bytes_of_mut(&mut s[start..]),
        }
    }

    /// `len` values of position `pos` starting at column `off`.
    #[inline]
    pub fn row(&self, pos: usize, off: usize, len: usize) -> KvRow<'_> {
        let start = pos * self.dim + off;
        match &self.store {
            Store::F32(s) => KvRow::F32(&s[start..start + len]),
            Store::F16(s) => KvRow::F16(&s[start..start + len]),
        }
    }
}
