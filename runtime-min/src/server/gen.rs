//! The parts of one request of the generation endpoints: the body becomes one or more
//! prompts (chat template, plain text, token ids, a list of prompts,
//! fill-in-the-middle), each prompt is answered `n` times (by `super::answer`, through
//! the shared driver [`crate::generate`]), stop strings are held back until they
//! cannot match, and the result goes out as server-sent events or one JSON body in the
//! shape of the API that was called (OpenAI chat or completions, llama-server's
//! `/completion` and `/infill`).
//!
//! Log-probabilities are those of the model's distribution (softmax of the raw logits,
//! temperature 1), as OpenAI and llama-server report them, whatever the sampling
//! settings.
//!
//! # Limits
//! A non-streamed answer is kept in [`Lane::out`]: when the next token's text does not
//! fit, the generation ends there with `finish_reason: "length"` (never a silent cut).
//! All prompts of one request share [`Lane::tokens`] (one context's worth); at most
//! [`MAX_RESULTS`] answers (prompts × `n`) per request, streamed requests one.
use core::fmt::Write;

use super::http;
use super::jraw::{Kind, Val};
use super::json::ToolChoice;
use super::json::{
    self, json_byte_list, json_bytes_str, json_f32, Api, Content, Params, MAX_STOP, MAX_STOP_LEN,
    MAX_TOP,
};
use super::{msg, tools, Io};
use crate::chat::{ChatMessage, Content as MsgContent, Template};
use crate::commands::out::json_str;
use crate::commands::run::SliceWriter;
use crate::commands::Ctx;
use crate::generate;
use crate::guard::GuardStop;
use crate::platform::Platform;
use crate::sampler::{top_n, Candidate, Sampler};
use crate::tokenizer::{Tokenizer, TokenizerError, Utf8Stream};
use serde_json_core::str::EscapedStr;

/// Buffers of the generation side that one request uses only while it is being
/// prepared or answered at once (shared by all generation slots), carved once from the
/// arena.
pub struct Bufs<'a> {
    pub scratch: &'a mut [u8],
    /// Longest prompt text accepted (the tokenizer scratch is sized for it).
    pub prompt_limit: usize,
    /// Constrained output (`grammar`, `json_schema`, `response_format`): what all
    /// slots share (the slot's own part is [`Lane::grammar`]).
    pub grammar: super::constrain::GrammarBufs<'a>,
}

/// Buffers one running request keeps until its answer is sent (one per generation
/// slot, `--parallel`), carved once from the arena.
#[derive(Default)]
pub struct Lane<'a> {
    /// Unescaped strings (first half) and the rendered prompt (second half).
    pub text: &'a mut [u8],
    pub tokens: &'a mut [u32],
    /// Generated text of a non-streamed response.
    pub out: &'a mut [u8],
    /// Per generated token: the chosen id and its alternatives ([`MAX_TOP`] + 1 each).
    pub rec_id: &'a mut [u32],
    pub rec_lp: &'a mut [f32],
    /// Logits after `logit_bias`: one vocabulary's worth.
    pub logits: &'a mut [f32],
    /// The request's grammar and its matcher's buffers (a constrained answer runs in
    /// a batch with the others, on its own state).
    pub grammar: super::constrain::SlotGrammar<'a>,
}

/// What one sequence of the session holds: the tokens whose keys and values are in its
/// cache, positions `0..n_cached` (`n_ctx` long). A request that starts with the same
/// tokens (the next turn of a chat, a retry) only evaluates the rest, as llama-server's
/// `cache_prompt`.
#[derive(Default)]
pub struct SeqCache<'a> {
    /// The session's sequence.
    pub seq: usize,
    pub cache: &'a mut [u32],
    pub n_cached: usize,
}

impl SeqCache<'_> {
    /// Tokens of `prompt` this sequence's cache already holds.
    pub fn common_prefix(&self, prompt: &[u32]) -> usize {
        self.cache[..self.n_cached]
            .iter()
            .zip(prompt)
            .take_while(|(x, y)| x == y)
            .count()
    }
}

/// Bytes of text per context token the server accepts in a prompt (English averages
/// about 4; the limit only keeps the tokenizer scratch bounded).
pub const PROMPT_BYTES_PER_TOKEN: usize = 12;
/// Most answers in one response (prompts × `n`).
pub const MAX_RESULTS: usize = 8;

/// The prompt text limit for a context of `n_ctx` tokens.
pub fn prompt_limit(n_ctx: usize) -> usize {
    (n_ctx * PROMPT_BYTES_PER_TOKEN).clamp(8 << 10, super::MAX_BODY)
}

/// The build string clients see as `system_fingerprint` (llama-server's starts with
/// `b` and the build number).
pub const FINGERPRINT: &str = concat!("b", env!("CARGO_PKG_VERSION"), "-pinch");

/// A request turned into token sequences and settings.
pub(super) struct Prepared {
    /// Ranges of `Bufs::tokens`, one per prompt.
    pub(super) prompts: heapless::Vec<(usize, usize), MAX_RESULTS>,
    pub(super) p: Params,
    pub(super) stops: heapless::Vec<heapless::Vec<u8, MAX_STOP_LEN>, MAX_STOP>,
    pub(super) bias: heapless::Vec<(u32, f32), { generate::MAX_BIAS }>,
    /// The rendered chat prompt or the prompt string (range of `Bufs::text`), for
    /// `echo` and `__verbose`.
    pub(super) shown: Option<(usize, usize)>,
    /// The grammar the answers follow (parsed into `Lane::grammar`).
    pub(super) grammar: Option<crate::grammar::parse::Parsed>,
    /// Tool calls in the answer, in this format, become `tool_calls` (chat with `tools`).
    pub(super) tools: Option<tools::Format>,
    /// Index in `stops` of the tool call's opening marker (streamed chat with tools).
    pub(super) tool_stop: Option<usize>,
}

/// Why a request cannot run.
pub(super) enum Refusal {
    /// Status and message (in the caller's buffer).
    Status(u16),
    /// The prompt does not fit the context (llama-server's `exceed_context_size_error`).
    Context { n_prompt: usize },
}

pub(super) type Msg = heapless::String<256>;

/// The server-wide settings a request is prepared with.
#[derive(Clone, Copy)]
pub struct Setup<'t> {
    /// The chat template (`--chat-template`, or the model's: see `Template::select`).
    pub template: Template<'t>,
    pub no_bos: bool,
    /// Every chat answer carries `__verbose` (`-v`).
    pub verbose: bool,
}

/// Tokenize `text` into `out` (BOS as the model wants it when `bos`).
pub(super) fn encode(
    tok: &Tokenizer<'_>,
    text: &str,
    bos: bool,
    scratch: &mut [u8],
    out: &mut [u32],
    n_ctx: usize,
) -> Result<usize, (u16, TokenizerError)> {
    let need = tok.scratch_bytes(text.len());
    let scratch = scratch.get_mut(..need).ok_or((
        400,
        TokenizerError::OutputFull {
            needed: need,
            given: 0,
        },
    ))?;
    match tok.encode(text, bos, true, scratch, out) {
        Ok(n) => Ok(n),
        Err(TokenizerError::OutputFull { .. }) => Ok(n_ctx + 1),
        Err(e) => Err((400, e)),
    }
}

/// Tokens of one prompt element appended at `*at`: a string (with BOS when `bos`), a
/// token id, or (for a list) each of those in turn.
pub(super) struct Enc<'t, 'a> {
    pub(super) tok: &'t Tokenizer<'a>,
    pub(super) n_ctx: usize,
    pub(super) limit: usize,
}

