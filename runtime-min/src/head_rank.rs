//! Ranking a pruned head by what dropping a token costs under the honest (restricted)
//! encoding, not by raw counts.
//!
//! With a pruned head the tokenizer merges only through kept tokens
//! ([`Tokenizer::set_allowed`]), so a kept token is worth a row only if the pieces its
//! own merges pass through are kept too, and dropping a token costs the extra tokens
//! its occurrences then take. [`choose`] works in three steps:
//! - closure: every token the corpus produced joins the candidates with its merge tree
//!   (the pieces of two or more characters it is merged from, [`Pieces::children`],
//!   recursively: merging starts from characters, tokens or not), so no kept word
//!   falls apart because an intermediate piece was pruned;
//! - when the candidates exceed the rows, a greedy drop: the candidate whose removal
//!   costs least (its count times the extra tokens its text then takes under the
//!   current kept set) goes first; its count moves to the pieces that replace it, and
//!   the pieces of its merge tree become droppable once no kept token needs them
//!   (costs only grow, so a lazy heap is the exact greedy);
//! - the rows left go by a prior over tokens the corpus never produced: the character
//!   prior ([`head::char_prior`]), then the corpus's character-trigram log-likelihood
//!   per character ([`CharModel`]) minus [`RANK_WEIGHT`] times the log of the token's
//!   score rank (merge order for Gemma), each with its closure. Tokens the full
//!   vocabulary cannot reach (their own text encodes otherwise) are never chosen.
use crate::arena::{Arena, ArenaError};
use crate::head::{self, CharSet};
use crate::tokenizer::{Tokenizer, VocabKind};

/// Weight of `-ln(score rank + 100)` against the per-character trigram log-likelihood
/// in the prior (tuned on the English corpus: 2-6 within noise of each other).
pub const RANK_WEIGHT: f32 = 4.0;

/// Longest token text (bytes) whose pieces are computed; longer ones count as leaves.
const MAX_TEXT: usize = 256;

const UNI: usize = 1 << 16;
const BI: usize = 1 << 17;
const TRI: usize = 1 << 19;

/// `u32` words a [`CharModel`] needs (hashed unigram, bigram and trigram counts).
pub const CHAR_MODEL_WORDS: usize = UNI + BI + TRI;

/// Hashed character n-gram counts of the selection corpus: a cheap model of what the
/// corpus's languages look like, to rank tokens it never produced.
pub struct CharModel<'a> {
    uni: &'a mut [u32],
    bi: &'a mut [u32],
    tri: &'a mut [u32],
    total: u64,
}

fn hash(parts: &[u32], buckets: usize) -> usize {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &p in parts {
        h = (h ^ p as u64).wrapping_mul(0x0100_0000_01b3);
        h ^= h >> 29;
    }
    (h as usize) & (buckets - 1)
}

