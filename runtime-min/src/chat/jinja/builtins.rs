//! What values do: variables, attributes and items, truth, equality, arithmetic, how a
//! value prints (`str`, Python's `repr`, `tojson`), and the filters, tests, string
//! methods and global functions chat templates call.
//!
//! Filters: `trim`, `length`/`count`, `tojson`, `upper`, `lower`, `capitalize`, `title`,
//! `default`/`d`, `join`, `first`, `last`, `string`, `int`, `list`, `reverse`, `replace`,
//! `safe`, `selectattr`/`rejectattr`/`select`/`reject`, `map(attribute=...)`, `items`,
//! `dictsort`, `sort`. Tests: `defined`, `undefined`, `none`, `string`, `number`, `integer`, `boolean`,
//! `true`, `false`, `mapping`, `iterable`, `sequence`, `callable`, `even`, `odd`,
//! `divisibleby`, `eq`/`equalto`/`==`, `ne`/`!=`, `sameas`, `in`, `lt`/`gt`/`le`/`ge`.
//! String methods: `strip`, `lstrip`, `rstrip`, `split`, `startswith`, `endswith`,
//! `upper`, `lower`, `replace`, `title`, `capitalize`; mapping methods: `get`, `items`.
//! Globals: `range`, `namespace`, `raise_exception`.
use super::expr::Args;
use super::value::{Base, Seq, Str, Value};
use super::{JinjaError, Vm};
use crate::chat::Content;

type R<T> = Result<T, JinjaError>;

/// Python's `str.isspace` for one character.
pub fn py_space(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\x1C'..='\x1F')
}

/// Whether a test reads an argument written after its name (`is divisibleby 3`).
pub fn test_takes_arg(name: &str) -> bool {
    matches!(
        name,
        "divisibleby"
            | "eq"
            | "equalto"
            | "ne"
            | "sameas"
            | "in"
            | "lt"
            | "gt"
            | "le"
            | "ge"
            | "lessthan"
            | "greaterthan"
    )
}

/// Which end(s) `strip` works on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ends {
    Both,
    Left,
    Right,
}

