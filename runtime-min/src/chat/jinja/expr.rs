//! Expressions, parsed and evaluated in one pass with jinja2's precedence:
//! `a if c else b` < `or` < `and` < `not` < comparisons and `in` < `+ -` < `~` <
//! `* // %` < `**` < unary `-` < primary with `.x`, `[i]`, `[a:b]`, calls, `|filter` and
//! `is test`.
//!
//! With `skip` set an expression is only read (a branch not taken, the untaken side of
//! `and`/`or`, a ternary's other arm): nothing is evaluated, so nothing there can fail
//! except its syntax.
use super::lexer::Tok;
use super::value::{Base, Seq, Str, Value};
use super::{JinjaError, Vm};

type R<T> = Result<T, JinjaError>;

/// Arguments of a call, a filter or a test.
#[derive(Default)]
pub struct Args<'a> {
    pub pos: heapless::Vec<Value<'a>, 6>,
    pub kw: heapless::Vec<(&'a str, Value<'a>), 6>,
}

impl<'a> Args<'a> {
    /// Argument `i` (positional) or `name` (keyword).
    pub fn get(&self, i: usize, name: &str) -> Option<Value<'a>> {
        self.pos
            .get(i)
            .copied()
            .or_else(|| self.kw.iter().find(|k| k.0 == name).map(|k| k.1))
    }
}

/// A `{{ }}` chain of `+`/`~` already written to the output, or a value not yet written.
#[derive(Clone, Copy)]
enum Acc<'a> {
    Done,
    Val(Value<'a>),
}