impl<'a> CharModel<'a> {
    /// A model over `words` ([`CHAR_MODEL_WORDS`] of them), empty.
    pub fn new(words: &'a mut [u32]) -> CharModel<'a> {
        words.fill(0);
        let (uni, rest) = words.split_at_mut(UNI);
        let (bi, tri) = rest.split_at_mut(BI);
        CharModel {
            uni,
            bi,
            tri,
            total: 0,
        }
    }

    /// Count the characters of `text` (invalid UTF-8 skipped) with weight `w`.
    pub fn add_text(&mut self, text: &[u8], w: u32) {
        let (mut a, mut b) = (0u32, 0u32);
        for chunk in text.utf8_chunks() {
            for c in chunk.valid().chars() {
                let c = c as u32;
                let u = &mut self.uni[hash(&[c], UNI)];
                *u = u.saturating_add(w);
                let x = &mut self.bi[hash(&[b, c], BI)];
                *x = x.saturating_add(w);
                let x = &mut self.tri[hash(&[a, b, c], TRI)];
                *x = x.saturating_add(w);
                self.total += w as u64;
                (a, b) = (b, c);
            }
        }
    }

    /// Mean log-probability per character of `text` under the interpolated trigram
    /// model (the first characters with the shorter contexts); 0 for empty text.
    pub fn score(&self, text: &[u8]) -> f32 {
        let n_total = self.total as f32 + 0.01 * UNI as f32;
        let (mut a, mut b) = (None::<u32>, None::<u32>);
        let (mut sum, mut n) = (0.0f32, 0u32);
        for chunk in text.utf8_chunks() {
            for c in chunk.valid().chars() {
                let c = c as u32;
                let p1 = (self.uni[hash(&[c], UNI)] as f32 + 0.01) / n_total;
                let p2 = match b {
                    Some(b) => {
                        let ctx = self.uni[hash(&[b], UNI)] as f32;
                        (self.bi[hash(&[b, c], BI)] as f32 + 2.0 * p1) / (ctx + 2.0)
                    }
                    None => p1,
                };
                let p3 = match (a, b) {
                    (Some(a), Some(b)) => {
                        let ctx = self.bi[hash(&[a, b], BI)] as f32;
                        (self.tri[hash(&[a, b, c], TRI)] as f32 + 2.0 * p2) / (ctx + 2.0)
                    }
                    _ => p2,
                };
                sum += libm::logf(p3);
                n += 1;
                (a, b) = (b, Some(c));
            }
        }
        if n == 0 {
            0.0
        } else {
            sum / n as f32
        }
    }
}

/// Restricted encodings of single tokens' texts: a tokenizer copy and the scratch it
/// needs.
pub struct Pieces<'t, 's> {
    tok: Tokenizer<'t>,
    scratch: &'s mut [u8],
    out: &'s mut [u32],
}

/// Bytes of scratch [`Pieces`] needs for `tok`.
pub fn pieces_scratch(tok: &Tokenizer<'_>) -> usize {
    tok.scratch_bytes(MAX_TEXT)
}

fn bit(mask: &[u64], id: u32) -> bool {
    mask.get(id as usize / 64)
        .is_some_and(|w| w >> (id % 64) & 1 == 1)
}

fn set_bit(mask: &mut [u64], id: u32, on: bool) {
    if let Some(w) = mask.get_mut(id as usize / 64) {
        if on {
            *w |= 1 << (id % 64);
        } else {
            *w &= !(1 << (id % 64));
        }
    }
}

impl<'t, 's> Pieces<'t, 's> {
    /// Encoders over `tok`; `scratch` holds [`pieces_scratch`] bytes, `out` at least
    /// [`MAX_TEXT`] + 8 ids.
    pub fn new(tok: &Tokenizer<'t>, scratch: &'s mut [u8], out: &'s mut [u32]) -> Self {
        Pieces {
            tok: tok.clone(),
            scratch,
            out,
        }
    }

    /// How the text of `id` encodes when only the ids of `mask` may be produced, with
    /// `id` itself left out when `without` (the mask is restored); `None` for a text
    /// longer than [`MAX_TEXT`] or one that fails to encode.
    pub fn encode(&mut self, id: u32, mask: &mut [u64], without: bool) -> Option<&[u32]> {
        let mut text = self.tok.token_bytes(id);
        if self.tok.adds_space_prefix() {
            // The encoder adds the leading space itself.
            text = text.strip_prefix(b" ").unwrap_or(text);
        }
        if text.is_empty() || text.len() > MAX_TEXT {
            return None;
        }
        let was = bit(mask, id);
        if without {
            set_bit(mask, id, false);
        }
        let n = {
            let mut t: Tokenizer<'_> = self.tok.clone();
            t.set_allowed(Some(&*mask));
            t.encode_bytes(text, false, false, self.scratch, self.out)
        };
        set_bit(mask, id, was);
        n.ok().map(|n| &self.out[..n])
    }

