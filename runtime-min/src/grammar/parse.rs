//! GBNF (llama.cpp's grammar syntax) -> [`Grammar`].
//!
//! ```text
//! root   ::= object            # a rule; `#` starts a comment
//! object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//! pair   ::= [a-z]+ ":" ws [0-9]{1,3} | "x"? .
//! ```
//! Literals (`"..."` with `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`), character
//! classes (`[a-z]`, `[^"\\]`), `.` (any character), rule names (`[A-Za-z0-9_-]+`),
//! groups, `|`, and the repetitions `* + ? {m} {m,} {m,n}`. A rule ends at the end of
//! its line unless inside parentheses. Token references (`<...>`) are refused.
//!
//! Checked here, so the matcher can trust the result: every rule used is defined,
//! `root` exists, no rule is defined twice, and no rule can reach itself before a
//! character (left recursion, which would make the matcher loop). Nesting is bounded
//! ([`MAX_NESTING`]) and so are repetition counts ([`MAX_REPEAT`]); a grammar larger
//! than the store is [`GrammarError::TooLarge`]. Nothing panics on any input.
use super::{elem, kind, Grammar, ALT, CHAR, END, NEGATED, OPERAND, RULE, SET, SKIP};

/// Deepest nesting of parentheses.
pub const MAX_NESTING: usize = 64;
/// Largest `m` or `n` in `{m,n}`.
pub const MAX_REPEAT: u32 = 1024;
/// Longest rule name kept in an error.
pub const NAME_LEN: usize = 32;

/// A rule name for error messages (cut at [`NAME_LEN`] bytes).
pub type Name = heapless::String<NAME_LEN>;

/// Why a grammar was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GrammarError {
    /// The text is not GBNF at byte `pos`: `what` was expected or is wrong.
    Syntax { pos: usize, what: &'static str },
    /// A rule is used but never defined.
    Undefined { rule: Name, pos: usize },
    /// A rule is defined twice.
    Duplicate { rule: Name, pos: usize },
    /// There is no `root` rule.
    NoRoot,
    /// `rule` can reach itself without consuming a character.
    LeftRecursion { rule: Name },
    /// The grammar does not fit the store: `what` ran out.
    TooLarge { what: &'static str },
}

impl core::fmt::Display for GrammarError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            GrammarError::Syntax { pos, what } => {
                write!(f, "grammar: at byte {pos}: expected {what}")
            }
            GrammarError::Undefined { rule, pos } => {
                write!(f, "grammar: rule '{rule}' (used at byte {pos}) is not defined")
            }
            GrammarError::Duplicate { rule, pos } => {
                write!(f, "grammar: rule '{rule}' is defined twice (again at byte {pos})")
            }
            GrammarError::NoRoot => write!(f, "grammar: there is no 'root' rule"),
            GrammarError::LeftRecursion { rule } => write!(
                f,
                "grammar: rule '{rule}' is left-recursive (it can reach itself without consuming a character)"
            ),
            GrammarError::TooLarge { what } => {
                write!(f, "grammar: too large for this server ({what})")
            }
        }
    }
}

impl core::error::Error for GrammarError {}

/// Storage a grammar is parsed into (lent by the caller, reused between grammars).
pub struct Store<'a> {
    pub elems: &'a mut [u32],
    pub sets: &'a mut [u32],
    /// Per rule: where its body starts (`u32::MAX`: used but not defined yet).
    pub rules: &'a mut [u32],
    /// Per rule: name offset and length in the source (length 0: generated), and the
    /// byte offset of its first use; then scratch for the left-recursion check.
    pub work: &'a mut [u32],
}

impl<'a> Store<'a> {
    /// Rules this store holds at most (`work` needs 4 words per rule).
    pub fn max_rules(&self) -> usize {
        self.rules.len().min(self.work.len() / 4)
    }
}

/// Counts of a parsed grammar in its store (to rebuild the [`Grammar`] view later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub n_elems: usize,
    pub n_sets: usize,
    pub n_rules: usize,
    pub root: u32,
}

