//! The arena: one region, carved front to back into named accounts.
//!
//! Everything the engine keeps (weights, KV cache, activations, scratch, tokenizer
//! tables) comes from here, so the sum of the accounts *is* the memory the engine uses
//! and the budget can be checked before anything is loaded. Carving is safe code: the
//! region is split with `split_at_mut`, and typed views go through
//! `pinch_kernels::blocks::cast_mut`.
use pinch_kernels::blocks::{cast_mut, Pod};

/// Maximum number of distinct account names tracked.
pub const MAX_ACCOUNTS: usize = 24;

/// A request the arena could not satisfy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArenaError {
    /// Not enough bytes left in the region.
    Exhausted {
        account: &'static str,
        requested: usize,
        remaining: usize,
        capacity: usize,
    },
    /// Too many distinct accounts.
    TooManyAccounts,
    /// Size computation overflowed.
    Overflow { account: &'static str },
}

impl core::fmt::Display for ArenaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ArenaError::Exhausted { account, requested, remaining, capacity } => write!(
                f,
                "memory budget exhausted: '{account}' needs {requested} bytes but only {remaining} of {capacity} remain"
            ),
            ArenaError::TooManyAccounts => write!(f, "too many arena accounts"),
            ArenaError::Overflow { account } => write!(f, "size of '{account}' overflows"),
        }
    }
}

impl core::error::Error for ArenaError {}

/// A bump arena over a lent region.
pub struct Arena<'r> {
    rest: &'r mut [u8],
    capacity: usize,
    used: usize,
    /// The most bytes in use at once, scratch scopes included ([`Arena::scratch`]).
    peak: usize,
    accounts: heapless::Vec<(&'static str, usize), MAX_ACCOUNTS>,
}

impl<'r> Arena<'r> {
    /// An arena over `region`.
    pub fn new(region: &'r mut [u8]) -> Arena<'r> {
        let capacity = region.len();
        Arena {
            rest: region,
            capacity,
            used: 0,
            peak: 0,
            accounts: heapless::Vec::new(),
        }
    }

    /// Total bytes of the region.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Bytes handed out so far (including alignment padding).
    pub fn used(&self) -> usize {
        self.used
    }
    /// The most bytes in use at once so far, counting the scratch scopes that have
    /// given theirs back.
    pub fn peak(&self) -> usize {
        self.peak.max(self.used)
    }
    /// Bytes still free.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }
    /// (account, bytes) pairs in order of first use.
    pub fn accounts(&self) -> &[(&'static str, usize)] {
        &self.accounts
    }

    /// `n` zeroed bytes aligned to 64 (a cache line, enough for every SIMD load), charged
    /// to `account`.
    pub fn bytes(&mut self, account: &'static str, n: usize) -> Result<&'r mut [u8], ArenaError> {
        self.bytes_aligned(account, n, 64)
    }

    /// `n` zeroed bytes starting at a multiple of `align` (a power of two): direct reads
    /// need page-aligned buffers. The padding is charged to `account` too.
    pub fn bytes_aligned(
        &mut self,
        account: &'static str,
        n: usize,
        align: usize,
    ) -> Result<&'r mut [u8], ArenaError> {
        let addr = self.rest.as_ptr() as usize;
        let align = align.max(1);
        let pad = (align - addr % align) % align;
        let total = n.checked_add(pad).ok_or(ArenaError::Overflow { account })?;
        if total > self.rest.len() {
            return Err(ArenaError::Exhausted {
                account,
                requested: n,
                remaining: self.rest.len().saturating_sub(pad),
                capacity: self.capacity,
            });
        }
        let rest = core::mem::take(&mut self.rest);
        let (head, tail) = rest.split_at_mut(total);
        self.rest = tail;
        self.used += total;
        self.charge(account, total)?;
        let out = &mut head[pad..];
        out.fill(0);
        Ok(out)
    }

    /// Run `f` on a scratch arena over the free bytes; what it carves is free again when
    /// `f` returns (handed out zeroed again later). Long-lived results go in slices carved
    /// from `self` before the call. [`Arena::peak`] counts the scope's use.
    pub fn scratch<R>(&mut self, f: impl FnOnce(&mut Arena<'_>) -> R) -> R {
        let mut sub = Arena::new(&mut *self.rest);
        let r = f(&mut sub);
        self.peak = self.peak.max(self.used + sub.peak());
        r
    }

    /// `n` zeroed values of a plain-old-data type.
    pub fn slice<T: Pod>(
        &mut self,
        account: &'static str,
        n: usize,
    ) -> Result<&'r mut [T], ArenaError> {
        let size = n
            .checked_mul(core::mem::size_of::<T>())
            .ok_or(ArenaError::Overflow { account })?;
        let b = self.bytes(account, size)?;
        // 64-byte alignment satisfies every Pod type we use, and the length is exact.
        cast_mut::<T>(b).ok_or(ArenaError::Overflow { account })
    }

    fn charge(&mut self, account: &'static str, n: usize) -> Result<(), ArenaError> {
        if let Some(a) = self.accounts.iter_mut().find(|a| a.0 == account) {
            a.1 += n;
            return Ok(());
        }
        self.accounts
            .push((account, n))
            .map_err(|_| ArenaError::TooManyAccounts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_aligned_zeroed_slices_and_counts_them() {
        let mut region = [0xAAu8; 4096];
        let mut a = Arena::new(&mut region);
        let x: &mut [f32] = a.slice("activations", 10).unwrap();
        assert_eq!(x.len(), 10);
        assert!(x.iter().all(|v| *v == 0.0));
        assert_eq!(x.as_ptr() as usize % 64, 0);
        let y = a.bytes("kv", 100).unwrap();
        assert_eq!(y.len(), 100);
        assert_eq!(a.accounts().len(), 2);
        assert!(a.used() >= 140);
    }

    #[test]
    fn scratch_gives_its_bytes_back_and_counts_its_peak() {
        let mut region = [0u8; 4096];
        let mut a = Arena::new(&mut region);
        let kept: &mut [u32] = a.slice("head", 4).unwrap();
        let used = a.used();
        a.scratch(|s| {
            let t = s.bytes("scratch", 3000).unwrap();
            t.fill(0xAA);
            kept[0] = 7;
        });
        assert_eq!(a.used(), used);
        assert!(
            (used + 3000..used + 3064).contains(&a.peak()),
            "{}",
            a.peak()
        );
        // The scratch bytes are free again, and handed out zeroed.
        let again = a.bytes("kv", 3000).unwrap();
        assert!(again.iter().all(|&b| b == 0));
        assert_eq!(kept[0], 7);
        assert!(a.scratch(|s| s.bytes("scratch", 2000).is_err()));
    }

    #[test]
    fn exhaustion_is_an_error_naming_the_account() {
        let mut region = [0u8; 256];
        let mut a = Arena::new(&mut region);
        match a.bytes("weights", 1000) {
            Err(ArenaError::Exhausted {
                account, requested, ..
            }) => {
                assert_eq!(account, "weights");
                assert_eq!(requested, 1000);
            }
            other => panic!("expected Exhausted, got {other:?}"),
        }
        assert!(matches!(
            a.slice::<f32>("x", usize::MAX),
            Err(ArenaError::Overflow { .. })
        ));
    }
}