    /// The pieces of more than one character the full vocabulary merges into `id` last
    /// (`full` has every bit set): its text encoded without `id`. `None` when `id` is not reachable (its text
    /// does not encode to `id` alone) or too long.
    /// On vocabularies that add a space prefix, a token without a leading space cannot
    /// be encoded alone: it counts as reachable, with no pieces.
    pub fn children(&mut self, id: u32, full: &mut [u64]) -> Option<(usize, [u32; 8])> {
        if self.tok.adds_space_prefix() && !self.tok.token_bytes(id).starts_with(b" ") {
            return Some((0, [0; 8]));
        }
        if self.encode(id, full, false)? != [id] {
            return None;
        }
        let mut c = [0u32; 8];
        let mut n = 0;
        let tok = self.tok.clone();
        for &q in self.encode(id, full, true)? {
            // Merging starts from characters whether or not they are tokens: only
            // merged pieces must be kept.
            let b = tok.token_bytes(q);
            let one_char = core::str::from_utf8(b).is_ok_and(|t| t.chars().count() == 1);
            if !one_char && n < 8 {
                c[n] = q;
                n += 1;
            }
        }
        Some((n, c))
    }
}

/// Binary min-heap of `u64` keys in a fixed slice.
struct MinHeap<'h> {
    a: &'h mut [u64],
    n: usize,
}

impl MinHeap<'_> {
    fn push(&mut self, k: u64) {
        if self.n == self.a.len() {
            return; // cannot happen: each id is pushed at most once outstanding
        }
        let mut i = self.n;
        self.a[i] = k;
        self.n += 1;
        while i > 0 && self.a[(i - 1) / 2] > self.a[i] {
            self.a.swap(i, (i - 1) / 2);
            i = (i - 1) / 2;
        }
    }
    fn pop(&mut self) -> Option<u64> {
        if self.n == 0 {
            return None;
        }
        let top = self.a[0];
        self.n -= 1;
        self.a[0] = self.a[self.n];
        let mut i = 0;
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < self.n && self.a[l] < self.a[m] {
                m = l;
            }
            if r < self.n && self.a[r] < self.a[m] {
                m = r;
            }
            if m == i {
                break;
            }
            self.a.swap(i, m);
            i = m;
        }
        Some(top)
    }
}

const ID_BITS: u32 = 24;

fn key(cost: u64, id: u32) -> u64 {
    // Equal costs: the higher id (later merge, rarer) drops first.
    (cost.min((1 << (64 - ID_BITS)) - 1) << ID_BITS) | ((1 << ID_BITS) - 1 - id as u64)
}

fn key_id(k: u64) -> u32 {
    ((1 << ID_BITS) - 1 - (k & ((1 << ID_BITS) - 1))) as u32
}

/// What [`choose`] needs besides the tokenizer and the counts.
pub struct Signals<'c, 'm> {
    /// The corpus's characters ([`head::char_prior`]).
    pub chars: &'c CharSet<'c>,
    /// The corpus's character trigrams, or `None` for the score rank alone.
    pub model: Option<&'m CharModel<'m>>,
}

