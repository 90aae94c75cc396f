//! A binary min-heap of merge candidates over caller-provided `u32` storage.
//!
//! Each entry is four `u32`s: a 64-bit priority (smaller pops first) split in two, then
//! two payload words. Both tokenizers put the left symbol index in the low priority word,
//! so ties pop leftmost first, as llama.cpp's comparators do.
use super::TokenizerError;

pub(crate) struct Heap<'s> {
    data: &'s mut [u32],
    len: usize,
}

pub(crate) type Entry = [u32; 4];

impl<'s> Heap<'s> {
    pub(crate) fn new(data: &'s mut [u32]) -> Heap<'s> {
        Heap { data, len: 0 }
    }

    fn key(&self, i: usize) -> u64 {
        ((self.data[4 * i] as u64) << 32) | self.data[4 * i + 1] as u64
    }

    fn swap(&mut self, a: usize, b: usize) {
        for k in 0..4 {
            self.data.swap(4 * a + k, 4 * b + k);
        }
    }

    pub(crate) fn push(&mut self, e: Entry) -> Result<(), TokenizerError> {
        let i = self.len;
        let dst = self
            .data
            .get_mut(4 * i..4 * i + 4)
            .ok_or(TokenizerError::ScratchTooSmall {
                needed: 0,
                given: 0,
            })?;
        dst.copy_from_slice(&e);
        self.len += 1;
        let mut i = i;
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.key(i) < self.key(parent) {
                self.swap(i, parent);
                i = parent;
            } else {
                break;
            }
        }
        Ok(())
    }

    pub(crate) fn pop(&mut self) -> Option<Entry> {
        if self.len == 0 {
            return None;
        }
        let mut top = [0u32; 4];
        top.copy_from_slice(&self.data[0..4]);
        self.len -= 1;
        if self.len > 0 {
            self.swap(0, self.len);
            let mut i = 0;
            loop {
                let (l, r) = (2 * i + 1, 2 * i + 2);
                let mut m = i;
                if l < self.len && self.key(l) < self.key(m) {
                    m = l;
                }
                if r < self.len && self.key(r) < self.key(m) {
                    m = r;
                }
                if m == i {
                    break;
                }
                self.swap(i, m);
                i = m;
            }
        }
        Some(top)
    }
}

/// Order-preserving map of an `f32` to `u32`, reversed, so a higher score sorts first.
pub(crate) fn score_key(score: f32) -> u32 {
    // -0.0 and 0.0 compare equal in llama.cpp's comparator; give them one key.
    let score = if score == 0.0 { 0.0 } else { score };
    let b = score.to_bits();
    let asc = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    !asc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_priority_then_left_order() {
        let mut store = [0u32; 4 * 8];
        let mut h = Heap::new(&mut store);
        for (p, l) in [(3, 0), (1, 5), (1, 2), (2, 1), (0, 9)] {
            h.push([p, l, 0, 0]).unwrap();
        }
        let mut got = heapless::Vec::<(u32, u32), 8>::new();
        while let Some(e) = h.pop() {
            got.push((e[0], e[1])).unwrap();
        }
        assert_eq!(&got[..], &[(0, 9), (1, 2), (1, 5), (2, 1), (3, 0)]);
    }

    #[test]
    fn score_key_puts_higher_scores_first() {
        let s = [-1000.0f32, -3.5, -0.0, 0.0, 2.0];
        for w in s.windows(2) {
            assert!(score_key(w[1]) <= score_key(w[0]), "{w:?}");
        }
    }

    #[test]
    fn full_heap_is_an_error() {
        let mut store = [0u32; 4];
        let mut h = Heap::new(&mut store);
        h.push([1, 1, 1, 1]).unwrap();
        assert!(h.push([2, 2, 2, 2]).is_err());
    }
}