impl Enc<'_, '_> {
    fn text(
        &self,
        text: &str,
        bos: bool,
        at: &mut usize,
        scratch: &mut [u8],
        tokens: &mut [u32],
    ) -> Result<(), Refusal> {
        if text.len() > self.limit {
            return Err(Refusal::Context {
                n_prompt: self.n_ctx + 1,
            });
        }
        let out = tokens.get_mut(*at..).unwrap_or(&mut []);
        let n = encode(self.tok, text, bos, scratch, out, self.n_ctx)
            .map_err(|_| Refusal::Status(400))?;
        if n > out.len() {
            return Err(Refusal::Context { n_prompt: *at + n });
        }
        *at += n;
        Ok(())
    }

    fn id(&self, v: u32, at: &mut usize, tokens: &mut [u32]) -> Result<(), Refusal> {
        if v >= self.tok.n_vocab() {
            return Err(Refusal::Status(400));
        }
        let slot = tokens
            .get_mut(*at)
            .ok_or(Refusal::Context { n_prompt: *at + 1 })?;
        *slot = v;
        *at += 1;
        Ok(())
    }
}

pub(super) fn prepare<P: Platform>(
    ctx: &Ctx<'_, '_, '_, P>,
    setup: Setup<'_>,
    bufs: &mut Bufs<'_>,
    lane: &mut Lane<'_>,
    api: Api,
    body: &[u8],
    why: &mut Msg,
) -> Result<Prepared, Refusal> {
    let mut refuse = |status: u16, d: &dyn core::fmt::Display| -> Refusal {
        *why = msg(d);
        Refusal::Status(status)
    };
    let req = json::parse(api, body).map_err(|e| refuse(e.status(), &e))?;
    let tok = ctx.tok;
    let n_ctx = ctx.sess.opts.n_ctx;
    let bos = !setup.no_bos;
    let enc = Enc {
        tok,
        n_ctx,
        limit: bufs.prompt_limit,
    };
    let base = lane.text.as_ptr() as usize;
    let half = lane.text.len() / 2;
    let (strs, render) = lane.text.split_at_mut(half);
    let mut strs: &mut [u8] = strs;
    let mut prompts: heapless::Vec<(usize, usize), MAX_RESULTS> = heapless::Vec::new();
    let mut shown = None;
    let mut at = 0usize;
    let (scratch, tokens) = (&mut *bufs.scratch, &mut *lane.tokens);
    match api {
        Api::Chat | Api::ApplyTemplate | Api::InputTokens => {
            let fmt = tools::Format::of(&setup.template);
            let mut msgs: heapless::Vec<ChatMessage<'_>, { json::MAX_MESSAGES }> =
                heapless::Vec::new();
            for m in req.messages.iter() {
                let role = json::unescape(&m.role, &mut strs).map_err(|e| refuse(400, &e))?;
                let content: &str = match m.content {
                    Content::None => "",
                    Content::Text(c) => {
                        json::unescape(&c, &mut strs).map_err(|e| refuse(400, &e))?
                    }
                    Content::Parts(v) => {
                        // Text parts joined with blank lines, unescaped one after another.
                        let region: &mut [u8] = core::mem::take(&mut strs);
                        let total = region.len();
                        let used = {
                            let mut cur: &mut [u8] = &mut region[..];
                            for (k, part) in v.items().enumerate() {
                                if k > 0 {
                                    json::unescape(&EscapedStr("\\n\\n"), &mut cur)
                                        .map_err(|e| refuse(400, &e))?;
                                }
                                let t = part
                                    .get("text")
                                    .and_then(|t| t.str())
                                    .unwrap_or(EscapedStr(""));
                                json::unescape(&t, &mut cur).map_err(|e| refuse(400, &e))?;
                            }
                            total - cur.len()
                        };
                        let (joined, rest) = region.split_at_mut(used);
                        strs = rest;
                        core::str::from_utf8(joined).map_err(|_| refuse(400, &"invalid UTF-8"))?
                    }
                };
                // An assistant's earlier tool calls, in the prompt's tool format.
                let content = match m.tool_calls {
                    Some(calls) => {
                        let region: &mut [u8] = core::mem::take(&mut strs);
                        let mut w = SliceWriter {
                            buf: region,
                            len: 0,
                        };
                        if fmt.write_history(&mut w, content, calls).is_err() {
                            return Err(refuse(
                                400,
                                &"the conversation is too long for the request buffer",
                            ));
                        }
                        let (n, region) = (w.len, w.buf);
                        let (joined, rest) = region.split_at_mut(n);
                        strs = rest;
                        core::str::from_utf8(joined).map_err(|_| refuse(400, &"invalid UTF-8"))?
                    }
                    None => content,
                };
                let _ = msgs.push(ChatMessage::new(fmt.tool_role(role), content));
            }
            // Tools: a Jinja template that reads `tools` writes them itself; for the
            // others, Llama 3's format writes the whole prompt (below), Hermes' puts the
            // signatures and the call format in the system message (a new one first
            // when there is none).
            let tools_on = req.tool_choice != ToolChoice::None;
            let own_tools = tools_on && setup.template.takes_tools();
            let llama3_tools = req
                .tools
                .filter(|_| tools_on && !own_tools && fmt == tools::Format::Llama3);
            if let (Some(list), true) = (
                req.tools,
                tools_on && !own_tools && fmt == tools::Format::Hermes,
            ) {
                let region: &mut [u8] = core::mem::take(&mut strs);
                let mut w = SliceWriter {
                    buf: region,
                    len: 0,
                };
                let sys = msgs
                    .first()
                    .filter(|m| m.role == "system")
                    .map(|m| m.content);
                let ok = match sys {
                    Some(MsgContent::Text(t)) if !t.is_empty() => write!(w, "{t}\n\n").is_ok(),
                    _ => true,
                } && tools::system_text(&mut w, list).is_ok();
                if !ok {
                    return Err(refuse(400, &"the tools do not fit the request buffer"));
                }
                let (n, region) = (w.len, w.buf);
                let (text, rest) = region.split_at_mut(n);
                strs = rest;
                let text = core::str::from_utf8(text).map_err(|_| refuse(400, &"invalid UTF-8"))?;
                let m = ChatMessage::new("system", text);
                match sys {
                    Some(_) => msgs[0] = m,
                    None => {
                        if msgs.insert(0, m).is_err() {
                            return Err(refuse(400, &json::BodyError::Range("messages")));
                        }
                    }
                }
            }
            let mut w = SliceWriter {
                buf: render,
                len: 0,
            };
            // A conversation that ends with the assistant's message continues it
            // (llama-server's prefill, vLLM's `continue_final_message`): the turns before
            // it with the assistant's opening, then its text, not closed.
            let prefill = msgs.len() > 1 && msgs.last().is_some_and(|m| m.role == "assistant");
            let (turns, tail) = match prefill {
                true => (
                    &msgs[..msgs.len() - 1],
                    match msgs.last().map(|m| m.content) {
                        Some(MsgContent::Text(t)) => t,
                        _ => "",
                    },
                ),
                false => (&msgs[..], ""),
            };
            let gen_prompt = req.p.add_generation_prompt || prefill;
            let tools_json = req
                .tools
                .filter(|_| own_tools)
                .and_then(|v| core::str::from_utf8(v.0).ok());
            let rendered = match llama3_tools {
                Some(list) => match tools::llama3_prompt(&mut w, turns, list, gen_prompt) {
                    Ok(()) => Ok(w.len),
                    Err(tools::PromptError::Write) => Err(crate::chat::ChatError::Write),
                    Err(tools::PromptError::NoUserMessage) => {
                        return Err(refuse(
                            400,
                            &"Llama 3's tool format puts the tools in the first message after the system one: the conversation has none",
                        ))
                    }
                },
                None => setup
                    .template
                    .render_with_tools(turns, gen_prompt, tools_json, &mut w.buf[..]),
            };
            let ok = match rendered {
                Ok(n) => {
                    w.len = n;
                    true
                }
                Err(crate::chat::ChatError::Write) => false,
                Err(e) => return Err(refuse(400, &e)),
            } && w.write_str(tail).is_ok();
            if !ok {
                return Err(refuse(
                    400,
                    &"the conversation is too long for the request buffer",
                ));
            }
            let n = w.len;
            let text =
                core::str::from_utf8(&w.buf[..n]).map_err(|_| refuse(400, &"invalid UTF-8"))?;
            // A template that writes BOS itself: the tokenizer adds it (llama.cpp strips
            // the template's).
            let text = match bos && tok.adds_bos() {
                true => setup.template.strip_bos(text),
                false => text,
            };
            shown = Some((text.as_ptr() as usize - base, text.len()));
            enc.text(text, bos, &mut at, scratch, tokens)?;
            let _ = prompts.push((0, at));
        }
        Api::Infill => {
            let (pre, suf, _extra) = req.infill.unwrap_or((Val(b"\"\""), Val(b"\"\""), None));
            let find = |names: [&[u8]; 3]| names.iter().find_map(|n| tok.token_id(n));
            let ids = [
                find([b"<|fim_prefix|>", b"<fim_prefix>", b"<PRE>"]),
                find([b"<|fim_suffix|>", b"<fim_suffix>", b"<SUF>"]),
                find([b"<|fim_middle|>", b"<fim_middle>", b"<MID>"]),
            ];
            let [Some(fp), Some(fs), Some(fm)] = ids else {
                return Err(refuse(
                    501,
                    &"this model has no fill-in-the-middle tokens (prefix, suffix, middle): /infill needs a code model",
                ));
            };
            // [BOS] <prefix> prefix <suffix> suffix <middle> prompt
            if bos {
                if let Some(b) = tok.bos().filter(|_| tok.adds_bos()) {
                    enc.id(b, &mut at, tokens)?;
                }
            }
            let mid = req.prompt.unwrap_or(Val(b"\"\""));
            for (id, v) in [(fp, pre), (fs, suf), (fm, mid)] {
                enc.id(id, &mut at, tokens)?;
                let t = json::unescape(&v.str().unwrap_or(EscapedStr("")), &mut strs)
                    .map_err(|e| refuse(400, &e))?;
                if !t.is_empty() {
                    enc.text(t, false, &mut at, scratch, tokens)?;
                }
            }
            let _ = prompts.push((0, at));
        }
        Api::Completions | Api::Llama | Api::Tokenize | Api::Detokenize => {
            let v = req
                .prompt
                .ok_or_else(|| refuse(400, &json::BodyError::Missing("prompt")))?;
            // One prompt: a string, an object with `prompt_string`, or a list mixing
            // token ids and strings. Several: a list of those (without numbers).
            let mixed = v.kind() == Kind::Arr && v.items().any(|x| x.kind() == Kind::Num);
            let single = v.kind() != Kind::Arr || mixed;
            let mut one = |v: Val<'_>,
                           at: &mut usize,
                           strs: &mut &mut [u8],
                           shown: &mut Option<(usize, usize)>|
             -> Result<(), Refusal> {
                let start = *at;
                let mut elems: heapless::Vec<Val<'_>, 1> = heapless::Vec::new();
                let list = match v.kind() {
                    Kind::Arr => v,
                    _ => {
                        let _ = elems.push(v);
                        Val(b"")
                    }
                };
                let mut first = true;
                for e in elems.iter().copied().chain(list.items()) {
                    let e = match e.kind() {
                        Kind::Obj => {
                            if e.get("multimodal_data").is_some() {
                                return Err(Refusal::Status(400));
                            }
                            e.get("prompt_string").ok_or(Refusal::Status(400))?
                        }
                        _ => e,
                    };
                    match e.kind() {
                        Kind::Num => enc.id(e.u32().ok_or(Refusal::Status(400))?, at, tokens)?,
                        Kind::Str => {
                            let s = e.str().ok_or(Refusal::Status(400))?;
                            let t = json::unescape(&s, strs).map_err(|_| Refusal::Status(400))?;
                            if shown.is_none() {
                                *shown = Some((t.as_ptr() as usize - base, t.len()));
                            }
                            let bos_here = bos && first && *at == start;
                            enc.text(t, bos_here, at, scratch, tokens)?;
                        }
                        _ => return Err(Refusal::Status(400)),
                    }
                    first = false;
                }
                Ok(())
            };
            if single {
                one(v, &mut at, &mut strs, &mut shown)?;
                let _ = prompts.push((0, at));
            } else {
                for e in v.items() {
                    let start = at;
                    one(e, &mut at, &mut strs, &mut shown)?;
                    prompts
                        .push((start, at))
                        .map_err(|_| Refusal::Status(400))?;
                }
            }
        }
    }
    if prompts.is_empty() || prompts.iter().any(|&(a, b)| a == b) {
        return Err(refuse(400, &"the prompt is empty"));
    }
    for &(a, b) in prompts.iter() {
        if b - a >= n_ctx {
            return Err(Refusal::Context { n_prompt: b - a });
        }
    }
    let p = req.p;
    if p.stream && prompts.len() * p.n > 1 {
        return Err(refuse(
            400,
            &"streaming several answers (a list of prompts, or n > 1) is not supported",
        ));
    }
    if prompts.len() * p.n > MAX_RESULTS {
        return Err(refuse(
            400,
            &format_args!("at most {MAX_RESULTS} answers (prompts x n) per request"),
        ));
    }
    let mut stops = heapless::Vec::new();
    for s in req.stop.iter() {
        let mut store = [0u8; MAX_STOP_LEN];
        let mut b: &mut [u8] = &mut store;
        let t =
            json::unescape(s, &mut b).map_err(|_| refuse(400, &json::BodyError::StopTooLong))?;
        let _ = stops.push(heapless::Vec::from_slice(t.as_bytes()).unwrap_or_default());
    }
    let tools_on = api == Api::Chat && req.tools.is_some() && req.tool_choice != ToolChoice::None;
    let fmt = tools::Format::of(&setup.template);
    let mut tool_stop = None;
    if tools_on && p.stream && stops.len() < MAX_STOP {
        tool_stop = Some(stops.len());
        let _ = stops.push(heapless::Vec::from_slice(fmt.open().as_bytes()).unwrap_or_default());
    }
    if api == Api::Chat && stops.len() < MAX_STOP {
        let eot = setup.template.end_of_turn().as_bytes();
        let _ = stops.push(heapless::Vec::from_slice(eot).unwrap_or_default());
    }
    // `tool_choice: required` (or a function) without another constraint: a grammar
    // for one call.
    let tool_call = match (req.tools, req.tool_choice) {
        (Some(list), ToolChoice::Required | ToolChoice::Named(_))
            if req.constraint == json::Constraint::None =>
        {
            Some((list, req.tool_choice, fmt))
        }
        _ => None,
    };
    let grammar = bufs
        .grammar
        .prepare(&mut lane.grammar, req.constraint, tool_call, &mut strs)
        .map_err(|e| refuse(400, &e))?;
    let mut bias = heapless::Vec::new();
    if let Some(v) = req.logit_bias {
        let mut add = |key: Val<'_>,
                       b: Val<'_>,
                       strs: &mut [u8],
                       scratch: &mut [u8]|
         -> Result<(), Refusal> {
            let bias_v = match b.kind() {
                Kind::Bool if b.bool() == Some(false) => f32::NEG_INFINITY,
                Kind::Num => b.num().unwrap_or(0.0) as f32,
                _ => return Err(Refusal::Status(400)),
            };
            let mut ids = [0u32; 64];
            let n = match key.kind() {
                Kind::Num => {
                    ids[0] = key.u32().ok_or(Refusal::Status(400))?;
                    1
                }
                Kind::Str => {
                    // A text key: each of its tokens (object keys may also be ids).
                    let mut buf: &mut [u8] = &mut strs[..];
                    let t = json::unescape(&key.str().ok_or(Refusal::Status(400))?, &mut buf)
                        .map_err(|_| Refusal::Status(400))?;
                    match t.parse::<u32>() {
                        Ok(id) => {
                            ids[0] = id;
                            1
                        }
                        Err(_) => encode(tok, t, false, scratch, &mut ids, n_ctx)
                            .map_err(|_| Refusal::Status(400))?
                            .min(ids.len()),
                    }
                }
                _ => return Err(Refusal::Status(400)),
            };
            for &id in &ids[..n] {
                if id < tok.n_vocab() {
                    bias.push((id, bias_v)).map_err(|_| Refusal::Status(400))?;
                }
            }
            Ok(())
        };
        match v.kind() {
            Kind::Obj => {
                for (k, b) in v.members() {
                    add(k, b, strs, scratch)?;
                }
            }
            _ => {
                for pair in v.items() {
                    let mut it = pair.items();
                    let (Some(k), Some(b)) = (it.next(), it.next()) else {
                        return Err(refuse(400, &json::BodyError::Shape("logit_bias")));
                    };
                    add(k, b, strs, scratch)?;
                }
            }
        }
    }
    Ok(Prepared {
        prompts,
        p,
        stops,
        bias,
        shown,
        grammar,
        tools: tools_on.then_some(fmt),
        tool_stop,
    })
}