impl<'a> Vm<'a, '_> {
    pub fn tok(&mut self) -> R<Tok<'a>> {
        self.step()?;
        self.lx.token()
    }

    pub fn peek(&self) -> R<Tok<'a>> {
        self.lx.peek()
    }

    pub fn eat_op(&mut self, op: &str) -> R<bool> {
        if matches!(self.peek()?, Tok::Op(o) if o == op) {
            self.tok()?;
            return Ok(true);
        }
        Ok(false)
    }

    pub fn eat_name(&mut self, n: &str) -> R<bool> {
        if matches!(self.peek()?, Tok::Name(o) if o == n) {
            self.tok()?;
            return Ok(true);
        }
        Ok(false)
    }

    pub fn expect_op(&mut self, op: &'static str) -> R<()> {
        if !self.eat_op(op)? {
            return Err(self.syntax(match op {
                ")" => "expected ')'",
                "]" => "expected ']'",
                "}" => "expected '}'",
                ":" => "expected ':'",
                "=" => "expected '='",
                "(" => "expected '('",
                _ => "unexpected token",
            }));
        }
        Ok(())
    }

    pub fn expect_end(&mut self) -> R<()> {
        match self.tok()? {
            Tok::End => Ok(()),
            _ => Err(self.syntax("expected the end of the tag")),
        }
    }

    pub fn name(&mut self) -> R<&'a str> {
        match self.tok()? {
            Tok::Name(n) => Ok(n),
            _ => Err(self.syntax("expected a name")),
        }
    }

    /// Whether a ternary `if` follows at this nesting level before the expression ends.
    fn cond_ahead(&self) -> R<bool> {
        let mut l = self.lx;
        let mut depth = 0u32;
        loop {
            match l.token()? {
                Tok::End => return Ok(false),
                Tok::Op("(" | "[" | "{") => depth += 1,
                Tok::Op(")" | "]" | "}") => {
                    if depth == 0 {
                        return Ok(false);
                    }
                    depth -= 1;
                }
                Tok::Op("," | ":") if depth == 0 => return Ok(false),
                Tok::Name("if") if depth == 0 => return Ok(true),
                Tok::Name("else") if depth == 0 => return Ok(false),
                _ => {}
            }
        }
    }

    /// A full expression (with `a if c else b`).
    pub fn expr(&mut self, skip: bool) -> R<Value<'a>> {
        self.enter()?;
        let v = self.cond_expr(skip);
        self.leave();
        v
    }

    fn cond_expr(&mut self, skip: bool) -> R<Value<'a>> {
        if !self.cond_ahead()? {
            return self.or_expr(skip);
        }
        // `A if C else B`: read A without evaluating it, evaluate C, then A or B.
        let a_pos = self.lx.pos;
        self.or_expr(true)?;
        if !self.eat_name("if")? {
            return Err(self.syntax("expected 'if'"));
        }
        let c = self.or_expr(skip)?;
        let take = !skip && self.truthy(c);
        let b = if self.eat_name("else")? {
            self.cond_expr(skip || take)?
        } else {
            Value::Undefined
        };
        if !take {
            return Ok(b);
        }
        let end = self.lx.pos;
        self.lx.pos = a_pos;
        let a = self.or_expr(false)?;
        self.lx.pos = end;
        Ok(a)
    }

    /// An expression without a ternary (a `for` loop's iterable, before its `if`).
    pub fn or_expr(&mut self, skip: bool) -> R<Value<'a>> {
        let mut v = self.and_expr(skip)?;
        while self.eat_name("or")? {
            let take_left = !skip && self.truthy(v);
            let r = self.and_expr(skip || take_left)?;
            if !take_left {
                v = r;
            }
        }
        Ok(v)
    }

    fn and_expr(&mut self, skip: bool) -> R<Value<'a>> {
        let mut v = self.not_expr(skip)?;
        while self.eat_name("and")? {
            let stop = skip || !self.truthy(v);
            let r = self.not_expr(stop)?;
            if !stop {
                v = r;
            }
        }
        Ok(v)
    }

    fn not_expr(&mut self, skip: bool) -> R<Value<'a>> {
        if self.eat_name("not")? {
            self.enter()?;
            let v = self.not_expr(skip);
            self.leave();
            return Ok(Value::Bool(!self.truthy(v?)));
        }
        self.compare(skip)
    }

    fn compare(&mut self, skip: bool) -> R<Value<'a>> {
        let mut left = self.math1(skip)?;
        let mut result: Option<bool> = None;
        loop {
            let op = match self.peek()? {
                Tok::Op(o @ ("==" | "!=" | "<" | "<=" | ">" | ">=")) => o,
                Tok::Name("in") => "in",
                Tok::Name("not") => {
                    let mut l = self.lx;
                    l.token()?;
                    if l.token()? != Tok::Name("in") {
                        break;
                    }
                    self.tok()?;
                    "not in"
                }
                _ => break,
            };
            self.tok()?;
            let right = self.math1(skip)?;
            if !skip {
                let r = self.compare_op(op, left, right)?;
                result = Some(result.unwrap_or(true) && r);
            }
            left = right;
        }
        Ok(match result {
            Some(b) => Value::Bool(b),
            None if skip => Value::Undefined,
            None => left,
        })
    }

    fn compare_op(&mut self, op: &str, a: Value<'a>, b: Value<'a>) -> R<bool> {
        Ok(match op {
            "==" => self.equal(a, b),
            "!=" => !self.equal(a, b),
            "in" => self.contains(b, a)?,
            "not in" => !self.contains(b, a)?,
            _ => {
                let ord = self.order(a, b)?;
                match op {
                    "<" => ord.is_lt(),
                    "<=" => ord.is_le(),
                    ">" => ord.is_gt(),
                    _ => ord.is_ge(),
                }
            }
        })
    }

    /// A left-associative level of arithmetic: operands from `next`, joined by `ops`.
    fn arith_level(
        &mut self,
        skip: bool,
        ops: &[&'static str],
        next: fn(&mut Self, bool) -> R<Value<'a>>,
    ) -> R<Value<'a>> {
        let mut v = next(self, skip)?;
        loop {
            let op = match self.peek()? {
                Tok::Op(o) if ops.contains(&o) => o,
                Tok::Op("/") => return Err(self.unsupported("'/' (floating point)")),
                _ => return Ok(v),
            };
            self.tok()?;
            let r = next(self, skip)?;
            if !skip {
                v = self.arith(op, v, r)?;
            }
        }
    }

    fn math1(&mut self, skip: bool) -> R<Value<'a>> {
        self.arith_level(skip, &["+", "-"], Self::concat)
    }

    fn concat(&mut self, skip: bool) -> R<Value<'a>> {
        let mut v = self.math2(skip)?;
        while self.eat_op("~")? {
            let r = self.math2(skip)?;
            if !skip {
                let mark = self.buf.len;
                self.write_value(v)?;
                self.write_value(r)?;
                v = Value::Str(self.buf.capture(mark));
            }
        }
        Ok(v)
    }

    fn math2(&mut self, skip: bool) -> R<Value<'a>> {
        self.arith_level(skip, &["*", "//", "%"], Self::pow)
    }

    fn pow(&mut self, skip: bool) -> R<Value<'a>> {
        let v = self.unary(skip)?;
        if self.eat_op("**")? {
            let r = self.unary(skip)?;
            if !skip {
                return self.arith("**", v, r);
            }
        }
        Ok(v)
    }

    fn unary(&mut self, skip: bool) -> R<Value<'a>> {
        self.enter()?;
        let v = self.unary_inner(skip);
        self.leave();
        v
    }

    fn unary_inner(&mut self, skip: bool) -> R<Value<'a>> {
        let neg = if self.eat_op("-")? {
            Some(true)
        } else if self.eat_op("+")? {
            Some(false)
        } else {
            None
        };
        let mut v = match neg {
            Some(n) => {
                let v = self.unary_no_filter(skip)?;
                if skip {
                    v
                } else if n {
                    self.arith("-", Value::Int(0), v)?
                } else {
                    v
                }
            }
            None => {
                let v = self.primary(skip)?;
                self.postfix(v, skip)?
            }
        };
        // Filters and tests bind to the unary expression.
        loop {
            if self.eat_op("|")? {
                let name = self.name()?;
                let args = if self.eat_op("(")? {
                    self.call_args(skip)?
                } else {
                    Args::default()
                };
                if !skip {
                    v = self.filter(v, name, &args)?;
                }
            } else if self.eat_name("is")? {
                let negate = self.eat_name("not")?;
                let name = self.name()?;
                let mut args = Args::default();
                if self.eat_op("(")? {
                    args = self.call_args(skip)?;
                } else if super::builtins::test_takes_arg(name)
                    && !matches!(
                        self.peek()?,
                        Tok::End | Tok::Name("and" | "or" | "if" | "else") | Tok::Op(_)
                    )
                {
                    let a = self.primary(skip)?;
                    let a = self.postfix(a, skip)?;
                    let _ = args.pos.push(a);
                }
                if !skip {
                    let r = self.test(v, name, &args)?;
                    v = Value::Bool(r != negate);
                }
            } else {
                return Ok(v);
            }
        }
    }

    fn unary_no_filter(&mut self, skip: bool) -> R<Value<'a>> {
        if self.eat_op("-")? {
            self.enter()?;
            let v = self.unary_no_filter(skip);
            self.leave();
            let v = v?;
            return if skip {
                Ok(v)
            } else {
                self.arith("-", Value::Int(0), v)
            };
        }
        let v = self.primary(skip)?;
        self.postfix(v, skip)
    }

    fn primary(&mut self, skip: bool) -> R<Value<'a>> {
        let at = self.lx.pos;
        match self.tok()? {
            Tok::Name(n) => {
                let lit = match n {
                    "true" | "True" => Some(Value::Bool(true)),
                    "false" | "False" => Some(Value::Bool(false)),
                    "none" | "None" => Some(Value::None),
                    _ => None,
                };
                if let Some(v) = lit {
                    return Ok(v);
                }
                if matches!(self.peek()?, Tok::Op("(")) && self.lookup(n).is_undefined() {
                    self.tok()?;
                    let args = self.call_args(skip)?;
                    if skip {
                        return Ok(Value::Undefined);
                    }
                    return self.call_global(n, &args, at);
                }
                Ok(if skip {
                    Value::Undefined
                } else {
                    self.lookup(n)
                })
            }
            Tok::Str(raw) => {
                let mut v = if skip {
                    Value::Undefined
                } else {
                    Value::Str(self.literal(raw)?)
                };
                // Adjacent literals are one string.
                while let Tok::Str(more) = self.peek()? {
                    self.tok()?;
                    if !skip {
                        let m = self.literal(more)?;
                        v = self.arith("+", v, Value::Str(m))?;
                    }
                }
                Ok(v)
            }
            Tok::Int(i) => Ok(Value::Int(i)),
            Tok::Float if skip => Ok(Value::Undefined),
            Tok::Float => Err(JinjaError::Unsupported {
                at: at as u32,
                what: "floating-point numbers",
            }),
            Tok::Op("(") => {
                let v = self.expr(skip)?;
                if !self.eat_op(",")? {
                    self.expect_op(")")?;
                    return Ok(v);
                }
                // A tuple: kept as a list (it prints as one).
                self.list_literal(skip, Some(v), ")")
            }
            Tok::Op("[") => self.list_literal(skip, None, "]"),
            Tok::Op("{") => self.dict_literal(skip),
            _ => Err(JinjaError::Syntax {
                at: at as u32,
                what: "expected a value",
            }),
        }
    }

    /// The items of a list (or tuple, after its `first` item) up to `close`.
    fn list_literal(
        &mut self,
        skip: bool,
        first: Option<Value<'a>>,
        close: &'static str,
    ) -> R<Value<'a>> {
        let mut items: heapless::Vec<Value<'a>, 16> = heapless::Vec::new();
        let full = |vm: &Self| vm.too_complex("list literal too long");
        if let Some(v) = first {
            items.push(v).map_err(|_| full(self))?;
        }
        while !self.eat_op(close)? {
            let v = self.expr(skip)?;
            if !skip {
                items.push(v).map_err(|_| full(self))?;
            }
            if !self.eat_op(",")? {
                self.expect_op(close)?;
                break;
            }
        }
        if skip {
            return Ok(Value::Undefined);
        }
        self.slab_list(&items)
    }

    fn dict_literal(&mut self, skip: bool) -> R<Value<'a>> {
        let mut items: heapless::Vec<Value<'a>, 32> = heapless::Vec::new();
        self.enter()?;
        while !self.eat_op("}")? {
            let k = self.expr(skip)?;
            self.expect_op(":")?;
            let v = self.expr(skip)?;
            if !skip {
                items
                    .push(k)
                    .and_then(|_| items.push(v))
                    .map_err(|_| self.too_complex("dict literal too long"))?;
            }
            if !self.eat_op(",")? {
                self.expect_op("}")?;
                break;
            }
        }
        self.leave();
        if skip {
            return Ok(Value::Undefined);
        }
        let at = self.slab.len() as u32;
        for &v in &items {
            self.keep(v)?;
        }
        Ok(Value::Dict {
            at,
            len: items.len() as u32 / 2,
        })
    }

    /// A list of `items`, kept in the slab.
    pub fn slab_list(&mut self, items: &[Value<'a>]) -> R<Value<'a>> {
        let start = self.slab.len();
        for &v in items {
            self.keep(v)?;
        }
        Ok(Value::Seq(Seq {
            base: Base::Slab,
            start: start as i64,
            step: 1,
            len: items.len() as u32,
        }))
    }

    /// Arguments after `(`, through `)`.
    pub fn call_args(&mut self, skip: bool) -> R<Args<'a>> {
        let mut a = Args::default();
        let full = |vm: &Self| vm.too_complex("too many arguments");
        while !self.eat_op(")")? {
            let mut l = self.lx;
            let kw = match (l.token()?, l.token()?) {
                (Tok::Name(n), Tok::Op("=")) => Some(n),
                _ => None,
            };
            if let Some(n) = kw {
                self.tok()?;
                self.tok()?;
                let v = self.expr(skip)?;
                a.kw.push((n, v)).map_err(|_| full(self))?;
            } else {
                let v = self.expr(skip)?;
                a.pos.push(v).map_err(|_| full(self))?;
            }
            if !self.eat_op(",")? {
                self.expect_op(")")?;
                break;
            }
        }
        Ok(a)
    }

    fn postfix(&mut self, mut v: Value<'a>, skip: bool) -> R<Value<'a>> {
        loop {
            if self.eat_op(".")? {
                let name = match self.tok()? {
                    Tok::Name(n) => n,
                    Tok::Int(_) => return Err(self.unsupported("numeric attributes")),
                    _ => return Err(self.syntax("expected an attribute name")),
                };
                if self.eat_op("(")? {
                    let args = self.call_args(skip)?;
                    if !skip {
                        v = self.method(v, name, &args)?;
                    }
                } else if !skip {
                    v = self.attr(v, name);
                }
            } else if self.eat_op("[")? {
                v = self.subscript(v, skip)?;
            } else if matches!(self.peek()?, Tok::Op("(")) {
                self.tok()?;
                let args = self.call_args(skip)?;
                if !skip {
                    v = match v {
                        Value::Macro(m) => self.call_macro(m, &args)?,
                        _ => return Err(self.type_err("the value is not callable")),
                    };
                }
            } else {
                return Ok(v);
            }
        }
    }

    fn subscript(&mut self, v: Value<'a>, skip: bool) -> R<Value<'a>> {
        self.enter()?;
        let bound = |vm: &mut Self, stop: &[&str]| -> R<Option<Value<'a>>> {
            if matches!(vm.peek()?, Tok::Op(o) if stop.contains(&o)) {
                return Ok(None);
            }
            vm.expr(skip).map(Some)
        };
        let a = bound(self, &[":"])?;
        let r = if self.eat_op(":")? {
            let b = bound(self, &[":", "]"])?;
            let c = if self.eat_op(":")? {
                bound(self, &["]"])?
            } else {
                None
            };
            self.expect_op("]")?;
            if skip {
                Value::Undefined
            } else {
                self.slice(v, a, b, c)?
            }
        } else {
            self.expect_op("]")?;
            match a {
                None => return Err(self.syntax("empty subscript")),
                Some(_) if skip => Value::Undefined,
                Some(k) => self.item(v, k),
            }
        };
        self.leave();
        Ok(r)
    }

    fn slice(
        &mut self,
        v: Value<'a>,
        a: Option<Value<'a>>,
        b: Option<Value<'a>>,
        c: Option<Value<'a>>,
    ) -> R<Value<'a>> {
        let int = |vm: &Self, x: Option<Value<'a>>| -> R<Option<i64>> {
            match x {
                None | Some(Value::None) => Ok(None),
                Some(x) => vm
                    .as_int(x)
                    .map(Some)
                    .ok_or_else(|| vm.type_err("slice bounds must be integers")),
            }
        };
        let (a, b, c) = (int(self, a)?, int(self, b)?, int(self, c)?);
        match v {
            Value::Seq(s) => s
                .slice(a, b, c)
                .map(Value::Seq)
                .ok_or_else(|| self.type_err("slice step cannot be zero")),
            Value::Str(s) => self.str_slice(s, a, b, c),
            Value::Undefined => Ok(Value::Undefined),
            _ => Err(self.type_err("this value cannot be sliced")),
        }
    }

    fn str_slice(
        &mut self,
        s: Str<'a>,
        a: Option<i64>,
        b: Option<i64>,
        c: Option<i64>,
    ) -> R<Value<'a>> {
        let text = self.buf.text(s);
        let n = text.chars().count() as i64;
        let (start, step, len) =
            super::value::slice_indices(n, a, b, c).ok_or(self.type_err("slice step is zero"))?;
        if step != 1 {
            // Characters in another order: a new string.
            let mut tmp = [0u8; 4];
            let mark = self.buf.len;
            for k in 0..len {
                let i = (start + k * step) as usize;
                let ch = self.buf.text(s).chars().nth(i).unwrap_or(' ');
                self.buf.put(ch.encode_utf8(&mut tmp).as_bytes())?;
            }
            return Ok(Value::Str(self.buf.capture(mark)));
        }
        let byte_at = |i: i64| {
            text.char_indices()
                .nth(i as usize)
                .map_or(text.len(), |(b, _)| b)
        };
        let (x, y) = (byte_at(start), byte_at(start + len));
        Ok(Value::Str(self.buf.sub(s, x, y)))
    }

    /// A string literal's value: the template's text, or its unescaped copy.
    fn literal(&mut self, raw: &'a str) -> R<Str<'a>> {
        if !raw.contains('\\') {
            return Ok(Str::Src(raw));
        }
        let mark = self.buf.len;
        let mut chars = raw.chars().peekable();
        let mut tmp = [0u8; 4];
        while let Some(c) = chars.next() {
            if c != '\\' {
                self.buf.put(c.encode_utf8(&mut tmp).as_bytes())?;
                continue;
            }
            let Some(e) = chars.next() else {
                self.buf.put(b"\\")?;
                break;
            };
            let simple = match e {
                'n' => Some('\n'),
                't' => Some('\t'),
                'r' => Some('\r'),
                '\\' => Some('\\'),
                '\'' => Some('\''),
                '"' => Some('"'),
                'a' => Some('\x07'),
                'b' => Some('\x08'),
                'f' => Some('\x0C'),
                'v' => Some('\x0B'),
                _ => None,
            };
            if let Some(ch) = simple {
                self.buf.put(ch.encode_utf8(&mut tmp).as_bytes())?;
                continue;
            }
            let hex_len = match e {
                'x' => 2,
                'u' => 4,
                'U' => 8,
                _ => 0,
            };
            if hex_len > 0 {
                let mut code = 0u32;
                for _ in 0..hex_len {
                    let d = chars.next().and_then(|d| d.to_digit(16));
                    code = code * 16 + d.ok_or(self.syntax("bad \\x or \\u escape"))?;
                }
                let ch = char::from_u32(code).ok_or(self.syntax("escape is not a character"))?;
                self.buf.put(ch.encode_utf8(&mut tmp).as_bytes())?;
            } else if e.is_digit(8) {
                let mut code = e.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.peek().and_then(|d| d.to_digit(8)) {
                        Some(d) => {
                            code = code * 8 + d;
                            chars.next();
                        }
                        None => break,
                    }
                }
                let ch = char::from_u32(code).unwrap_or('\0');
                self.buf.put(ch.encode_utf8(&mut tmp).as_bytes())?;
            } else if e == '\n' {
                // A line continuation.
            } else {
                // Python keeps an unknown escape as written.
                self.buf.put(b"\\")?;
                self.buf.put(e.encode_utf8(&mut tmp).as_bytes())?;
            }
        }
        Ok(self.buf.capture(mark))
    }

    /// `{{ expression }}`: write the value. A chain of string `+` and `~` is written piece
    /// by piece, so the usual `'<|im_start|>' + role + '\n' + content` costs no scratch.
    pub fn print_expr(&mut self) -> R<()> {
        if self.complex_ahead()? {
            let v = self.expr(false)?;
            return self.write_value(v);
        }
        self.enter()?;
        let mut acc = self.emit_concat()?;
        while let Tok::Op(op @ ("+" | "-")) = self.peek()? {
            self.tok()?;
            match (acc, op) {
                (Acc::Done, "+") => {
                    if let Acc::Val(r) = self.emit_concat()? {
                        if !r.is_str() {
                            return Err(self.type_err("can only concatenate a string to a string"));
                        }
                        self.write_value(r)?;
                    }
                }
                (Acc::Val(Value::Str(l)), "+") => {
                    let r = self.concat(false)?;
                    if !r.is_str() {
                        return Err(self.type_err("can only concatenate a string to a string"));
                    }
                    self.buf.put_str(l)?;
                    self.write_value(r)?;
                    acc = Acc::Done;
                }
                (Acc::Val(l), _) => {
                    let r = self.concat(false)?;
                    acc = Acc::Val(self.arith(op, l, r)?);
                }
                (Acc::Done, _) => return Err(self.type_err("'-' on a string")),
            }
        }
        self.leave();
        if let Acc::Val(v) = acc {
            self.write_value(v)?;
        }
        Ok(())
    }

    fn emit_concat(&mut self) -> R<Acc<'a>> {
        let v = self.math2(false)?;
        if !matches!(self.peek()?, Tok::Op("~")) {
            return Ok(Acc::Val(v));
        }
        self.write_value(v)?;
        while self.eat_op("~")? {
            let r = self.math2(false)?;
            self.write_value(r)?;
        }
        Ok(Acc::Done)
    }

    /// Whether the `{{ }}` expression has operators below `+` at its top level.
    fn complex_ahead(&self) -> R<bool> {
        let mut l = self.lx;
        let mut depth = 0u32;
        loop {
            match l.token()? {
                Tok::End => return Ok(false),
                Tok::Op("(" | "[" | "{") => depth += 1,
                Tok::Op(")" | "]" | "}") => depth = depth.saturating_sub(1),
                Tok::Op("==" | "!=" | "<" | "<=" | ">" | ">=") if depth == 0 => return Ok(true),
                Tok::Name("and" | "or" | "not" | "in" | "if") if depth == 0 => return Ok(true),
                _ => {}
            }
        }
    }
}
