//! Tool calls, in the format the chat template implies ([`Format`]):
//!
//! - [`Format::Hermes`], the Hermes / Qwen 2.5 format SmolLM2, Qwen and most small
//!   instruct models were tuned on (and pinch's default):
//!   `<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`.
//!   Its tool list goes in the system message, worded as Qwen 2.5's template words it.
//! - [`Format::Llama3`], Llama 3.1 / 3.2 / 3.3's: the answer is a bare JSON object,
//!   `{"name": "get_weather", "parameters": {"city": "Paris"}}`, and the prompt is written
//!   as Llama 3.1's template writes it with `tools` ([`llama3_prompt`]: "Environment:
//!   ipython" in the system part, the functions as indented JSON in the first user
//!   message, tool results in `ipython` turns).
//!
//! A Jinja template that reads `tools` itself writes the tool list in its own words; the
//! format still decides how earlier calls are written back ([`Format::write_history`]),
//! the grammar of a forced call and how the answer is read.
//!
//! - `tool_choice: "required"` (or a named function): the answer is constrained by a
//!   grammar to one call of one of the tools with arguments that follow its
//!   `parameters` schema ([`call_gbnf`]).
//! - The answer: the calls found in the text become OpenAI's `tool_calls`
//!   ([`write_calls`]); the text before the first call stays the `content`. A call must be
//!   valid JSON with a string `name`; anything else stays text.
use core::fmt::Write;

use super::jraw::{root, Kind, Val};
use super::json::{self, json_bytes_str, ToolChoice};
use crate::chat::{ChatMessage, Content};
use crate::grammar::json_schema::{self, SchemaError};

/// A tool-call format: one row of [`SPECS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Hermes,
    Llama3,
}

/// What differs between the formats.
struct Spec {
    /// The text a call starts with: found in answers, and a stream's stop string that
    /// switches it to collecting the call.
    open: &'static str,
    /// How a call written back into the prompt starts (up to its name) and ends.
    call_start: &'static str,
    post: &'static str,
    /// Between two calls written back into the prompt.
    between: &'static str,
    /// The key of the arguments in the call object.
    args: &'static str,
    /// The role tool results are given (`tool` as the request says it, or Llama 3's
    /// `ipython`).
    tool_role: &'static str,
    /// Whether an assistant message's text is kept beside its calls (Llama 3.1's template
    /// writes only the call).
    keeps_content: bool,
    /// Grammar text around the call rule.
    gbnf_pre: &'static str,
    gbnf_post: &'static str,
}

const SPECS: [Spec; 2] = [
    Spec {
        open: "<tool_call>",
        call_start: "<tool_call>\n{\"name\": ",
        post: "\n</tool_call>",
        between: "\n",
        args: "arguments",
        tool_role: "tool",
        keeps_content: true,
        gbnf_pre: "\"<tool_call>\" \"\\n\"? ",
        gbnf_post: " \"\\n\"? \"</tool_call>\"",
    },
    Spec {
        open: "{\"name\"",
        call_start: "{\"name\": ",
        post: "",
        // Llama 3.1's template takes one call per message; several are written as
        // its answers may give them (see [`calls`]).
        between: "; ",
        args: "parameters",
        tool_role: "ipython",
        keeps_content: false,
        gbnf_pre: "",
        gbnf_post: "",
    },
];

impl Format {
    /// The format of a chat template: Llama 3's for the templates llama.cpp detects as
    /// `llama3` (`<|start_header_id|>` ... `<|end_header_id|>`), else Hermes.
    pub fn of(t: &crate::chat::Template<'_>) -> Format {
        match t.named {
            crate::chat::Named::Llama3 => Format::Llama3,
            _ => Format::Hermes,
        }
    }