/// Holds back text that may be the start of a stop string.
pub(super) struct StopMatcher {
    pub(super) held: heapless::Vec<u8, 512>,
}

impl StopMatcher {
    /// Add `s`; `out` gets the text that can no longer be part of a stop string. Returns
    /// the index of the stop string found (the text before it has been given to `out`).
    pub(super) fn push(
        &mut self,
        s: &[u8],
        stops: &[heapless::Vec<u8, MAX_STOP_LEN>],
        out: &mut dyn FnMut(&[u8]),
    ) -> Option<usize> {
        if stops.is_empty() {
            out(s);
            return None;
        }
        if self.held.len() + s.len() > self.held.capacity() {
            out(&self.held);
            self.held.clear();
            if s.len() > self.held.capacity() {
                out(s);
                return None;
            }
        }
        let _ = self.held.extend_from_slice(s);
        let h = &self.held[..];
        let found = stops
            .iter()
            .enumerate()
            .filter_map(|(k, st)| find(h, st).map(|pos| (pos, k)))
            .min();
        if let Some((pos, k)) = found {
            out(&h[..pos]);
            self.held.clear();
            return Some(k);
        }
        // The longest tail of `held` that begins some stop string stays held.
        let mut keep = 0;
        for st in stops {
            for l in (1..st.len().min(h.len() + 1)).rev() {
                if h.ends_with(&st[..l]) {
                    keep = keep.max(l);
                    break;
                }
            }
        }
        let cut = h.len() - keep;
        out(&h[..cut]);
        let rest: heapless::Vec<u8, 512> = heapless::Vec::from_slice(&h[cut..]).unwrap_or_default();
        self.held = rest;
        None
    }
}

