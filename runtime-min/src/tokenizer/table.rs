//! Open-addressing hash tables over `u32` ids, carved from the arena.
//!
//! The tables store only ids; the keys live elsewhere (token texts in the GGUF header,
//! merge pairs in their own arrays), so a table costs 4 bytes a slot. Slot value 0 means
//! empty, otherwise it holds `id + 1`. Capacity is a power of two at least 1.5 times
//! the number of keys, so linear probing stays short and always finds an empty slot.
use super::TokenizerError;
use crate::arena::Arena;

/// Hash of a byte string given in up to two parts (so `a ++ b` can be hashed without
/// building it). Word-at-a-time multiply-xorshift; not cryptographic, just well spread.
pub(crate) fn hash_parts(a: &[u8], b: &[u8]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ ((a.len() + b.len()) as u64);
    let mut buf = [0u8; 8];
    let mut fill = 0usize;
    for part in [a, b] {
        let mut s = part;
        // Fast path: whole words when no partial word is pending.
        if fill == 0 {
            while s.len() >= 8 {
                let (w, r) = s.split_at(8);
                let mut x = [0u8; 8];
                x.copy_from_slice(w);
                h = mix(h, u64::from_le_bytes(x));
                s = r;
            }
        }
        for &c in s {
            buf[fill] = c;
            fill += 1;
            if fill == 8 {
                h = mix(h, u64::from_le_bytes(buf));
                fill = 0;
            }
        }
    }
    if fill > 0 {
        buf[fill..].fill(0);
        h = mix(h, u64::from_le_bytes(buf));
    }
    h ^ (h >> 29)
}

#[inline]
fn mix(h: u64, w: u64) -> u64 {
    let x = (h ^ w).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 31)
}

/// Smallest power of two `>= 1.5 * n` (at least 16): load factor at most 2/3, so
/// linear probes stay short.
pub(crate) fn capacity_for(n: usize) -> Result<usize, TokenizerError> {
    let want = n
        .checked_add(n / 2 + 1)
        .ok_or(TokenizerError::TooLarge { what: "hash table" })?;
    want.max(16)
        .checked_next_power_of_two()
        .ok_or(TokenizerError::TooLarge { what: "hash table" })
}

/// A set of ids keyed by byte strings that the caller resolves (`key_of(id)`).
pub(crate) struct IdTable<'a> {
    slots: &'a mut [u32],
}

/// The frozen, shared form used after building.
#[derive(Clone, Copy)]
pub(crate) struct IdTableRef<'a> {
    slots: &'a [u32],
}

impl<'a> IdTable<'a> {
    pub(crate) fn new(
        arena: &mut Arena<'a>,
        account: &'static str,
        n_keys: usize,
    ) -> Result<IdTable<'a>, TokenizerError> {
        let cap = capacity_for(n_keys)?;
        let slots = arena.slice::<u32>(account, cap)?;
        Ok(IdTable { slots })
    }

    /// Insert `id` under `key`, unless an id whose key is equal is already present
    /// (first one wins, as `std::unordered_map::emplace` does). Returns whether inserted.
    pub(crate) fn insert<'k>(
        &mut self,
        id: u32,
        key: &[u8],
        key_of: impl Fn(u32) -> &'k [u8],
    ) -> bool {
        let mask = self.slots.len() - 1;
        let mut i = (hash_parts(key, &[]) as usize) & mask;
        loop {
            let s = self.slots[i];
            if s == 0 {
                self.slots[i] = id + 1;
                return true;
            }
            if key_of(s - 1) == key {
                return false;
            }
            i = (i + 1) & mask;
        }
    }

    pub(crate) fn freeze(self) -> IdTableRef<'a> {
        IdTableRef { slots: self.slots }
    }
}

impl<'a> IdTableRef<'a> {
    /// The first id whose key equals `a ++ b` and that `accept`s.
    #[inline]
    pub(crate) fn find<'k>(
        &self,
        a: &[u8],
        b: &[u8],
        key_of: impl Fn(u32) -> &'k [u8],
        accept: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = (hash_parts(a, b) as usize) & mask;
        loop {
            let s = self.slots[i];
            if s == 0 {
                return None;
            }
            let k = key_of(s - 1);
            if k.len() == a.len() + b.len()
                && &k[..a.len()] == a
                && &k[a.len()..] == b
                && accept(s - 1)
            {
                return Some(s - 1);
            }
            i = (i + 1) & mask;
        }
    }
}

/// Hash of an id pair (BPE merge key).
#[inline]
pub(crate) fn hash_pair(l: u32, r: u32) -> u64 {
    let x = ((l as u64) << 32 | r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 32)
}

/// Merge ranks keyed by (left id, right id). Slot holds `rank + 1`; `left[rank]`,
/// `right[rank]`, `result[rank]` hold the pair and the id of the merged token.
#[derive(Clone, Copy)]
pub(crate) struct MergeTable<'a> {
    pub(crate) slots: &'a [u32],
    pub(crate) left: &'a [u32],
    pub(crate) right: &'a [u32],
    pub(crate) result: &'a [u32],
}

impl<'a> MergeTable<'a> {
    pub(crate) fn empty() -> MergeTable<'static> {
        MergeTable {
            slots: &[],
            left: &[],
            right: &[],
            result: &[],
        }
    }

    /// (rank, merged id) of the pair, if it is a merge.
    #[inline]
    pub(crate) fn get(&self, l: u32, r: u32) -> Option<(u32, u32)> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = (hash_pair(l, r) as usize) & mask;
        loop {
            let s = self.slots[i];
            if s == 0 {
                return None;
            }
            let m = (s - 1) as usize;
            if self.left[m] == l && self.right[m] == r {
                return Some((m as u32, self.result[m]));
            }
            i = (i + 1) & mask;
        }
    }
}

/// Insert merge `rank` into `slots`; keeps the lowest rank for a repeated pair.
pub(crate) fn merge_insert(slots: &mut [u32], left: &[u32], right: &[u32], rank: u32) {
    let mask = slots.len() - 1;
    let (l, r) = (left[rank as usize], right[rank as usize]);
    let mut i = (hash_pair(l, r) as usize) & mask;
    loop {
        let s = slots[i];
        if s == 0 {
            slots[i] = rank + 1;
            return;
        }
        let m = (s - 1) as usize;
        if left[m] == l && right[m] == r {
            return;
        }
        i = (i + 1) & mask;
    }
}