    fn spec(self) -> &'static Spec {
        &SPECS[self as usize]
    }

    /// The text a call starts with (see [`Spec::open`]).
    pub fn open(self) -> &'static str {
        self.spec().open
    }

    /// The role a `tool` message is rendered with.
    pub fn tool_role(self, role: &str) -> &str {
        match role {
            "tool" => self.spec().tool_role,
            r => r,
        }
    }

    /// An assistant message (`content`, then its `tool_calls` in OpenAI's shape:
    /// `arguments` is a string holding JSON) as the prompt writes it.
    pub fn write_history(
        self,
        w: &mut dyn Write,
        content: &str,
        calls: Val<'_>,
    ) -> core::fmt::Result {
        let sp = self.spec();
        if sp.keeps_content && !content.is_empty() {
            writeln!(w, "{content}")?;
        }
        for (k, c) in calls.items().enumerate() {
            let f = c.get("function").unwrap_or(Val(b"{}"));
            if k > 0 {
                w.write_str(sp.between)?;
            }
            w.write_str(sp.call_start)?;
            match f.get("name").filter(|n| n.kind() == Kind::Str) {
                Some(n) => w.write_str(core::str::from_utf8(n.0).map_err(|_| core::fmt::Error)?)?,
                None => w.write_str("\"\"")?,
            }
            write!(w, ", \"{}\": ", sp.args)?;
            match f.get("arguments") {
                // A string of JSON: its text, unescaped (Hermes: as given; Llama 3: as
                // its template's `tojson` writes the parsed object).
                Some(a) if a.kind() == Kind::Str => {
                    let mut buf = [0u8; 2048];
                    let mut b: &mut [u8] = &mut buf;
                    let t = a
                        .str()
                        .and_then(|s| json::unescape(&s, &mut b).ok())
                        .unwrap_or("{}");
                    match (self, root(t.as_bytes())) {
                        (Format::Llama3, Some(v)) => dump(w, v, None, 0)?,
                        _ => w.write_str(t)?,
                    }
                }
                Some(a) if self == Format::Llama3 => dump(w, a, None, 0)?,
                Some(a) => compact(w, a)?,
                None => w.write_str("{}")?,
            }
            w.write_char('}')?;
            w.write_str(sp.post)?;
        }
        Ok(())
    }
}

/// Write the tools' part of the system message (the Hermes format).
pub fn system_text(w: &mut dyn Write, tools: Val<'_>) -> core::fmt::Result {
    w.write_str("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>")?;
    for t in tools.items() {
        w.write_char('\n')?;
        compact(w, t)?;
    }
    w.write_str("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
}

/// Why [`llama3_prompt`] wrote no prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptError {
    /// Llama 3.1's template puts the tools in the first message after the system one.
    NoUserMessage,
    /// The output is full.
    Write,
}

impl From<core::fmt::Error> for PromptError {
    fn from(_: core::fmt::Error) -> Self {
        PromptError::Write
    }
}

/// The prompt Llama 3.1's chat template writes for `msgs` with `tools` (its defaults:
/// `tools_in_user_message`, no `builtin_tools`, `date_string` "26 Jul 2024"), without
/// the BOS text (the tokenizer adds it). For a Llama 3 template that does not read
/// `tools` itself (pinch's built-in `llama3`, or Llama 3.0's template). Assistant calls
/// and `ipython` roles are expected already written by [`Format::write_history`] and
/// [`Format::tool_role`].
pub fn llama3_prompt<'m>(
    w: &mut dyn Write,
    msgs: &[ChatMessage<'m>],
    tools: Val<'_>,
    add_generation_prompt: bool,
) -> Result<(), PromptError> {
    const HS: &str = "<|start_header_id|>";
    const HE: &str = "<|end_header_id|>\n\n";
    const EOT: &str = "<|eot_id|>";
    let text = |m: &ChatMessage<'m>| -> &'m str {
        match m.content {
            Content::Text(t) => t,
            Content::Parts(_) => "",
        }
    };
    let (sys, rest) = match msgs.split_first() {
        Some((m, rest)) if m.role == "system" => (text(m).trim(), rest),
        _ => ("", msgs),
    };
    write!(w, "{HS}system{HE}Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n{sys}{EOT}")?;
    let (first, rest) = rest.split_first().ok_or(PromptError::NoUserMessage)?;
    write!(w, "{HS}user{HE}Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {{\"name\": function name, \"parameters\": dictionary of argument name and its value}}.Do not use variables.\n\n")?;
    for t in tools.items() {
        dump(w, t, Some(4), 0)?;
        w.write_str("\n\n")?;
    }
    write!(w, "{}{EOT}", text(first).trim())?;
    for m in rest {
        let t = text(m);
        if m.role == "ipython" {
            // The template's `content | tojson`: a string is iterable, so it is quoted.
            write!(w, "{HS}ipython{HE}")?;
            json_bytes_str(w, t.as_bytes())?;
        } else {
            write!(w, "{HS}{}{HE}{}", m.role, t.trim())?;
        }
        w.write_str(EOT)?;
    }
    if add_generation_prompt {
        write!(w, "{HS}assistant{HE}")?;
    }
    Ok(())
}