pub(super) fn find(h: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > h.len() {
        return None;
    }
    h.windows(needle.len()).position(|w| w == needle)
}

/// A token's probability figures: log-probabilities of the model's distribution, or
/// with `post` (llama-server's `post_sampling_probs`) probabilities of the distribution
/// the sampler drew from.
#[derive(Clone, Copy)]
pub(super) struct TokProbs {
    /// The chosen token's figure.
    pub(super) lp: f32,
    pub(super) n: usize,
    /// The alternatives, best first, each with its figure in `logit`.
    pub(super) top: [Candidate; MAX_TOP],
    pub(super) post: bool,
}

impl TokProbs {
    pub(super) const EMPTY: TokProbs = TokProbs {
        lp: 0.0,
        n: 0,
        top: [Candidate { id: 0, logit: 0.0 }; MAX_TOP],
        post: false,
    };

    /// A figure as a log-probability (for the shapes that only have those).
    fn log(&self, v: f32) -> f32 {
        if self.post {
            libm::logf(v)
        } else {
            v
        }
    }
}

/// `post_sampling_probs`: the probability `sampler` gave `chosen` when it drew it from
/// `used`, and the `k` most likely of what it drew from (tokens of probability 0 are
/// left out, as llama-server does).
pub(super) fn post_probs(sampler: &mut Sampler, used: &[f32], chosen: u32, k: usize) -> TokProbs {
    let mut t = TokProbs::EMPTY;
    t.post = true;
    let (p, n) = sampler.post_probs(used, chosen, &mut t.top[..k.min(MAX_TOP)]);
    t.lp = p;
    t.n = t.top[..n].iter().take_while(|c| c.logit > 0.0).count();
    t
}

/// Log-softmax figures of `chosen` and the `k` most likely tokens.
pub(super) fn probs(logits: &[f32], chosen: u32, k: usize) -> TokProbs {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&l| libm::expf(l - max))
        .sum();
    let lse = max + libm::logf(sum);
    let mut t = TokProbs::EMPTY;
    t.lp = logits
        .get(chosen as usize)
        .map_or(f32::NEG_INFINITY, |l| l - lse);
    t.n = top_n(logits, &mut t.top[..k.min(MAX_TOP)]);
    for c in t.top[..t.n].iter_mut() {
        c.logit -= lse;
    }
    t
}

/// Why one answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Finish {
    Eos,
    Length,
    Word(usize),
}

impl Finish {
    fn openai(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Eos | Finish::Word(_) => "stop",
        }
    }
    fn llama(self) -> &'static str {
        match self {
            Finish::Length => "limit",
            Finish::Eos => "eos",
            Finish::Word(_) => "word",
        }
    }
}

/// Identity shared by every event of one response.
pub(super) struct Resp<'s> {
    pub(super) api: Api,
    pub(super) id: u64,
    pub(super) model: &'s str,
    /// The generation slot (`id_slot`).
    pub(super) slot: usize,
}

impl Resp<'_> {
    pub(super) fn open(&self, w: &mut dyn Write, object: &str) -> core::fmt::Result {
        let prefix = if self.api == Api::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        };
        write!(
            w,
            "{{\"id\":\"{prefix}-{}\",\"object\":\"{object}\",\"created\":0,\"system_fingerprint\":\"{FINGERPRINT}\",\"model\":",
            self.id
        )?;
        json_str(w, self.model)
    }
}

/// One token's log-probability entry (OpenAI chat and llama-server shape).
pub(super) fn entry(
    w: &mut dyn Write,
    tok: &Tokenizer<'_>,
    id: u32,
    t: &TokProbs,
    with_id: bool,
) -> core::fmt::Result {
    let one = |w: &mut dyn Write, id: u32, lp: f32| -> core::fmt::Result {
        w.write_char('{')?;
        if with_id {
            write!(w, "\"id\":{id},")?;
        }
        let b = tok.token_bytes(id);
        w.write_str("\"token\":")?;
        json_bytes_str(w, b)?;
        w.write_str(if t.post {
            ",\"prob\":"
        } else {
            ",\"logprob\":"
        })?;
        json_f32(w, lp)?;
        w.write_str(",\"bytes\":")?;
        json_byte_list(w, b)
    };
    one(w, id, t.lp)?;
    w.write_str(if t.post {
        ",\"top_probs\":["
    } else {
        ",\"top_logprobs\":["
    })?;
    for (k, c) in t.top[..t.n].iter().enumerate() {
        if k > 0 {
            w.write_char(',')?;
        }
        one(w, c.id, c.logit)?;
        w.write_char('}')?;
    }
    w.write_str("]}")
}