/// Choose the head: forced ids ([`head::must_keep`]), the corpus's tokens with their
/// merge trees (greedy drop by marginal cost when they exceed the rows), then the prior
/// (module doc), until [`head::row_count`] rows. `counts` (final-token counts of the
/// corpus, weighted; modified) index the vocabulary. Ids go to `out` (increasing, at
/// least `row_count` long); returns how many.
pub fn choose(
    tok: &Tokenizer<'_>,
    counts: &mut [u32],
    sig: &Signals<'_, '_>,
    rows: usize,
    arena: &mut Arena<'_>,
    out: &mut [u32],
) -> Result<usize, ArenaError> {
    let nv = counts.len().min(tok.n_vocab() as usize);
    let words = nv.div_ceil(64);
    let full = arena.slice::<u64>("head rank", words)?;
    full.fill(u64::MAX);
    let kept = arena.slice::<u64>("head rank", words)?;
    kept.fill(0);
    let needed = arena.slice::<u32>("head rank", nv)?;
    needed.fill(0);
    let scratch = arena.bytes("head rank", pieces_scratch(tok))?;
    let pout = arena.slice::<u32>("head rank", MAX_TEXT + 8)?;
    let mut pieces = Pieces::new(tok, scratch, pout);
    let target = head::row_count(tok, rows, nv).min(out.len());
    let mut n_kept = 0usize;
    for id in 0..nv as u32 {
        if head::must_keep(tok, id) {
            set_bit(kept, id, true);
            n_kept += 1;
        }
    }
    // Closure of the corpus's tokens: each joins with the pieces it is merged from.
    let mut c = Closure {
        kept,
        needed,
        full,
        pieces: &mut pieces,
    };
    for id in 0..nv as u32 {
        if counts[id as usize] > 0 && !head::is_unused(tok, id) {
            n_kept += c.add(id, usize::MAX, true);
        }
    }
    if n_kept > target {
        greedy_drop(tok, counts, &mut c, n_kept, target, arena)?;
    } else {
        // The prior over the rest.
        let prior = arena.slice::<f32>("head rank", nv)?;
        let order = arena.slice::<u32>("head rank", nv)?;
        prior_keys(tok, sig, prior, order);
        for (i, o) in order.iter_mut().enumerate() {
            *o = i as u32;
        }
        order.sort_unstable_by(|&a, &b| {
            prior[b as usize]
                .total_cmp(&prior[a as usize])
                .then(a.cmp(&b))
        });
        for &id in order.iter() {
            if n_kept >= target {
                break;
            }
            if bit(c.kept, id) || head::is_unused(tok, id) {
                continue;
            }
            n_kept += c.add(id, target - n_kept, false);
        }
        // Rows a closure did not fit: the next ids of the prior, pieces or not.
        for &id in order.iter() {
            if n_kept >= target {
                break;
            }
            if !bit(c.kept, id) && !head::is_unused(tok, id) {
                set_bit(c.kept, id, true);
                n_kept += 1;
            }
        }
    }
    let kept = c.kept;
    let mut k = 0;
    for id in 0..nv as u32 {
        if bit(kept, id) && k < out.len() {
            out[k] = id;
            k += 1;
        }
    }
    Ok(k)
}

/// The kept set and what its closure needs.
struct Closure<'k, 'p, 't, 's> {
    kept: &'k mut [u64],
    /// For each id, how many kept ids are merged from it.
    needed: &'k mut [u32],
    /// Every bit set ([`Pieces::children`]).
    full: &'k mut [u64],
    pieces: &'p mut Pieces<'t, 's>,
}

impl Closure<'_, '_, '_, '_> {
    /// Keep `root` and its merge tree if that takes at most `room` new rows (nothing
    /// for a root its own text does not reach, unless `force`: a corpus token may
    /// arise only in context); returns the rows added.
    fn add(&mut self, root: u32, room: usize, force: bool) -> usize {
        if bit(self.kept, root) {
            return 0;
        }
        let mut stack = [0u32; 64];
        // Dry run: count the missing ids (a piece met twice counts twice).
        let (mut sp, mut missing) = (1, 0usize);
        stack[0] = root;
        while sp > 0 {
            sp -= 1;
            let id = stack[sp];
            if bit(self.kept, id) {
                continue;
            }
            missing += 1;
            let Some((n, ch)) = self.pieces.children(id, self.full) else {
                if id == root && !force {
                    return 0;
                }
                continue;
            };
            for &q in &ch[..n] {
                if sp < stack.len() {
                    stack[sp] = q;
                    sp += 1;
                }
            }
        }
        if missing > room {
            return 0;
        }
        let (mut sp, mut added) = (1, 0usize);
        stack[0] = root;
        while sp > 0 {
            sp -= 1;
            let id = stack[sp];
            if bit(self.kept, id) {
                continue;
            }
            set_bit(self.kept, id, true);
            added += 1;
            if let Some((n, ch)) = self.pieces.children(id, self.full) {
                for &q in &ch[..n] {
                    self.needed[q as usize] += 1;
                    if sp < stack.len() {
                        stack[sp] = q;
                        sp += 1;
                    }
                }
            }
        }
        added
    }
}

