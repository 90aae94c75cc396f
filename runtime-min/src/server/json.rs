//! Request bodies of the generation endpoints, deserialized with `serde-json-core`
//! straight from the request buffer (strings stay borrowed and escaped until copied
//! into the arena by [`unescape`]), and the checks that turn bad values into 400s.
//!
//! `serde-json-core` cannot deserialize "either a string or a list" (it has no
//! `deserialize_any`): it reads the scalar fields, and [`super::jraw`] walks the ones
//! whose shape varies (`prompt`, `messages`, `stop`, `logprobs`, `logit_bias`).
use core::fmt::Write;

use serde::Deserialize;
use serde_json_core::str::EscapedStr;

use super::jraw::{root, Kind, Val};

/// Most messages in one chat request.
pub const MAX_MESSAGES: usize = 256;
/// Most stop strings, and the longest one in bytes.
pub const MAX_STOP: usize = 4;
pub const MAX_STOP_LEN: usize = 64;
/// Most alternatives reported per token (OpenAI allows 20).
pub const MAX_TOP: usize = 20;

/// A message's `content`: absent or null, a string, or a list of parts
/// (`{"type":"text","text":...}`; the text parts are joined with blank lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content<'a> {
    None,
    Text(EscapedStr<'a>),
    Parts(Val<'a>),
}

/// One chat message.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    pub role: EscapedStr<'a>,
    pub content: Content<'a>,
    /// An assistant message's `tool_calls` (a list), written into the prompt in the
    /// tool format.
    pub tool_calls: Option<Val<'a>>,
}

/// `tool_choice`: whether the model may, must, or must not call one of `tools`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolChoice<'a> {
    None,
    Auto,
    Required,
    /// `{"type": "function", "function": {"name": ...}}`: that one.
    Named(EscapedStr<'a>),
}

/// Read `tools` (a list of `{"type": "function", "function": {"name", "parameters"}}`)
/// and `tool_choice` (default `auto` with tools, `none` without).
fn tools(r: Val<'_>) -> Result<(Option<Val<'_>>, ToolChoice<'_>), BodyError> {
    let list = r.get("tools").filter(|v| v.kind() != Kind::Null);
    if let Some(l) = list {
        if l.kind() != Kind::Arr {
            return Err(BodyError::Shape("tools"));
        }
        for t in l.items() {
            let f = t.get("function");
            let named = f.and_then(|f| f.get("name")).and_then(|n| n.str());
            let params_ok = f
                .and_then(|f| f.get("parameters"))
                .is_none_or(|p| matches!(p.kind(), Kind::Obj | Kind::Null));
            if t.get("type").and_then(|x| x.str()).map(|x| x.0) != Some("function")
                || named.is_none_or(|n| n.0.is_empty())
                || !params_ok
            {
                return Err(BodyError::Shape(
                    "tools[]: {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}",
                ));
            }
        }
    }
    let list = list.filter(|l| l.items().next().is_some());
    let choice = match r.get("tool_choice").filter(|v| v.kind() != Kind::Null) {
        None => match list {
            Some(_) => ToolChoice::Auto,
            None => ToolChoice::None,
        },
        Some(v) => match (v.kind(), v.str().map(|s| s.0)) {
            (_, Some("none")) => ToolChoice::None,
            (_, Some("auto")) => ToolChoice::Auto,
            (_, Some("required")) => ToolChoice::Required,
            (Kind::Obj, _) => ToolChoice::Named(
                v.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(|n| n.str())
                    .ok_or(BodyError::Shape("tool_choice.function.name"))?,
            ),
            _ => {
                return Err(BodyError::Shape(
                    "tool_choice (none, auto, required or a function)",
                ))
            }
        },
    };
    if list.is_none() && !matches!(choice, ToolChoice::None) {
        return Err(BodyError::Missing("tools (for tool_choice)"));
    }
    Ok((list, choice))
}