/// Figures of one answer.
#[derive(Clone, Copy, Default)]
pub(super) struct Timings {
    /// Prompt tokens (cached + evaluated).
    pub(super) prompt_n: usize,
    /// Prompt tokens reused from the cache (not evaluated).
    pub(super) cached: usize,
    pub(super) prompt_s: f64,
    pub(super) gen_n: usize,
    pub(super) gen_s: f64,
}

impl Timings {
    /// llama-server's `timings`: `prompt_n` counts the evaluated tokens, `cache_n` the
    /// reused ones; the generation rate is over the decode steps after the first token
    /// (which comes from the prompt's last pass).
    fn write(&self, w: &mut dyn Write) -> core::fmt::Result {
        let evaluated = self.prompt_n - self.cached;
        let steps = self.gen_n.saturating_sub(1);
        // Rates from the milliseconds as printed (3 decimals), so that they agree.
        let ms = |s: f64| libm::round(s * 1e6) / 1e3;
        let (pms, gms) = (ms(self.prompt_s), ms(self.gen_s));
        let per_ms = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
        write!(
            w,
            "{{\"cache_n\":{},\"prompt_n\":{evaluated},\"prompt_ms\":{pms:.3},\"prompt_per_token_ms\":{:.3},\"prompt_per_second\":{:.3},\"predicted_n\":{},\"predicted_ms\":{gms:.3},\"predicted_per_token_ms\":{},\"predicted_per_second\":{}}}",
            self.cached,
            per_ms(pms, evaluated),
            generate::per_second(evaluated, self.prompt_s),
            self.gen_n,
            per_ms(gms, steps),
            if gms > 0.0 { 1e3 / gms * steps as f64 } else { 0.0 },
        )
    }
    fn usage(&self, w: &mut dyn Write) -> core::fmt::Result {
        write!(
            w,
            "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":{}}}}}",
            self.prompt_n,
            self.gen_n,
            self.prompt_n + self.gen_n,
            self.cached
        )
    }
    fn add(&mut self, o: &Timings) {
        self.prompt_n += o.prompt_n;
        self.cached += o.cached;
        self.prompt_s += o.prompt_s;
        self.gen_n += o.gen_n;
        self.gen_s += o.gen_s;
    }
}

/// One finished answer of a non-streamed response.
#[derive(Clone, Copy)]
pub(super) struct Res {
    /// Range of `Bufs::out`.
    pub(super) text: (usize, usize),
    /// First record (index into the per-token records) and count.
    pub(super) rec: (usize, usize),
    pub(super) fin: Finish,
    pub(super) tm: Timings,
    pub(super) truncated: bool,
    /// A streamed answer switched to a tool call (its text is in `Bufs::out`).
    pub(super) calling: bool,
    /// The prompt's tokens (range of `Bufs::tokens`).
    pub(super) prompt: (usize, usize),
}

/// The request-level settings echoed back as llama-server's `generation_settings`.
pub(super) struct GenSettings<'r> {
    pub(super) sp: crate::sampler::SamplerParams,
    pub(super) p: &'r Params,
    pub(super) n_predict: i64,
    pub(super) ignore_eos: bool,
    pub(super) eog: &'r [u32],
}

impl GenSettings<'_> {
    fn write(&self, w: &mut dyn Write) -> core::fmt::Result {
        let sp = &self.sp;
        write!(
            w,
            "{{\"n_predict\":{},\"seed\":{},\"temperature\":{},\"top_k\":{},\"top_p\":{},\"min_p\":{},\"repeat_last_n\":{},\"repeat_penalty\":{},\"presence_penalty\":{},\"frequency_penalty\":{},\"n_probs\":{},\"ignore_eos\":{},\"stream\":{},\"post_sampling_probs\":{},",
            self.n_predict, sp.seed, sp.temp, sp.top_k, sp.top_p, sp.min_p, sp.repeat_last_n,
            sp.repeat_penalty, self.p.presence_penalty, self.p.frequency_penalty, self.p.top,
            self.ignore_eos, self.p.stream, self.p.post_sampling
        )?;
        // pinch has no adaptive-p sampler: its settings are reported as off
        // (llama-server's values for a disabled one).
        w.write_str("\"adaptive_target\":-1.0,\"adaptive_decay\":0.9,\"logit_bias\":[")?;
        if self.ignore_eos {
            for (k, id) in self.eog.iter().enumerate() {
                if k > 0 {
                    w.write_char(',')?;
                }
                write!(w, "{{\"bias\":null,\"token\":{id}}}")?;
            }
        }
        w.write_str("]}")
    }
}

/// Append `piece` to the answer in `out[..*len]`; false (nothing appended) when it
/// does not fit whole, so a token's text is never cut.
pub(super) fn keep(out: &mut [u8], len: &mut usize, piece: &[u8]) -> bool {
    let Some(dst) = out.get_mut(*len..*len + piece.len()) else {
        return false;
    };
    dst.copy_from_slice(piece);
    *len += piece.len();
    true
}

/// Stream event for one token with released text `text`.
pub(super) fn token_event(
    w: &mut dyn Write,
    r: &Resp<'_>,
    tok: &Tokenizer<'_>,
    text: &[u8],
    id: u32,
    t: Option<&TokProbs>,
) -> core::fmt::Result {
    w.write_str("data: ")?;
    match r.api {
        Api::Chat => {
            r.open(w, "chat.completion.chunk")?;
            w.write_str(",\"choices\":[{\"index\":0,\"delta\":{\"content\":")?;
            json_bytes_str(w, text)?;
            w.write_str("},\"logprobs\":")?;
            match t {
                Some(t) => {
                    w.write_str("{\"content\":[")?;
                    entry(w, tok, id, t, false)?;
                    w.write_str("]}")?;
                }
                None => w.write_str("null")?,
            }
            w.write_str(",\"finish_reason\":null}]}")?;
        }
        Api::Completions => {
            r.open(w, "text_completion")?;
            w.write_str(",\"choices\":[{\"index\":0,\"text\":")?;
            json_bytes_str(w, text)?;
            w.write_str(",\"logprobs\":")?;
            match t {
                Some(t) => {
                    w.write_str("{\"tokens\":[")?;
                    json_bytes_str(w, tok.token_bytes(id))?;
                    w.write_str("],\"token_logprobs\":[")?;
                    json_f32(w, t.log(t.lp))?;
                    w.write_str("],\"top_logprobs\":[")?;
                    legacy_top(w, tok, t)?;
                    w.write_str("]}")?;
                }
                None => w.write_str("null")?,
            }
            w.write_str(",\"finish_reason\":null}]}")?;
        }
        // llama-server's shape (`/completion`, `/infill`).
        _ => {
            w.write_str("{\"index\":0,\"content\":")?;
            json_bytes_str(w, text)?;
            write!(
                w,
                ",\"tokens\":[{id}],\"stop\":false,\"id_slot\":{}",
                r.slot
            )?;
            if let Some(t) = t {
                w.write_str(",\"completion_probabilities\":[")?;
                entry(w, tok, id, t, true)?;
                w.write_str("]")?;
            }
            w.write_str("}")?;
        }
    }
    w.write_str("\n\n")
}

