//! Values of the interpreter and the one buffer that holds the output and every string
//! made while rendering.
//!
//! A value is small and `Copy`: strings are slices of the template or of the messages
//! (`Str::Src`) or spans of the scratch end of the caller's buffer (`Str::Tmp`); lists are
//! views (`Seq`: a base, a first index, a step and a length) over the messages, a
//! message's content parts, a range, a string's split, or values kept in the evaluator's
//! fixed slab. Nothing is allocated.
use super::JinjaError;

/// A string: borrowed from the inputs, or `len` bytes at `at` in the scratch area.
#[derive(Clone, Copy, Debug)]
pub enum Str<'a> {
    Src(&'a str),
    Tmp(u32, u32),
}

/// What a sequence's indices point into.
#[derive(Clone, Copy, Debug)]
pub enum Base<'a> {
    /// The conversation's messages.
    Messages,
    /// The content parts of message `.0`.
    Parts(u16),
    /// The evaluator's slab of values (list literals, filter results).
    Slab,
    /// The integers themselves (`range`).
    Range,
    /// The pieces of `str.split(sep)`; `None`: split on runs of whitespace.
    Split(Str<'a>, Option<Str<'a>>),
    /// The `(key, value)` pairs of a dict whose pairs start at slab index `.0`.
    DictItems(u32),
    /// Consecutive JSON nodes from buffer offset `.0` (an array's elements, a pair).
    JsonRun(u32),
    /// The `(key, value)` pairs of the JSON object at buffer offset `.0`.
    JsonItems(u32),
    /// The keys of the JSON object at buffer offset `.0` (iterating over it).
    JsonKeys(u32),
}

/// Elements `start, start + step, ...` (`len` of them) of a base.
#[derive(Clone, Copy, Debug)]
pub struct Seq<'a> {
    pub base: Base<'a>,
    pub start: i64,
    pub step: i64,
    pub len: u32,
}

impl<'a> Seq<'a> {
    pub fn new(base: Base<'a>, len: usize) -> Seq<'a> {
        Seq {
            base,
            start: 0,
            step: 1,
            len: len as u32,
        }
    }

    /// The base index of element `i` (`i < len`).
    pub fn index(&self, i: u32) -> i64 {
        self.start + i64::from(i) * self.step
    }

    /// Python's `seq[a:b:c]`.
    pub fn slice(&self, a: Option<i64>, b: Option<i64>, c: Option<i64>) -> Option<Seq<'a>> {
        let (start, step, len) = slice_indices(i64::from(self.len), a, b, c)?;
        Some(Seq {
            base: self.base,
            start: self.index(start as u32),
            step: self.step * step,
            len: len as u32,
        })
    }

    pub fn reversed(&self) -> Seq<'a> {
        if self.len == 0 {
            return *self;
        }
        Seq {
            base: self.base,
            start: self.index(self.len - 1),
            step: -self.step,
            len: self.len,
        }
    }
}

/// `slice(a, b, c).indices(n)` and the slice's length: `None` for a zero step.
pub fn slice_indices(
    n: i64,
    a: Option<i64>,
    b: Option<i64>,
    c: Option<i64>,
) -> Option<(i64, i64, i64)> {
    let step = c.unwrap_or(1);
    if step == 0 {
        return None;
    }
    let clamp = |v: Option<i64>, dflt: i64, lo: i64, hi: i64| match v {
        None => dflt,
        Some(v) if v < 0 => (v + n).max(lo),
        Some(v) => v.min(hi),
    };
    let (start, stop) = if step > 0 {
        (clamp(a, 0, 0, n), clamp(b, n, 0, n))
    } else {
        (clamp(a, n - 1, -1, n - 1), clamp(b, -1, -1, n - 1))
    };
    let len = if step > 0 {
        if stop > start {
            (stop - start + step - 1) / step
        } else {
            0
        }
    } else if start > stop {
        (start - stop + (-step) - 1) / (-step)
    } else {
        0
    };
    Some((start, step, len))
}