/// `stream_options`.
#[derive(Deserialize, Debug, Default, Clone, Copy)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The scalar fields of all the generation APIs (each ignores what it does not use);
/// the fields whose shape varies are read with [`jraw`](super::jraw) in [`parse`].
#[derive(Deserialize, Debug)]
pub struct Body<'a> {
    #[serde(borrow, default)]
    pub model: Option<EscapedStr<'a>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<i32>,
    #[serde(default)]
    pub max_completion_tokens: Option<i32>,
    /// llama-server: -1 means "until the context is full".
    #[serde(default)]
    pub n_predict: Option<i32>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub n_probs: Option<u32>,
    #[serde(default)]
    pub post_sampling_probs: Option<bool>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// llama-server: reuse the cached prefix of the previous request (default true).
    #[serde(default)]
    pub cache_prompt: Option<bool>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub return_tokens: Option<bool>,
    #[serde(default)]
    pub return_progress: Option<bool>,
    #[serde(default)]
    pub timings_per_token: Option<bool>,
    #[serde(default)]
    pub verbose: Option<bool>,
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: Option<bool>,
}

/// `stop` as a list.
pub type StopList<'a> = heapless::Vec<EscapedStr<'a>, MAX_STOP>;

/// Which API a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
    /// `POST /completion` (llama-server)
    Llama,
    /// `POST /infill` (llama-server: fill in the middle)
    Infill,
    /// `POST /tokenize`, `POST /detokenize` (no generation; answered in turn).
    Tokenize,
    Detokenize,
    /// `POST /apply-template`: the rendered chat prompt, no generation.
    ApplyTemplate,
    /// `POST /v1/chat/completions/input_tokens`: the chat prompt's token count.
    InputTokens,
}

/// A request body, checked.
pub struct Parsed<'a> {
    pub model: Option<EscapedStr<'a>>,
    pub messages: heapless::Vec<Message<'a>, MAX_MESSAGES>,
    /// The raw `prompt` (a string, token ids, or a list of prompts).
    pub prompt: Option<Val<'a>>,
    pub stop: StopList<'a>,
    /// The raw `logit_bias` (a list of `[token or text, bias]` pairs, or an object).
    pub logit_bias: Option<Val<'a>>,
    /// Infill: `input_prefix`, `input_suffix`, `input_extra`.
    pub infill: Option<(Val<'a>, Val<'a>, Option<Val<'a>>)>,
    pub constraint: Constraint<'a>,
    /// `tools` (a non-empty list) and `tool_choice`.
    pub tools: Option<Val<'a>>,
    pub tool_choice: ToolChoice<'a>,
    pub p: Params,
}

/// The settings of one generation, checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    pub stream: bool,
    /// Tokens to generate at most (`None`: until the context is full).
    pub max_tokens: Option<u32>,
    /// Answers per prompt (`n`).
    pub n: usize,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: Option<i64>,
    /// Report the chosen token's log-probability.
    pub logprobs: bool,
    /// Alternatives per token to report.
    pub top: usize,
    /// Report probabilities after sampling (`post_sampling_probs`).
    pub post_sampling: bool,
    pub ignore_eos: Option<bool>,
    pub cache_prompt: bool,
    /// Chat stream: a last chunk with `usage` and empty `choices` (llama-server's
    /// default; `stream_options.include_usage: false` leaves it out).
    pub include_usage: bool,
    pub echo: bool,
    pub return_tokens: bool,
    pub return_progress: bool,
    pub verbose: bool,
    /// Chat: end the prompt with the assistant's turn opening (default true).
    pub add_generation_prompt: bool,
}

/// Why a body was refused (always a 400).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BodyError {
    Json(serde_json_core::de::Error),
    Missing(&'static str),
    Range(&'static str),
    /// A field of the wrong type or shape.
    Shape(&'static str),
    StopTooLong,
    BadEscape,
    /// A conversation that ends with two assistant messages (llama-server refuses it).
    TwoAssistants,
    /// `add_generation_prompt` and `continue_final_message` together.
    PrefillAndPrompt,
}

impl BodyError {
    /// The HTTP status (always 400).
    pub fn status(&self) -> u16 {
        400
    }
}

impl core::fmt::Display for BodyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BodyError::Json(e) => {
                write!(f, "invalid JSON body (or a field of the wrong type): {e}")
            }
            BodyError::Missing(what) => write!(f, "'{what}' is required"),
            BodyError::Range(what) => write!(f, "'{what}' is out of range"),
            BodyError::Shape(what) => write!(f, "'{what}' has the wrong type or shape"),
            BodyError::StopTooLong => write!(
                f,
                "at most {MAX_STOP} stop strings of at most {MAX_STOP_LEN} bytes"
            ),
            BodyError::BadEscape => write!(f, "invalid escape sequence in a string"),
            BodyError::TwoAssistants => write!(
                f,
                "the conversation ends with two assistant messages: the last one cannot be continued"
            ),
            BodyError::PrefillAndPrompt => write!(
                f,
                "'add_generation_prompt' and 'continue_final_message' cannot both be true"
            ),
        }
    }
}