/// A token's alternatives in the legacy completions shape: `{"text": logprob, ...}`.
pub(super) fn legacy_top(
    w: &mut dyn Write,
    tok: &Tokenizer<'_>,
    t: &TokProbs,
) -> core::fmt::Result {
    w.write_char('{')?;
    for (k, c) in t.top[..t.n].iter().enumerate() {
        if k > 0 {
            w.write_char(',')?;
        }
        json_bytes_str(w, tok.token_bytes(c.id))?;
        w.write_char(':')?;
        json_f32(w, t.log(c.logit))?;
    }
    w.write_char('}')
}

/// Recorded log-probabilities of generated tokens.
#[derive(Clone, Copy)]
pub(super) struct Recs<'r> {
    pub(super) ids: &'r [u32],
    pub(super) lps: &'r [f32],
    /// Alternatives per token (at most; a record's list ends early at [`NO_TOKEN`]).
    pub(super) n_top: usize,
    /// The figures are post-sampling probabilities.
    pub(super) post: bool,
}

/// Marks the end of a record's alternatives.
pub(super) const NO_TOKEN: u32 = u32::MAX;

impl Recs<'_> {
    fn get(&self, j: usize) -> (u32, TokProbs) {
        let stride = MAX_TOP + 1;
        let base = j * stride;
        let mut t = TokProbs::EMPTY;
        if base + stride > self.ids.len() {
            return (0, t);
        }
        t.lp = self.lps[base];
        t.post = self.post;
        t.n = self.ids[base + 1..base + 1 + self.n_top]
            .iter()
            .take_while(|&&id| id != NO_TOKEN)
            .count();
        for k in 0..t.n {
            t.top[k] = Candidate {
                id: self.ids[base + 1 + k],
                logit: self.lps[base + 1 + k],
            };
        }
        (self.ids[base], t)
    }
}

/// What every answer of a response shares.
pub(super) struct Body<'x, 'b> {
    pub(super) r: &'x Resp<'x>,
    pub(super) tok: &'x Tokenizer<'b>,
    pub(super) out: &'x [u8],
    pub(super) recs: Recs<'x>,
    pub(super) res: &'x [Res],
    pub(super) stops: &'x [heapless::Vec<u8, MAX_STOP_LEN>],
    pub(super) gs: &'x GenSettings<'x>,
    /// The rendered or given prompt text (for `echo` and `__verbose`).
    pub(super) shown: &'x [u8],
    pub(super) verbose: bool,
    /// Calls in the text, in this format, become `tool_calls`.
    pub(super) tools: Option<tools::Format>,
    /// `Bufs::tokens`: each answer's prompt, shown as llama-server shows it (the
    /// tokens' text, specials included).
    pub(super) tokens: &'x [u32],
}

impl Body<'_, '_> {
    fn stop_word(&self, fin: Finish) -> &[u8] {
        match fin {
            Finish::Word(k) => self.stops.get(k).map_or(&[][..], |s| &s[..]),
            _ => b"",
        }
    }

    fn total(&self) -> Timings {
        let mut t = Timings::default();
        for r in self.res {
            t.add(&r.tm);
        }
        t
    }

    /// llama-server's object for one answer (`/completion`, `/infill`; the final
    /// stream event without its content when `text` is given separately).
    fn llama_one(&self, w: &mut dyn Write, k: usize, res: &Res, text: &[u8]) -> core::fmt::Result {
        let p = self.gs.p;
        write!(w, "{{\"index\":{k},\"content\":")?;
        json_bytes_str(w, text)?;
        w.write_str(",\"tokens\":[")?;
        if p.return_tokens && !p.stream {
            for j in 0..res.rec.1 {
                if j > 0 {
                    w.write_char(',')?;
                }
                write!(w, "{}", self.recs.get(res.rec.0 + j).0)?;
            }
        }
        write!(w, "],\"id_slot\":{},\"stop\":true,\"model\":", self.r.slot)?;
        json_str(w, self.r.model)?;
        write!(
            w,
            ",\"tokens_predicted\":{},\"tokens_evaluated\":{},\"tokens_cached\":{},\"has_new_line\":{},\"truncated\":{},\"stop_type\":\"{}\",\"stopping_word\":",
            res.tm.gen_n,
            res.tm.prompt_n,
            res.tm.cached,
            text.contains(&b'\n'),
            res.truncated,
            res.fin.llama()
        )?;
        json_bytes_str(w, self.stop_word(res.fin))?;
        w.write_str(",\"prompt\":")?;
        self.prompt(w, res)?;
        w.write_str(",\"generation_settings\":")?;
        self.gs.write(w)?;
        if p.logprobs && !p.stream {
            w.write_str(",\"completion_probabilities\":")?;
            self.entries(w, res, true)?;
        }
        w.write_str(",\"timings\":")?;
        res.tm.write(w)?;
        w.write_char('}')
    }

    /// The log-probability entries of `res`'s tokens, as a JSON list.
    fn entries(&self, w: &mut dyn Write, res: &Res, with_id: bool) -> core::fmt::Result {
        w.write_char('[')?;
        for j in 0..res.rec.1 {
            if j > 0 {
                w.write_char(',')?;
            }
            let (id, t) = self.recs.get(res.rec.0 + j);
            entry(w, self.tok, id, &t, with_id)?;
        }
        w.write_char(']')
    }

    /// The prompt of `res` as its tokens' text, as one JSON string.
    fn prompt(&self, w: &mut dyn Write, res: &Res) -> core::fmt::Result {
        w.write_char('"')?;
        for &id in self.tokens.get(res.prompt.0..res.prompt.1).unwrap_or(&[]) {
            json::json_bytes_inner(w, self.tok.token_to_piece(id, true))?;
        }
        w.write_char('"')
    }

    fn text(&self, res: &Res) -> &[u8] {
        &self.out[res.text.0..res.text.0 + res.text.1]
    }

    /// The whole non-streamed body.
    pub(super) fn write(&self, w: &mut dyn Write) -> core::fmt::Result {
        let p = self.gs.p;
        match self.r.api {
            Api::Chat => self.r.open(w, "chat.completion")?,
            Api::Completions => self.r.open(w, "text_completion")?,
            // llama-server's shape (`/completion`, `/infill`).
            _ => {
                if self.res.len() == 1 {
                    return self.llama_one(w, 0, &self.res[0], self.text(&self.res[0]));
                }
                w.write_char('[')?;
                for (k, res) in self.res.iter().enumerate() {
                    if k > 0 {
                        w.write_char(',')?;
                    }
                    self.llama_one(w, k, res, self.text(res))?;
                }
                return w.write_char(']');
            }
        }
        w.write_str(",\"choices\":[")?;
        for (k, res) in self.res.iter().enumerate() {
            if k > 0 {
                w.write_char(',')?;
            }
            write!(w, "{{\"index\":{k},")?;
            let mut finish = res.fin.openai();
            if self.r.api == Api::Chat {
                w.write_str("\"message\":{\"role\":\"assistant\",\"content\":")?;
                let text = self.text(res);
                match self.tools.and_then(|f| Some((f, f.first_call(text)?))) {
                    Some((fmt, at)) => {
                        let content = text[..at].trim_ascii();
                        match content.is_empty() {
                            true => w.write_str("null")?,
                            false => json_bytes_str(w, content)?,
                        }
                        w.write_str(",\"tool_calls\":")?;
                        fmt.write_calls(w, &text[at..], self.r.id, false)?;
                        finish = "tool_calls";
                    }
                    None => json_bytes_str(w, text)?,
                }
                w.write_str("},\"logprobs\":")?;
                if p.logprobs {
                    w.write_str("{\"content\":")?;
                    self.entries(w, res, false)?;
                    w.write_char('}')?;
                } else {
                    w.write_str("null")?;
                }
            } else {
                w.write_str("\"text\":")?;
                if p.echo {
                    // The prompt, then the answer, as one JSON string.
                    w.write_char('"')?;
                    json::json_bytes_inner(w, self.shown)?;
                    json::json_bytes_inner(w, self.text(res))?;
                    w.write_char('"')?;
                } else {
                    json_bytes_str(w, self.text(res))?;
                }
                w.write_str(",\"logprobs\":")?;
                if p.logprobs {
                    self.legacy_logprobs(w, res)?;
                } else {
                    w.write_str("null")?;
                }
            }
            write!(w, ",\"finish_reason\":\"{finish}\"}}")?;
        }
        w.write_str("],\"usage\":")?;
        let total = self.total();
        total.usage(w)?;
        w.write_str(",\"timings\":")?;
        self.res.first().map_or(total, |r| r.tm).write(w)?;
        if p.verbose || self.verbose {
            w.write_str(",\"__verbose\":{\"prompt\":")?;
            if let Some(first) = self.res.first() {
                self.prompt(w, first)?;
            }
            w.write_char('}')?;
        }
        w.write_char('}')
    }