/// An interpreter value.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    Undefined,
    None,
    Bool(bool),
    Int(i64),
    Str(Str<'a>),
    Seq(Seq<'a>),
    /// Message `.0` of the conversation (a mapping with `role` and `content`).
    Message(u16),
    /// Part `.1` of message `.0`'s content (a mapping with `type` and `text`).
    Part(u16, u16),
    /// A `namespace()` object; its attributes live in the evaluator.
    Namespace(u16),
    /// The `loop` variable of the for loop at depth `.0`.
    Loop(u16),
    /// A macro defined by `{% macro %}` (its index).
    Macro(u16),
    /// A dict literal: `len` key/value pairs at slab index `at` (key, value, key, ...).
    Dict {
        at: u32,
        len: u32,
    },
    /// A `(key, value)` pair of a dict, at slab index `.0`.
    Pair(u32),
    /// A JSON object from outside the template (`tools`), at buffer offset `.0`.
    JsonObj(u32),
    /// A JSON number that is not an integer, at buffer offset `.0` (kept as its text).
    JsonNum(u32),
}

impl Value<'_> {
    pub fn is_undefined(&self) -> bool {
        matches!(self, Value::Undefined)
    }
    pub fn is_str(&self) -> bool {
        matches!(self, Value::Str(_))
    }
    pub fn is_mapping(&self) -> bool {
        matches!(
            self,
            Value::Message(_)
                | Value::Part(..)
                | Value::Namespace(_)
                | Value::Loop(_)
                | Value::Dict { .. }
                | Value::JsonObj(_)
        )
    }
}

/// The caller's buffer: output grows from the front, scratch strings from the back.
///
/// # Invariants
/// `len <= top <= mem.len()`; `mem[..len]` is output, `mem[top..]` scratch strings that
/// stay valid (and unchanged) until rendering ends.
pub struct Buf<'o> {
    pub mem: &'o mut [u8],
    pub len: usize,
    pub top: usize,
}

impl<'o> Buf<'o> {
    pub fn new(mem: &'o mut [u8]) -> Buf<'o> {
        let top = mem.len();
        Buf { mem, len: 0, top }
    }

    pub fn put(&mut self, b: &[u8]) -> Result<(), JinjaError> {
        let end = self.len + b.len();
        if end > self.top {
            return Err(JinjaError::BufferFull);
        }
        self.mem[self.len..end].copy_from_slice(b);
        self.len = end;
        Ok(())
    }

    pub fn put_str(&mut self, s: Str<'_>) -> Result<(), JinjaError> {
        match s {
            Str::Src(s) => self.put(s.as_bytes()),
            Str::Tmp(at, n) => {
                let (at, n) = (at as usize, n as usize);
                if self.len + n > self.top {
                    return Err(JinjaError::BufferFull);
                }
                self.mem.copy_within(at..at + n, self.len);
                self.len += n;
                Ok(())
            }
        }
    }

    /// Turn the output written since `mark` into a scratch string.
    pub fn capture<'a>(&mut self, mark: usize) -> Str<'a> {
        let n = self.len - mark;
        if n == 0 {
            return Str::Src("");
        }
        // top - n >= len - n = mark: the move never overlaps live scratch.
        self.top -= n;
        self.mem.copy_within(mark..self.len, self.top);
        self.len = mark;
        Str::Tmp(self.top as u32, n as u32)
    }

    pub fn bytes<'s, 'a: 's>(&'s self, s: Str<'a>) -> &'s [u8] {
        match s {
            Str::Src(s) => s.as_bytes(),
            Str::Tmp(at, n) => &self.mem[at as usize..(at + n) as usize],
        }
    }

    /// The string as `str` (every string made here is built from whole characters).
    pub fn text<'s, 'a: 's>(&'s self, s: Str<'a>) -> &'s str {
        match s {
            Str::Src(s) => s,
            Str::Tmp(..) => core::str::from_utf8(self.bytes(s)).unwrap_or(""),
        }
    }

    /// A sub-span of `s` (byte offsets on character boundaries).
    pub fn sub<'a>(&self, s: Str<'a>, a: usize, b: usize) -> Str<'a> {
        match s {
            Str::Src(t) => Str::Src(t.get(a..b).unwrap_or("")),
            Str::Tmp(at, _) => Str::Tmp(at + a as u32, (b - a) as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_like_python() {
        assert_eq!(slice_indices(5, Some(1), None, None), Some((1, 1, 4)));
        assert_eq!(slice_indices(5, None, None, Some(-1)), Some((4, -1, 5)));
        assert_eq!(slice_indices(5, Some(-2), None, None), Some((3, 1, 2)));
        assert_eq!(slice_indices(5, Some(9), Some(2), None), Some((5, 1, 0)));
        assert_eq!(slice_indices(0, None, None, Some(-1)), Some((-1, -1, 0)));
        assert_eq!(slice_indices(3, None, None, Some(0)), None);
    }

    #[test]
    fn capture_moves_output_to_scratch() {
        let mut m = [0u8; 16];
        let mut b = Buf::new(&mut m);
        b.put(b"ab").unwrap();
        let mark = b.len;
        b.put(b"xyz").unwrap();
        let s = b.capture(mark);
        assert_eq!(b.len, 2);
        assert_eq!(b.bytes(s), b"xyz");
        b.put_str(s).unwrap();
        assert_eq!(&b.mem[..5], b"abxyz");
        assert_eq!(b.put(&[0; 9]), Err(JinjaError::BufferFull));
    }
}
