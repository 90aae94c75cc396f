//! Constrained output: llama.cpp's GBNF grammars, enforced while sampling.
//!
//! - [`parse`]: GBNF text -> a flat, checked [`Grammar`] in caller-lent storage
//!   ([`Store`]); errors name the rule and byte offset at fault. Left-recursive and
//!   undefined rules are refused here, so the matcher never loops.
//! - [`matcher`]: the set of parse stacks a grammar is in after the text so far
//!   (a pushdown automaton run on code points, fed bytes, with partial UTF-8 held), which
//!   says whether a token's bytes can come next and masks the logits of those that cannot.
//! - [`vocab`]: the vocabulary sorted by bytes, so that one walk tests every token and a
//!   rejected prefix rejects all the tokens that share it (the "trie" of llama.cpp's
//!   matcher, without building one).
//! - [`json_schema`]: a JSON schema (the common subset) -> GBNF text, for
//!   `response_format` and `json_schema`.
//!
//! # Element encoding
//! A grammar is a list of `u32` elements: the top 4 bits say what it is ([`END`],
//! [`ALT`], [`RULE`], [`SET`], [`SKIP`], [`CHAR`]), the low 28 bits are its operand.
//! A rule's body starts at `rules[id]` and holds its alternatives separated by `ALT`
//! and closed by `END`. Groups and repetitions become generated rules whose bodies are
//! written in place, behind a `SKIP n` that the matcher jumps over. A `SET` operand is
//! an offset into `sets`: a header (bit 31: negated; low bits: the number of ranges)
//! and that many `lo, hi` code point pairs.
//!
//! No allocation: everything lives in slices the caller carves from the arena.
pub mod json_schema;
pub mod matcher;
pub mod parse;
pub mod vocab;

pub use matcher::{Matcher, MatcherBufs};
pub use parse::{parse, GrammarError, Store};
pub use vocab::SortedVocab;

/// Element kinds (the top 4 bits of an element).
pub const END: u32 = 0;
pub const ALT: u32 = 1;
pub const RULE: u32 = 2;
pub const SET: u32 = 3;
pub const SKIP: u32 = 4;
pub const CHAR: u32 = 5;
/// Mask of an element's operand.
pub const OPERAND: u32 = (1 << 28) - 1;
/// The negation bit of a set header.
pub const NEGATED: u32 = 1 << 31;

/// An element of `kind` with `operand`.
pub const fn elem(kind: u32, operand: u32) -> u32 {
    (kind << 28) | (operand & OPERAND)
}

/// The kind of element `e`.
pub const fn kind(e: u32) -> u32 {
    e >> 28
}

/// A parsed grammar: views into a [`Store`].
///
/// # Invariants
/// Every `RULE` operand is `< rules.len()`, every rule start and every position a
/// `SKIP` leads to is inside `elems`, every body ends with `END`, every `SET` operand
/// points at a whole set in `sets`, and no rule can reach itself without consuming a
/// character (checked by [`parse`]).
#[derive(Clone, Copy, Debug)]
pub struct Grammar<'g> {
    pub elems: &'g [u32],
    pub sets: &'g [u32],
    pub rules: &'g [u32],
    pub root: u32,
}

impl Grammar<'_> {
    /// Whether code point `c` matches the character element `e` (a `CHAR` or `SET`).
    pub fn matches(&self, e: u32, c: u32) -> bool {
        self.overlaps(e, c, c)
    }

    /// Whether any code point in `lo..=hi` matches the character element `e`.
    pub fn overlaps(&self, e: u32, lo: u32, hi: u32) -> bool {
        match kind(e) {
            CHAR => (lo..=hi).contains(&(e & OPERAND)),
            SET => {
                let at = (e & OPERAND) as usize;
                let Some(&head) = self.sets.get(at) else {
                    return false;
                };
                let n = (head & !NEGATED) as usize;
                let pairs = self.sets.get(at + 1..at + 1 + 2 * n).unwrap_or(&[]);
                if head & NEGATED == 0 {
                    pairs.chunks_exact(2).any(|p| p[0] <= hi && lo <= p[1])
                } else {
                    // Some code point of lo..=hi lies outside every range: the ranges
                    // do not cover lo..=hi together. Walk up from lo.
                    let mut c = lo;
                    loop {
                        match pairs.chunks_exact(2).find(|p| p[0] <= c && c <= p[1]) {
                            None => return true,
                            Some(p) if p[1] >= hi => return false,
                            Some(p) => c = p[1] + 1,
                        }
                    }
                }
            }
            _ => false,
        }
    }

    /// `pos` with every `SKIP` on the way followed.
    pub fn resolve(&self, mut pos: usize) -> usize {
        while let Some(&e) = self.elems.get(pos) {
            if kind(e) != SKIP {
                break;
            }
            pos += 1 + (e & OPERAND) as usize;
        }
        pos
    }

    /// Whether `pos` (resolved) closes an alternative.
    pub fn at_end(&self, pos: usize) -> bool {
        self.elems
            .get(self.resolve(pos))
            .is_none_or(|&e| matches!(kind(e), END | ALT))
    }
}

#[cfg(test)]
mod tests;

/// What other modules' tests use.
#[cfg(test)]
pub mod tests_support {
    /// Whether GBNF `src` takes the whole of `text`.
    pub fn accepts(src: &str, text: &str) -> bool {
        super::tests::accepts(src, text, 1)
    }
}
