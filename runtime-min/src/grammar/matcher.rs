//! Where a grammar stands after the text so far, and which tokens may come next.
//!
//! The state is a set of parse stacks (the grammar is ambiguous in general). A stack is
//! a chain of nodes `(position, parent)`: the top's position is the character element
//! to match next, each parent holds where to go on once the rule below it is done.
//! Stacks share their tails, and a rule called last in an alternative pushes no frame
//! (a tail call), so `x ::= "a" x | ""` runs in constant space. Bytes are fed one at a
//! time; a multi-byte UTF-8 character is held as a prefix (and stacks that no code point
//! with that prefix can match are dropped) until it is complete. A state whose set is
//! empty but that reached the end of `root` is *done*: only an end-of-generation token
//! may follow.
//!
//! # Memory
//! All in [`MatcherBufs`], lent by the caller: two node pools (the committed state is
//! copied into the spare pool after each accepted token, so the pool never fills with
//! dead nodes), a forwarding table for that copy, and the stack tops. Testing a token
//! allocates above the committed state and is rolled back. Running out of any of them
//! makes the token under test rejected ([`Matcher::overflowed`] records it), never a
//! panic or a wrong acceptance.
use super::{kind, Grammar, SortedVocab, ALT, CHAR, END, OPERAND, RULE, SET};
use crate::tokenizer::Tokenizer;

const NONE: u32 = u32::MAX;
/// Deepest expansion (rule calls and returns in one step).
pub const MAX_DEPTH: u32 = 256;
/// Longest token (in bytes) a mask walk follows; longer ones are rejected.
pub const MAX_TOKEN: usize = 128;

/// Buffers of a matcher.
pub struct MatcherBufs<'m> {
    /// Two words per node (position, parent).
    pub nodes: &'m mut [u32],
    /// As long as `nodes`: the committed state is copied here after a token.
    pub spare: &'m mut [u32],
    /// Half as long as `nodes`.
    pub fwd: &'m mut [u32],
    pub tops: &'m mut [u32],
}

impl MatcherBufs<'_> {
    /// Words the buffers take for `nodes` nodes and `tops` stack tops.
    pub const fn words(nodes: usize, tops: usize) -> usize {
        5 * nodes + tops
    }
}

/// One state: stack tops `tops[start..start+len]`, the bump marks after it, and a
/// pending UTF-8 prefix.
#[derive(Clone, Copy, Debug)]
struct Level {
    start: u32,
    len: u32,
    nodes_end: u32,
    partial: u32,
    need: u8,
    /// Smallest code point of the character in progress (1..=4 bytes: no overlong
    /// encodings).
    min: u32,
    done: bool,
}

impl Level {
    fn tops_end(&self) -> usize {
        (self.start + self.len) as usize
    }
}

/// Where a matcher stands, apart from its buffers: what [`Matcher::resume`] needs to go
/// on over the same buffers (a batched answer keeps it between the steps of the
/// server, whose buffers are borrowed again for each step).
#[derive(Clone, Copy, Debug)]
pub struct Saved {
    n_nodes: usize,
    n_tops: usize,
    state: Level,
    overflowed: bool,
    /// The committed nodes are in the buffer lent as `spare` (each accepted token swaps
    /// the pools).
    flipped: bool,
}

/// Out of matcher buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

/// A grammar's matcher.
pub struct Matcher<'g, 'm> {
    g: Grammar<'g>,
    b: MatcherBufs<'m>,
    n_nodes: usize,
    n_tops: usize,
    state: Level,
    /// A token was rejected because the buffers ran out (or was longer than
    /// [`MAX_TOKEN`]).
    pub overflowed: bool,
    /// `b.nodes` is the buffer first lent as `spare`.
    flipped: bool,
}

impl<'g, 'm> Matcher<'g, 'm> {
    /// The matcher at the start of `g`'s root rule.
    ///
    /// # Errors
    /// [`Full`] when the buffers cannot hold even the start state.
    pub fn new(g: Grammar<'g>, b: MatcherBufs<'m>) -> Result<Self, Full> {
        let mut m = Matcher {
            g,
            b,
            n_nodes: 0,
            n_tops: 0,
            state: Level {
                start: 0,
                len: 0,
                nodes_end: 0,
                partial: 0,
                need: 0,
                min: 0,
                done: false,
            },
            overflowed: false,
            flipped: false,
        };
        let mut done = false;
        let root = m.g.rules.get(m.g.root as usize).copied().ok_or(Full)?;
        m.alternatives(root as usize, NONE, 0, 0, &mut done)?;
        m.state = Level {
            start: 0,
            len: m.n_tops as u32,
            nodes_end: m.n_nodes as u32,
            partial: 0,
            need: 0,
            min: 0,
            done,
        };
        Ok(m)
    }