/// `v` as Python's `json.dumps(v, ensure_ascii=False, indent=indent)` writes it (the
/// templates' `tojson`): `, ` and `: ` between items without an indent; with one, each
/// item on its own line. Numbers are copied as the request wrote them.
fn dump(w: &mut dyn Write, v: Val<'_>, indent: Option<usize>, depth: usize) -> core::fmt::Result {
    if depth > super::jraw::MAX_DEPTH {
        return Err(core::fmt::Error);
    }
    let line = |w: &mut dyn Write, d: usize| -> core::fmt::Result {
        if let Some(n) = indent {
            w.write_char('\n')?;
            for _ in 0..n * d {
                w.write_char(' ')?;
            }
        }
        Ok(())
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        Kind::Str => string(w, v),
        Kind::Obj | Kind::Arr => {
            let obj = v.kind() == Kind::Obj;
            w.write_char(if obj { '{' } else { '[' })?;
            let mut n = 0;
            let mut item =
                |w: &mut dyn Write, k: Option<Val<'_>>, x: Val<'_>| -> core::fmt::Result {
                    if n > 0 {
                        w.write_str(sep)?;
                    }
                    n += 1;
                    line(w, depth + 1)?;
                    if let Some(k) = k {
                        string(w, k)?;
                        w.write_str(": ")?;
                    }
                    dump(w, x, indent, depth + 1)
                };
            if obj {
                for (k, x) in v.members() {
                    item(w, Some(k), x)?;
                }
            } else {
                for x in v.items() {
                    item(w, None, x)?;
                }
            }
            if n > 0 {
                line(w, depth)?;
            }
            w.write_char(if obj { '}' } else { ']' })
        }
        _ => w.write_str(core::str::from_utf8(v.0).map_err(|_| core::fmt::Error)?),
    }
}

/// A JSON string re-escaped as Python's `json.dumps(ensure_ascii=False)` escapes it.
fn string(w: &mut dyn Write, v: Val<'_>) -> core::fmt::Result {
    let s = v.str().ok_or(core::fmt::Error)?;
    w.write_char('"')?;
    json::unescape_each(&s, &mut |b: &[u8]| {
        let t = core::str::from_utf8(b).map_err(|_| json::BodyError::BadEscape)?;
        let put = |w: &mut dyn Write, t: &str| w.write_str(t);
        let mut r = Ok(());
        for c in t.chars() {
            r = r.and_then(|()| match c {
                '"' => put(w, "\\\""),
                '\\' => put(w, "\\\\"),
                '\n' => put(w, "\\n"),
                '\r' => put(w, "\\r"),
                '\t' => put(w, "\\t"),
                '\x08' => put(w, "\\b"),
                '\x0C' => put(w, "\\f"),
                c if (c as u32) < 0x20 => write!(w, "\\u{:04x}", c as u32),
                c => w.write_char(c),
            });
        }
        r.map_err(|_| json::BodyError::BadEscape)
    })
    .map_err(|_| core::fmt::Error)?;
    w.write_char('"')
}

/// The JSON text `v` without the whitespace outside strings.
fn compact(w: &mut dyn Write, v: Val<'_>) -> core::fmt::Result {
    let (mut in_str, mut esc) = (false, false);
    let text = core::str::from_utf8(v.0).map_err(|_| core::fmt::Error)?;
    for c in text.chars() {
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
        } else if c.is_ascii_whitespace() {
            continue;
        }
        w.write_char(c)?;
    }
    Ok(())
}