impl Parsed {
    /// The grammar view over `store`.
    pub fn view<'g>(&self, store: &'g Store<'_>) -> Grammar<'g> {
        Grammar {
            elems: &store.elems[..self.n_elems],
            sets: &store.sets[..self.n_sets],
            rules: &store.rules[..self.n_rules],
            root: self.root,
        }
    }
}

const UNDEFINED: u32 = u32::MAX;

struct P<'s, 'x, 'a> {
    src: &'s [u8],
    i: usize,
    st: &'x mut Store<'a>,
    n_elems: usize,
    n_sets: usize,
    n_rules: usize,
    depth: usize,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}

fn name_of(src: &[u8], off: usize, len: usize) -> Name {
    let mut n = Name::new();
    let s = src.get(off..off + len).unwrap_or(&[]);
    for ch in core::str::from_utf8(s).unwrap_or("?").chars() {
        if n.push(ch).is_err() {
            break;
        }
    }
    n
}

impl P<'_, '_, '_> {
    fn err<T>(&self, what: &'static str) -> Result<T, GrammarError> {
        Err(GrammarError::Syntax { pos: self.i, what })
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.i).copied()
    }

    /// Skip spaces and comments (and line ends when `newlines`).
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.i += 1,
                b'\r' | b'\n' if newlines => self.i += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n' && c != b'\r') {
                        self.i += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn emit(&mut self, e: u32) -> Result<usize, GrammarError> {
        let at = self.n_elems;
        let slot = self
            .st
            .elems
            .get_mut(at)
            .ok_or(GrammarError::TooLarge { what: "elements" })?;
        *slot = e;
        self.n_elems += 1;
        Ok(at)
    }

    fn new_rule(&mut self, name: (usize, usize)) -> Result<u32, GrammarError> {
        let r = self.n_rules;
        if r >= self.st.max_rules() || r as u32 > OPERAND {
            return Err(GrammarError::TooLarge { what: "rules" });
        }
        self.st.rules[r] = UNDEFINED;
        self.st.work[2 * r] = name.0 as u32;
        self.st.work[2 * r + 1] = name.1 as u32;
        self.n_rules += 1;
        Ok(r as u32)
    }

    /// A generated rule whose body starts at `start`.
    fn gen_rule(&mut self, start: usize) -> Result<u32, GrammarError> {
        let r = self.new_rule((self.i, 0))?;
        self.st.rules[r as usize] = start as u32;
        Ok(r)
    }

    /// The id of the rule named `src[off..off+len]` (created undefined if new).
    fn rule_id(&mut self, off: usize, len: usize) -> Result<u32, GrammarError> {
        let want = &self.src[off..off + len];
        for r in 0..self.n_rules {
            let (o, l) = (
                self.st.work[2 * r] as usize,
                self.st.work[2 * r + 1] as usize,
            );
            if l == len && &self.src[o..o + l] == want {
                return Ok(r as u32);
            }
        }
        self.new_rule((off, len))
    }

    fn name(&mut self) -> (usize, usize) {
        let start = self.i;
        while self.peek().is_some_and(is_word) {
            self.i += 1;
        }
        (start, self.i - start)
    }

    fn hex(&mut self, digits: usize) -> Result<u32, GrammarError> {
        let mut v = 0u32;
        for _ in 0..digits {
            let d = match self.peek() {
                Some(c @ b'0'..=b'9') => c - b'0',
                Some(c @ b'a'..=b'f') => c - b'a' + 10,
                Some(c @ b'A'..=b'F') => c - b'A' + 10,
                _ => return self.err("a hexadecimal digit"),
            };
            v = v.wrapping_mul(16) | d as u32;
            self.i += 1;
        }
        if v > 0x10FFFF {
            return self.err("a code point up to U+10FFFF");
        }
        Ok(v)
    }

    /// One character of a literal or class (escapes decoded).
    fn char(&mut self) -> Result<u32, GrammarError> {
        let Some(c) = self.peek() else {
            return self.err("a character (the text ended)");
        };
        if c == b'\\' {
            self.i += 1;
            let Some(e) = self.peek() else {
                return self.err("an escape after '\\'");
            };
            self.i += 1;
            return match e {
                b'x' => self.hex(2),
                b'u' => self.hex(4),
                b'U' => self.hex(8),
                b't' => Ok('\t' as u32),
                b'r' => Ok('\r' as u32),
                b'n' => Ok('\n' as u32),
                b'\\' | b'"' | b'[' | b']' | b'-' | b'^' => Ok(e as u32),
                _ => {
                    self.i -= 1;
                    self.err("a known escape (\\x \\u \\U \\t \\r \\n \\\\ \\\" \\[ \\])")
                }
            };
        }
        // A UTF-8 sequence of the source (which is a `&str`: valid).
        let rest = core::str::from_utf8(&self.src[self.i..]).ok();
        let ch = rest.and_then(|s| s.chars().next());
        match ch {
            Some(ch) => {
                self.i += ch.len_utf8();
                Ok(ch as u32)
            }
            None => self.err("valid UTF-8"),
        }
    }

    fn literal(&mut self) -> Result<(), GrammarError> {
        self.i += 1; // "
        loop {
            match self.peek() {
                None => return self.err("the closing '\"' of a literal"),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => {
                    let c = self.char()?;
                    self.emit(elem(CHAR, c))?;
                }
            }
        }
    }

    fn put_set(&mut self, v: u32) -> Result<(), GrammarError> {
        let slot = self
            .st
            .sets
            .get_mut(self.n_sets)
            .ok_or(GrammarError::TooLarge {
                what: "character sets",
            })?;
        *slot = v;
        self.n_sets += 1;
        Ok(())
    }

    fn class(&mut self) -> Result<(), GrammarError> {
        self.i += 1; // [
        let head = self.n_sets;
        let mut negated = false;
        if self.peek() == Some(b'^') {
            negated = true;
            self.i += 1;
        }
        if head as u32 > OPERAND {
            return Err(GrammarError::TooLarge {
                what: "character sets",
            });
        }
        self.put_set(0)?;
        let mut n = 0u32;
        loop {
            match self.peek() {
                None => return self.err("the closing ']' of a character class"),
                Some(b']') => {
                    self.i += 1;
                    break;
                }
                _ => {
                    let lo = self.char()?;
                    let mut hi = lo;
                    if self.peek() == Some(b'-') && self.src.get(self.i + 1) != Some(&b']') {
                        self.i += 1;
                        hi = self.char()?;
                        if hi < lo {
                            return self.err("a range whose end is not below its start");
                        }
                    }
                    self.put_set(lo)?;
                    self.put_set(hi)?;
                    n += 1;
                }
            }
        }
        self.st.sets[head] = n | if negated { NEGATED } else { 0 };
        self.emit(elem(SET, head as u32))?;
        Ok(())
    }

    fn any(&mut self) -> Result<(), GrammarError> {
        self.i += 1;
        let head = self.n_sets;
        if head as u32 > OPERAND {
            return Err(GrammarError::TooLarge {
                what: "character sets",
            });
        }
        self.put_set(NEGATED)?; // no ranges, negated: every character
        self.emit(elem(SET, head as u32))?;
        Ok(())
    }

    fn number(&mut self) -> Result<u32, GrammarError> {
        let start = self.i;
        let mut v = 0u32;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            v = v.saturating_mul(10).saturating_add((c - b'0') as u32);
            self.i += 1;
        }
        if self.i == start {
            return self.err("a number in '{m,n}'");
        }
        if v > MAX_REPEAT {
            return self.err("a repetition count of at most 1024");
        }
        Ok(v)
    }

    /// The repetition operator at `self.i` applied to the item whose elements are at
    /// `a + 1..` (`a` holds a placeholder `SKIP 0`).
    fn repeat(&mut self, a: usize) -> Result<(), GrammarError> {
        let op = self.peek().unwrap_or(0);
        self.i += 1;
        let (min, max) = match op {
            b'*' => (0, None),
            b'+' => (1, None),
            b'?' => (0, Some(1)),
            _ => {
                self.space(true);
                let m = self.number()?;
                self.space(true);
                let n = match self.peek() {
                    Some(b'}') => Some(m),
                    Some(b',') => {
                        self.i += 1;
                        self.space(true);
                        match self.peek() {
                            Some(b'}') => None,
                            _ => {
                                let n = self.number()?;
                                self.space(true);
                                if n < m {
                                    return self.err("n >= m in '{m,n}'");
                                }
                                Some(n)
                            }
                        }
                    }
                    _ => return self.err("',' or '}' in '{m,n}'"),
                };
                if self.peek() != Some(b'}') {
                    return self.err("the closing '}' of '{m,n}'");
                }
                self.i += 1;
                (m, n)
            }
        };
        // The item becomes rule `r` (body: the item, END).
        self.emit(elem(END, 0))?;
        let r = self.gen_rule(a + 1)?;
        // The tail after the `min` copies: r* (unbounded), or nested optionals
        // o1 ::= r | ; ok ::= r o(k-1) |  (so that each count has one parse).
        let tail = match max {
            None => {
                let s = self.gen_rule(self.n_elems)?;
                self.emit(elem(RULE, r))?;
                self.emit(elem(RULE, s))?;
                self.emit(elem(ALT, 0))?;
                self.emit(elem(END, 0))?;
                Some(s)
            }
            Some(n) if n > min => {
                let mut prev = None;
                for _ in min..n {
                    let o = self.gen_rule(self.n_elems)?;
                    self.emit(elem(RULE, r))?;
                    if let Some(p) = prev {
                        self.emit(elem(RULE, p))?;
                    }
                    self.emit(elem(ALT, 0))?;
                    self.emit(elem(END, 0))?;
                    prev = Some(o);
                }
                prev
            }
            Some(_) => None,
        };
        self.st.elems[a] = elem(SKIP, (self.n_elems - a - 1) as u32);
        for _ in 0..min {
            self.emit(elem(RULE, r))?;
        }
        if let Some(t) = tail {
            self.emit(elem(RULE, t))?;
        }
        Ok(())
    }

    fn sequence(&mut self, nested: bool) -> Result<(), GrammarError> {
        let mut last: Option<usize> = None;
        while let Some(c) = self.peek() {
            let a = self.n_elems;
            match c {
                b'*' | b'+' | b'?' | b'{' => match last.take() {
                    Some(item) => self.repeat(item)?,
                    None => return self.err("an item before the repetition operator"),
                },
                b'"' => {
                    self.emit(elem(SKIP, 0))?;
                    self.literal()?;
                    last = Some(a);
                }
                b'[' => {
                    self.emit(elem(SKIP, 0))?;
                    self.class()?;
                    last = Some(a);
                }
                b'.' => {
                    self.emit(elem(SKIP, 0))?;
                    self.any()?;
                    last = Some(a);
                }
                b'(' => {
                    if self.depth >= MAX_NESTING {
                        return self.err("at most 64 nested parentheses");
                    }
                    self.emit(elem(SKIP, 0))?;
                    self.i += 1;
                    self.space(true);
                    let b = self.emit(elem(SKIP, 0))?;
                    let g = self.gen_rule(b + 1)?;
                    self.depth += 1;
                    self.alternates(true)?;
                    self.depth -= 1;
                    self.emit(elem(END, 0))?;
                    if self.peek() != Some(b')') {
                        return self.err("')'");
                    }
                    self.i += 1;
                    self.st.elems[b] = elem(SKIP, (self.n_elems - b - 1) as u32);
                    self.emit(elem(RULE, g))?;
                    last = Some(a);
                }
                b'<' => {
                    return self.err("a grammar item (token references '<...>' are not supported)")
                }
                c if is_word(c) => {
                    // A rule name, unless it starts the next rule (`name ::=`).
                    let save = self.i;
                    let (off, len) = self.name();
                    self.space(false);
                    if self.src[self.i..].starts_with(b"::=") {
                        self.i = save;
                        return self.err("a newline before the next rule");
                    }
                    self.emit(elem(SKIP, 0))?;
                    let r = self.rule_id(off, len)?;
                    self.emit(elem(RULE, r))?;
                    last = Some(a);
                }
                _ => break,
            }
            self.space(nested);
        }
        Ok(())
    }

    fn alternates(&mut self, nested: bool) -> Result<(), GrammarError> {
        self.sequence(nested)?;
        while self.peek() == Some(b'|') {
            self.i += 1;
            self.space(true);
            self.emit(elem(ALT, 0))?;
            self.sequence(nested)?;
        }
        Ok(())
    }

    fn rule(&mut self) -> Result<(), GrammarError> {
        let (off, len) = self.name();
        if len == 0 {
            return self.err("a rule name");
        }
        self.space(false);
        if !self.src[self.i..].starts_with(b"::=") {
            return self.err("'::=' after the rule name");
        }
        self.i += 3;
        self.space(true);
        let r = self.rule_id(off, len)? as usize;
        if self.st.rules[r] != UNDEFINED {
            return Err(GrammarError::Duplicate {
                rule: name_of(self.src, off, len),
                pos: off,
            });
        }
        // Groups and repetitions in the body are written inside it, behind a SKIP.
        self.st.rules[r] = self.n_elems as u32;
        self.alternates(false)?;
        self.emit(elem(END, 0))?;
        match self.peek() {
            None | Some(b'\n') | Some(b'\r') => Ok(()),
            Some(b')') => self.err("a '(' before this ')'"),
            _ => self.err("a newline or the end of the text after a rule"),
        }
    }
}