    /// Where this matcher stands, to [`resume`](Self::resume) it later over the same
    /// buffers.
    pub fn save(&self) -> Saved {
        Saved {
            n_nodes: self.n_nodes,
            n_tops: self.n_tops,
            state: self.state,
            overflowed: self.overflowed,
            flipped: self.flipped,
        }
    }

    /// The matcher `s` was saved from, over the buffers it had (lent in the same order
    /// as to [`new`](Self::new)), which must hold what they held then.
    ///
    /// # Errors
    /// [`Full`] when the buffers are too short for the saved state (not the ones it was
    /// saved from).
    pub fn resume(g: Grammar<'g>, mut b: MatcherBufs<'m>, s: Saved) -> Result<Self, Full> {
        if s.flipped {
            core::mem::swap(&mut b.nodes, &mut b.spare);
        }
        if 2 * s.n_nodes > b.nodes.len() || s.n_tops > b.tops.len() {
            return Err(Full);
        }
        Ok(Matcher {
            g,
            b,
            n_nodes: s.n_nodes,
            n_tops: s.n_tops,
            state: s.state,
            overflowed: s.overflowed,
            flipped: s.flipped,
        })
    }

    /// The text so far is a whole sentence of the grammar (an end-of-generation token
    /// may come now).
    pub fn can_end(&self) -> bool {
        self.state.done && self.state.need == 0
    }

    /// Nothing but the end can follow.
    pub fn only_end(&self) -> bool {
        self.state.len == 0
    }

    fn node(&self, n: u32) -> (usize, u32) {
        let i = 2 * n as usize;
        (self.b.nodes[i] as usize, self.b.nodes[i + 1])
    }

    fn new_node(&mut self, pos: usize, parent: u32) -> Result<u32, Full> {
        let i = 2 * self.n_nodes;
        if i + 2 > self.b.nodes.len() || i + 2 > 2 * self.b.fwd.len() {
            return Err(Full);
        }
        self.b.nodes[i] = pos as u32;
        self.b.nodes[i + 1] = parent;
        self.n_nodes += 1;
        Ok((self.n_nodes - 1) as u32)
    }

    fn same_chain(&self, mut a: u32, mut b: u32) -> bool {
        loop {
            if a == b {
                return true;
            }
            if a == NONE || b == NONE {
                return false;
            }
            let (pa, qa) = self.node(a);
            let (pb, qb) = self.node(b);
            if pa != pb {
                return false;
            }
            a = qa;
            b = qb;
        }
    }

    /// Add the stack `(pos, parent)` to the level starting at `lv` unless it is there.
    fn add_top(&mut self, pos: usize, parent: u32, lv: usize) -> Result<(), Full> {
        for k in lv..self.n_tops {
            let (p, q) = self.node(self.b.tops[k]);
            if p == pos && self.same_chain(q, parent) {
                return Ok(());
            }
        }
        if self.n_tops >= self.b.tops.len() {
            return Err(Full);
        }
        let n = self.new_node(pos, parent)?;
        self.b.tops[self.n_tops] = n;
        self.n_tops += 1;
        Ok(())
    }

    /// Every alternative of the rule whose body starts at `body`, with `parent` below.
    fn alternatives(
        &mut self,
        body: usize,
        parent: u32,
        depth: u32,
        lv: usize,
        done: &mut bool,
    ) -> Result<(), Full> {
        let mut a = body;
        loop {
            self.expand(a, parent, depth + 1, lv, done)?;
            // The next alternative: past this one's elements (generated bodies inside
            // it are skipped).
            let mut q = a;
            loop {
                q = self.g.resolve(q);
                match self.g.elems.get(q).map(|&e| kind(e)) {
                    Some(ALT) => {
                        a = q + 1;
                        break;
                    }
                    Some(END) | None => return Ok(()),
                    _ => q += 1,
                }
            }
        }
    }