/// The grammar of one call of a tool `choice` allows (`Required`: any of `tools`), in
/// format `fmt`.
///
/// # Errors
/// A tool's `parameters` schema is not supported, or the grammar is too large.
pub fn call_gbnf(
    w: &mut dyn Write,
    tools: Val<'_>,
    choice: ToolChoice<'_>,
    fmt: Format,
) -> Result<(), SchemaError> {
    let e = |_| SchemaError::TooLarge;
    let sp = fmt.spec();
    write!(w, "root ::= {}call{}\ncall ::= ", sp.gbnf_pre, sp.gbnf_post).map_err(e)?;
    let mut n = 0;
    for (k, t) in tools.items().enumerate() {
        let f = t.get("function").unwrap_or(Val(b"{}"));
        let Some(name) = f.get("name") else { continue };
        if let ToolChoice::Named(want) = choice {
            if name.str() != Some(want) {
                continue;
            }
        }
        if n > 0 {
            w.write_str(" | ").map_err(e)?;
        }
        write!(w, "tool-{k}").map_err(e)?;
        n += 1;
    }
    if n == 0 {
        return Err(SchemaError::NotASchema {
            at: "tool_choice (names no tool of 'tools')",
        });
    }
    w.write_char('\n').map_err(e)?;
    for (k, t) in tools.items().enumerate() {
        let f = t.get("function").unwrap_or(Val(b"{}"));
        let Some(name) = f.get("name") else { continue };
        // `{"name"` without a space: the text a stream watches for ([`Format::open`]).
        write!(w, "tool-{k} ::= \"{{\\\"name\\\"\" space \":\" space ").map_err(e)?;
        json_schema::write_literal(w, name).map_err(e)?;
        write!(
            w,
            " space \",\" space \"\\\"{}\\\"\" space \":\" space ",
            sp.args
        )
        .map_err(e)?;
        let params = f
            .get("parameters")
            .filter(|p| p.kind() == Kind::Obj)
            .unwrap_or(Val(b"{\"type\":\"object\"}"));
        json_schema::sub_schema(w, params, &format_args!("tool-{k}-"))?;
        w.write_str(" \"}\" space\n").map_err(e)?;
    }
    w.write_str(json_schema::PRIMITIVES).map_err(e)
}

/// One call found in an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call<'t> {
    pub name: Val<'t>,
    pub arguments: Val<'t>,
}

/// The call object at the start of `b` (after whitespace) and the length it takes: valid
/// JSON (checked in full: the walker only matches brackets), with a string `name`;
/// `arguments` (or Llama 3's `parameters`, llama.cpp takes either) defaults to `{}`.
fn object_at(b: &[u8]) -> Option<(Call<'_>, usize)> {
    let v = root(b).filter(|v| v.kind() == Kind::Obj)?;
    serde_json_core::from_slice::<serde::de::IgnoredAny>(v.0).ok()?;
    let name = v.get("name").filter(|n| n.kind() == Kind::Str)?;
    let arguments = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .unwrap_or(Val(b"{}"));
    let end = v.0.as_ptr() as usize - b.as_ptr() as usize + v.0.len();
    Some((Call { name, arguments }, end))
}

impl Format {
    /// Where the calls in `text` start (the content is `text[..start]`), if a call parses.
    pub fn first_call(self, text: &[u8]) -> Option<usize> {
        let open = self.open().as_bytes();
        let mut from = 0;
        while let Some(at) = find(&text[from..], open) {
            if self.calls(&text[from + at..]).next().is_some() {
                return Some(from + at);
            }
            from += at + 1;
        }
        None
    }

