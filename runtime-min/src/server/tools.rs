//! Tool calls in the Hermes / Qwen 2.5 format, the one SmolLM2, Qwen and most small
//! instruct models were tuned on:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! - The prompt: the tools' signatures and the format are added to the system message
//!   (as Qwen 2.5's own template words it), whatever the chat template, since pinch's
//!   template interpreter does not take a `tools` variable; an assistant message's
//!   `tool_calls` are written back in the same format.
//! - `tool_choice: "required"` (or a named function): the answer is constrained by a
//!   grammar to one call of one of the tools with arguments that follow its
//!   `parameters` schema ([`call_gbnf`]).
//! - The answer: the calls found in the text become OpenAI's `tool_calls`
//!   ([`write_calls`]); the text before the first call stays the `content`.
use core::fmt::Write;

use super::jraw::{root, Kind, Val};
use super::json::{self, json_bytes_str, ToolChoice};
use crate::grammar::json_schema::{self, SchemaError};

/// The markers around one call.
pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// Write the tools' part of the system message.
pub fn system_text(w: &mut dyn Write, tools: Val<'_>) -> core::fmt::Result {
    w.write_str("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>")?;
    for t in tools.items() {
        w.write_char('\n')?;
        compact(w, t)?;
    }
    w.write_str("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
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

/// An assistant message's `tool_calls` (OpenAI's shape: `arguments` is a string holding
/// JSON) in the prompt format.
pub fn write_history(w: &mut dyn Write, calls: Val<'_>) -> core::fmt::Result {
    for (k, c) in calls.items().enumerate() {
        let f = c.get("function").unwrap_or(Val(b"{}"));
        let name = f.get("name").and_then(|n| n.str());
        if k > 0 {
            w.write_char('\n')?;
        }
        w.write_str(OPEN)?;
        w.write_str("\n{\"name\": ")?;
        match name {
            Some(n) => write!(w, "\"{}\"", n.0)?,
            None => w.write_str("\"\"")?,
        }
        w.write_str(", \"arguments\": ")?;
        match f.get("arguments") {
            // A string of JSON: its text, unescaped.
            Some(a) if a.kind() == Kind::Str => {
                let mut buf = [0u8; 2048];
                let mut b: &mut [u8] = &mut buf;
                let t = a
                    .str()
                    .and_then(|s| json::unescape(&s, &mut b).ok())
                    .unwrap_or("{}");
                w.write_str(t)?;
            }
            Some(a) => compact(w, a)?,
            None => w.write_str("{}")?,
        }
        w.write_str("}\n")?;
        w.write_str(CLOSE)?;
    }
    Ok(())
}

/// The grammar of one call of a tool `choice` allows (`Required`: any of `tools`).
///
/// # Errors
/// A tool's `parameters` schema is not supported, or the grammar is too large.
pub fn call_gbnf(
    w: &mut dyn Write,
    tools: Val<'_>,
    choice: ToolChoice<'_>,
) -> Result<(), SchemaError> {
    let e = |_| SchemaError::TooLarge;
    w.write_str("root ::= \"<tool_call>\" \"\\n\"? call \"\\n\"? \"</tool_call>\"\ncall ::= ")
        .map_err(e)?;
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
        write!(
            w,
            "tool-{k} ::= \"{{\" space \"\\\"name\\\"\" space \":\" space "
        )
        .map_err(e)?;
        json_schema::write_literal(w, name).map_err(e)?;
        w.write_str(" space \",\" space \"\\\"arguments\\\"\" space \":\" space ")
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

/// Where the calls in `text` start (the content is `text[..start]`), if any call parses.
pub fn first_call(text: &[u8]) -> Option<usize> {
    let at = find(text, OPEN.as_bytes())?;
    calls(&text[at..]).next().map(|_| at)
}

/// The calls of `text` (from its first marker on): each `<tool_call>` followed by a JSON
/// object with a string `name`; `arguments` defaults to `{}`.
pub fn calls(text: &[u8]) -> impl Iterator<Item = Call<'_>> {
    let mut rest = text;
    core::iter::from_fn(move || loop {
        let at = find(rest, OPEN.as_bytes())?;
        let body = &rest[at + OPEN.len()..];
        let end = find(body, CLOSE.as_bytes()).unwrap_or(body.len());
        rest = &body[end..];
        let Some(v) = root(&body[..end]).filter(|v| v.kind() == Kind::Obj) else {
            continue;
        };
        let Some(name) = v.get("name").filter(|n| n.kind() == Kind::Str) else {
            continue;
        };
        let arguments = v
            .get("arguments")
            .or_else(|| v.get("parameters"))
            .unwrap_or(Val(b"{}"));
        return Some(Call { name, arguments });
    })
}

fn find(h: &[u8], needle: &[u8]) -> Option<usize> {
    h.windows(needle.len()).position(|w| w == needle)
}

/// OpenAI's `tool_calls` list for the calls in `text` (ids `call_<id>_<k>`).
pub fn write_calls(w: &mut dyn Write, text: &[u8], id: u64, stream: bool) -> core::fmt::Result {
    w.write_char('[')?;
    for (k, c) in calls(text).enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_found_after_the_content_and_written_in_openai_shape() {
        let text = b"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\":\"x\"}</tool_call>";
        assert_eq!(first_call(text), Some(14));
        let all: heapless::Vec<Call<'_>, 4> = calls(text).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].name.0, b"\"get_weather\"");
        let mut s: heapless::String<512> = heapless::String::new();
        write_calls(&mut s, text, 7, false).unwrap();
        assert_eq!(
            s.as_str(),
            r#"[{"id":"call_7_0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"call_7_1","type":"function","function":{"name":"x","arguments":"{}"}}]"#
        );
        assert_eq!(first_call(b"no calls <tool_call> {bad json"), None);
        assert_eq!(first_call(b"plain"), None);
    }

    #[test]
    fn the_required_call_grammar_takes_one_call_of_a_named_tool() {
        use crate::grammar::tests_support::accepts;
        let tools = root(br#"[{"type":"function","function":{"name":"test","parameters":{"type":"object","properties":{"success":{"type":"boolean","const":true}},"required":["success"]}}},{"type":"function","function":{"name":"python","parameters":{"type":"object","properties":{"code":{"type":"string"}},"required":["code"]}}}]"#).unwrap();
        let mut g: heapless::String<8192> = heapless::String::new();
        call_gbnf(&mut g, tools, ToolChoice::Required).unwrap();
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
        )
        .unwrap();
        assert!(!accepts(
            &g,
            "<tool_call>{\"name\":\"test\",\"arguments\":{\"success\":true}}</tool_call>"
        ));
    }
}