impl<'a> Vm<'a, '_> {
    pub fn lookup(&self, name: &str) -> Value<'a> {
        if let Some(e) = self.locals.iter().rev().find(|e| e.0 == name) {
            return e.1;
        }
        let v = self.vars;
        match name {
            "messages" => Value::Seq(Seq::new(Base::Messages, v.messages.len())),
            "add_generation_prompt" => Value::Bool(v.add_generation_prompt),
            "bos_token" => Value::Str(Str::Src(v.bos_token)),
            "eos_token" => Value::Str(Str::Src(v.eos_token)),
            "tools" => self.tools,
            "functions" | "function_call" | "tool_choice" => Value::None,
            "loop" if !self.loops.is_empty() => Value::Loop(self.loops.len() as u16 - 1),
            _ => match self.macros.iter().position(|m| m.name == name) {
                Some(i) => Value::Macro(i as u16),
                None => Value::Undefined,
            },
        }
    }

    /// `v.name` (and `v['name']`).
    pub fn attr(&self, v: Value<'a>, name: &str) -> Value<'a> {
        match v {
            Value::Message(i) => {
                let Some(m) = self.vars.messages.get(i as usize) else {
                    return Value::Undefined;
                };
                match name {
                    "role" => Value::Str(Str::Src(m.role)),
                    "content" => match m.content {
                        Content::Text(t) => Value::Str(Str::Src(t)),
                        Content::Parts(p) => Value::Seq(Seq::new(Base::Parts(i), p.len())),
                    },
                    _ => Value::Undefined,
                }
            }
            Value::Part(m, j) => match name {
                "type" => Value::Str(Str::Src("text")),
                "text" => match self.vars.messages.get(m as usize).map(|m| m.content) {
                    Some(Content::Parts(p)) => p
                        .get(j as usize)
                        .map_or(Value::Undefined, |t| Value::Str(Str::Src(t))),
                    _ => Value::Undefined,
                },
                _ => Value::Undefined,
            },
            Value::Dict { at, len } => (0..len)
                .map(|i| (at + 2 * i) as usize)
                .find(|&k| {
                    matches!(self.slab.get(k), Some(&Value::Str(x)) if self.buf.text(x) == name)
                })
                .and_then(|k| self.slab.get(k + 1).copied())
                .unwrap_or(Value::Undefined),
            Value::JsonObj(at) => self.json_get(at, name),
            Value::Namespace(ns) => self
                .attrs
                .iter()
                .find(|e| e.0 == ns && e.1 == name)
                .map_or(Value::Undefined, |e| e.2),
            Value::Loop(d) => {
                let Some(f) = self.loops.get(d as usize) else {
                    return Value::Undefined;
                };
                let (i, n) = (i64::from(f.index0), i64::from(f.seq.len));
                match name {
                    "index0" => Value::Int(i),
                    "index" => Value::Int(i + 1),
                    "revindex0" => Value::Int(n - i - 1),
                    "revindex" => Value::Int(n - i),
                    "first" => Value::Bool(i == 0),
                    "last" => Value::Bool(i == n - 1),
                    "length" => Value::Int(n),
                    "depth" => Value::Int(i64::from(d) + 1),
                    "depth0" => Value::Int(i64::from(d)),
                    "previtem" if i > 0 => self.elem(&f.seq, f.index0 - 1),
                    "nextitem" if i + 1 < n => self.elem(&f.seq, f.index0 + 1),
                    _ => Value::Undefined,
                }
            }
            _ => Value::Undefined,
        }
    }

    /// The value under `key` in a dict (`Undefined` when absent).
    pub fn dict_get(&self, d: Value<'a>, key: Value<'a>) -> Value<'a> {
        let Value::Dict { at, len } = d else {
            return Value::Undefined;
        };
        (0..len)
            .map(|i| (at + 2 * i) as usize)
            .find(|&k| self.slab.get(k).is_some_and(|&x| self.equal(x, key)))
            .and_then(|k| self.slab.get(k + 1).copied())
            .unwrap_or(Value::Undefined)
    }

    /// `v[key]`.
    pub fn item(&self, v: Value<'a>, key: Value<'a>) -> Value<'a> {
        if let Value::Dict { .. } = v {
            return self.dict_get(v, key);
        }
        if let (Value::Pair(at), Some(i @ -2..=1)) = (v, self.as_int(key)) {
            let k = at as usize + usize::from(i == 1 || i == -1);
            return self.slab.get(k).copied().unwrap_or(Value::Undefined);
        }
        match key {
            Value::Str(k) => self.attr(v, self.buf.text(k)),
            Value::Int(_) | Value::Bool(_) => {
                let i = self.as_int(key).unwrap_or(0);
                match v {
                    Value::Seq(s) => {
                        let i = if i < 0 { i + i64::from(s.len) } else { i };
                        if i < 0 || i >= i64::from(s.len) {
                            return Value::Undefined;
                        }
                        self.elem(&s, i as u32)
                    }
                    Value::Str(s) => {
                        let t = self.buf.text(s);
                        let n = t.chars().count() as i64;
                        let i = if i < 0 { i + n } else { i };
                        match t.char_indices().nth(i.max(0) as usize) {
                            Some((b, c)) if i >= 0 => {
                                Value::Str(self.buf.sub(s, b, b + c.len_utf8()))
                            }
                            _ => Value::Undefined,
                        }
                    }
                    _ => Value::Undefined,
                }
            }
            _ => Value::Undefined,
        }
    }

    /// Element `i` (`i < s.len`) of a sequence.
    pub fn elem(&self, s: &Seq<'a>, i: u32) -> Value<'a> {
        let j = s.index(i);
        match s.base {
            Base::Messages => Value::Message(j as u16),
            Base::Parts(m) => Value::Part(m, j as u16),
            Base::Slab => self
                .slab
                .get(j as usize)
                .copied()
                .unwrap_or(Value::Undefined),
            Base::Range => Value::Int(j),
            Base::DictItems(at) => Value::Pair(at + 2 * j as u32),
            Base::JsonRun(at) => self.json_value(self.json_skip(at as usize, j as usize)),
            Base::JsonItems(at) => self.json_pair(at, j as u32),
            Base::JsonKeys(at) => match self.json_pair(at, j as u32) {
                Value::Seq(pair) => self.elem(&pair, 0),
                v => v,
            },
            Base::Split(st, sep) => {
                let t = self.buf.text(st);
                let sep = sep.map(|p| self.buf.text(p));
                match split_piece(t, sep, j as usize) {
                    Some((a, b)) => Value::Str(self.buf.sub(st, a, b)),
                    None => Value::Undefined,
                }
            }
        }
    }

    pub fn truthy(&self, v: Value<'a>) -> bool {
        match v {
            Value::Undefined | Value::None => false,
            Value::Bool(b) => b,
            Value::Int(i) => i != 0,
            Value::Str(s) => !self.buf.bytes(s).is_empty(),
            Value::Seq(s) => s.len > 0,
            Value::Dict { len, .. } => len > 0,
            Value::JsonObj(at) => self.json_count(at) > 0,
            Value::JsonNum(at) => {
                let t = self.buf.text(self.json_num_text(at));
                t.bytes().any(|c| matches!(c, b'1'..=b'9'))
            }
            Value::Pair(_)
            | Value::Message(_)
            | Value::Part(..)
            | Value::Namespace(_)
            | Value::Loop(_)
            | Value::Macro(_) => true,
        }
    }

    pub fn as_int(&self, v: Value<'a>) -> Option<i64> {
        match v {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    pub fn equal(&self, a: Value<'a>, b: Value<'a>) -> bool {
        match (a, b) {
            (Value::Str(x), Value::Str(y)) => self.buf.bytes(x) == self.buf.bytes(y),
            (Value::None, Value::None) | (Value::Undefined, Value::Undefined) => true,
            (Value::Seq(x), Value::Seq(y)) => {
                x.len == y.len
                    && (0..x.len).all(|i| {
                        let (p, q) = (self.elem(&x, i), self.elem(&y, i));
                        // Lists of lists compare by identity here (no recursion).
                        match (p, q) {
                            (Value::Seq(_), _) | (_, Value::Seq(_)) => false,
                            _ => self.equal(p, q),
                        }
                    })
            }
            (Value::Message(i), Value::Message(j)) => {
                i == j || {
                    let role = |m: u16| self.attr(Value::Message(m), "role");
                    let text = |m: u16| match self.attr(Value::Message(m), "content") {
                        v @ Value::Str(_) => Some(v),
                        _ => None,
                    };
                    self.equal(role(i), role(j))
                        && matches!((text(i), text(j)), (Some(x), Some(y)) if self.equal(x, y))
                }
            }
            (Value::Part(m, i), Value::Part(n, j)) => {
                self.equal(self.attr(a, "text"), self.attr(b, "text")) || (m, i) == (n, j)
            }
            (Value::Namespace(x), Value::Namespace(y)) => x == y,
            (Value::Dict { at: x, .. }, Value::Dict { at: y, .. }) => x == y,
            (Value::Pair(x), Value::Pair(y)) => {
                x == y
                    || (0..2).all(|k| {
                        match (self.slab.get(x as usize + k), self.slab.get(y as usize + k)) {
                            (Some(&p), Some(&q)) if !matches!(p, Value::Pair(_)) => {
                                self.equal(p, q)
                            }
                            _ => false,
                        }
                    })
            }
            (Value::Loop(x), Value::Loop(y)) => x == y,
            (Value::JsonObj(x), Value::JsonObj(y)) => x == y,
            (Value::JsonNum(x), Value::JsonNum(y)) => {
                self.buf.bytes(self.json_num_text(x)) == self.buf.bytes(self.json_num_text(y))
            }
            _ => match (self.as_int(a), self.as_int(b)) {
                (Some(x), Some(y)) => x == y,
                _ => false,
            },
        }
    }

    /// `needle in hay`.
    pub fn contains(&self, hay: Value<'a>, needle: Value<'a>) -> R<bool> {
        Ok(match hay {
            Value::Str(h) => match needle {
                Value::Str(n) => self.buf.text(h).contains(self.buf.text(n)),
                _ => return Err(self.type_err("'in <string>' needs a string")),
            },
            Value::Seq(s) => (0..s.len).any(|i| self.equal(self.elem(&s, i), needle)),
            Value::Dict { .. } => !self.dict_get(hay, needle).is_undefined(),
            Value::Message(_)
            | Value::Part(..)
            | Value::Namespace(_)
            | Value::Loop(_)
            | Value::JsonObj(_) => match needle {
                Value::Str(k) => !self.attr(hay, self.buf.text(k)).is_undefined(),
                _ => false,
            },
            Value::Undefined => false,
            _ => return Err(self.type_err("'in' on a value that is not a container")),
        })
    }

    pub fn arith(&mut self, op: &str, a: Value<'a>, b: Value<'a>) -> R<Value<'a>> {
        if let (Value::Str(x), Value::Str(y), "+") = (a, b, op) {
            let mark = self.buf.len;
            self.buf.put_str(x)?;
            self.buf.put_str(y)?;
            return Ok(Value::Str(self.buf.capture(mark)));
        }
        if let (Value::Seq(x), Value::Seq(y), "+") = (a, b, op) {
            let mut items: heapless::Vec<Value<'a>, 64> = heapless::Vec::new();
            for (s, i) in (0..x.len)
                .map(|i| (&x, i))
                .chain((0..y.len).map(|i| (&y, i)))
            {
                items
                    .push(self.elem(s, i))
                    .map_err(|_| self.too_complex("list too long"))?;
            }
            return self.slab_list(&items);
        }
        let (Some(x), Some(y)) = (self.as_int(a), self.as_int(b)) else {
            return Err(self.type_err("arithmetic on values that are not numbers"));
        };
        let overflow = || self.type_err("integer overflow");
        let r = match op {
            "+" => x.checked_add(y),
            "-" => x.checked_sub(y),
            "*" => x.checked_mul(y),
            "//" | "%" => {
                if y == 0 {
                    return Err(self.type_err("division by zero"));
                }
                // Python floors toward negative infinity.
                let mut q = x.checked_div(y).ok_or_else(overflow)?;
                if x % y != 0 && ((x < 0) != (y < 0)) {
                    q -= 1;
                }
                if op == "//" {
                    Some(q)
                } else {
                    Some(x - q * y)
                }
            }
            _ => {
                if !(0..=62).contains(&y) {
                    return Err(self.unsupported("'**' with this exponent"));
                }
                x.checked_pow(y as u32)
            }
        };
        r.map(Value::Int).ok_or_else(overflow)
    }

    /// `str(v)` to the output.
    pub fn write_value(&mut self, v: Value<'a>) -> R<()> {
        match v {
            Value::Undefined => Ok(()),
            Value::Str(s) => self.buf.put_str(s),
            _ => self.write_repr(v, false),
        }
    }

    fn write_int(&mut self, i: i64) -> R<()> {
        let mut d = [0u8; 20];
        let mut n = i.unsigned_abs();
        let mut k = d.len();
        loop {
            k -= 1;
            d[k] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if i < 0 {
            self.buf.put(b"-")?;
        }
        self.buf.put(&d[k..])
    }

    /// Python's `repr(v)` (`quote`: strings quoted) or `str(v)` for non-strings.
    fn write_repr(&mut self, v: Value<'a>, quote: bool) -> R<()> {
        match v {
            Value::Str(s) if !quote => self.buf.put_str(s),
            _ => self.write_form(v, Form::Repr),
        }
    }

    /// `v` as Python's `repr` or as JSON: the same shapes, different punctuation.
    fn write_form(&mut self, v: Value<'a>, form: Form) -> R<()> {
        self.write_form_in(v, form, None, 0)
    }

    /// Between a container's items (`i > 0`), or at its start (`i == 0`, `open`) or end
    /// (`close`): `, ` or, with json.dumps' `indent`, a newline and the item's indent.
    fn sep(&mut self, ind: Option<u32>, depth: u32, first: bool, close: bool) -> R<()> {
        match ind {
            None if first || close => Ok(()),
            None => self.buf.put(b", "),
            Some(n) => {
                if !first && !close {
                    self.buf.put(b",")?;
                }
                self.buf.put(b"\n")?;
                let d = if close { depth } else { depth + 1 };
                for _ in 0..n * d {
                    self.buf.put(b" ")?;
                }
                Ok(())
            }
        }
    }

    /// [`Self::write_form`] with json.dumps' `indent` (`ind`) at nesting `depth`.
    fn write_form_in(&mut self, v: Value<'a>, form: Form, ind: Option<u32>, depth: u32) -> R<()> {
        self.step()?;
        self.enter()?;
        let r = self.write_form_inner(v, form, ind, depth);
        self.leave();
        r
    }

    fn write_form_inner(
        &mut self,
        v: Value<'a>,
        form: Form,
        ind: Option<u32>,
        depth: u32,
    ) -> R<()> {
        let d1 = depth + 1;
        let json = form == Form::Json;
        let pick = |r: &'static [u8], j: &'static [u8]| if json { j } else { r };
        match v {
            Value::None => self.buf.put(pick(b"None", b"null")),
            Value::Bool(b) => self.buf.put(match (b, json) {
                (true, false) => b"True",
                (false, false) => b"False",
                (true, true) => b"true",
                (false, true) => b"false",
            }),
            Value::Int(i) => self.write_int(i),
            Value::Str(s) => self.write_quoted(s, form),
            Value::Seq(s) => {
                self.buf.put(b"[")?;
                for i in 0..s.len {
                    self.sep(ind, depth, i == 0, false)?;
                    let e = self.elem(&s, i);
                    self.write_form_in(e, form, ind, d1)?;
                }
                if s.len > 0 {
                    self.sep(ind, depth, false, true)?;
                }
                self.buf.put(b"]")
            }
            Value::JsonObj(at) => {
                self.buf.put(b"{")?;
                let n = self.json_count(at);
                for i in 0..n {
                    self.sep(ind, depth, i == 0, false)?;
                    let Value::Seq(pair) = self.json_pair(at, i) else {
                        return Err(self.type_err("broken JSON pair"));
                    };
                    let (k, e) = (self.elem(&pair, 0), self.elem(&pair, 1));
                    self.write_form_in(k, form, ind, d1)?;
                    self.buf.put(b": ")?;
                    self.write_form_in(e, form, ind, d1)?;
                }
                if n > 0 {
                    self.sep(ind, depth, false, true)?;
                }
                self.buf.put(b"}")
            }
            Value::JsonNum(at) => self.buf.put_str(self.json_num_text(at)),
            Value::Message(_) | Value::Part(..) => {
                let keys: [&str; 2] = if matches!(v, Value::Message(_)) {
                    ["role", "content"]
                } else {
                    ["type", "text"]
                };
                self.buf.put(b"{")?;
                for (i, k) in keys.iter().enumerate() {
                    self.sep(ind, depth, i == 0, false)?;
                    self.write_form(Value::Str(Str::Src(k)), form)?;
                    self.buf.put(b": ")?;
                    let e = self.attr(v, k);
                    self.write_form_in(e, form, ind, d1)?;
                }
                self.sep(ind, depth, false, true)?;
                self.buf.put(b"}")
            }
            Value::Dict { at, len } => {
                self.buf.put(b"{")?;
                for i in 0..len {
                    self.sep(ind, depth, i == 0, false)?;
                    let k = at as usize + 2 * i as usize;
                    let (kv, vv) = (self.slab[k], self.slab[k + 1]);
                    // JSON keys are strings: json.dumps quotes numbers and null.
                    let quote_key = json && !kv.is_str();
                    if json
                        && !matches!(
                            kv,
                            Value::Str(_) | Value::Int(_) | Value::Bool(_) | Value::None
                        )
                    {
                        return Err(self.type_err("JSON keys must be strings"));
                    }
                    if quote_key {
                        self.buf.put(b"\"")?;
                    }
                    self.write_form(kv, form)?;
                    if quote_key {
                        self.buf.put(b"\"")?;
                    }
                    self.buf.put(b": ")?;
                    self.write_form_in(vv, form, ind, d1)?;
                }
                if len > 0 {
                    self.sep(ind, depth, false, true)?;
                }
                self.buf.put(b"}")
            }
            Value::Pair(at) => {
                let (kv, vv) = (self.slab[at as usize], self.slab[at as usize + 1]);
                self.buf.put(pick(b"(", b"["))?;
                self.write_form(kv, form)?;
                self.buf.put(b", ")?;
                self.write_form(vv, form)?;
                self.buf.put(pick(b")", b"]"))
            }
            Value::Undefined if !json => Ok(()),
            _ if json => Err(self.type_err("this value has no JSON form")),
            _ => Err(self.unsupported("printing this kind of value")),
        }
    }

    /// A string quoted as Python's `repr` or as JSON (`ensure_ascii=False`) quotes it.
    fn write_quoted(&mut self, s: Str<'a>, form: Form) -> R<()> {
        let q = match form {
            Form::Json => b'"',
            Form::Repr => {
                let b = self.buf.bytes(s);
                if b.contains(&b'\'') && !b.contains(&b'"') {
                    b'"'
                } else {
                    b'\''
                }
            }
        };
        self.buf.put(&[q])?;
        let mut i = 0;
        while let Some(c) = self.buf.text(s)[i..].chars().next() {
            i += c.len_utf8();
            let mut tmp = [0u8; 10];
            let out: &[u8] = match c {
                '\\' => b"\\\\",
                '\n' => b"\\n",
                '\r' => b"\\r",
                '\t' => b"\\t",
                '\x08' if form == Form::Json => b"\\b",
                '\x0C' if form == Form::Json => b"\\f",
                c if c as u32 == u32::from(q) => {
                    if q == b'"' {
                        b"\\\""
                    } else {
                        b"\\'"
                    }
                }
                c if (c as u32) < 0x20 && form == Form::Json => {
                    hex_escape(&mut tmp, b'u', c as u32, 4)
                }
                c if form == Form::Repr
                    && ((c as u32) < 0x20 || (0x7F..=0xA0).contains(&(c as u32))) =>
                {
                    hex_escape(&mut tmp, b'x', c as u32, 2)
                }
                // tojson(ensure_ascii=True): \uXXXX, astral characters as a surrogate pair.
                c if form == Form::Json && self.json_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    let units = c.encode_utf16(&mut units);
                    if let [hi, _] = units {
                        let hi = *hi;
                        self.buf.put(hex_escape(&mut tmp, b'u', u32::from(hi), 4))?;
                    }
                    let lo = u32::from(*units.last().unwrap_or(&0));
                    hex_escape(&mut tmp, b'u', lo, 4)
                }
                c => c.encode_utf8(&mut tmp).as_bytes(),
            };
            let out: heapless::Vec<u8, 10> = heapless::Vec::from_slice(out).unwrap_or_default();
            self.buf.put(&out)?;
        }
        self.buf.put(&[q])
    }

    /// `str(v)` as a string value.
    pub fn to_str(&mut self, v: Value<'a>) -> R<Str<'a>> {
        if let Value::Str(s) = v {
            return Ok(s);
        }
        let mark = self.buf.len;
        self.write_value(v)?;
        Ok(self.buf.capture(mark))
    }

    fn str_arg(&self, a: &Args<'a>, i: usize, name: &str) -> R<Option<Str<'a>>> {
        match a.get(i, name) {
            None | Some(Value::None) => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s)),
            Some(_) => Err(self.type_err("expected a string argument")),
        }
    }

    fn strip(&self, s: Str<'a>, chars: Option<Str<'a>>, ends: Ends) -> Str<'a> {
        let t = self.buf.text(s);
        let set = chars.map(|c| self.buf.text(c));
        let is = |c: char| match set {
            Some(set) => set.contains(c),
            None => py_space(c),
        };
        let a = if ends == Ends::Right {
            0
        } else {
            t.len() - t.trim_start_matches(is).len()
        };
        let b = if ends == Ends::Left {
            t.len()
        } else {
            t.trim_end_matches(is).len()
        };
        if b <= a {
            return Str::Src("");
        }
        self.buf.sub(s, a, b)
    }

    /// Write `s` with each character mapped.
    fn map_chars(&mut self, s: Str<'a>, mut f: impl FnMut(char, bool) -> Case) -> R<Str<'a>> {
        let mark = self.buf.len;
        let mut i = 0;
        let mut prev_alnum = false;
        while let Some(c) = self.buf.text(s)[i..].chars().next() {
            i += c.len_utf8();
            let mut tmp = [0u8; 12];
            let mut n = 0;
            let mut push = |ch: char| {
                if n + 4 <= tmp.len() {
                    n += ch.encode_utf8(&mut tmp[n..]).len();
                }
            };
            match f(c, prev_alnum) {
                Case::Upper => c.to_uppercase().for_each(&mut push),
                Case::Lower => c.to_lowercase().for_each(&mut push),
            }
            prev_alnum = c.is_alphanumeric();
            self.buf.put(&tmp[..n])?;
        }
        Ok(self.buf.capture(mark))
    }

    fn replace(
        &mut self,
        s: Str<'a>,
        from: Str<'a>,
        to: Str<'a>,
        count: Option<i64>,
    ) -> R<Str<'a>> {
        let mark = self.buf.len;
        let mut i = 0;
        let mut done = 0i64;
        let n_from = self.buf.bytes(from).len();
        loop {
            let t = self.buf.text(s);
            let f = self.buf.text(from);
            let hit = if count.is_some_and(|c| c >= 0 && done >= c) {
                None
            } else if f.is_empty() {
                // Python inserts `to` between characters (and at both ends).
                if i <= t.len() {
                    Some(i)
                } else {
                    None
                }
            } else {
                t[i..].find(f).map(|k| i + k)
            };
            self.step()?;
            match hit {
                Some(k) => {
                    let piece = self.buf.sub(s, i, k);
                    self.buf.put_str(piece)?;
                    self.buf.put_str(to)?;
                    done += 1;
                    if n_from == 0 {
                        let t = self.buf.text(s);
                        let Some(c) = t[k..].chars().next() else {
                            i = t.len() + 1;
                            continue;
                        };
                        let next = self.buf.sub(s, k, k + c.len_utf8());
                        self.buf.put_str(next)?;
                        i = k + c.len_utf8();
                    } else {
                        i = k + n_from;
                    }
                }
                None => {
                    let len = self.buf.text(s).len();
                    if i <= len {
                        let rest = self.buf.sub(s, i, len);
                        self.buf.put_str(rest)?;
                    }
                    break;
                }
            }
        }
        Ok(self.buf.capture(mark))
    }

    /// `v` sorted (stably) by element, by item `index` of each element, in the slab.
    fn sorted(&mut self, v: Value<'a>, index: Option<i64>, rev: bool) -> R<Value<'a>> {
        let s = self.seq_of(v)?;
        let mut items: heapless::Vec<(Value<'a>, Value<'a>), 32> = heapless::Vec::new();
        for i in 0..s.len {
            let e = self.elem(&s, i);
            let k = match index {
                Some(j) => self.item(e, Value::Int(j)),
                None => e,
            };
            items
                .push((k, e))
                .map_err(|_| self.too_complex("sorted list too long"))?;
        }
        self.sort_pairs(&mut items, rev)
    }

    fn sorted_by_attr(&mut self, v: Value<'a>, key: Str<'a>, rev: bool) -> R<Value<'a>> {
        let s = self.seq_of(v)?;
        let mut items: heapless::Vec<(Value<'a>, Value<'a>), 32> = heapless::Vec::new();
        for i in 0..s.len {
            let e = self.elem(&s, i);
            let k = self.attr(e, self.buf.text(key));
            items
                .push((k, e))
                .map_err(|_| self.too_complex("sorted list too long"))?;
        }
        self.sort_pairs(&mut items, rev)
    }

    /// Insertion sort on keys (stable, like Python's); the sorted values to the slab.
    fn sort_pairs(&mut self, items: &mut [(Value<'a>, Value<'a>)], rev: bool) -> R<Value<'a>> {
        for i in 1..items.len() {
            let mut j = i;
            while j > 0 {
                let ord = self.order(items[j - 1].0, items[j].0)?;
                let out_of_order = if rev { ord.is_lt() } else { ord.is_gt() };
                if !out_of_order {
                    break;
                }
                items.swap(j - 1, j);
                j -= 1;
            }
        }
        let vals: heapless::Vec<Value<'a>, 32> = items.iter().map(|p| p.1).collect();
        self.slab_list(&vals)
    }

    /// Python's ordering of two strings or two numbers.
    pub fn order(&self, a: Value<'a>, b: Value<'a>) -> R<core::cmp::Ordering> {
        match (a, b) {
            (Value::Str(x), Value::Str(y)) => Ok(self.buf.bytes(x).cmp(self.buf.bytes(y))),
            _ => match (self.as_int(a), self.as_int(b)) {
                (Some(x), Some(y)) => Ok(x.cmp(&y)),
                _ => Err(self.type_err("ordering of values that are not both strings or numbers")),
            },
        }
    }

    /// A list of the elements of `s` that pass `keep`.
    fn filter_seq(
        &mut self,
        s: Seq<'a>,
        mut keep: impl FnMut(&mut Self, Value<'a>) -> R<bool>,
    ) -> R<Value<'a>> {
        let mut items: heapless::Vec<Value<'a>, 64> = heapless::Vec::new();
        for i in 0..s.len {
            self.step()?;
            let e = self.elem(&s, i);
            if keep(self, e)? {
                items
                    .push(e)
                    .map_err(|_| self.too_complex("filtered list too long"))?;
            }
        }
        self.slab_list(&items)
    }

    pub fn seq_of(&self, v: Value<'a>) -> R<Seq<'a>> {
        match v {
            Value::Seq(s) => Ok(s),
            Value::Undefined => Ok(Seq::new(Base::Slab, 0)),
            Value::Str(_) => Err(self.unsupported("iterating over a string")),
            Value::Dict { .. } => Err(self.unsupported("iterating over a dict (use .items())")),
            Value::JsonObj(at) => Ok(Seq::new(Base::JsonKeys(at), self.json_count(at) as usize)),
            Value::Pair(at) => Ok(Seq {
                base: Base::Slab,
                start: i64::from(at),
                step: 1,
                len: 2,
            }),
            _ => Err(self.type_err("the value is not iterable")),
        }
    }

    pub fn filter(&mut self, v: Value<'a>, name: &str, a: &Args<'a>) -> R<Value<'a>> {
        let need_str = |vm: &Self| -> R<Str<'a>> {
            match v {
                Value::Str(s) => Ok(s),
                _ => Err(vm.type_err("the filter needs a string")),
            }
        };
        Ok(match name {
            "trim" => {
                let s = self.to_str(v)?;
                Value::Str(self.strip(s, self.str_arg(a, 0, "chars")?, Ends::Both))
            }
            "length" | "count" => Value::Int(match v {
                Value::Str(s) => self.buf.text(s).chars().count() as i64,
                Value::Seq(s) => i64::from(s.len),
                Value::Message(_) | Value::Part(..) | Value::Pair(_) => 2,
                Value::Dict { len, .. } => i64::from(len),
                Value::JsonObj(at) => i64::from(self.json_count(at)),
                Value::Undefined => 0,
                _ => return Err(self.type_err("length of a value that has none")),
            }),
            "tojson" => {
                let ind = match a.get(0, "indent") {
                    None | Some(Value::None) => None,
                    Some(i) => match self.as_int(i) {
                        Some(n @ 0..=16) => Some(n as u32),
                        _ => return Err(self.unsupported("tojson(indent=...) not 0-16")),
                    },
                };
                let ascii = a
                    .get(usize::MAX, "ensure_ascii")
                    .is_some_and(|x| self.truthy(x));
                let mark = self.buf.len;
                self.json_ascii = ascii;
                let r = self.write_form_in(v, Form::Json, ind, 0);
                self.json_ascii = false;
                r?;
                Value::Str(self.buf.capture(mark))
            }
            "upper" | "lower" | "capitalize" | "title" => {
                let s = self.to_str(v)?;
                let mut first = true;
                let s = match name {
                    "upper" => self.map_chars(s, |_, _| Case::Upper)?,
                    "lower" => self.map_chars(s, |_, _| Case::Lower)?,
                    "capitalize" => self.map_chars(s, |_, _| {
                        let c = if first { Case::Upper } else { Case::Lower };
                        first = false;
                        c
                    })?,
                    _ => {
                        self.map_chars(s, |_, prev| if prev { Case::Lower } else { Case::Upper })?
                    }
                };
                Value::Str(s)
            }
            "default" | "d" => {
                let dflt = a
                    .get(0, "default_value")
                    .unwrap_or(Value::Str(Str::Src("")));
                let boolean = a.get(1, "boolean").is_some_and(|b| self.truthy(b));
                if v.is_undefined() || (boolean && !self.truthy(v)) {
                    dflt
                } else {
                    v
                }
            }
            "join" => {
                let s = self.seq_of(v)?;
                let sep = self.str_arg(a, 0, "d")?.unwrap_or(Str::Src(""));
                let attr = self.str_arg(a, 1, "attribute")?;
                let mark = self.buf.len;
                for i in 0..s.len {
                    if i > 0 {
                        self.buf.put_str(sep)?;
                    }
                    let mut e = self.elem(&s, i);
                    if let Some(k) = attr {
                        e = self.attr(e, self.buf.text(k));
                    }
                    self.write_value(e)?;
                }
                Value::Str(self.buf.capture(mark))
            }
            "first" | "last" => match v {
                Value::Seq(s) if s.len == 0 => Value::Undefined,
                Value::Seq(s) => self.elem(&s, if name == "first" { 0 } else { s.len - 1 }),
                Value::Str(_) => {
                    let i = if name == "first" { 0 } else { -1 };
                    self.item(v, Value::Int(i))
                }
                _ => Value::Undefined,
            },
            "string" => Value::Str(self.to_str(v)?),
            "safe" | "list" => match (name, v) {
                ("list", Value::Str(_)) => return Err(self.unsupported("list of a string")),
                _ => v,
            },
            "int" => match v {
                Value::Int(_) | Value::Bool(_) => Value::Int(self.as_int(v).unwrap_or(0)),
                Value::Str(s) => Value::Int(self.buf.text(s).trim().parse().unwrap_or(0)),
                _ => Value::Int(0),
            },
            "reverse" => match v {
                Value::Seq(s) => Value::Seq(s.reversed()),
                Value::Str(s) => self.slice_str_rev(s)?,
                _ => return Err(self.type_err("reverse of a value that is not a sequence")),
            },
            "replace" => {
                let s = need_str(self)?;
                let (Some(f), Some(t)) = (self.str_arg(a, 0, "old")?, self.str_arg(a, 1, "new")?)
                else {
                    return Err(self.type_err("replace needs two strings"));
                };
                let count = a.get(2, "count").and_then(|c| self.as_int(c));
                Value::Str(self.replace(s, f, t, count)?)
            }
            // jinja2 reads `none` as an empty sequence here (`if seq:`).
            "selectattr" | "rejectattr" | "select" | "reject" | "map"
                if matches!(v, Value::None) =>
            {
                self.slab_list(&[])?
            }
            "selectattr" | "rejectattr" | "select" | "reject" => {
                let s = self.seq_of(v)?;
                let want = name == "selectattr" || name == "select";
                let by_attr = name.ends_with("attr");
                let attr = if by_attr {
                    self.str_arg(a, 0, "attribute")?
                } else {
                    None
                };
                let off = usize::from(by_attr);
                let test = self.str_arg(a, off, "test")?;
                let arg = a.get(off + 1, "value");
                self.filter_seq(s, |vm, e| {
                    let x = match attr {
                        Some(k) => vm.attr(e, vm.buf.text(k)),
                        None => e,
                    };
                    let ok = match test {
                        None => vm.truthy(x),
                        Some(t) => {
                            let mut ta = Args::default();
                            if let Some(arg) = arg {
                                let _ = ta.pos.push(arg);
                            }
                            let t = vm.buf.text(t);
                            // Names of tests are static; copy out of the buffer.
                            let t: heapless::String<16> =
                                heapless::String::try_from(t).unwrap_or_default();
                            vm.test(x, &t, &ta)?
                        }
                    };
                    Ok(ok == want)
                })?
            }
            "items" | "dictsort" if matches!(v, Value::JsonObj(_)) => {
                let Value::JsonObj(at) = v else {
                    return Err(self.type_err("items of a value that is not a dict"));
                };
                let items = Value::Seq(self.json_items(at));
                if name == "items" {
                    items
                } else {
                    self.sorted(items, Some(0), false)?
                }
            }
            "items" | "dictsort" => {
                let Value::Dict { at, len } = v else {
                    return Err(self.type_err("items of a value that is not a dict"));
                };
                let items = Value::Seq(Seq::new(Base::DictItems(at), len as usize));
                if name == "items" {
                    items
                } else {
                    self.sorted(items, Some(0), false)?
                }
            }
            "sort" => {
                let key = self.str_arg(a, 2, "attribute")?;
                let rev = a.get(0, "reverse").is_some_and(|r| self.truthy(r));
                match key {
                    None => self.sorted(v, None, rev)?,
                    Some(k) => self.sorted_by_attr(v, k, rev)?,
                }
            }
            "map" => {
                let s = self.seq_of(v)?;
                let Some(k) = self.str_arg(a, 0, "attribute")? else {
                    return Err(self.unsupported("map without attribute="));
                };
                let mut items: heapless::Vec<Value<'a>, 64> = heapless::Vec::new();
                for i in 0..s.len {
                    let e = self.elem(&s, i);
                    let x = self.attr(e, self.buf.text(k));
                    items
                        .push(x)
                        .map_err(|_| self.too_complex("mapped list too long"))?;
                }
                self.slab_list(&items)?
            }
            _ => return Err(self.unsupported("this filter")),
        })
    }

    fn slice_str_rev(&mut self, s: Str<'a>) -> R<Value<'a>> {
        let mark = self.buf.len;
        let mut end = self.buf.text(s).len();
        while let Some(c) = self.buf.text(s)[..end].chars().next_back() {
            let piece = self.buf.sub(s, end - c.len_utf8(), end);
            self.buf.put_str(piece)?;
            end -= c.len_utf8();
        }
        Ok(Value::Str(self.buf.capture(mark)))
    }

    pub fn test(&mut self, v: Value<'a>, name: &str, a: &Args<'a>) -> R<bool> {
        let arg = a.get(0, "value");
        let need = |vm: &Self| arg.ok_or_else(|| vm.type_err("the test needs an argument"));
        Ok(match name {
            "defined" => !v.is_undefined(),
            "undefined" => v.is_undefined(),
            "none" => matches!(v, Value::None),
            "string" => v.is_str(),
            "number" => matches!(v, Value::Int(_) | Value::JsonNum(_)),
            "integer" => matches!(v, Value::Int(_)),
            "boolean" => matches!(v, Value::Bool(_)),
            "true" => matches!(v, Value::Bool(true)),
            "false" => matches!(v, Value::Bool(false)),
            "mapping" => v.is_mapping(),
            "iterable" => matches!(v, Value::Seq(_) | Value::Str(_)) || v.is_mapping(),
            "sequence" => matches!(v, Value::Seq(_) | Value::Str(_)) || v.is_mapping(),
            "callable" => matches!(v, Value::Macro(_)),
            "even" | "odd" | "divisibleby" => {
                let x = self
                    .as_int(v)
                    .ok_or_else(|| self.type_err("the test needs a number"))?;
                match name {
                    "even" => x % 2 == 0,
                    "odd" => x % 2 != 0,
                    _ => {
                        let d = self
                            .as_int(need(self)?)
                            .ok_or_else(|| self.type_err("divisibleby needs a number"))?;
                        d != 0 && x % d == 0
                    }
                }
            }
            "eq" | "equalto" | "==" => self.equal(v, need(self)?),
            "ne" | "!=" => !self.equal(v, need(self)?),
            "sameas" => match (v, need(self)?) {
                (Value::Bool(x), Value::Bool(y)) => x == y,
                (Value::None, Value::None) => true,
                (x, y) => self.equal(x, y) && !x.is_str(),
            },
            "in" => self.contains(need(self)?, v)?,
            "lt" | "lessthan" | "gt" | "greaterthan" | "le" | "ge" => {
                let (x, y) = (self.as_int(v), self.as_int(need(self)?));
                let (Some(x), Some(y)) = (x, y) else {
                    return Err(self.type_err("comparison of values that are not numbers"));
                };
                match name {
                    "lt" | "lessthan" => x < y,
                    "gt" | "greaterthan" => x > y,
                    "le" => x <= y,
                    _ => x >= y,
                }
            }
            _ => return Err(self.unsupported("this test")),
        })
    }

    pub fn method(&mut self, v: Value<'a>, name: &str, a: &Args<'a>) -> R<Value<'a>> {
        if v.is_mapping() {
            return match name {
                "get" => {
                    let key = self.str_arg(a, 0, "key")?;
                    let found = key.map_or(Value::Undefined, |k| self.attr(v, self.buf.text(k)));
                    Ok(if found.is_undefined() {
                        a.get(1, "default").unwrap_or(Value::None)
                    } else {
                        found
                    })
                }
                "items" => self.filter(v, "items", &Args::default()),
                _ => Err(self.unsupported("this mapping method")),
            };
        }
        let Value::Str(s) = v else {
            return Err(self.type_err("method call on a value without methods"));
        };
        Ok(match name {
            "strip" | "lstrip" | "rstrip" => {
                let ends = match name {
                    "strip" => Ends::Both,
                    "lstrip" => Ends::Left,
                    _ => Ends::Right,
                };
                Value::Str(self.strip(s, self.str_arg(a, 0, "chars")?, ends))
            }
            "split" => {
                let sep = self.str_arg(a, 0, "sep")?;
                if sep.is_some_and(|p| self.buf.bytes(p).is_empty()) {
                    return Err(self.type_err("empty separator"));
                }
                let t = self.buf.text(s);
                let n = split_count(t, sep.map(|p| self.buf.text(p)));
                let all = Seq::new(Base::Split(s, sep), n);
                match a.get(1, "maxsplit").map(|m| self.as_int(m)) {
                    None | Some(Some(-1)) => Value::Seq(all),
                    Some(Some(m)) if m >= 0 && sep.is_some() => {
                        // The first `m` pieces, then the rest of the string as one.
                        let m = (m as u32).min(all.len.saturating_sub(1));
                        let mut items: heapless::Vec<Value<'a>, 16> = heapless::Vec::new();
                        for i in 0..m {
                            items
                                .push(self.elem(&all, i))
                                .map_err(|_| self.too_complex("split list too long"))?;
                        }
                        let t = self.buf.text(s);
                        let p = sep.map(|p| self.buf.text(p)).unwrap_or(" ");
                        let from = split_piece(t, Some(p), m as usize).map_or(t.len(), |r| r.0);
                        let rest = self.buf.sub(s, from, t.len());
                        let _ = items.push(Value::Str(rest));
                        self.slab_list(&items)?
                    }
                    _ => return Err(self.unsupported("split with this maxsplit")),
                }
            }
            "startswith" | "endswith" => {
                let Some(p) = self.str_arg(a, 0, "prefix")? else {
                    return Err(self.type_err("startswith needs a string"));
                };
                let (t, p) = (self.buf.bytes(s), self.buf.bytes(p));
                Value::Bool(if name == "startswith" {
                    t.starts_with(p)
                } else {
                    t.ends_with(p)
                })
            }
            "upper" | "lower" | "title" | "capitalize" => self.filter(v, name, &Args::default())?,
            "format" => {
                // `'{}'.format(a, ...)`: positional `{}` fields and `{{`/`}}` only.
                let mark = self.buf.len;
                let (mut i, mut next) = (0, 0);
                let t_len = self.buf.text(s).len();
                while i < t_len {
                    let rest = &self.buf.bytes(s)[i..];
                    if rest.starts_with(b"{{") || rest.starts_with(b"}}") {
                        let piece = self.buf.sub(s, i, i + 1);
                        self.buf.put_str(piece)?;
                        i += 2;
                    } else if rest.starts_with(b"{}") {
                        let v = a
                            .pos
                            .get(next)
                            .copied()
                            .ok_or_else(|| self.type_err("format has too few arguments"))?;
                        self.write_value(v)?;
                        next += 1;
                        i += 2;
                    } else if rest[0] == b'{' || rest[0] == b'}' {
                        return Err(self.unsupported("format fields other than {}"));
                    } else {
                        let n = rest
                            .iter()
                            .position(|&b| b == b'{' || b == b'}')
                            .unwrap_or(rest.len());
                        let piece = self.buf.sub(s, i, i + n);
                        self.buf.put_str(piece)?;
                        i += n;
                    }
                }
                Value::Str(self.buf.capture(mark))
            }
            "replace" => self.filter(v, name, a)?,
            _ => return Err(self.unsupported("this string method")),
        })
    }

    pub fn call_global(&mut self, name: &str, a: &Args<'a>, at: usize) -> R<Value<'a>> {
        match name {
            "raise_exception" => Err(JinjaError::Raised { at: at as u32 }),
            "range" => {
                let ints: heapless::Vec<i64, 3> = a
                    .pos
                    .iter()
                    .map(|&v| self.as_int(v))
                    .collect::<Option<_>>()
                    .ok_or_else(|| self.type_err("range needs integers"))?;
                let (start, stop, step) = match ints.as_slice() {
                    [n] => (0, *n, 1),
                    [a, b] => (*a, *b, 1),
                    [a, b, c] => (*a, *b, *c),
                    _ => return Err(self.type_err("range takes 1 to 3 arguments")),
                };
                if step == 0 {
                    return Err(self.type_err("range step is zero"));
                }
                let len = if step > 0 {
                    (stop.saturating_sub(start)).max(0).saturating_add(step - 1) / step
                } else {
                    (start.saturating_sub(stop))
                        .max(0)
                        .saturating_add(-step - 1)
                        / -step
                };
                if len > i64::from(u32::MAX) {
                    return Err(self.too_complex("range too long"));
                }
                Ok(Value::Seq(Seq {
                    base: Base::Range,
                    start,
                    step,
                    len: len as u32,
                }))
            }
            "namespace" => {
                let ns = self.n_ns;
                self.n_ns = self
                    .n_ns
                    .checked_add(1)
                    .ok_or_else(|| self.too_complex("too many namespaces"))?;
                for &(k, v) in a.kw.iter() {
                    self.set_attr(ns, k, v)?;
                }
                if !a.pos.is_empty() {
                    return Err(self.unsupported("namespace() from a mapping"));
                }
                Ok(Value::Namespace(ns))
            }
            _ => Err(JinjaError::Type {
                at: at as u32,
                what: "call of an undefined function",
            }),
        }
    }
}