/// The constraint on the output a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Constraint<'a> {
    None,
    /// `grammar`: GBNF text (still escaped).
    Grammar(EscapedStr<'a>),
    /// `response_format: {"type": "json_object"}` without a schema: any JSON object.
    AnyObject,
    /// A JSON schema (`response_format` `json_schema` or `json_object` with `schema`,
    /// or llama-server's `json_schema`); checked when it becomes a grammar.
    Schema(Val<'a>),
}

/// Read `response_format`, `json_schema` and `grammar` (a malformed one is a 400, as
/// llama-server answers it; the schema itself is checked by
/// [`crate::grammar::json_schema`]).
fn constraints(r: Val<'_>) -> Result<Constraint<'_>, BodyError> {
    if let Some(f) = r.get("response_format").filter(|v| v.kind() != Kind::Null) {
        let kind = f.get("type").and_then(|t| t.str()).map(|t| t.0);
        match kind {
            Some("text") => {}
            Some("json_object") => {
                return Ok(match f.get("schema") {
                    Some(s) => Constraint::Schema(s),
                    None => Constraint::AnyObject,
                })
            }
            Some("json_schema") => {
                let s = f.get("json_schema").and_then(|j| j.get("schema"));
                return s
                    .map(Constraint::Schema)
                    .ok_or(BodyError::Missing("response_format.json_schema.schema"));
            }
            _ => {
                return Err(BodyError::Shape(
                    "response_format.type (text, json_object or json_schema)",
                ))
            }
        }
    }
    if let Some(s) = r.get("json_schema").filter(|v| v.kind() != Kind::Null) {
        return Ok(Constraint::Schema(s));
    }
    match r.get("grammar") {
        Some(g) if g.kind() == Kind::Str => {
            Ok(Constraint::Grammar(g.str().ok_or(BodyError::BadEscape)?))
        }
        Some(g) if g.kind() != Kind::Null => Err(BodyError::Shape("grammar")),
        _ => Ok(Constraint::None),
    }
}

/// Most answers per prompt (`n`).
pub const MAX_N: usize = 8;

fn messages(v: Val<'_>) -> Result<heapless::Vec<Message<'_>, MAX_MESSAGES>, BodyError> {
    if v.kind() != Kind::Arr {
        return Err(BodyError::Shape("messages"));
    }
    let mut out = heapless::Vec::new();
    for m in v.items() {
        let role = m
            .get("role")
            .and_then(|r| r.str())
            .ok_or(BodyError::Shape("messages[].role"))?;
        let content = match m.get("content") {
            None => Content::None,
            Some(c) => match c.kind() {
                Kind::Null => Content::None,
                Kind::Str => Content::Text(c.str().ok_or(BodyError::BadEscape)?),
                Kind::Arr => {
                    for part in c.items() {
                        let t = part.get("type").and_then(|t| t.str());
                        if t.map(|t| t.0) != Some("text")
                            || part.get("text").and_then(|x| x.str()).is_none()
                        {
                            return Err(BodyError::Shape("messages[].content[]: only text parts"));
                        }
                    }
                    Content::Parts(c)
                }
                _ => return Err(BodyError::Shape("messages[].content")),
            },
        };
        let tool_calls = m.get("tool_calls").filter(|v| v.kind() != Kind::Null);
        if tool_calls.is_some_and(|v| v.kind() != Kind::Arr) {
            return Err(BodyError::Shape("messages[].tool_calls"));
        }
        out.push(Message {
            role,
            content,
            tool_calls,
        })
        .map_err(|_| BodyError::Range("messages"))?;
    }
    let n = out.len();
    if n >= 2 && out[n - 1].role.0 == "assistant" && out[n - 2].role.0 == "assistant" {
        return Err(BodyError::TwoAssistants);
    }
    Ok(out)
}

fn stops(v: Option<Val<'_>>) -> Result<StopList<'_>, BodyError> {
    let mut stop = StopList::new();
    let Some(v) = v else { return Ok(stop) };
    match v.kind() {
        Kind::Null => {}
        Kind::Str => {
            let _ = stop.push(v.str().ok_or(BodyError::BadEscape)?);
        }
        Kind::Arr => {
            for s in v.items() {
                let s = s.str().ok_or(BodyError::Shape("stop"))?;
                stop.push(s).map_err(|_| BodyError::StopTooLong)?;
            }
        }
        _ => return Err(BodyError::Shape("stop")),
    }
    for s in stop.iter() {
        if s.0.is_empty() || s.0.len() > MAX_STOP_LEN {
            return Err(BodyError::StopTooLong);
        }
    }
    Ok(stop)
}

/// Parse and check the body of a generation request.
///
/// # Errors
/// A [`BodyError`] naming the field at fault (answered with 400).
pub fn parse(api: Api, body: &[u8]) -> Result<Parsed<'_>, BodyError> {
    let b = serde_json_core::from_slice::<Body<'_>>(body)
        .map(|(b, _)| b)
        .map_err(BodyError::Json)?;
    let r = root(body).ok_or(BodyError::Shape("body"))?;
    let constraint = constraints(r)?;
    let (tool_list, tool_choice) = tools(r)?;
    let stop = stops(r.get("stop"))?;
    // `logprobs`: a flag (chat) or a count (legacy completions).
    let (logprobs, lp_top) = match r.get("logprobs") {
        None => (false, 0),
        Some(v) => match (v.kind(), v.bool(), v.u32()) {
            (Kind::Null, ..) => (false, 0),
            (_, Some(f), _) => (f, 0),
            (_, _, Some(n)) => (true, n),
            _ => return Err(BodyError::Shape("logprobs")),
        },
    };
    // The error names the field the client sent.
    for (field, n) in [
        ("logprobs", Some(lp_top)),
        ("top_logprobs", b.top_logprobs),
        ("n_probs", b.n_probs),
    ] {
        if n.unwrap_or(0) as usize > MAX_TOP {
            return Err(BodyError::Range(field));
        }
    }
    let top = lp_top
        .max(b.top_logprobs.unwrap_or(0))
        .max(b.n_probs.unwrap_or(0));
    let max_tokens = match b.max_tokens.or(b.max_completion_tokens).or(b.n_predict) {
        Some(n) if n < 0 => None,
        Some(n) => Some(n as u32),
        None => None,
    };
    let finite_nonneg = |v: Option<f32>| v.is_none_or(|x| x.is_finite() && x >= 0.0);
    if !finite_nonneg(b.temperature) {
        return Err(BodyError::Range("temperature"));
    }
    if !b.top_p.is_none_or(|x| x.is_finite() && x > 0.0 && x <= 1.0) {
        return Err(BodyError::Range("top_p"));
    }
    if !b
        .min_p
        .is_none_or(|x| x.is_finite() && (0.0..=1.0).contains(&x))
    {
        return Err(BodyError::Range("min_p"));
    }
    if !b.repeat_penalty.is_none_or(|x| x.is_finite() && x > 0.0) {
        return Err(BodyError::Range("repeat_penalty"));
    }
    let pen = |v: Option<f32>, name| match v {
        Some(x) if !(x.is_finite() && (-2.0..=2.0).contains(&x)) => Err(BodyError::Range(name)),
        v => Ok(v.unwrap_or(0.0)),
    };
    let presence_penalty = pen(b.presence_penalty, "presence_penalty")?;
    let frequency_penalty = pen(b.frequency_penalty, "frequency_penalty")?;
    let n = b.n.unwrap_or(1) as usize;
    if n == 0 || n > MAX_N {
        return Err(BodyError::Range("n"));
    }
    let add_generation_prompt = b.add_generation_prompt.unwrap_or(true);
    if b.continue_final_message == Some(true) && b.add_generation_prompt == Some(true) {
        return Err(BodyError::PrefillAndPrompt);
    }
    let mut msgs = heapless::Vec::new();
    let mut infill = None;
    let prompt = r.get("prompt");
    match api {
        Api::Chat | Api::ApplyTemplate | Api::InputTokens => {
            msgs = messages(r.get("messages").ok_or(BodyError::Missing("messages"))?)?;
            if msgs.is_empty() {
                return Err(BodyError::Missing("messages"));
            }
        }
        Api::Tokenize | Api::Detokenize => {}
        Api::Completions | Api::Llama => {
            if prompt.is_none() {
                return Err(BodyError::Missing("prompt"));
            }
        }
        Api::Infill => {
            let text = |k: &'static str| match r.get(k) {
                None => Ok(Val(b"\"\"")),
                Some(v) if v.kind() == Kind::Str => Ok(v),
                Some(_) => Err(BodyError::Shape(k)),
            };
            let extra = r.get("input_extra");
            if let Some(x) = extra {
                if x.kind() != Kind::Arr {
                    return Err(BodyError::Shape("input_extra"));
                }
                for chunk in x.items() {
                    let ok = |k| chunk.get(k).is_some_and(|v| v.kind() == Kind::Str);
                    if chunk.kind() != Kind::Obj
                        || !ok("text")
                        || chunk.get("filename").is_some_and(|v| v.kind() != Kind::Str)
                    {
                        return Err(BodyError::Shape(
                            "input_extra: chunks need a string 'text' and 'filename'",
                        ));
                    }
                }
            }
            infill = Some((text("input_prefix")?, text("input_suffix")?, extra));
            if prompt.is_some_and(|v| v.kind() != Kind::Str) {
                return Err(BodyError::Shape("prompt"));
            }
        }
    }
    let logit_bias = r.get("logit_bias").filter(|v| v.kind() != Kind::Null);
    if let Some(v) = logit_bias {
        if !matches!(v.kind(), Kind::Arr | Kind::Obj) {
            return Err(BodyError::Shape("logit_bias"));
        }
    }
    Ok(Parsed {
        model: b.model,
        messages: msgs,
        prompt,
        stop,
        logit_bias,
        infill,
        constraint,
        tools: tool_list,
        tool_choice,
        p: Params {
            stream: b.stream.unwrap_or(false),
            max_tokens,
            n,
            temperature: b.temperature,
            top_p: b.top_p,
            top_k: b.top_k,
            min_p: b.min_p,
            repeat_penalty: b.repeat_penalty,
            presence_penalty,
            frequency_penalty,
            seed: b.seed,
            logprobs: logprobs || top > 0,
            top: top as usize,
            post_sampling: b.post_sampling_probs.unwrap_or(false),
            ignore_eos: b.ignore_eos,
            cache_prompt: b.cache_prompt.unwrap_or(true),
            include_usage: b
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(true),
            echo: b.echo.unwrap_or(false),
            return_tokens: b.return_tokens.unwrap_or(false),
            return_progress: b.return_progress.unwrap_or(false),
            verbose: b.verbose.unwrap_or(false),
            add_generation_prompt,
        },
    })
}

/// Copy the unescaped text of `s` to the front of `*buf` and advance `*buf` past it.
///
/// # Errors
/// `BadEscape` for an invalid escape, `Range` when `buf` is too small.
pub fn unescape<'b>(s: &EscapedStr<'_>, buf: &mut &'b mut [u8]) -> Result<&'b str, BodyError> {
    let mut n = 0usize;
    {
        let out: &mut [u8] = buf;
        unescape_each(s, &mut |bytes: &[u8]| {
            let end = n + bytes.len();
            if end > out.len() {
                return Err(BodyError::Range("prompt"));
            }
            out[n..end].copy_from_slice(bytes);
            n = end;
            Ok(())
        })?;
    }
    let taken = core::mem::take(buf);
    let (head, tail) = taken.split_at_mut(n);
    *buf = tail;
    // The source is a `&str` and escapes become whole chars: valid UTF-8.
    core::str::from_utf8(head).map_err(|_| BodyError::BadEscape)
}

/// The unescaped bytes of `s` in pieces, in order, to `put` (which may refuse).
pub(super) fn unescape_each(
    s: &EscapedStr<'_>,
    put: &mut dyn FnMut(&[u8]) -> Result<(), BodyError>,
) -> Result<(), BodyError> {
    let src = s.0.as_bytes();
    let hex4 = |at: usize| -> Option<u32> {
        let h = src.get(at..at + 4)?;
        u32::from_str_radix(core::str::from_utf8(h).ok()?, 16).ok()
    };
    let mut i = 0;
    while i < src.len() {
        let run = src[i..]
            .iter()
            .position(|&c| c == b'\\')
            .unwrap_or(src.len() - i);
        put(&src[i..i + run])?;
        i += run;
        if i >= src.len() {
            break;
        }
        let e = *src.get(i + 1).ok_or(BodyError::BadEscape)?;
        let c = match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\x08',
            b'f' => '\x0C',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = hex4(i + 2).ok_or(BodyError::BadEscape)?;
                if (0xD800..0xDC00).contains(&hi) {
                    // A surrogate pair: \uD83E\uDD17.
                    let lo = (src.get(i + 6..i + 8) == Some(b"\\u"))
                        .then(|| hex4(i + 8))
                        .flatten()
                        .filter(|lo| (0xDC00..0xE000).contains(lo))
                        .ok_or(BodyError::BadEscape)?;
                    i += 6;
                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                        .ok_or(BodyError::BadEscape)?
                } else {
                    char::from_u32(hi).ok_or(BodyError::BadEscape)?
                }
            }
            _ => return Err(BodyError::BadEscape),
        };
        i += if e == b'u' { 6 } else { 2 };
        let mut tmp = [0u8; 4];
        put(c.encode_utf8(&mut tmp).as_bytes())?;
    }
    Ok(())
}

