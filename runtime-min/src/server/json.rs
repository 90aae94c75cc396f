//! Request bodies of the generation endpoints, deserialized with `serde-json-core`
//! straight from the request buffer (strings stay borrowed and escaped until copied
//! into the arena by [`unescape`]), and the checks that turn bad values into 400s.
//!
//! `serde-json-core` cannot deserialize "either a string or a list" (it has no
//! `deserialize_any`), so `stop` is tried as a list first and then as a single string.
//! `prompt` and message `content` must be strings.
use core::fmt::Write;

use serde::Deserialize;
use serde_json_core::str::{EscapedStr, EscapedStringFragment};

/// Most messages in one chat request.
pub const MAX_MESSAGES: usize = 64;
/// Most stop strings, and the longest one in bytes.
pub const MAX_STOP: usize = 4;
pub const MAX_STOP_LEN: usize = 64;
/// Most alternatives reported per token (OpenAI allows 20).
pub const MAX_TOP: usize = 20;

/// One chat message.
#[derive(Deserialize, Debug)]
pub struct Message<'a> {
    #[serde(borrow)]
    pub role: EscapedStr<'a>,
    #[serde(borrow, default)]
    pub content: Option<EscapedStr<'a>>,
}

/// The fields of all three generation APIs (each ignores what it does not use).
/// `S`: the shape of `stop`; `L`: the type of `logprobs` (a flag for chat, a count for
/// legacy completions).
#[derive(Deserialize, Debug)]
pub struct Body<'a, S, L> {
    #[serde(borrow, default)]
    pub model: Option<EscapedStr<'a>>,
    #[serde(borrow, default)]
    pub messages: Option<heapless::Vec<Message<'a>, MAX_MESSAGES>>,
    #[serde(borrow, default)]
    pub prompt: Option<EscapedStr<'a>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// llama-server: -1 means "until the context is full".
    #[serde(default)]
    pub n_predict: Option<i32>,
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
    pub seed: Option<u64>,
    // No `default` on fields of a generic type: it would demand `L: Default`; a missing
    // `Option` field is `None` anyway.
    pub logprobs: Option<L>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub n_probs: Option<u32>,
    pub stop: Option<S>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// llama-server: reuse the cached prefix of the previous request (default true).
    #[serde(default)]
    pub cache_prompt: Option<bool>,
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
}

/// A request body, whatever the shape of its `stop`.
pub struct Parsed<'a> {
    pub model: Option<EscapedStr<'a>>,
    pub messages: heapless::Vec<Message<'a>, MAX_MESSAGES>,
    pub prompt: Option<EscapedStr<'a>>,
    pub stop: StopList<'a>,
    pub p: Params,
}

/// The settings of one generation, checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    pub stream: bool,
    /// Tokens to generate at most (`None`: until the context is full).
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub seed: Option<u64>,
    /// Report the chosen token's log-probability.
    pub logprobs: bool,
    /// Alternatives per token to report.
    pub top: usize,
    pub ignore_eos: Option<bool>,
    pub cache_prompt: bool,
}

/// Why a body was refused (always a 400).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BodyError {
    Json(serde_json_core::de::Error),
    Missing(&'static str),
    Range(&'static str),
    StopTooLong,
    BadEscape,
}

impl core::fmt::Display for BodyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BodyError::Json(e) => {
                write!(f, "invalid JSON body (or a field of the wrong type): {e}")
            }
            BodyError::Missing(what) => write!(f, "'{what}' is required"),
            BodyError::Range(what) => write!(f, "'{what}' is out of range"),
            BodyError::StopTooLong => write!(
                f,
                "at most {MAX_STOP} stop strings of at most {MAX_STOP_LEN} bytes"
            ),
            BodyError::BadEscape => write!(f, "invalid escape sequence in a string"),
        }
    }
}

trait LogprobsField: Copy {
    /// (report the chosen token, alternatives requested by this field).
    fn get(self) -> (bool, u32);
}
impl LogprobsField for bool {
    fn get(self) -> (bool, u32) {
        (self, 0)
    }
}
impl LogprobsField for u32 {
    fn get(self) -> (bool, u32) {
        (true, self)
    }
}

fn from_body<'a, S: Deserialize<'a>, L: Deserialize<'a>>(
    body: &'a [u8],
) -> Result<Body<'a, S, L>, serde_json_core::de::Error> {
    serde_json_core::from_slice::<Body<'a, S, L>>(body).map(|(b, _)| b)
}

fn parse_as<'a, L: Deserialize<'a> + LogprobsField>(
    api: Api,
    body: &'a [u8],
) -> Result<Parsed<'a>, BodyError> {
    match from_body::<StopList<'a>, L>(body) {
        Ok(b) => {
            let stop = b.stop.clone().unwrap_or_default();
            check(api, b, stop)
        }
        Err(serde_json_core::de::Error::InvalidType) => {
            let b = from_body::<EscapedStr<'a>, L>(body).map_err(BodyError::Json)?;
            let mut stop = StopList::new();
            if let Some(s) = b.stop {
                let _ = stop.push(s);
            }
            check(api, b, stop)
        }
        Err(e) => Err(BodyError::Json(e)),
    }
}

