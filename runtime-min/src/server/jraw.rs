//! A JSON value walker over the request bytes, for the fields whose shape varies
//! (`prompt`: a string, token ids, a list of either; message `content`: a string or
//! a list of parts; `stop`; `logit_bias`: a list of pairs or an object), which
//! `serde-json-core` cannot take (it has no `deserialize_any`).
//!
//! Nothing is copied or allocated: a value is a byte range of the body. The walker
//! checks brackets, strings and nesting (at most [`MAX_DEPTH`] levels) without
//! recursion; `serde-json-core` has already checked the whole body's syntax.
use serde_json_core::str::EscapedStr;

/// Deepest nesting accepted.
pub const MAX_DEPTH: usize = 32;

fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// End (exclusive) of the value starting at `i` (after whitespace), or None.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    let i = ws(b, i);
    let first = *b.get(i)?;
    match first {
        b'"' => {
            let mut j = i + 1;
            while j < b.len() {
                match b[j] {
                    b'\\' => j += 2,
                    b'"' => return Some(j + 1),
                    _ => j += 1,
                }
            }
            None
        }
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            let mut in_str = false;
            while j < b.len() {
                let c = b[j];
                if in_str {
                    match c {
                        b'\\' => j += 1,
                        b'"' => in_str = false,
                        _ => {}
                    }
                } else {
                    match c {
                        b'"' => in_str = true,
                        b'{' | b'[' => {
                            depth += 1;
                            if depth > MAX_DEPTH {
                                return None;
                            }
                        }
                        b'}' | b']' => {
                            depth = depth.checked_sub(1)?;
                            if depth == 0 {
                                return Some(j + 1);
                            }
                        }
                        _ => {}
                    }
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// A JSON value: the bytes of one value, without surrounding whitespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Val<'a>(pub &'a [u8]);

/// What kind of value it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Str,
    Num,
    Bool,
    Null,
    Arr,
    Obj,
    Bad,
}

impl<'a> Val<'a> {
    pub fn kind(&self) -> Kind {
        match self.0.first() {
            Some(b'"') => Kind::Str,
            Some(b'[') => Kind::Arr,
            Some(b'{') => Kind::Obj,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'n') => Kind::Null,
            Some(b'-' | b'0'..=b'9') => Kind::Num,
            _ => Kind::Bad,
        }
    }

    /// The string's escaped text (for `json::unescape`).
    pub fn str(&self) -> Option<EscapedStr<'a>> {
        if self.kind() != Kind::Str || self.0.len() < 2 {
            return None;
        }
        core::str::from_utf8(&self.0[1..self.0.len() - 1])
            .ok()
            .map(EscapedStr)
    }

    pub fn num(&self) -> Option<f64> {
        if self.kind() != Kind::Num {
            return None;
        }
        core::str::from_utf8(self.0).ok()?.parse().ok()
    }

    /// A non-negative integer that fits `u32`.
    pub fn u32(&self) -> Option<u32> {
        if self.kind() != Kind::Num || !self.0.iter().all(u8::is_ascii_digit) {
            return None;
        }
        core::str::from_utf8(self.0).ok()?.parse().ok()
    }

    pub fn bool(&self) -> Option<bool> {
        match self.0 {
            b"true" => Some(true),
            b"false" => Some(false),
            _ => None,
        }
    }

    /// The elements of an array (none for other values).
    pub fn items(&self) -> Items<'a> {
        let inner = if self.kind() == Kind::Arr {
            &self.0[1..self.0.len() - 1]
        } else {
            &[]
        };
        Items { b: inner, i: 0 }
    }

    /// The members of an object (none for other values).
    pub fn members(&self) -> Members<'a> {
        let inner = if self.kind() == Kind::Obj {
            &self.0[1..self.0.len() - 1]
        } else {
            &[]
        };
        Members { b: inner, i: 0 }
    }

    /// The member `key` of an object (keys are compared as written).
    pub fn get(&self, key: &str) -> Option<Val<'a>> {
        self.members()
            .find(|(k, _)| k.0.len() == key.len() + 2 && &k.0[1..k.0.len() - 1] == key.as_bytes())
            .map(|(_, v)| v)
    }
}

/// The top-level value of `body`, if it parses as one value.
pub fn root(body: &[u8]) -> Option<Val<'_>> {
    let i = ws(body, 0);
    let e = value_end(body, i)?;
    Some(Val(&body[i..e]))
}

pub struct Items<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Iterator for Items<'a> {
    type Item = Val<'a>;
    fn next(&mut self) -> Option<Val<'a>> {
        let s = ws(self.b, self.i);
        if s >= self.b.len() {
            return None;
        }
        let e = value_end(self.b, s)?;
        let mut j = ws(self.b, e);
        if self.b.get(j) == Some(&b',') {
            j += 1;
        }
        self.i = j.max(e);
        Some(Val(&self.b[s..e]))
    }
}

pub struct Members<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Iterator for Members<'a> {
    type Item = (Val<'a>, Val<'a>);
    fn next(&mut self) -> Option<(Val<'a>, Val<'a>)> {
        let ks = ws(self.b, self.i);
        if ks >= self.b.len() {
            return None;
        }
        let ke = value_end(self.b, ks)?;
        let colon = ws(self.b, ke);
        if self.b.get(colon) != Some(&b':') {
            return None;
        }
        let vs = ws(self.b, colon + 1);
        let ve = value_end(self.b, vs)?;
        let mut j = ws(self.b, ve);
        if self.b.get(j) == Some(&b',') {
            j += 1;
        }
        self.i = j;
        Some((Val(&self.b[ks..ke]), Val(&self.b[vs..ve])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_nested_values_with_strings_that_hold_brackets() {
        let body = br#" {"a": [1, "x]\"y", {"b": null}], "c": {"d": true}, "e": -2.5e1} "#;
        let r = root(body).unwrap();
        assert_eq!(r.kind(), Kind::Obj);
        let a = r.get("a").unwrap();
        let items: heapless::Vec<Val<'_>, 4> = a.items().collect();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].u32(), Some(1));
        assert_eq!(items[1].str().unwrap().0, "x]\\\"y");
        assert_eq!(items[2].get("b").unwrap().kind(), Kind::Null);
        assert_eq!(r.get("c").unwrap().get("d").unwrap().bool(), Some(true));
        assert_eq!(r.get("e").unwrap().num(), Some(-25.0));
        assert_eq!(r.get("zz"), None);
    }

    #[test]
    fn malformed_and_too_deep_values_are_none_not_panics() {
        for b in [
            &b"[1,2"[..],
            b"\"abc",
            b"",
            b"]",
            b"{\"a\" 1}",
            b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        ] {
            if let Some(v) = root(b) {
                let _ = v.items().count();
                let _ = v.members().count();
            }
        }
        assert!(root(&[b'['; 40]).is_none());
        assert_eq!(root(b"{\"a\" 1}").unwrap().members().count(), 0);
    }
}