/// Prior keys of every id (higher first): the character prior, then trigram score minus
/// [`RANK_WEIGHT`] x ln(score rank + 100); -inf for ids the prior must not pick
/// (unreachable ones are skipped later by their closure). `order` is scratch.
fn prior_keys(tok: &Tokenizer<'_>, sig: &Signals<'_, '_>, prior: &mut [f32], order: &mut [u32]) {
    for (i, o) in order.iter_mut().enumerate() {
        *o = i as u32;
    }
    // Score rank: SentencePiece's log-probability or merge order; equal scores (BPE)
    // rank by id, a byte-level BPE vocabulary's merge rank.
    order.sort_unstable_by(|&a, &b| tok.score(b).total_cmp(&tok.score(a)).then(a.cmp(&b)));
    let spm = tok.kind() == VocabKind::Spm;
    for (rank, &id) in order.iter().enumerate() {
        let r = -libm::logf(rank as f32 + 100.0);
        let lm = match (sig.model, spm) {
            (Some(m), true) => m.score(tok.token_bytes(id)) + RANK_WEIGHT * r,
            _ => r,
        };
        // The character prior is 0..=3: a step of 1000 keeps it first.
        prior[id as usize] = head::char_prior(tok, sig.chars, id) as f32 * 1000.0 + lm;
    }
}

/// Share of a lowercase word's count [`share_with_title_case`] adds to its capitalized
/// twin (Gemma 3 270M, the shared English corpus, 65,536 rows: held-out English outside
/// the top tokens by the model's predictions 1.44 -> 1.28 % at 0.03, 1.32 % at 0.01,
/// 1.34 % at 0.3; through `head-select` 1.381687 -> 1.375818 bits per byte).
pub const TITLE_CASE_SHARE: f32 = 0.03;

/// Add `share` times the count of each lowercase word token (`▁direction`) to its
/// capitalized twin (`▁Direction`). Why: a title, a heading or a sentence start
/// capitalizes any word, so the twin of a word the corpus and the model's predictions
/// count is likely in other text, but its own count comes only from the few contexts
/// seen. Whole-word twins only (no all-caps forms: sharing with every case form of a
/// frequent word measured worse, it crowds out rare words).
pub fn share_with_title_case(tok: &Tokenizer<'_>, counts: &mut [f32], share: f32) {
    let nv = counts.len().min(tok.n_vocab() as usize);
    let mut buf = [0u8; TWIN_MAX];
    for id in 0..nv as u32 {
        let Some(twin) = lowercase_twin(tok.token_text(id), &mut buf) else {
            continue;
        };
        if let Some(low) = tok.token_id(twin).filter(|&l| (l as usize) < nv) {
            counts[id as usize] += share * counts[low as usize];
        }
    }
}

/// Longest token text [`lowercase_twin`] looks at.
const TWIN_MAX: usize = 64;

/// The text of `text`'s lowercase twin when `text` is a capitalized ASCII word of two
/// or more letters, optionally after a word-start marker (`▁`, GPT-2's `Ġ` or a space):
/// `▁Direction` -> `▁direction`; `None` otherwise (`▁DNA`, `▁direction`, `Über`).
fn lowercase_twin<'b>(text: &[u8], buf: &'b mut [u8; TWIN_MAX]) -> Option<&'b [u8]> {
    let start = ["\u{2581}".as_bytes(), "\u{120}".as_bytes(), &b" "[..]]
        .iter()
        .find(|m| text.starts_with(m))
        .map_or(0, |m| m.len());
    let word = &text[start..];
    let title = word.len() >= 2
        && word[0].is_ascii_uppercase()
        && word[1..].iter().all(u8::is_ascii_lowercase);
    if !title || text.len() > TWIN_MAX {
        return None;
    }
    let out = &mut buf[..text.len()];
    out.copy_from_slice(text);
    out[start] = out[start].to_ascii_lowercase();
    Some(out)
}