    /// The calls of `text` (from a call's opening on). Hermes: each `<tool_call>` ...
    /// `</tool_call>` that holds a call (others are skipped). Llama 3: call objects one
    /// after another, separated by whitespace or `;`, up to the first text that is not
    /// one.
    pub fn calls(self, text: &[u8]) -> impl Iterator<Item = Call<'_>> {
        let mut rest = text;
        core::iter::from_fn(move || loop {
            match self {
                Format::Hermes => {
                    let at = find(rest, self.open().as_bytes())?;
                    let body = &rest[at + self.open().len()..];
                    let end = find(body, b"</tool_call>").unwrap_or(body.len());
                    rest = &body[end..];
                    if let Some((c, _)) = object_at(&body[..end]) {
                        return Some(c);
                    }
                }
                Format::Llama3 => {
                    let (c, end) = object_at(rest)?;
                    if !rest[..end]
                        .trim_ascii_start()
                        .starts_with(self.open().as_bytes())
                    {
                        return None;
                    }
                    let next = rest[end..].trim_ascii_start();
                    rest = next.strip_prefix(b";").unwrap_or(next);
                    return Some(c);
                }
            }
        })
    }

    /// OpenAI's `tool_calls` list for the calls in `text` (ids `call_<id>_<k>`).
    pub fn write_calls(
        self,
        w: &mut dyn Write,
        text: &[u8],
        id: u64,
        stream: bool,
    ) -> core::fmt::Result {
        w.write_char('[')?;
        for (k, c) in self.calls(text).enumerate() {
            if k > 0 {
                w.write_char(',')?;
            }
            if stream {
                write!(w, "{{\"index\":{k},")?;
            } else {
                w.write_char('{')?;
            }
            write!(
                w,
                "\"id\":\"call_{id}_{k}\",\"type\":\"function\",\"function\":{{\"name\":"
            )?;
            w.write_str(core::str::from_utf8(c.name.0).unwrap_or("\"\""))?;
            w.write_str(",\"arguments\":")?;
            // The arguments as a string of compact JSON.
            let mut buf: heapless::String<4096> = heapless::String::new();
            compact(&mut buf, c.arguments)?;
            json_bytes_str(w, buf.as_bytes())?;
            w.write_str("}}")?;
        }
        w.write_char(']')
    }
}