fn check<'a, S, L: LogprobsField>(
    api: Api,
    b: Body<'a, S, L>,
    stop: StopList<'a>,
) -> Result<Parsed<'a>, BodyError> {
    for s in stop.iter() {
        if s.0.is_empty() || s.0.len() > MAX_STOP_LEN {
            return Err(BodyError::StopTooLong);
        }
    }
    let (logprobs, mut top) = b.logprobs.map_or((false, 0), L::get);
    top = top
        .max(b.top_logprobs.unwrap_or(0))
        .max(b.n_probs.unwrap_or(0));
    if top as usize > MAX_TOP {
        return Err(BodyError::Range("top_logprobs"));
    }
    let max_tokens = match (b.max_tokens.or(b.max_completion_tokens), b.n_predict) {
        (Some(n), _) => Some(n),
        (None, Some(n)) if n < 0 => None,
        (None, Some(n)) => Some(n as u32),
        (None, None) => None,
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
    let messages = b.messages.unwrap_or_default();
    match api {
        Api::Chat if messages.is_empty() => return Err(BodyError::Missing("messages")),
        Api::Completions | Api::Llama if b.prompt.is_none() => {
            return Err(BodyError::Missing("prompt"))
        }
        _ => {}
    }
    Ok(Parsed {
        model: b.model,
        messages,
        prompt: b.prompt,
        stop,
        p: Params {
            stream: b.stream.unwrap_or(false),
            max_tokens,
            temperature: b.temperature,
            top_p: b.top_p,
            top_k: b.top_k,
            min_p: b.min_p,
            repeat_penalty: b.repeat_penalty,
            seed: b.seed,
            logprobs: logprobs || top > 0,
            top: top as usize,
            ignore_eos: b.ignore_eos,
            cache_prompt: b.cache_prompt.unwrap_or(true),
        },
    })
}

/// Parse and check the body of a generation request.
///
/// # Errors
/// A [`BodyError`] naming the field at fault (answered with 400).
pub fn parse(api: Api, body: &[u8]) -> Result<Parsed<'_>, BodyError> {
    match api {
        Api::Chat => parse_as::<bool>(api, body),
        Api::Completions | Api::Llama => parse_as::<u32>(api, body),
    }
}

/// Copy the unescaped text of `s` to the front of `*buf` and advance `*buf` past it.
///
/// # Errors
/// `BadEscape` for an invalid escape, `Range` when `buf` is too small.
pub fn unescape<'b>(s: &EscapedStr<'_>, buf: &mut &'b mut [u8]) -> Result<&'b str, BodyError> {
    let mut n = 0usize;
    {
        let out: &mut [u8] = buf;
        for frag in s.fragments() {
            let mut tmp = [0u8; 4];
            let bytes = match frag.map_err(|_| BodyError::BadEscape)? {
                EscapedStringFragment::NotEscaped(t) => t.as_bytes(),
                EscapedStringFragment::Escaped(c) => c.encode_utf8(&mut tmp).as_bytes(),
            };
            let end = n + bytes.len();
            if end > out.len() {
                return Err(BodyError::Range("prompt"));
            }
            out[n..end].copy_from_slice(bytes);
            n = end;
        }
    }
    let taken = core::mem::take(buf);
    let (head, tail) = taken.split_at_mut(n);
    *buf = tail;
    // Fragments are `&str`s and chars, so their concatenation is valid UTF-8.
    core::str::from_utf8(head).map_err(|_| BodyError::BadEscape)
}

/// Whether the escaped JSON string `s` equals `want` once unescaped.
pub fn escaped_eq(s: &EscapedStr<'_>, want: &str) -> bool {
    let mut rest = want.as_bytes();
    for frag in s.fragments() {
        let mut tmp = [0u8; 4];
        let bytes = match frag {
            Ok(EscapedStringFragment::NotEscaped(t)) => t.as_bytes(),
            Ok(EscapedStringFragment::Escaped(c)) => c.encode_utf8(&mut tmp).as_bytes(),
            Err(_) => return false,
        };
        match rest.strip_prefix(bytes) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    rest.is_empty()
}

/// Write `bytes` as a JSON string, invalid UTF-8 as U+FFFD.
pub fn json_bytes_str(w: &mut dyn Write, bytes: &[u8]) -> core::fmt::Result {
    w.write_char('"')?;
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
    w.write_char('"')
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
            "stop":["\n\n","END"],"frequency_penalty":0,"tools":[{"a":[1,2,{"b":null}]}]}"#;
        let p = parse(Api::Chat, body).unwrap();
        assert_eq!(p.messages.len(), 2);
        assert_eq!(p.stop.len(), 2);
        assert!(p.p.stream && p.p.logprobs);
        assert_eq!((p.p.max_tokens, p.p.top, p.p.seed), (Some(7), 3, Some(3)));
        let mut store = [0u8; 64];
        let mut buf: &mut [u8] = &mut store;
        let a = unescape(&p.messages[0].content.unwrap(), &mut buf).unwrap();
        let b = unescape(&p.messages[1].content.unwrap(), &mut buf).unwrap();
        assert_eq!(a, "be \"brief\"\n");
        assert_eq!(b, "hi é");
        assert!(escaped_eq(&p.model.unwrap(), "m"));
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
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-5}",
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
    }

    #[test]
    fn unescape_reports_a_full_buffer() {
        let p = parse(Api::Llama, br#"{"prompt":"abcdef"}"#).unwrap();
        let mut store = [0u8; 3];
        let mut buf: &mut [u8] = &mut store;
        assert_eq!(
            unescape(&p.prompt.unwrap(), &mut buf),
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
}