/// Drop kept ids by least marginal cost until `target` remain (module doc); returns the
/// kept count.
fn greedy_drop(
    tok: &Tokenizer<'_>,
    counts: &mut [u32],
    c: &mut Closure<'_, '_, '_, '_>,
    mut n_kept: usize,
    target: usize,
    arena: &mut Arena<'_>,
) -> Result<usize, ArenaError> {
    let nv = counts.len();
    let Closure {
        kept,
        needed,
        full,
        pieces,
    } = c;
    let (kept, needed, full) = (&mut **kept, &mut **needed, &mut **full);
    let heap = arena.slice::<u64>("head rank", nv)?;
    let mut heap = MinHeap { a: heap, n: 0 };
    let droppable = |id: u32, kept: &[u64], needed: &[u32]| {
        bit(kept, id) && needed[id as usize] == 0 && !head::must_keep(tok, id)
    };
    let cost = |id: u32, kept: &mut [u64], counts: &[u32], pieces: &mut Pieces<'_, '_>| {
        let extra = pieces
            .encode(id, kept, true)
            .map_or(1, |p| p.len().saturating_sub(1).max(1));
        counts[id as usize] as u64 * extra as u64
    };
    for id in 0..nv as u32 {
        if droppable(id, kept, needed) {
            heap.push(key(cost(id, kept, counts, pieces), id));
        }
    }
    while n_kept > target {
        let Some(k) = heap.pop() else { break };
        let id = key_id(k);
        if !droppable(id, kept, needed) {
            continue;
        }
        let now = key(cost(id, kept, counts, pieces), id);
        if now > k {
            heap.push(now);
            continue;
        }
        // Drop: its occurrences now take the pieces its text encodes to.
        let c = counts[id as usize];
        if let Some(p) = pieces.encode(id, kept, true) {
            let mut ps = [0u32; MAX_TEXT + 8];
            let n = p.len();
            ps[..n].copy_from_slice(p);
            for &q in &ps[..n] {
                counts[q as usize] = counts[q as usize].saturating_add(c);
            }
        }
        set_bit(kept, id, false);
        n_kept -= 1;
        if let Some((n, ch)) = pieces.children(id, full) {
            for &q in &ch[..n] {
                let nd = &mut needed[q as usize];
                *nd = nd.saturating_sub(1);
                if droppable(q, kept, needed) {
                    heap.push(key(cost(q, kept, counts, pieces), q));
                }
            }
        }
    }
    Ok(n_kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercase_twin_of_capitalized_words_only() {
        let mut buf = [0u8; TWIN_MAX];
        let mut twin = |t: &[u8]| {
            lowercase_twin(t, &mut buf).map(|x| {
                let mut a = [0u8; TWIN_MAX + 1];
                a[..x.len()].copy_from_slice(x);
                (a, x.len())
            })
        };
        for (from, to) in [
            ("\u{2581}Direction", "\u{2581}direction"),
            ("\u{120}Film", "\u{120}film"),
            (" Track", " track"),
            ("Wave", "wave"),
        ] {
            let (a, n) = twin(from.as_bytes()).expect(from);
            assert_eq!(&a[..n], to.as_bytes(), "{from:?}");
        }
        for no in [
            "\u{2581}DNA",
            "\u{2581}direction",
            "Über",
            "\u{2581}A",
            "\u{2581}",
            "",
            "Mc2",
        ] {
            assert!(twin(no.as_bytes()).is_none(), "{no:?}");
        }
        let mut long = [b'b'; TWIN_MAX + 1];
        long[0] = b'A';
        assert!(twin(&long).is_none());
    }
}
