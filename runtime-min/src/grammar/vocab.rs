//! The vocabulary sorted by token bytes, for [`Matcher::mask`](super::Matcher::mask).
//!
//! Tokens that share a prefix are neighbours in byte order, so a walk in that order
//! that keeps the grammar state after each byte of the previous token only computes
//! each token's bytes past the prefix it shares with the one before (`lcp`), as a walk
//! over a trie of the vocabulary would, with 6 bytes per token instead of a trie's
//! nodes. Built once per model (about 30 ms for 262,144 tokens here).
use crate::tokenizer::{attr, Tokenizer};

/// Whether `id` can be produced under a grammar at all: it has bytes and is not a
/// control, unknown or unused token (end-of-generation tokens are handled apart).
pub fn eligible(tok: &Tokenizer<'_>, id: u32) -> bool {
    tok.token_attr(id) & (attr::CONTROL | attr::UNKNOWN | attr::UNUSED) == 0
        && !tok.token_bytes(id).is_empty()
}

/// The eligible tokens in byte order, with the length of the prefix each shares with
/// the one before (cut at `u16::MAX`), and the other tokens.
#[derive(Clone, Copy, Debug)]
pub struct SortedVocab<'v> {
    pub order: &'v [u32],
    pub lcp: &'v [u16],
    pub excluded: &'v [u32],
}

impl<'v> SortedVocab<'v> {
    /// Sort `tok`'s vocabulary into `ids` and `lcp` (each `n_vocab` long; shorter
    /// buffers sort only the first tokens that fit, and the rest count as excluded).
    pub fn build(tok: &Tokenizer<'_>, ids: &'v mut [u32], lcp: &'v mut [u16]) -> Self {
        let n = (tok.n_vocab() as usize).min(ids.len()).min(lcp.len());
        let (mut front, mut back) = (0usize, n);
        for id in 0..n as u32 {
            if eligible(tok, id) {
                ids[front] = id;
                front += 1;
            } else {
                back -= 1;
                ids[back] = id;
            }
        }
        let (order, excluded) = ids[..n].split_at_mut(front);
        order.sort_unstable_by(|&a, &b| tok.token_bytes(a).cmp(tok.token_bytes(b)));
        for k in 0..order.len() {
            lcp[k] = if k == 0 {
                0
            } else {
                let (a, b) = (tok.token_bytes(order[k - 1]), tok.token_bytes(order[k]));
                a.iter()
                    .zip(b)
                    .take_while(|(x, y)| x == y)
                    .count()
                    .min(u16::MAX as usize) as u16
            };
        }
        SortedVocab {
            order,
            lcp: &lcp[..front],
            excluded,
        }
    }
}