    fn legacy_logprobs(&self, w: &mut dyn Write, res: &Res) -> core::fmt::Result {
        let tok = self.tok;
        let ids = |j| self.recs.get(res.rec.0 + j);
        w.write_str("{\"tokens\":[")?;
        for j in 0..res.rec.1 {
            if j > 0 {
                w.write_char(',')?;
            }
            json_bytes_str(w, tok.token_bytes(ids(j).0))?;
        }
        w.write_str("],\"token_logprobs\":[")?;
        for j in 0..res.rec.1 {
            if j > 0 {
                w.write_char(',')?;
            }
            let t = ids(j).1;
            json_f32(w, t.log(t.lp))?;
        }
        w.write_str("],\"top_logprobs\":[")?;
        for j in 0..res.rec.1 {
            if j > 0 {
                w.write_char(',')?;
            }
            legacy_top(w, tok, &ids(j).1)?;
        }
        w.write_str("]}")
    }
}

/// The memory guard's error for a stopped generation: the status (503, with
/// `Retry-After`, as memory may come back) and the message, logged on stderr too.
pub(super) fn guard_stopped<P: Platform>(
    p: &P,
    io: &mut Io<'_, '_, '_, P>,
    s: GuardStop,
    tokens: usize,
) -> Msg {
    io.m.guard_stops += 1;
    let mut m = Msg::new();
    let _ = write!(m, "{s} (after {tokens} generated tokens)");
    let mut line: heapless::String<300> = heapless::String::new();
    let _ = writeln!(line, "pinch: generation {}: {m}", io.m.generations);
    p.stderr(line.as_bytes());
    m
}

/// A stream's error event (the page and OpenAI clients read `error.message`).
pub(super) fn error_event(w: &mut dyn Write, api: Api, status: u16, m: &str) -> core::fmt::Result {
    write!(w, "data: {{\"error\":{{\"code\":{status},\"message\":")?;
    json_str(w, m)?;
    w.write_str(",\"type\":\"unavailable_error\"}}\n\n")?;
    if !matches!(api, Api::Llama | Api::Infill) {
        w.write_str("data: [DONE]\n\n")?;
    }
    Ok(())
}

/// The last events of a stream: the held-back text, the finish, usage and timings.
pub(super) fn final_events(
    w: &mut dyn Write,
    b: &Body<'_, '_>,
    res: &Res,
    tail: &[u8],
) -> core::fmt::Result {
    let r = b.r;
    match r.api {
        Api::Chat | Api::Completions => {
            let chat = r.api == Api::Chat;
            let obj = if chat {
                "chat.completion.chunk"
            } else {
                "text_completion"
            };
            if !tail.is_empty() {
                w.write_str("data: ")?;
                r.open(w, obj)?;
                if chat {
                    w.write_str(",\"choices\":[{\"index\":0,\"delta\":{\"content\":")?;
                    json_bytes_str(w, tail)?;
                    w.write_str("},")?;
                } else {
                    w.write_str(",\"choices\":[{\"index\":0,\"text\":")?;
                    json_bytes_str(w, tail)?;
                    w.write_char(',')?;
                }
                w.write_str("\"logprobs\":null,\"finish_reason\":null}]}\n\n")?;
            }
            let mut finish = res.fin.openai();
            let call = &b.out[res.text.0..res.text.0 + res.text.1];
            let fmt = b
                .tools
                .filter(|f| chat && res.calling && f.first_call(call).is_some());
            if let Some(fmt) = fmt {
                // The tool call the answer switched to, as one delta.
                w.write_str("data: ")?;
                r.open(w, obj)?;
                w.write_str(",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":")?;
                fmt.write_calls(w, call, r.id, true)?;
                w.write_str("},\"logprobs\":null,\"finish_reason\":null}]}\n\n")?;
                finish = "tool_calls";
            }
            w.write_str("data: ")?;
            r.open(w, obj)?;
            if chat {
                w.write_str(",\"choices\":[{\"index\":0,\"delta\":{},")?;
            } else {
                w.write_str(",\"choices\":[{\"index\":0,\"text\":\"\",")?;
            }
            write!(w, "\"logprobs\":null,\"finish_reason\":\"{finish}\"}}]")?;
            if chat && !b.gs.p.include_usage {
                return w.write_str("}\n\ndata: [DONE]\n\n");
            }
            if chat {
                // llama-server's last chunk: no choices, the usage and timings.
                w.write_str("}\n\ndata: ")?;
                r.open(w, obj)?;
                w.write_str(",\"choices\":[]")?;
            }
            w.write_str(",\"usage\":")?;
            res.tm.usage(w)?;
            w.write_str(",\"timings\":")?;
            res.tm.write(w)?;
            w.write_str("}\n\ndata: [DONE]\n\n")
        }
        // llama-server's shape (`/completion`, `/infill`).
        _ => {
            w.write_str("data: ")?;
            b.llama_one(w, 0, res, tail)?;
            w.write_str("\n\n")
        }
    }
}

/// `/tokenize` (`content`, `add_special`, `with_pieces`) and `/detokenize` (`tokens`).
#[allow(clippy::too_many_arguments)]
pub(super) fn tokens_endpoint<P: Platform>(
    tok: &Tokenizer<'_>,
    setup: Setup<'_>,
    bufs: &mut Bufs<'_>,
    lane: &mut Lane<'_>,
    api: Api,
    body: &[u8],
    p: &P,
    sock: crate::platform::Socket,
) -> Result<(), &'static str> {
    let r = super::jraw::root(body)
        .filter(|r| r.kind() == Kind::Obj)
        .ok_or("the body must be a JSON object")?;
    if api == Api::Detokenize {
        let list = r
            .get("tokens")
            .filter(|v| v.kind() == Kind::Arr)
            .ok_or("'tokens' must be a list of token ids")?;
        let mut n = 0;
        for v in list.items() {
            let id = v
                .u32()
                .filter(|&id| id < tok.n_vocab())
                .ok_or("'tokens' holds a value that is not a token id of this model")?;
            let slot = lane.tokens.get_mut(n).ok_or("too many tokens")?;
            *slot = id;
            n += 1;
        }
        let ids = &lane.tokens[..n];
        // Bytes of consecutive tokens joined before UTF-8 is checked (a character may
        // span byte tokens); the space SentencePiece puts before the text is dropped.
        let strip = tok.adds_space_prefix();
        http::respond(p, sock, 200, "application/json", "", &|w| {
            w.write_str("{\"content\":\"")?;
            let mut utf8 = Utf8Stream::new();
            let mut first = strip;
            let mut out = |s: &str| -> Result<(), ()> {
                let s = match first {
                    true => s.strip_prefix(' ').unwrap_or(s),
                    false => s,
                };
                first &= s.is_empty();
                json::json_bytes_inner(w, s.as_bytes()).map_err(|_| ())
            };
            for &id in ids {
                utf8.push(tok.token_bytes(id), &mut out)
                    .map_err(|_| core::fmt::Error)?;
            }
            utf8.finish(&mut out).map_err(|_| core::fmt::Error)?;
            w.write_str("\"}")
        });
        return Ok(());
    }
    let content = r
        .get("content")
        .and_then(|v| v.str())
        .ok_or("'content' must be a string")?;
    let add_special = r.get("add_special").and_then(|v| v.bool()).unwrap_or(false);
    let pieces = r.get("with_pieces").and_then(|v| v.bool()).unwrap_or(false);
    let mut strs: &mut [u8] = &mut lane.text[..];
    let text = json::unescape(&content, &mut strs).map_err(|_| "'content' has a bad escape")?;
    if text.len() > bufs.prompt_limit {
        return Err("'content' is longer than this server tokenizes");
    }
    let n = encode(
        tok,
        text,
        add_special && !setup.no_bos,
        bufs.scratch,
        lane.tokens,
        lane.tokens.len(),
    )
    .map_err(|_| "'content' cannot be tokenized")?
    .min(lane.tokens.len());
    let ids = &lane.tokens[..n];
    http::respond(p, sock, 200, "application/json", "", &|w| {
        w.write_str("{\"tokens\":[")?;
        for (k, &id) in ids.iter().enumerate() {
            if k > 0 {
                w.write_char(',')?;
            }
            if pieces {
                write!(w, "{{\"id\":{id},\"piece\":")?;
                json_bytes_str(w, tok.token_bytes(id))?;
                w.write_char('}')?;
            } else {
                write!(w, "{id}")?;
            }
        }
        w.write_str("]}")
    });
    Ok(())
}

