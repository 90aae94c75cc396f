//! A small Jinja interpreter for chat templates, without an allocator.
//!
//! Chat models ship their prompt format as a Jinja template (`tokenizer.chat_template`);
//! llama.cpp renders it with its own interpreter (minja), Hugging Face and
//! llama-cpp-python with jinja2. This one renders the subset real chat templates use, in
//! jinja2's chat-template environment (`trim_blocks`, `lstrip_blocks`, loop controls,
//! `{% generation %}` ignored, `tojson` without HTML escaping), into the caller's buffer.
//!
//! # How it works
//! There is no syntax tree: the evaluator reads the template text directly ([`lexer`]),
//! parsing and evaluating each expression in one pass ([`expr`]); a statement it must not
//! run (an `if` branch not taken, a loop body after the last item) is read in *skip* mode,
//! parsed but not evaluated. A loop runs its body by reading the same text again. Values
//! ([`value`]) are small `Copy` views; strings made while rendering (concatenation,
//! `upper`, `tojson`, ...) go to the back of the output buffer, which the output fills
//! from the front.
//!
//! # Supported
//! `{{ }}`, `{% if/elif/else %}`, `{% for x in xs [if c] %}` (with `else`, `loop.*`,
//! `break`, `continue`, unpacking `k, v`), `{% set %}` (names, `ns.attr`, `a, b = ...`,
//! `{% set x %}...{% endset %}`), `{% macro %}` with positional and keyword arguments and
//! defaults, `{# #}`, whitespace control; literals (strings with Python escapes,
//! integers, lists, tuples, dicts, `true`/`none`...), `+ - * // % ** ~`, comparisons,
//! `and or not in is`, `a if c else b`, indexing and Python slices (strings by
//! character), the filters, tests and methods of [`builtins`], `namespace()`, `range()`,
//! `raise_exception()`. Variables: `messages` (each with `role` and `content`, a string
//! or a list of `{type: text, text}` parts), `add_generation_prompt`, `bos_token`,
//! `eos_token`, `tools` (the request's JSON list of tool definitions, or `none`; see
//! [`json`]); `functions`, `function_call`, `tool_choice` are `none`.
//!
//! Not supported (a typed error, never a wrong output): floats and `/` (read in a branch
//! not taken), `{% raw %}`, `{% filter %}`, `{% call %}`, `include`/`import`/`extends`,
//! recursive loops, iterating over a string or a dict itself, `strftime_now` and other
//! callables not listed. Known differences: message fields other than `role` and
//! `content` are undefined (no `tool_calls`, `reasoning_content`, `name`); tuples print as
//! lists; CRLF newlines in the template are kept (jinja2 turns them into `\n`).
//!
//! # Limits
//! Nesting of statements and expressions, variables, namespace attributes, list values
//! and total work (tokens read) are bounded; exceeding one is
//! [`JinjaError::TooComplex`]. The output and scratch strings share the caller's buffer;
//! running out is [`JinjaError::BufferFull`]. Nothing in a template or message can panic.
pub mod builtins;
pub mod expr;
pub mod json;
pub mod lexer;
pub mod stmt;
pub mod value;

use super::ChatMessage;
use value::{Buf, Value};

/// Variables bound at once (all scopes).
pub const MAX_VARS: usize = 48;
/// Attributes of all `namespace()` objects together.
pub const MAX_ATTRS: usize = 32;
/// Values held by list literals and list-making filters together.
pub const MAX_SLAB: usize = 96;
/// Nesting of statements plus expressions.
pub const MAX_DEPTH: u32 = 32;
/// Nested `for` loops.
pub const MAX_LOOPS: usize = 8;
/// Macros defined.
pub const MAX_MACROS: usize = 16;
/// Tokens read in one rendering (loop bodies count each time they run).
pub const MAX_STEPS: u32 = 2_000_000;