/// Whether the escaped JSON string `s` equals `want` once unescaped (as [`unescape`]
/// reads it: surrogate pairs included).
pub fn escaped_eq(s: &EscapedStr<'_>, want: &str) -> bool {
    let mut rest = want.as_bytes();
    let same = unescape_each(s, &mut |bytes: &[u8]| match rest.strip_prefix(bytes) {
        Some(r) => {
            rest = r;
            Ok(())
        }
        None => Err(BodyError::BadEscape),
    });
    same.is_ok() && rest.is_empty()
}

/// Write `bytes` as a JSON string, invalid UTF-8 as U+FFFD.
pub fn json_bytes_str(w: &mut dyn Write, bytes: &[u8]) -> core::fmt::Result {
    w.write_char('"')?;
    json_bytes_inner(w, bytes)?;
    w.write_char('"')
}

/// The escaped text of `bytes` without the quotes (to join several into one string).
pub fn json_bytes_inner(w: &mut dyn Write, bytes: &[u8]) -> core::fmt::Result {
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => w.write_str("\\\"")?,
                '\\' => w.write_str("\\\\")?,
                '\n' => w.write_str("\\n")?,
                '\r' => w.write_str("\\r")?,
                '\t' => w.write_str("\\t")?,
                c if (c as u32) < 0x20 => write!(w, "\\u{:04x}", c as u32)?,
                c => w.write_char(c)?,
            }
        }
        if !chunk.invalid().is_empty() {
            w.write_char('\u{FFFD}')?;
        }
    }
    Ok(())
}