fn find(h: &[u8], needle: &[u8]) -> Option<usize> {
    h.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(fmt: Format, text: &[u8]) -> heapless::String<1024> {
        let mut s = heapless::String::new();
        fmt.write_calls(&mut s, text, 7, false).unwrap();
        s
    }

    #[test]
    fn calls_are_found_after_the_content_and_written_in_openai_shape() {
        let text = b"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\":\"x\"}</tool_call>";
        let h = Format::Hermes;
        assert_eq!(h.first_call(text), Some(14));
        let all: heapless::Vec<Call<'_>, 4> = h.calls(text).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].name.0, b"\"get_weather\"");
        assert_eq!(
            listed(h, text).as_str(),
            r#"[{"id":"call_7_0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"call_7_1","type":"function","function":{"name":"x","arguments":"{}"}}]"#
        );
        assert_eq!(h.first_call(b"no calls <tool_call> {bad json"), None);
        // Brackets that match around invalid JSON are no call either.
        assert_eq!(
            h.first_call(b"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }}</tool_call>"),
            None
        );
        assert_eq!(h.first_call(b"plain"), None);
    }

    #[test]
    fn llama3_bare_json_answers_become_calls_and_anything_else_stays_text() {
        let l = Format::Llama3;
        let one = b"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        assert_eq!(l.first_call(one), Some(0));
        let want = r#"[{"id":"call_7_0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]"#;
        assert_eq!(listed(l, one).as_str(), want);
        // Text after the call is not part of it.
        let trailing = b" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\nHope this helps!";
        assert_eq!(l.first_call(trailing), Some(1));
        assert_eq!(listed(l, &trailing[1..]).as_str(), want);
        // `arguments` as llama.cpp also takes it; several calls separated by `;`.
        let two =
            b"{\"name\": \"a\", \"arguments\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}";
        assert_eq!(
            listed(l, two).as_str(),
            r#"[{"id":"call_7_0","type":"function","function":{"name":"a","arguments":"{\"x\":1}"}},{"id":"call_7_1","type":"function","function":{"name":"b","arguments":"{}"}}]"#
        );
        // Not calls: invalid JSON, no string name, other JSON, prose.
        for t in [
            &b"{\"name\": \"f\", \"parameters\": {\"a\": }}"[..],
            b"{\"name\": \"f\", \"parameters\": {\"a\": 1}",
            b"{\"name\" \"f\"}",
            b"{\"name\": 3, \"parameters\": {}}",
            b"{\"city\": \"Paris\"}",
            b"The weather is fine.",
        ] {
            assert_eq!(
                l.first_call(t),
                None,
                "{}",
                core::str::from_utf8(t).unwrap()
            );
        }
    }

    #[test]
    fn history_is_written_back_in_each_format() {
        let calls = root(br#"[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"n\":[1,2]}"}}]"#).unwrap();
        let mut s: heapless::String<512> = heapless::String::new();
        Format::Hermes
            .write_history(&mut s, "Checking.", calls)
            .unwrap();
        assert_eq!(
            s.as_str(),
            "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"n\":[1,2]}}\n</tool_call>"
        );
        s.clear();
        // Llama 3.1's template: `{"name": "..", "parameters": ` + arguments | tojson + `}`,
        // the message's text left out.
        Format::Llama3
            .write_history(&mut s, "Checking.", calls)
            .unwrap();
        assert_eq!(
            s.as_str(),
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"n\": [1, 2]}}"
        );
        assert_eq!(Format::Llama3.tool_role("tool"), "ipython");
        assert_eq!(Format::Hermes.tool_role("tool"), "tool");
    }

    #[test]
    fn tools_are_dumped_as_python_json_with_an_indent() {
        let v = root(br#"{"a":{"b":[1,"\u00e9\"\n"],"c":{}},"d":[]}"#).unwrap();
        let mut s: heapless::String<256> = heapless::String::new();
        dump(&mut s, v, Some(4), 0).unwrap();
        assert_eq!(
            s.as_str(),
            "{\n    \"a\": {\n        \"b\": [\n            1,\n            \"\u{e9}\\\"\\n\"\n        ],\n        \"c\": {}\n    },\n    \"d\": []\n}"
        );
    }

    #[test]
    fn the_required_call_grammar_takes_one_call_of_a_named_tool() {
        use crate::grammar::tests_support::accepts;
        let tools = root(br#"[{"type":"function","function":{"name":"test","parameters":{"type":"object","properties":{"success":{"type":"boolean","const":true}},"required":["success"]}}},{"type":"function","function":{"name":"python","parameters":{"type":"object","properties":{"code":{"type":"string"}},"required":["code"]}}}]"#).unwrap();
        let mut g: heapless::String<8192> = heapless::String::new();
        call_gbnf(&mut g, tools, ToolChoice::Required, Format::Hermes).unwrap();
        assert!(accepts(
            &g,
            "<tool_call>\n{\"name\": \"test\", \"arguments\": {\"success\": true}}\n</tool_call>"
        ));
        assert!(accepts(
            &g,
            "<tool_call>{\"name\":\"python\",\"arguments\":{\"code\":\"print(1)\"}}</tool_call>"
        ));
        assert!(!accepts(
            &g,
            "<tool_call>{\"name\":\"other\",\"arguments\":{}}</tool_call>"
        ));
        assert!(!accepts(&g, "Sure! <tool_call>"));
        g.clear();
        call_gbnf(
            &mut g,
            tools,
            ToolChoice::Named(serde_json_core::str::EscapedStr("python")),
            Format::Hermes,
        )
        .unwrap();
        assert!(!accepts(
            &g,
            "<tool_call>{\"name\":\"test\",\"arguments\":{\"success\":true}}</tool_call>"
        ));
        // Llama 3: the bare object, with `parameters`.
        g.clear();
        call_gbnf(&mut g, tools, ToolChoice::Required, Format::Llama3).unwrap();
        let call = "{\"name\": \"test\", \"parameters\": {\"success\": true}}";
        assert!(accepts(&g, call));
        assert_eq!(Format::Llama3.first_call(call.as_bytes()), Some(0));
        assert!(!accepts(
            &g,
            "{\"name\": \"test\", \"arguments\": {\"success\": true}}"
        ));
        assert!(!accepts(
            &g,
            "<tool_call>{\"name\": \"test\", \"parameters\": {\"success\": true}}</tool_call>"
        ));
    }
}