/// Why a template did not render. `at` is a byte offset in the template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JinjaError {
    /// The text is not valid Jinja.
    Syntax { at: u32, what: &'static str },
    /// Valid Jinja this interpreter does not implement.
    Unsupported { at: u32, what: &'static str },
    /// An operation on values of the wrong kind (e.g. a string plus a list), or an
    /// undefined name called.
    Type { at: u32, what: &'static str },
    /// The template called `raise_exception` (it refuses the conversation).
    Raised { at: u32 },
    /// A fixed limit (nesting, variables, work) was reached.
    TooComplex { at: u32, what: &'static str },
    /// The output and the strings made while rendering did not fit the buffer.
    BufferFull,
}

impl core::fmt::Display for JinjaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            JinjaError::Syntax { at, what } => write!(f, "syntax error at byte {at}: {what}"),
            JinjaError::Unsupported { at, what } => {
                write!(f, "not supported at byte {at}: {what}")
            }
            JinjaError::Type { at, what } => write!(f, "type error at byte {at}: {what}"),
            JinjaError::Raised { at } => {
                write!(f, "the template raised an exception at byte {at}")
            }
            JinjaError::TooComplex { at, what } => {
                write!(f, "template too complex at byte {at}: {what}")
            }
            JinjaError::BufferFull => write!(f, "the prompt does not fit the buffer"),
        }
    }
}

impl core::error::Error for JinjaError {}

/// The variables a chat template sees.
#[derive(Clone, Copy, Debug)]
pub struct Vars<'a> {
    pub messages: &'a [ChatMessage<'a>],
    pub add_generation_prompt: bool,
    pub bos_token: &'a str,
    pub eos_token: &'a str,
    /// The JSON text of the request's `tools` (a list of `{"type": "function",
    /// "function": {...}}`), parsed into the buffer when rendering starts.
    pub tools: Option<&'a str>,
}

/// Render `template` into `out`; returns the output's length (`out[..n]`).
///
/// `out` is also the scratch space for strings the template builds, so it needs room
/// beyond the output for templates that concatenate (`set x = a + b`).
pub fn render(template: &str, vars: &Vars<'_>, out: &mut [u8]) -> Result<usize, JinjaError> {
    // jinja2 drops one newline at the end of the template (keep_trailing_newline off).
    let src = template
        .strip_suffix("\r\n")
        .or_else(|| template.strip_suffix('\n'))
        .unwrap_or(template);
    if src.len() > u32::MAX as usize / 2 || vars.messages.len() > u16::MAX as usize / 2 {
        return Err(JinjaError::TooComplex {
            at: 0,
            what: "template or conversation too large",
        });
    }
    let mut vm = Vm::new(src, vars, out);
    if let Some(t) = vars.tools {
        vm.tools = vm.load_json(t)?;
    }
    vm.run_template()?;
    Ok(vm.buf.len)
}

/// A `{% macro %}`: its name, where its parameter list and body start.
#[derive(Clone, Copy, Debug)]
pub struct Macro<'a> {
    pub name: &'a str,
    pub params: usize,
    pub body: usize,
}

/// A running `for` loop, for `loop.*`.
#[derive(Clone, Copy, Debug)]
pub struct LoopFrame<'a> {
    pub seq: value::Seq<'a>,
    pub index0: u32,
}

/// The evaluator's state: the template, the variables, the buffer and fixed tables.
pub struct Vm<'a, 'o> {
    pub src: &'a str,
    pub vars: &'a Vars<'a>,
    pub buf: Buf<'o>,
    pub lx: lexer::Lexer<'a>,
    pub locals: heapless::Vec<(&'a str, Value<'a>), MAX_VARS>,
    pub attrs: heapless::Vec<(u16, &'a str, Value<'a>), MAX_ATTRS>,
    pub n_ns: u16,
    pub slab: heapless::Vec<Value<'a>, MAX_SLAB>,
    pub loops: heapless::Vec<LoopFrame<'a>, MAX_LOOPS>,
    pub macros: heapless::Vec<Macro<'a>, MAX_MACROS>,
    pub steps: u32,
    pub depth: u32,
    /// Where the innermost scope's variables begin in `locals` (a loop body or macro
    /// has its own; `if` does not).
    pub scope: usize,
    /// `tools` (loaded from [`Vars::tools`]).
    pub tools: Value<'a>,
    /// Inside `tojson(ensure_ascii=True)`.
    pub json_ascii: bool,
}