/// Parse GBNF `src` into `store`.
///
/// # Errors
/// [`GrammarError`]: the byte offset and what is wrong, or the rule at fault.
pub fn parse(src: &str, store: &mut Store<'_>) -> Result<Parsed, GrammarError> {
    let mut p = P {
        src: src.as_bytes(),
        i: 0,
        st: store,
        n_elems: 0,
        n_sets: 0,
        n_rules: 0,
        depth: 0,
    };
    p.space(true);
    while p.i < p.src.len() {
        p.rule()?;
        p.space(true);
    }
    let (n_elems, n_sets, n_rules) = (p.n_elems, p.n_sets, p.n_rules);
    let src = p.src;
    let st = p.st;
    let mut root = None;
    for r in 0..n_rules {
        let (o, l) = (st.work[2 * r] as usize, st.work[2 * r + 1] as usize);
        if st.rules[r] == UNDEFINED {
            return Err(GrammarError::Undefined {
                rule: name_of(src, o, l),
                pos: o,
            });
        }
        if l > 0 && &src[o..o + l] == b"root" {
            root = Some(r as u32);
        }
    }
    let root = root.ok_or(GrammarError::NoRoot)?;
    let parsed = Parsed {
        n_elems,
        n_sets,
        n_rules,
        root,
    };
    left_recursion(st, &parsed, src)?;
    Ok(parsed)
}