    /// The stacks reached from position `pos` with `parent` below: pushed while `pos`
    /// is a rule call, popped while it ends an alternative, added when it is a
    /// character element.
    fn expand(
        &mut self,
        pos: usize,
        parent: u32,
        depth: u32,
        lv: usize,
        done: &mut bool,
    ) -> Result<(), Full> {
        if depth > MAX_DEPTH {
            return Err(Full);
        }
        let pos = self.g.resolve(pos);
        let Some(&e) = self.g.elems.get(pos) else {
            return Ok(());
        };
        match kind(e) {
            CHAR | SET => self.add_top(pos, parent, lv),
            END | ALT => {
                if parent == NONE {
                    *done = true;
                    Ok(())
                } else {
                    let (p, q) = self.node(parent);
                    self.expand(p, q, depth + 1, lv, done)
                }
            }
            RULE => {
                let Some(&body) = self.g.rules.get((e & OPERAND) as usize) else {
                    return Ok(());
                };
                let frame = if self.g.at_end(pos + 1) {
                    parent
                } else {
                    self.new_node(pos + 1, parent)?
                };
                self.alternatives(body as usize, frame, depth, lv, done)
            }
            _ => Ok(()),
        }
    }

    /// The level after byte `c` from `from` (`None`: the grammar cannot take it).
    fn advance(&mut self, from: Level, c: u8) -> Result<Option<Level>, Full> {
        let (partial, need, min) = if from.need == 0 {
            match c {
                0x00..=0x7F => (c as u32, 0, 0),
                0xC2..=0xDF => ((c & 0x1F) as u32, 1, 0x80),
                0xE0..=0xEF => ((c & 0x0F) as u32, 2, 0x800),
                0xF0..=0xF4 => ((c & 0x07) as u32, 3, 0x10000),
                _ => return Ok(None),
            }
        } else {
            if c & 0xC0 != 0x80 {
                return Ok(None);
            }
            (
                (from.partial << 6) | (c & 0x3F) as u32,
                from.need - 1,
                from.min,
            )
        };
        // What the character can still become: no overlong form, no surrogate, at
        // most U+10FFFF.
        let span = 6 * need as u32;
        let lo = (partial << span).max(min);
        let hi = (partial << span | ((1u32 << span) - 1)).min(0x10FFFF);
        if lo > hi || (need == 0 && (0xD800..0xE000).contains(&partial)) {
            return Ok(None);
        }
        let start = self.n_tops;
        let nodes0 = self.n_nodes;
        let mut done = false;
        if need > 0 {
            // A character in progress: keep the stacks some completion can match.
            for k in from.start as usize..from.tops_end() {
                let t = self.b.tops[k];
                let (pos, _) = self.node(t);
                if self.g.overlaps(self.g.elems[pos], lo, hi) {
                    if self.n_tops >= self.b.tops.len() {
                        self.n_tops = start;
                        return Err(Full);
                    }
                    self.b.tops[self.n_tops] = t;
                    self.n_tops += 1;
                }
            }
        } else {
            for k in from.start as usize..from.tops_end() {
                let (pos, parent) = self.node(self.b.tops[k]);
                if self.g.matches(self.g.elems[pos], partial) {
                    if let Err(f) = self.expand(pos + 1, parent, 0, start, &mut done) {
                        self.n_tops = start;
                        self.n_nodes = nodes0;
                        return Err(f);
                    }
                }
            }
        }
        if self.n_tops == start && !done {
            self.n_nodes = nodes0;
            return Ok(None);
        }
        Ok(Some(Level {
            start: start as u32,
            len: (self.n_tops - start) as u32,
            nodes_end: self.n_nodes as u32,
            partial: if need > 0 { partial } else { 0 },
            need,
            min,
            done: done && need == 0,
        }))
    }

    fn rewind(&mut self, to: Level) {
        self.n_tops = to.tops_end();
        self.n_nodes = to.nodes_end as usize;
    }

    /// The level after `bytes` from the committed state (rolled back by the caller).
    fn run(&mut self, bytes: &[u8]) -> Option<Level> {
        let mut lv = self.state;
        for &c in bytes {
            match self.advance(lv, c) {
                Ok(Some(n)) => lv = n,
                Ok(None) => return None,
                Err(Full) => {
                    self.overflowed = true;
                    return None;
                }
            }
        }
        Some(lv)
    }

    /// Whether `bytes` can come next (nothing is committed).
    pub fn allows(&mut self, bytes: &[u8]) -> bool {
        let ok = !bytes.is_empty() && self.run(bytes).is_some();
        self.rewind(self.state);
        ok
    }

    /// Whether token `id` can come next: its bytes, or (an end-of-generation token)
    /// the end; control and unknown tokens never.
    pub fn allows_token(&mut self, tok: &Tokenizer<'_>, id: u32) -> bool {
        if tok.is_eog(id) {
            return self.can_end();
        }
        super::vocab::eligible(tok, id) && self.allows(tok.token_bytes(id))
    }