/// Write `bytes` as a JSON array of numbers.
pub fn json_byte_list(w: &mut dyn Write, bytes: &[u8]) -> core::fmt::Result {
    w.write_char('[')?;
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            w.write_char(',')?;
        }
        write!(w, "{b}")?;
    }
    w.write_char(']')
}

/// Write a float as JSON (non-finite values become very negative numbers, as JSON has no
/// infinities: a log-probability of -inf is written as -9999).
pub fn json_f32(w: &mut dyn Write, v: f32) -> core::fmt::Result {
    if v.is_finite() {
        write!(w, "{v}")
    } else if v > 0.0 {
        w.write_str("9999")
    } else {
        w.write_str("-9999")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_body_with_escapes_stop_list_and_unknown_fields() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"be \"brief\"\n"},{"role":"user","content":"hi \u00e9"}],
            "stream":true,"max_tokens":7,"temperature":0.5,"seed":3,"logprobs":true,"top_logprobs":3,
            "stop":["\n\n","END"],"frequency_penalty":0,"tools":[{"type":"function","function":{"name":"f","parameters":{"a":[1,2,{"b":null}]}}}]}"#;
        let p = parse(Api::Chat, body).unwrap();
        assert_eq!(p.messages.len(), 2);
        assert_eq!(p.stop.len(), 2);
        assert!(p.p.stream && p.p.logprobs);
        assert_eq!((p.p.max_tokens, p.p.top, p.p.seed), (Some(7), 3, Some(3)));
        let mut store = [0u8; 64];
        let mut buf: &mut [u8] = &mut store;
        fn text(c: Content<'_>) -> EscapedStr<'_> {
            match c {
                Content::Text(t) => t,
                other => panic!("{other:?}"),
            }
        }
        let a = unescape(&text(p.messages[0].content), &mut buf).unwrap();
        let b = unescape(&text(p.messages[1].content), &mut buf).unwrap();
        assert_eq!(a, "be \"brief\"\n");
        assert_eq!(b, "hi é");
        assert!(escaped_eq(&p.model.unwrap(), "m"));
    }

    #[test]
    fn flexible_fields_keep_their_raw_shape() {
        let p = parse(
            Api::Chat,
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"logit_bias":{"5":-100},"n":2,"max_tokens":-1,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert!(matches!(p.messages[0].content, Content::Parts(_)));
        assert_eq!(p.logit_bias.unwrap().kind(), Kind::Obj);
        assert_eq!((p.p.n, p.p.max_tokens, p.p.include_usage), (2, None, true));
        let p = parse(
            Api::Llama,
            br#"{"prompt":[[1,2],"x",{"prompt_string":"y"}]}"#,
        )
        .unwrap();
        assert_eq!(p.prompt.unwrap().items().count(), 3);
        assert_eq!(
            parse(Api::Chat, br#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a"},{"role":"assistant","content":"b"}]}"#).err(),
            Some(BodyError::TwoAssistants)
        );
    }

    #[test]
    fn constraints_are_read_and_malformed_ones_refused() {
        let m = r#""messages":[{"role":"user","content":"x"}]"#;
        let read = |extra: &str| {
            let mut b: heapless::String<256> = heapless::String::new();
            write!(b, "{{{m},{extra}}}").unwrap();
            let p = parse(Api::Chat, b.as_bytes());
            p.map(|p| match p.constraint {
                Constraint::None => "none",
                Constraint::Grammar(_) => "grammar",
                Constraint::AnyObject => "object",
                Constraint::Schema(_) => "schema",
            })
        };
        assert_eq!(read(r#""response_format":{"type":"text"}"#), Ok("none"));
        assert_eq!(
            read(r#""response_format":{"type":"json_object"}"#),
            Ok("object")
        );
        assert_eq!(
            read(
                r#""response_format":{"type":"json_schema","json_schema":{"schema":{"const":"a"}}}"#
            ),
            Ok("schema")
        );
        assert_eq!(
            read(r#""response_format":{"type":"json_object","schema":123}"#),
            Ok("schema")
        );
        assert_eq!(read(r#""grammar":"root ::= \"a\"""#), Ok("grammar"));
        assert_eq!(
            read(r#""json_schema":{"type":["string","null"]}"#),
            Ok("schema")
        );
        assert_eq!(
            read(r#""response_format":{"type":"sound"}"#)
                .err()
                .map(|e| e.status()),
            Some(400)
        );
        assert_eq!(
            read(r#""grammar":5"#).err(),
            Some(BodyError::Shape("grammar"))
        );
        assert_eq!(
            read(r#""response_format":{"type":"json_schema"}"#).err(),
            Some(BodyError::Missing("response_format.json_schema.schema"))
        );
    }

    #[test]
    fn stop_may_be_a_single_string() {
        let p = parse(
            Api::Llama,
            br#"{"prompt":"x","stop":"END","n_predict":-1,"n_probs":2}"#,
        )
        .unwrap();
        assert_eq!(p.stop.len(), 1);
        assert_eq!(p.stop[0].0, "END");
        assert_eq!(p.p.max_tokens, None);
        assert_eq!(p.p.top, 2);
    }

    #[test]
    fn legacy_logprobs_is_a_count() {
        let p = parse(Api::Completions, br#"{"prompt":"x","logprobs":2}"#).unwrap();
        assert!(p.p.logprobs);
        assert_eq!(p.p.top, 2);
    }

    #[test]
    fn bad_bodies_are_errors_not_panics() {
        for body in [
            &b"{"[..],
            b"",
            b"[1,2]",
            b"{\"messages\":\"hi\"}",
            b"{\"messages\":[{\"role\":1}]}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":3}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"add_generation_prompt\":true,\"continue_final_message\":true}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}",
            b"{\"messages\":[]}",
            b"{\"prompt\":\"x\"}",
            b"\xff\xfe",
        ] {
            assert!(
                parse(Api::Chat, body).is_err(),
                "{:?}",
                core::str::from_utf8(body)
            );
        }
        assert_eq!(
            parse(Api::Llama, b"{}").err(),
            Some(BodyError::Missing("prompt"))
        );
        assert_eq!(
            parse(
                Api::Chat,
                br#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#
            )
            .err(),
            Some(BodyError::Range("top_p"))
        );
        assert_eq!(
            parse(
                Api::Chat,
                br#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":21}"#
            )
            .err(),
            Some(BodyError::Range("top_logprobs"))
        );
        assert_eq!(
            parse(Api::Llama, br#"{"prompt":"x","n_probs":300}"#).err(),
            Some(BodyError::Range("n_probs"))
        );
        assert_eq!(
            parse(Api::Completions, br#"{"prompt":"x","logprobs":99}"#).err(),
            Some(BodyError::Range("logprobs"))
        );
    }

    #[test]
    fn unescape_joins_surrogate_pairs_and_refuses_lone_ones() {
        let mut store = [0u8; 32];
        let mut buf: &mut [u8] = &mut store;
        let t = unescape(&EscapedStr(r"a\u5abd \ud83e\udd17\n"), &mut buf).unwrap();
        assert_eq!(t, "a\u{5abd} \u{1f917}\n");
        for bad in [r"\ud83e", r"\ud83ex", r"\udd17", r"\q", r"\u12"] {
            let mut buf: &mut [u8] = &mut store;
            assert_eq!(
                unescape(&EscapedStr(bad), &mut buf),
                Err(BodyError::BadEscape),
                "{bad}"
            );
        }
    }

    #[test]
    fn unescape_reports_a_full_buffer() {
        let p = parse(Api::Llama, br#"{"prompt":"abcdef"}"#).unwrap();
        let mut store = [0u8; 3];
        let mut buf: &mut [u8] = &mut store;
        assert_eq!(
            unescape(&p.prompt.unwrap().str().unwrap(), &mut buf),
            Err(BodyError::Range("prompt"))
        );
    }

    #[test]
    fn writes_token_text_and_bytes() {
        let mut s: heapless::String<64> = heapless::String::new();
        json_bytes_str(&mut s, b"a\"\n\xe2\x82").unwrap();
        assert_eq!(s.as_str(), "\"a\\\"\\n\u{FFFD}\"");
        s.clear();
        json_byte_list(&mut s, &[1, 200]).unwrap();
        assert_eq!(s.as_str(), "[1,200]");
    }

    /// Fuzz regression (json_body): a surrogate pair unescapes to one char, and
    /// `escaped_eq` agrees with `unescape` on it.
    #[test]
    fn escaped_eq_reads_surrogate_pairs_as_unescape_does() {
        let s = EscapedStr("Hi \\u00e9\\ud83d\\ude80 \\\"x\\\"");
        let mut store = [0u8; 64];
        let mut buf: &mut [u8] = &mut store;
        let t = unescape(&s, &mut buf).unwrap();
        assert_eq!(t, "Hi \u{e9}\u{1F680} \"x\"");
        assert!(escaped_eq(&s, t));
        assert!(!escaped_eq(&s, "Hi \u{e9}\u{1F680} \"x"));
        assert!(!escaped_eq(&EscapedStr("\\ud83d"), "\u{FFFD}"));
    }
}