/// Refuse a rule that reaches itself before any character. First which rules can
/// match the empty text (a fixpoint), then a depth-first walk over the "leftmost"
/// references (those preceded only by nullable elements in some alternative).
fn left_recursion(st: &mut Store<'_>, p: &Parsed, src: &[u8]) -> Result<(), GrammarError> {
    let n = p.n_rules;
    let (names, rest) = st.work.split_at_mut(2 * n);
    let (nullable, rest) = rest.split_at_mut(n);
    let (color, _) = rest.split_at_mut(n);
    nullable.fill(0);
    color.fill(0);
    let g = Grammar {
        elems: &st.elems[..p.n_elems],
        sets: &st.sets[..p.n_sets],
        rules: &st.rules[..n],
        root: p.root,
    };
    // Nullable rules: repeat until nothing changes (at most n rounds).
    for _ in 0..=n {
        let mut changed = false;
        for r in 0..n {
            if nullable[r] == 0 && rule_nullable(&g, r, nullable) {
                nullable[r] = 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Cycle search over leftmost references, iteratively: `color` 0 = new,
    // 1 = on the path, 2 = done. The path is walked again from each rule's first
    // leftmost reference; each rule is finished once, so this is O(rules x elements).
    for start in 0..n {
        if color[start] != 0 {
            continue;
        }
        dfs(&g, start, nullable, color, names, src)?;
    }
    Ok(())
}

fn rule_nullable(g: &Grammar<'_>, r: usize, nullable: &[u32]) -> bool {
    let mut pos = g.rules[r] as usize;
    loop {
        // One alternative: all its elements nullable?
        let mut all = true;
        loop {
            pos = g.resolve(pos);
            let e = g.elems[pos];
            match kind(e) {
                END | ALT => break,
                RULE if nullable[(e & OPERAND) as usize] != 0 => pos += 1,
                _ => {
                    all = false;
                    // Skip to the end of this alternative.
                    while !matches!(kind(g.elems[g.resolve(pos)]), END | ALT) {
                        pos = g.resolve(pos) + 1;
                    }
                    break;
                }
            }
        }
        if all {
            return true;
        }
        if kind(g.elems[pos]) == END {
            return false;
        }
        pos += 1;
    }
}

/// The leftmost references of rule `r`, one at a time: `k`-th reference of the
/// walk (None when there are no more).
fn leftmost(g: &Grammar<'_>, r: usize, nullable: &[u32], mut k: usize) -> Option<usize> {
    let mut pos = g.rules[r] as usize;
    loop {
        loop {
            pos = g.resolve(pos);
            let e = g.elems[pos];
            match kind(e) {
                END | ALT => break,
                RULE => {
                    let s = (e & OPERAND) as usize;
                    if k == 0 {
                        return Some(s);
                    }
                    k -= 1;
                    if nullable[s] != 0 {
                        pos += 1;
                        continue;
                    }
                }
                _ => {}
            }
            while !matches!(kind(g.elems[g.resolve(pos)]), END | ALT) {
                pos = g.resolve(pos) + 1;
            }
            break;
        }
        if kind(g.elems[pos]) == END {
            return None;
        }
        pos += 1;
    }
}

fn dfs(
    g: &Grammar<'_>,
    start: usize,
    nullable: &[u32],
    color: &mut [u32],
    names: &[u32],
    src: &[u8],
) -> Result<(), GrammarError> {
    // Path of (rule, index of the next leftmost reference) pairs: depth <= rules.
    let mut path: heapless::Vec<(u32, u32), 512> = heapless::Vec::new();
    let push = |path: &mut heapless::Vec<(u32, u32), 512>, color: &mut [u32], r: usize| {
        color[r] = 1;
        path.push((r as u32, 0))
            .map_err(|_| GrammarError::TooLarge {
                what: "rule nesting",
            })
    };
    push(&mut path, color, start)?;
    while let Some(&(r, k)) = path.last() {
        let top = path.len() - 1;
        match leftmost(g, r as usize, nullable, k as usize) {
            None => {
                color[r as usize] = 2;
                path.pop();
            }
            Some(s) => {
                path[top].1 += 1;
                match color[s] {
                    0 => push(&mut path, color, s)?,
                    1 => {
                        // A cycle: name a rule on it that has a name if there is one.
                        let at = path.iter().position(|&(x, _)| x as usize == s).unwrap_or(0);
                        let named = path[at..]
                            .iter()
                            .map(|&(x, _)| x as usize)
                            .find(|&x| names[2 * x + 1] > 0)
                            .unwrap_or(s);
                        let (o, l) = (names[2 * named] as usize, names[2 * named + 1] as usize);
                        return Err(GrammarError::LeftRecursion {
                            rule: name_of(src, o, l),
                        });
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}