impl<'a, 'o> Vm<'a, 'o> {
    fn new(src: &'a str, vars: &'a Vars<'a>, out: &'o mut [u8]) -> Vm<'a, 'o> {
        Vm {
            src,
            vars,
            buf: Buf::new(out),
            lx: lexer::Lexer::new(src, 0, b'%'),
            locals: heapless::Vec::new(),
            attrs: heapless::Vec::new(),
            n_ns: 0,
            slab: heapless::Vec::new(),
            loops: heapless::Vec::new(),
            macros: heapless::Vec::new(),
            steps: 0,
            depth: 0,
            scope: 0,
            tools: Value::None,
            json_ascii: false,
        }
    }

    /// The current offset, for errors.
    pub fn at(&self) -> u32 {
        self.lx.pos as u32
    }

    pub fn syntax(&self, what: &'static str) -> JinjaError {
        JinjaError::Syntax {
            at: self.at(),
            what,
        }
    }
    pub fn unsupported(&self, what: &'static str) -> JinjaError {
        JinjaError::Unsupported {
            at: self.at(),
            what,
        }
    }
    pub fn type_err(&self, what: &'static str) -> JinjaError {
        JinjaError::Type {
            at: self.at(),
            what,
        }
    }
    pub fn too_complex(&self, what: &'static str) -> JinjaError {
        JinjaError::TooComplex {
            at: self.at(),
            what,
        }
    }

    /// Count work; every token read and loop iteration passes here.
    pub fn step(&mut self) -> Result<(), JinjaError> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return Err(self.too_complex("work limit reached (a very long loop?)"));
        }
        Ok(())
    }

    pub fn enter(&mut self) -> Result<(), JinjaError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.too_complex("nesting too deep"));
        }
        Ok(())
    }
    pub fn leave(&mut self) {
        self.depth -= 1;
    }

    /// A value kept in the slab; returns its index.
    pub fn keep(&mut self, v: Value<'a>) -> Result<usize, JinjaError> {
        let i = self.slab.len();
        self.slab
            .push(v)
            .map_err(|_| self.too_complex("too many list values"))?;
        Ok(i)
    }

    /// Bind `name` in the innermost scope that has it, else a new binding.
    pub fn set_var(&mut self, name: &'a str, v: Value<'a>, scope: usize) -> Result<(), JinjaError> {
        if let Some(e) = self.locals[scope..].iter_mut().rev().find(|e| e.0 == name) {
            e.1 = v;
            return Ok(());
        }
        self.locals
            .push((name, v))
            .map_err(|_| self.too_complex("too many variables"))
    }

    pub fn set_attr(&mut self, ns: u16, name: &'a str, v: Value<'a>) -> Result<(), JinjaError> {
        if let Some(e) = self.attrs.iter_mut().find(|e| e.0 == ns && e.1 == name) {
            e.2 = v;
            return Ok(());
        }
        self.attrs
            .push((ns, name, v))
            .map_err(|_| self.too_complex("too many namespace attributes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_stays_small() {
        // The evaluator lives on the caller's stack: keep it a few KiB.
        let (v, vm) = (
            core::mem::size_of::<Value<'_>>(),
            core::mem::size_of::<Vm<'_, '_>>(),
        );
        assert!(v <= 64 && vm <= 16 * 1024, "Value {v} B, Vm {vm} B");
    }
}