    /// Make `bytes` part of the text. False (and nothing changes) when the grammar
    /// cannot take them.
    pub fn accept(&mut self, bytes: &[u8]) -> bool {
        let Some(lv) = self.run(bytes) else {
            self.rewind(self.state);
            return false;
        };
        if self.compact(lv).is_err() {
            self.overflowed = true;
            self.rewind(self.state);
            return false;
        }
        true
    }

    /// Copy the stacks of `lv` into the spare pool (and its tops to the front), then
    /// make that the committed state.
    fn compact(&mut self, lv: Level) -> Result<(), Full> {
        let n = self.n_nodes;
        if n > self.b.fwd.len() {
            return Err(Full);
        }
        self.b.fwd[..n].fill(NONE);
        let mut n_new = 0usize;
        for k in 0..lv.len as usize {
            let t = self.b.tops[lv.start as usize + k];
            // The chain up to the first node already copied, then copied root-first.
            let mut chain: heapless::Vec<u32, { MAX_DEPTH as usize * 2 }> = heapless::Vec::new();
            let mut x = t;
            while x != NONE && self.b.fwd[x as usize] == NONE {
                chain.push(x).map_err(|_| Full)?;
                x = self.node(x).1;
            }
            let mut below = if x == NONE {
                NONE
            } else {
                self.b.fwd[x as usize]
            };
            for &y in chain.iter().rev() {
                let i = 2 * n_new;
                if i + 2 > self.b.spare.len() {
                    return Err(Full);
                }
                self.b.spare[i] = self.b.nodes[2 * y as usize];
                self.b.spare[i + 1] = below;
                below = n_new as u32;
                self.b.fwd[y as usize] = below;
                n_new += 1;
            }
            self.b.tops[k] = self.b.fwd[t as usize];
        }
        core::mem::swap(&mut self.b.nodes, &mut self.b.spare);
        self.flipped = !self.flipped;
        self.n_nodes = n_new;
        self.n_tops = lv.len as usize;
        self.state = Level {
            start: 0,
            len: lv.len,
            nodes_end: n_new as u32,
            partial: lv.partial,
            need: lv.need,
            min: lv.min,
            done: lv.done,
        };
        Ok(())
    }

    /// Set `logits[id]` to `-inf` for every token the grammar cannot take next (the
    /// end-of-generation tokens stay when [`Self::can_end`]). Returns how many tokens
    /// remain allowed.
    ///
    /// One walk over the vocabulary sorted by bytes: the states after each prefix of
    /// the previous token are kept, so a token only costs its bytes past the prefix it
    /// shares with the one before, and a prefix the grammar refuses refuses every
    /// following token that starts with it without looking at them.
    pub fn mask(&mut self, tok: &Tokenizer<'_>, v: &SortedVocab<'_>, logits: &mut [f32]) -> usize {
        let end_ok = self.can_end();
        let reject = |id: u32, logits: &mut [f32]| {
            if !(end_ok && tok.is_eog(id)) {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        };
        let mut levels: heapless::Vec<Level, { MAX_TOKEN + 1 }> = heapless::Vec::new();
        let _ = levels.push(self.state);
        let mut dead = usize::MAX;
        let mut allowed = 0usize;
        for (k, &id) in v.order.iter().enumerate() {
            let b = tok.token_bytes(id);
            let l = v.lcp.get(k).copied().unwrap_or(0) as usize;
            if l >= dead {
                reject(id, logits);
                continue;
            }
            dead = usize::MAX;
            let keep = l.min(levels.len() - 1);
            levels.truncate(keep + 1);
            let top = levels[keep];
            self.rewind(top);
            let mut ok = b.len() <= MAX_TOKEN;
            if ok {
                for j in keep..b.len() {
                    match self.advance(levels[j], b[j]) {
                        Ok(Some(n)) => {
                            let _ = levels.push(n);
                        }
                        Ok(None) => {
                            dead = j + 1;
                            ok = false;
                            break;
                        }
                        Err(Full) => {
                            self.overflowed = true;
                            ok = false;
                            break;
                        }
                    }
                }
            } else {
                self.overflowed = true;
            }
            if ok && (end_ok || !tok.is_eog(id)) {
                allowed += 1;
            } else {
                reject(id, logits);
            }
        }
        self.rewind(self.state);
        for &id in v.excluded {
            reject(id, logits);
        }
        if end_ok {
            allowed += tok.eog_ids().len();
        }
        allowed
    }
}