/// The members of `obj` named in `fields` (a list of names; `a/b` is member `b` of
/// member `a`, written as `"a/b"`), in the order given; missing ones are left out.
pub(super) fn project(w: &mut dyn Write, obj: Val<'_>, fields: Val<'_>) -> core::fmt::Result {
    w.write_char('{')?;
    let mut first = true;
    for f in fields.items() {
        let Some(name) = f.str() else { continue };
        let mut v = Some(obj);
        for part in name.0.split('/') {
            v = v.and_then(|x| x.get(part));
        }
        let Some(v) = v else { continue };
        if !first {
            w.write_char(',')?;
        }
        first = false;
        json_str(w, name.0)?;
        w.write_char(':')?;
        w.write_str(core::str::from_utf8(v.0).unwrap_or("null"))?;
    }
    w.write_char('}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(list: &[&str]) -> heapless::Vec<heapless::Vec<u8, MAX_STOP_LEN>, MAX_STOP> {
        list.iter()
            .map(|s| heapless::Vec::from_slice(s.as_bytes()).unwrap())
            .collect()
    }

    fn run(pieces: &[&str], st: &[&str]) -> (heapless::String<256>, Option<usize>) {
        let st = stops(st);
        let mut m = StopMatcher {
            held: heapless::Vec::new(),
        };
        let mut out: heapless::String<256> = heapless::String::new();
        for p in pieces {
            let hit = m.push(p.as_bytes(), &st, &mut |b| {
                out.push_str(core::str::from_utf8(b).unwrap()).unwrap()
            });
            if hit.is_some() {
                return (out, hit);
            }
        }
        out.push_str(core::str::from_utf8(&m.held).unwrap())
            .unwrap();
        (out, None)
    }

    #[test]
    fn stop_string_split_across_tokens_is_cut_and_not_shown() {
        assert_eq!(
            run(&["Hello", " EN", "D and more"], &["END"]),
            ("Hello ".try_into().unwrap(), Some(0))
        );
        assert_eq!(
            run(&["a", "b", "c"], &["bd", "zz"]),
            ("abc".try_into().unwrap(), None)
        );
        assert_eq!(run(&["xyz"], &[]), ("xyz".try_into().unwrap(), None));
        // The earliest of several matches wins.
        assert_eq!(
            run(&["one two three"], &["three", "two"]),
            ("one ".try_into().unwrap(), Some(1))
        );
    }

    #[test]
    fn log_probabilities_sum_to_one_and_rank_best_first() {
        let logits = [1.0f32, 3.0, 2.0, -1.0];
        let t = probs(&logits, 2, 3);
        let sum: f32 = (0..4).map(|i| libm::expf(probs(&logits, i, 0).lp)).sum();
        assert!((sum - 1.0).abs() < 1e-5, "{sum}");
        assert_eq!(t.n, 3);
        assert_eq!([t.top[0].id, t.top[1].id, t.top[2].id], [1, 2, 0]);
        assert!((t.lp - t.top[1].logit).abs() < 1e-6);
        assert!(t.top[0].logit > t.top[1].logit && t.top[1].logit > t.top[2].logit);
    }

    #[test]
    fn a_full_answer_buffer_takes_no_part_of_a_token() {
        let mut out = [0u8; 8];
        let mut len = 0;
        assert!(keep(&mut out, &mut len, b"hello"));
        assert!(
            !keep(&mut out, &mut len, b" world"),
            "6 bytes do not fit in 3"
        );
        assert_eq!((len, &out[..len]), (5, &b"hello"[..]));
        assert!(keep(&mut out, &mut len, b"!!!"));
        assert!(!keep(&mut out, &mut len, b"x"));
        assert!(keep(&mut out, &mut len, b""));
        assert_eq!(&out, b"hello!!!");
    }

    #[test]
    fn timings_rate_is_over_the_decode_steps_and_usage_counts_the_cache() {
        let t = Timings {
            prompt_n: 10,
            cached: 4,
            prompt_s: 0.5,
            gen_n: 5,
            gen_s: 2.0,
        };
        let mut s: heapless::String<512> = heapless::String::new();
        t.write(&mut s).unwrap();
        assert!(s.contains("\"cache_n\":4,\"prompt_n\":6,"), "{s}");
        assert!(
            s.ends_with("\"predicted_per_second\":2}"),
            "4 steps in 2 s: {s}"
        );
        assert!(s.contains("\"predicted_per_token_ms\":500"), "{s}");
        let one = Timings { gen_n: 1, ..t };
        s.clear();
        one.write(&mut s).unwrap();
        assert!(s.contains("\"predicted_per_second\":0}"), "{s}");
        s.clear();
        t.usage(&mut s).unwrap();
        assert!(
            s.contains("\"prompt_tokens_details\":{\"cached_tokens\":4}"),
            "{s}"
        );
    }

    #[test]
    fn response_fields_pick_and_unnest() {
        let obj = super::super::jraw::root(
            br#"{"content":"x","generation_settings":{"n_predict":3},"a":1}"#,
        )
        .unwrap();
        let f =
            super::super::jraw::root(br#"["content","generation_settings/n_predict","missing"]"#)
                .unwrap();
        let mut s: heapless::String<128> = heapless::String::new();
        project(&mut s, obj, f).unwrap();
        assert_eq!(
            s.as_str(),
            r#"{"content":"x","generation_settings/n_predict":3}"#
        );
    }
}
