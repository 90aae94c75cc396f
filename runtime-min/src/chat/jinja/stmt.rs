//! Statements: the text between tags, `{{ }}`, and the `{% %}` blocks.
//!
//! [`Vm::block`] runs (or, in skip mode, only reads) the template from an offset until a
//! tag that closes the enclosing block and says which; `if`, `for`, `set` and `macro`
//! call it for their bodies. A `break` or `continue` travels up to its loop, which then
//! reads the rest of its body in skip mode to find its `endfor`.
use super::lexer::{self, Lexer, TagKind};
use super::value::Value;
use super::{JinjaError, LoopFrame, Macro, Vm};

type R<T> = Result<T, JinjaError>;

/// The names a `for` or `set` binds.
type Targets<'a> = heapless::Vec<&'a str, 4>;

/// The tag that stopped a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Eof,
    Elif,
    Else,
    EndIf,
    EndFor,
    EndSet,
    EndMacro,
    Break,
    Continue,
}

impl<'a> Vm<'a, '_> {
    pub fn run_template(&mut self) -> R<()> {
        match self.block(0, false)? {
            End::Eof => Ok(()),
            End::Break | End::Continue => Err(self.syntax("'break' outside a loop")),
            _ => Err(self.syntax("end tag without its block")),
        }
    }

    /// Run (`skip`: only read) from `pos` to the tag that ends the enclosing block.
    /// On return the lexer is just past that tag's keyword.
    pub fn block(&mut self, mut pos: usize, skip: bool) -> R<End> {
        let src = self.src;
        loop {
            self.step()?;
            let Some((t, kind)) = lexer::find_tag(src, pos) else {
                if !skip {
                    let (a, b) = lexer::text_span(src, pos, src.len());
                    self.buf.put(&src.as_bytes()[a..b])?;
                }
                self.lx.pos = src.len();
                return Ok(End::Eof);
            };
            if !skip {
                let (a, b) = lexer::text_span(src, pos, t);
                self.buf.put(&src.as_bytes()[a..b])?;
            }
            let mut inner = t + 2;
            if matches!(src.as_bytes().get(inner), Some(b'-' | b'+')) {
                inner += 1;
            }
            match kind {
                TagKind::Comment => {
                    pos = lexer::comment_end(src, t)?;
                    continue;
                }
                TagKind::Print => {
                    self.lx = Lexer::new(src, inner, b'}');
                    if skip {
                        self.expr(true)?;
                    } else {
                        self.print_expr()?;
                    }
                    self.expect_end()?;
                }
                TagKind::Block => {
                    self.lx = Lexer::new(src, inner, b'%');
                    let kw = self.name()?;
                    let end = match kw {
                        "if" => self.if_stmt(skip)?,
                        "for" => {
                            self.for_stmt(skip)?;
                            None
                        }
                        "set" => {
                            self.set_stmt(skip)?;
                            None
                        }
                        "macro" => {
                            self.macro_stmt(skip)?;
                            None
                        }
                        "break" | "continue" => {
                            self.expect_end()?;
                            match (skip, kw) {
                                (true, _) => None,
                                (false, "break") => Some(End::Break),
                                _ => Some(End::Continue),
                            }
                        }
                        "generation" | "endgeneration" => {
                            self.expect_end()?;
                            None
                        }
                        "elif" => return Ok(End::Elif),
                        "else" => return Ok(End::Else),
                        "endif" | "endfor" | "endset" | "endmacro" => {
                            self.expect_end()?;
                            return Ok(match kw {
                                "endif" => End::EndIf,
                                "endfor" => End::EndFor,
                                "endset" => End::EndSet,
                                _ => End::EndMacro,
                            });
                        }
                        _ => return Err(self.unsupported("this statement")),
                    };
                    if let Some(e) = end {
                        return Ok(e);
                    }
                }
            }
            pos = self.lx.pos;
        }
    }

    /// `{% if %}...{% endif %}`; returns a `break`/`continue` met in the branch run.
    fn if_stmt(&mut self, skip: bool) -> R<Option<End>> {
        self.enter()?;
        let c = self.expr(skip)?;
        self.expect_end()?;
        let mut active = !skip && self.truthy(c);
        let mut chosen = active;
        loop {
            let pos = self.lx.pos;
            match self.block(pos, !active)? {
                e @ (End::Break | End::Continue) => {
                    self.leave();
                    return Ok(Some(e));
                }
                End::Elif => {
                    let c = self.expr(skip || chosen)?;
                    self.expect_end()?;
                    active = !skip && !chosen && self.truthy(c);
                    chosen |= active;
                }
                End::Else => {
                    self.expect_end()?;
                    active = !skip && !chosen;
                    chosen = true;
                }
                End::EndIf => {
                    self.leave();
                    return Ok(None);
                }
                End::Eof => return Err(self.syntax("'if' without 'endif'")),
                _ => return Err(self.syntax("unexpected end tag in 'if'")),
            }
        }
    }

    fn for_stmt(&mut self, skip: bool) -> R<()> {
        self.enter()?;
        let targets = self.targets()?;
        if !self.eat_name("in")? {
            return Err(self.syntax("expected 'in'"));
        }
        let it = self.or_expr(skip)?;
        let cond = if self.eat_name("if")? {
            let p = self.lx.pos;
            self.expr(true)?;
            Some(p)
        } else {
            None
        };
        if self.eat_name("recursive")? {
            return Err(self.unsupported("recursive loops"));
        }
        self.expect_end()?;
        let body = self.lx.pos;
        let mut ran = false;
        if !skip {
            let mut seq = self.seq_of(it)?;
            if let Some(cp) = cond {
                seq = self.filter_loop(seq, &targets, cp)?;
            }
            let (scope, mark) = (self.scope, self.locals.len());
            self.loops
                .push(LoopFrame { seq, index0: 0 })
                .map_err(|_| self.too_complex("loops nested too deep"))?;
            self.scope = mark;
            for i in 0..seq.len {
                self.step()?;
                self.locals.truncate(mark);
                let e = self.elem(&seq, i);
                self.bind(&targets, e, mark)?;
                if let Some(f) = self.loops.last_mut() {
                    f.index0 = i;
                }
                ran = true;
                match self.block(body, false)? {
                    End::EndFor | End::Else | End::Continue => {}
                    End::Break => break,
                    _ => return Err(self.syntax("'for' without 'endfor'")),
                }
            }
            self.locals.truncate(mark);
            self.scope = scope;
            self.loops.pop();
        }
        // Read the body once more to find `else` / `endfor`.
        match self.block(body, true)? {
            End::EndFor => {}
            End::Else => {
                self.expect_end()?;
                let pos = self.lx.pos;
                if self.block(pos, skip || ran)? != End::EndFor {
                    return Err(self.syntax("'for' without 'endfor'"));
                }
            }
            _ => return Err(self.syntax("'for' without 'endfor'")),
        }
        self.leave();
        Ok(())
    }

    /// The elements of `seq` for which the loop's `if` condition (at `cond`) holds.
    fn filter_loop(
        &mut self,
        seq: super::value::Seq<'a>,
        targets: &Targets<'a>,
        cond: usize,
    ) -> R<super::value::Seq<'a>> {
        let saved = self.lx;
        let mark = self.locals.len();
        let mut items: heapless::Vec<Value<'a>, 64> = heapless::Vec::new();
        for i in 0..seq.len {
            self.step()?;
            let e = self.elem(&seq, i);
            self.locals.truncate(mark);
            self.bind(targets, e, mark)?;
            self.lx.pos = cond;
            let c = self.expr(false)?;
            if self.truthy(c) {
                items
                    .push(e)
                    .map_err(|_| self.too_complex("filtered loop too long"))?;
            }
        }
        self.locals.truncate(mark);
        self.lx = saved;
        match self.slab_list(&items)? {
            Value::Seq(s) => Ok(s),
            _ => Err(self.syntax("internal: filtered loop")),
        }
    }

    /// `a` or `a, b, ...`: the names a `for` or `set` binds.
    fn targets(&mut self) -> R<Targets<'a>> {
        let mut t = Targets::new();
        loop {
            let n = self.name()?;
            t.push(n)
                .map_err(|_| self.too_complex("too many names to unpack"))?;
            if !self.eat_op(",")? {
                return Ok(t);
            }
        }
    }

    /// Bind `v` to the names (unpacking a pair or a list for several).
    fn bind(&mut self, t: &Targets<'a>, v: Value<'a>, scope: usize) -> R<()> {
        if let [one] = t.as_slice() {
            return self.set_var(one, v, scope);
        }
        let s = match v {
            Value::Pair(_) | Value::Seq(_) => self.seq_of(v)?,
            _ => return Err(self.type_err("cannot unpack this value")),
        };
        if s.len as usize != t.len() {
            return Err(self.type_err("wrong number of values to unpack"));
        }
        for (i, n) in t.iter().enumerate() {
            let e = self.elem(&s, i as u32);
            self.set_var(n, e, scope)?;
        }
        Ok(())
    }

    fn set_stmt(&mut self, skip: bool) -> R<()> {
        let at = self.lx.pos;
        let targets = self.targets()?;
        let name = targets[0];
        let attr = if targets.len() == 1 && self.eat_op(".")? {
            Some(self.name()?)
        } else {
            None
        };
        let v = if self.eat_op("=")? {
            let v = self.expr(skip)?;
            self.expect_end()?;
            v
        } else {
            // `{% set x %}...{% endset %}`: the body's output.
            self.expect_end()?;
            self.enter()?;
            let mark = self.buf.len;
            let pos = self.lx.pos;
            if self.block(pos, skip)? != End::EndSet {
                return Err(self.syntax("'set' without 'endset'"));
            }
            self.leave();
            if skip {
                Value::Undefined
            } else {
                Value::Str(self.buf.capture(mark))
            }
        };
        if skip {
            return Ok(());
        }
        if targets.len() > 1 {
            return self.bind(&targets, v, self.scope);
        }
        let _ = at;
        match attr {
            None => self.set_var(name, v, self.scope),
            Some(a) => match self.lookup(name) {
                Value::Namespace(ns) => self.set_attr(ns, a, v),
                _ => Err(self.type_err("attribute assignment on a value that is not a namespace")),
            },
        }
    }

    /// `{% macro name(params) %}body{% endmacro %}`: remembered, not run.
    fn macro_stmt(&mut self, skip: bool) -> R<()> {
        let name = self.name()?;
        self.expect_op("(")?;
        let params = self.lx.pos;
        self.call_args(true)?;
        self.expect_end()?;
        let body = self.lx.pos;
        self.enter()?;
        if self.block(body, true)? != End::EndMacro {
            return Err(self.syntax("'macro' without 'endmacro'"));
        }
        self.leave();
        if !skip {
            let m = Macro { name, params, body };
            if let Some(e) = self.macros.iter_mut().find(|m| m.name == name) {
                *e = m;
            } else {
                self.macros
                    .push(m)
                    .map_err(|_| self.too_complex("too many macros"))?;
            }
        }
        Ok(())
    }

    /// Call macro `m`: bind its parameters, run its body, return its output as a string.
    pub fn call_macro(&mut self, m: u16, args: &super::expr::Args<'a>) -> R<Value<'a>> {
        let Some(&mac) = self.macros.get(m as usize) else {
            return Err(self.type_err("no such macro"));
        };
        self.enter()?;
        let saved = self.lx;
        let (scope, mark) = (self.scope, self.locals.len());
        // Read the parameter list: `name` or `name=default`, bound in order.
        self.lx = Lexer::new(self.src, mac.params, b'%');
        let mut i = 0;
        while !self.eat_op(")")? {
            let p = self.name()?;
            let dflt = if self.eat_op("=")? {
                self.expr(false)?
            } else {
                Value::Undefined
            };
            let v = args.get(i, p).unwrap_or(dflt);
            self.locals
                .push((p, v))
                .map_err(|_| self.too_complex("too many variables"))?;
            i += 1;
            if !self.eat_op(",")? {
                self.expect_op(")")?;
                break;
            }
        }
        self.scope = mark;
        let out = self.buf.len;
        let e = self.block(mac.body, false)?;
        if e != End::EndMacro {
            return Err(self.syntax("'break' outside a loop"));
        }
        let s = self.buf.capture(out);
        self.locals.truncate(mark);
        self.scope = scope;
        self.lx = saved;
        self.leave();
        Ok(Value::Str(s))
    }
}
