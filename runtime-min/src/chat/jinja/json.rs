//! JSON values from outside the template (the request's `tools`), as interpreter values.
//!
//! The JSON text is parsed once, when rendering starts, into a compact tree in the
//! scratch end of the output buffer, with strings unescaped, so that every later access
//! is a read (`attr`, `elem` take `&self`). Node layout (integers little-endian):
//!
//! | tag | then | value |
//! |---|---|---|
//! | `o` | count `u32`, size `u32`, then count (key `s` node, value node) pairs | `JsonObj` |
//! | `a` | count `u32`, size `u32`, then count nodes | a sequence over the elements |
//! | `s` | length `u32`, the UTF-8 bytes | a string |
//! | `i` | `i64` | an integer |
//! | `n` | length `u32`, the number's JSON text | `JsonNum` (not an integer) |
//! | `T` `F` `N` | - | `true`, `false`, `none` |
//!
//! `size` is the whole node's length in bytes, so a walk skips a container in one step.
//! A `(key, value)` pair of `items()` is a two-element sequence over the pair's nodes.
use super::value::{Base, Seq, Str, Value};
use super::{JinjaError, Vm};

type R<T> = Result<T, JinjaError>;

/// Deepest nesting read.
const MAX_DEPTH: u32 = 32;

impl<'a> Vm<'a, '_> {
    /// Parse `text` into the scratch area and return its value.
    pub fn load_json(&mut self, text: &str) -> R<Value<'a>> {
        let b = text.as_bytes();
        let mark = self.buf.len;
        let end = self.json_node(b, ws(b, 0), 0)?;
        if ws(b, end) != b.len() {
            return Err(self.json_err());
        }
        let Str::Tmp(at, _) = self.buf.capture(mark) else {
            return Err(self.json_err());
        };
        Ok(self.json_value(at as usize))
    }

    fn json_err(&self) -> JinjaError {
        JinjaError::Type {
            at: 0,
            what: "tools is not valid JSON",
        }
    }

    fn put_u32(&mut self, v: u32) -> R<()> {
        self.buf.put(&v.to_le_bytes())
    }

    fn patch_u32(&mut self, at: usize, v: u32) {
        self.buf.mem[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Encode the value at `b[i..]`; returns where it ends.
    fn json_node(&mut self, b: &[u8], i: usize, depth: u32) -> R<usize> {
        self.step()?;
        if depth > MAX_DEPTH {
            return Err(self.too_complex("tools nested too deep"));
        }
        let lit = |w: &[u8]| b.get(i..i + w.len()) == Some(w);
        match b.get(i) {
            Some(b'{') | Some(b'[') => {
                let obj = b[i] == b'{';
                let head = self.buf.len;
                self.buf.put(&[if obj { b'o' } else { b'a' }; 9])?;
                let (close, mut j, mut count) = (if obj { b'}' } else { b']' }, ws(b, i + 1), 0u32);
                if b.get(j) == Some(&close) {
                    j += 1;
                } else {
                    loop {
                        if obj {
                            if b.get(j) != Some(&b'"') {
                                return Err(self.json_err());
                            }
                            j = ws(b, self.json_string(b, j)?);
                            if b.get(j) != Some(&b':') {
                                return Err(self.json_err());
                            }
                            j = ws(b, j + 1);
                        }
                        j = ws(b, self.json_node(b, j, depth + 1)?);
                        count += 1;
                        match b.get(j) {
                            Some(b',') => j = ws(b, j + 1),
                            Some(&c) if c == close => {
                                j += 1;
                                break;
                            }
                            _ => return Err(self.json_err()),
                        }
                    }
                }
                self.patch_u32(head + 1, count);
                let size = (self.buf.len - head) as u32;
                self.patch_u32(head + 5, size);
                Ok(j)
            }
            Some(b'"') => self.json_string(b, i),
            Some(b't') if lit(b"true") => self.buf.put(b"T").map(|_| i + 4),
            Some(b'f') if lit(b"false") => self.buf.put(b"F").map(|_| i + 5),
            Some(b'n') if lit(b"null") => self.buf.put(b"N").map(|_| i + 4),
            Some(b'-' | b'0'..=b'9') => {
                let mut j = i + 1;
                while j < b.len() && matches!(b[j], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    j += 1;
                }
                let t = core::str::from_utf8(&b[i..j]).map_err(|_| self.json_err())?;
                match t.parse::<i64>() {
                    Ok(v) => {
                        self.buf.put(b"i")?;
                        self.buf.put(&v.to_le_bytes())?;
                    }
                    Err(_) => {
                        self.buf.put(b"n")?;
                        self.put_u32(t.len() as u32)?;
                        self.buf.put(t.as_bytes())?;
                    }
                }
                Ok(j)
            }
            _ => Err(self.json_err()),
        }
    }

    /// Encode the string at `b[i..]` (`b[i] == '"'`) unescaped; returns where it ends.
    fn json_string(&mut self, b: &[u8], i: usize) -> R<usize> {
        let head = self.buf.len;
        self.buf.put(b"s\0\0\0\0")?;
        let mut j = i + 1;
        loop {
            let Some(&c) = b.get(j) else {
                return Err(self.json_err());
            };
            match c {
                b'"' => break,
                b'\\' => {
                    let e = *b.get(j + 1).ok_or_else(|| self.json_err())?;
                    j += 2;
                    let simple = match e {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 8,
                        b'f' => 12,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => 0,
                        _ => return Err(self.json_err()),
                    };
                    if e != b'u' {
                        self.buf.put(&[simple])?;
                        continue;
                    }
                    let mut cp = self.hex4(b, j)?;
                    j += 4;
                    if (0xD800..0xDC00).contains(&cp) && b.get(j..j + 2) == Some(b"\\u") {
                        let lo = self.hex4(b, j + 2)?;
                        if (0xDC00..0xE000).contains(&lo) {
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                            j += 6;
                        }
                    }
                    let ch = char::from_u32(cp).unwrap_or('\u{FFFD}');
                    let mut tmp = [0u8; 4];
                    self.buf.put(ch.encode_utf8(&mut tmp).as_bytes())?;
                }
                c if c < 0x20 => return Err(self.json_err()),
                _ => {
                    let mut k = j + 1;
                    while k < b.len() && !matches!(b[k], b'"' | b'\\') && b[k] >= 0x20 {
                        k += 1;
                    }
                    self.buf.put(&b[j..k])?;
                    j = k;
                }
            }
        }
        let n = (self.buf.len - head - 5) as u32;
        self.patch_u32(head + 1, n);
        Ok(j + 1)
    }

    fn hex4(&self, b: &[u8], j: usize) -> R<u32> {
        let h = b.get(j..j + 4).ok_or_else(|| self.json_err())?;
        let t = core::str::from_utf8(h).map_err(|_| self.json_err())?;
        u32::from_str_radix(t, 16).map_err(|_| self.json_err())
    }

    fn rd_u32(&self, at: usize) -> u32 {
        let m = &self.buf.mem;
        m.get(at..at + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Length in bytes of the node at `at`.
    pub fn json_size(&self, at: usize) -> usize {
        match self.buf.mem.get(at) {
            Some(b'o' | b'a') => self.rd_u32(at + 5) as usize,
            Some(b's' | b'n') => 5 + self.rd_u32(at + 1) as usize,
            Some(b'i') => 9,
            _ => 1,
        }
    }

    /// The node at `at` as a value.
    pub fn json_value(&self, at: usize) -> Value<'a> {
        match self.buf.mem.get(at) {
            Some(b'o') => Value::JsonObj(at as u32),
            Some(b'a') => Value::Seq(Seq::new(
                Base::JsonRun(at as u32 + 9),
                self.rd_u32(at + 1) as usize,
            )),
            Some(b's') => Value::Str(Str::Tmp(at as u32 + 5, self.rd_u32(at + 1))),
            Some(b'i') => {
                let m = &self.buf.mem[at + 1..at + 9];
                let mut v = [0u8; 8];
                v.copy_from_slice(m);
                Value::Int(i64::from_le_bytes(v))
            }
            Some(b'n') => Value::JsonNum(at as u32),
            Some(b'T') => Value::Bool(true),
            Some(b'F') => Value::Bool(false),
            _ => Value::None,
        }
    }

    /// The node `j` nodes after the one at `at`.
    pub fn json_skip(&self, mut at: usize, j: usize) -> usize {
        for _ in 0..j {
            at += self.json_size(at);
        }
        at
    }

    /// Number of members of the object at `at`.
    pub fn json_count(&self, at: u32) -> u32 {
        self.rd_u32(at as usize + 1)
    }

    /// The member `name` of the object at `at`.
    pub fn json_get(&self, at: u32, name: &str) -> Value<'a> {
        let mut p = at as usize + 9;
        for _ in 0..self.json_count(at) {
            let klen = self.rd_u32(p + 1) as usize;
            let v = p + 5 + klen;
            if self.buf.mem.get(p + 5..v) == Some(name.as_bytes()) {
                return self.json_value(v);
            }
            p = v + self.json_size(v);
        }
        Value::Undefined
    }

    /// `items()` of the object at `at`: sequences of (key, value).
    pub fn json_items(&self, at: u32) -> Seq<'a> {
        Seq::new(Base::JsonItems(at), self.json_count(at) as usize)
    }

    /// Pair `j` of [`Self::json_items`].
    pub fn json_pair(&self, at: u32, j: u32) -> Value<'a> {
        let p = self.json_skip(at as usize + 9, 2 * j as usize);
        Value::Seq(Seq::new(Base::JsonRun(p as u32), 2))
    }

    /// The JSON text of the non-integer number at `at`.
    pub fn json_num_text(&self, at: u32) -> Str<'a> {
        Str::Tmp(at + 5, self.rd_u32(at as usize + 1))
    }
}

fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}