/// Which printed form of a value: Python's `repr` or JSON.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Repr,
    Json,
}

/// How `map_chars` changes one character.
enum Case {
    Upper,
    Lower,
}

fn hex_escape(tmp: &mut [u8; 10], kind: u8, v: u32, digits: usize) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    tmp[0] = b'\\';
    tmp[1] = kind;
    for k in 0..digits {
        tmp[2 + k] = HEX[((v >> (4 * (digits - 1 - k))) & 15) as usize];
    }
    &tmp[..2 + digits]
}

/// Byte range of piece `j` of `t.split(sep)` (Python's: `None` splits on whitespace runs).
pub fn split_piece(t: &str, sep: Option<&str>, j: usize) -> Option<(usize, usize)> {
    match sep {
        Some(p) => {
            let mut start = 0;
            for (k, (at, _)) in t.match_indices(p).enumerate() {
                if k == j {
                    return Some((start, at));
                }
                start = at + p.len();
            }
            (split_count(t, sep) == j + 1).then_some((start, t.len()))
        }
        None => {
            let mut k = 0;
            let mut i = 0;
            while i < t.len() {
                let rest = &t[i..];
                let skip = rest.len() - rest.trim_start_matches(py_space).len();
                i += skip;
                if i >= t.len() {
                    break;
                }
                let word = t[i..].find(py_space).map_or(t.len(), |w| i + w);
                if k == j {
                    return Some((i, word));
                }
                k += 1;
                i = word;
            }
            None
        }
    }
}

/// The number of pieces of `t.split(sep)`.
pub fn split_count(t: &str, sep: Option<&str>) -> usize {
    match sep {
        Some(p) if !p.is_empty() => t.matches(p).count() + 1,
        Some(_) => 1,
        None => t.split(py_space).filter(|w| !w.is_empty()).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_python() {
        assert_eq!(split_count("a</think>b", Some("</think>")), 2);
        assert_eq!(
            split_piece("a</think>b", Some("</think>"), 1),
            Some((9, 10))
        );
        assert_eq!(split_piece("xx", Some("x"), 2), Some((2, 2)));
        assert_eq!(split_count("  a  b ", None), 2);
        assert_eq!(split_piece("  a  bc ", None, 1), Some((5, 7)));
        assert_eq!(split_piece("  a ", None, 1), None);
    }
}
