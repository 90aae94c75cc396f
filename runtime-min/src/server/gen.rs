//! One request of the generation endpoints: the body becomes one or more prompts
//! (chat template, plain text, token ids, a list of prompts, fill-in-the-middle), each
//! prompt is answered `n` times by the shared driver ([`crate::generate`]) with the
//! server loop polled between weight passes, stop strings are held back until they
//! cannot match, and the result goes out as server-sent events or one JSON body in the
//! shape of the API that was called (OpenAI chat or completions, llama-server's
//! `/completion` and `/infill`).
//!
//! Log-probabilities are those of the model's distribution (softmax of the raw logits,
//! temperature 1), as OpenAI and llama-server report them, whatever the sampling
//! settings.
//!
//! # Limits
//! A non-streamed answer is kept in [`Bufs::out`]: when the next token's text does not
//! fit, the generation ends there with `finish_reason: "length"` (never a silent cut).
//! All prompts of one request share [`Bufs::tokens`] (one context's worth); at most
//! [`MAX_RESULTS`] answers (prompts × `n`) per request, streamed requests one.
use core::fmt::Write;

use super::http::{self, SockWriter};
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
use crate::generate::{self, Adjust, Constrain, End, Settings, Sink};
use crate::guard::{GuardStop, MemoryGuard};
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
    /// Constrained output (`grammar`, `json_schema`, `response_format`).
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
    /// Adjusted logits (`logit_bias`, penalties): one vocabulary's worth.
    pub logits: &'a mut [f32],
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
struct Prepared {
    /// Ranges of `Bufs::tokens`, one per prompt.
    prompts: heapless::Vec<(usize, usize), MAX_RESULTS>,
    p: Params,
    stops: heapless::Vec<heapless::Vec<u8, MAX_STOP_LEN>, MAX_STOP>,
    bias: heapless::Vec<(u32, f32), { generate::MAX_BIAS }>,
    /// The rendered chat prompt or the prompt string (range of `Bufs::text`), for
    /// `echo` and `__verbose`.
    shown: Option<(usize, usize)>,
    /// The grammar the answers follow (parsed into `Bufs::grammar`).
    grammar: Option<crate::grammar::parse::Parsed>,
    /// Tool calls in the answer become `tool_calls` (chat with `tools`).
    tools: bool,
    /// Index in `stops` of the tool call's opening marker (streamed chat with tools).
    tool_stop: Option<usize>,
}

/// Why a request cannot run.
enum Refusal {
    /// Status and message (in the caller's buffer).
    Status(u16),
    /// The prompt does not fit the context (llama-server's `exceed_context_size_error`).
    Context { n_prompt: usize },
}

type Msg = heapless::String<256>;

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
fn encode(
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
struct Enc<'t, 'a> {
    tok: &'t Tokenizer<'a>,
    n_ctx: usize,
    limit: usize,
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

fn prepare<P: Platform>(
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
                        let sep = if content.is_empty() { "" } else { "\n" };
                        if write!(w, "{content}{sep}").is_err()
                            || tools::write_history(&mut w, calls).is_err()
                        {
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
                let _ = msgs.push(ChatMessage::new(role, content));
            }
            // Tools: a Jinja template that reads `tools` writes them itself; for the
            // others, their signatures and the call format go in the system message (a
            // new one first when there is none).
            let tools_on = req.tool_choice != ToolChoice::None;
            let own_tools = tools_on && setup.template.takes_tools();
            if let (Some(list), true) = (req.tools, tools_on && !own_tools) {
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
            let rendered =
                setup
                    .template
                    .render_with_tools(turns, gen_prompt, tools_json, &mut w.buf[..]);
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
    let mut tool_stop = None;
    if tools_on && p.stream && stops.len() < MAX_STOP {
        tool_stop = Some(stops.len());
        let _ = stops.push(heapless::Vec::from_slice(tools::OPEN.as_bytes()).unwrap_or_default());
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
            Some((list, req.tool_choice))
        }
        _ => None,
    };
    let grammar = bufs
        .grammar
        .prepare(req.constraint, tool_call, &mut strs)
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
        tools: tools_on,
        tool_stop,
    })
}

/// Holds back text that may be the start of a stop string.
struct StopMatcher {
    held: heapless::Vec<u8, 512>,
}

impl StopMatcher {
    /// Add `s`; `out` gets the text that can no longer be part of a stop string. Returns
    /// the index of the stop string found (the text before it has been given to `out`).
    fn push(
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

fn find(h: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > h.len() {
        return None;
    }
    h.windows(needle.len()).position(|w| w == needle)
}

/// A token's probability figures: log-probabilities of the model's distribution, or
/// with `post` (llama-server's `post_sampling_probs`) probabilities of the distribution
/// the sampler drew from.
#[derive(Clone, Copy)]
struct TokProbs {
    /// The chosen token's figure.
    lp: f32,
    n: usize,
    /// The alternatives, best first, each with its figure in `logit`.
    top: [Candidate; MAX_TOP],
    post: bool,
}

impl TokProbs {
    const EMPTY: TokProbs = TokProbs {
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
fn post_probs(sampler: &mut Sampler, used: &[f32], chosen: u32, k: usize) -> TokProbs {
    let mut t = TokProbs::EMPTY;
    t.post = true;
    let (p, n) = sampler.post_probs(used, chosen, &mut t.top[..k.min(MAX_TOP)]);
    t.lp = p;
    t.n = t.top[..n].iter().take_while(|c| c.logit > 0.0).count();
    t
}

/// Log-softmax figures of `chosen` and the `k` most likely tokens.
fn probs(logits: &[f32], chosen: u32, k: usize) -> TokProbs {
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
enum Finish {
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
struct Resp<'s> {
    api: Api,
    id: u64,
    model: &'s str,
    /// The generation slot (`id_slot`).
    slot: usize,
}

impl Resp<'_> {
    fn open(&self, w: &mut dyn Write, object: &str) -> core::fmt::Result {
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
fn entry(
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
struct Timings {
    /// Prompt tokens (cached + evaluated).
    prompt_n: usize,
    /// Prompt tokens reused from the cache (not evaluated).
    cached: usize,
    prompt_s: f64,
    gen_n: usize,
    gen_s: f64,
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
struct Res {
    /// Range of `Bufs::out`.
    text: (usize, usize),
    /// First record (index into the per-token records) and count.
    rec: (usize, usize),
    fin: Finish,
    tm: Timings,
    truncated: bool,
    /// A streamed answer switched to a tool call (its text is in `Bufs::out`).
    calling: bool,
    /// The prompt's tokens (range of `Bufs::tokens`).
    prompt: (usize, usize),
}

/// The request-level settings echoed back as llama-server's `generation_settings`.
struct GenSettings<'r> {
    sp: crate::sampler::SamplerParams,
    p: &'r Params,
    n_predict: i64,
    ignore_eos: bool,
    eog: &'r [u32],
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

/// What the sink of one answer keeps from token to token (the parts that are not
/// borrowed buffers), so that a batched answer can be resumed at every step.
pub struct SinkState {
    /// Records: ids (and log-probabilities when wanted), from `rec0`.
    rec0: usize,
    n_rec: usize,
    /// Non-streamed text.
    out_len: usize,
    /// The sequence's cached tokens: generated ones are appended at `n_cached`.
    n_cached: usize,
    cur: TokProbs,
    utf8: Utf8Stream,
    matcher: StopMatcher,
    hit: Option<usize>,
    /// The client went away (a failed send, or seen by the server loop).
    pub gone: bool,
    /// The output buffer is full.
    full: bool,
    /// Prompt progress (`return_progress`): total, cached.
    progress: (usize, usize),
    /// The stop string that opens a tool call (streamed chat with tools): when it
    /// comes, the rest of the answer is kept (in `out`) instead of streamed, and sent as
    /// `tool_calls` at the end.
    tool_stop: Option<usize>,
    calling: bool,
    /// Tokens generated and not yet counted in the server's metrics (a sink without the
    /// server: batched steps).
    pub uncounted: u64,
}

/// The per-request part of the server that the driver's sink writes to.
pub struct ServeSink<'x, 'a, 's, 'p, 'b, 'w, P: Platform> {
    /// The server, polled between passes; `None` in a batched step (the server loop
    /// polls between steps).
    io: Option<&'x mut Io<'a, 's, 'p, P>>,
    i: usize,
    w: &'x mut SockWriter<'w, P>,
    r: &'x Resp<'s>,
    tok: &'x Tokenizer<'b>,
    p: &'x Params,
    stops: &'x [heapless::Vec<u8, MAX_STOP_LEN>],
    rec_id: &'x mut [u32],
    rec_lp: &'x mut [f32],
    out: &'x mut [u8],
    cache: &'x mut [u32],
    s: &'x mut SinkState,
}

impl<P: Platform> ServeSink<'_, '_, '_, '_, '_, '_, P> {
    /// llama-server's `prompt_progress` event (`return_progress`, streamed): `done`
    /// tokens of this request's prompt evaluated after the cached ones.
    fn progress_event(&mut self, done: usize) -> bool {
        if !(self.p.stream && self.p.return_progress) {
            return true;
        }
        let (total, cached) = self.s.progress;
        let _ = write!(
            self.w,
            "data: {{\"prompt_progress\":{{\"total\":{total},\"cache\":{cached},\"processed\":{},\"time_ms\":0}}}}\n\n",
            cached + done
        );
        if !self.w.flush() {
            self.s.gone = true;
        }
        !self.s.gone
    }

    fn alive(&mut self) -> bool {
        if let Some(io) = self.io.as_deref_mut() {
            io.poll();
            if io.client_gone(self.i) {
                self.s.gone = true;
            }
        }
        !self.s.gone
    }

    fn count_token(&mut self) {
        match self.io.as_deref_mut() {
            Some(io) => io.m.tokens_generated += 1,
            None => self.s.uncounted += 1,
        }
    }
}

impl<P: Platform> Sink for ServeSink<'_, '_, '_, '_, '_, '_, P> {
    fn prompt_batch(&mut self, done: usize, _total: usize) -> bool {
        self.progress_event(done) && self.alive()
    }

    fn sampled(&mut self, logits: &[f32], used: &[f32], sampler: &mut Sampler, id: u32) {
        if self.p.logprobs && self.p.post_sampling {
            self.s.cur = post_probs(sampler, used, id, self.p.top);
        } else if self.p.logprobs {
            self.s.cur = probs(logits, id, self.p.top);
        }
    }

    fn token(&mut self, id: u32, bytes: &[u8]) -> bool {
        let stride = MAX_TOP + 1;
        let s = &mut *self.s;
        let j = s.rec0 + s.n_rec;
        if (j + 1) * stride <= self.rec_id.len() {
            let base = j * stride;
            self.rec_id[base] = id;
            self.rec_lp[base] = s.cur.lp;
            let top = &mut self.rec_id[base + 1..base + stride];
            // Fewer alternatives than asked (post-sampling cuts, a tiny vocabulary)
            // end at NO_TOKEN.
            top.fill(NO_TOKEN);
            for (kk, c) in s.cur.top[..s.cur.n].iter().enumerate() {
                top[kk] = c.id;
                self.rec_lp[base + 1 + kk] = c.logit;
            }
            s.n_rec += 1;
        }
        if s.n_cached < self.cache.len() {
            self.cache[s.n_cached] = id;
            s.n_cached += 1;
        }
        if s.calling {
            // Inside a streamed tool call: kept for the `tool_calls` at the end.
            if !keep(self.out, &mut s.out_len, bytes) {
                s.full = true;
                return false;
            }
            self.count_token();
            return self.alive();
        }
        // Released text of this token: through the UTF-8 assembler and the stop matcher.
        let mut piece: heapless::Vec<u8, 1024> = heapless::Vec::new();
        let (matcher, stops, hit) = (&mut s.matcher, self.stops, &mut s.hit);
        let _ = s.utf8.push(bytes, &mut |t: &str| -> Result<(), ()> {
            if hit.is_none() {
                *hit = matcher.push(t.as_bytes(), stops, &mut |b| {
                    let _ = piece.extend_from_slice(b);
                });
            }
            Ok(())
        });
        self.count_token();
        let s = &mut *self.s;
        if self.p.stream {
            let t = self.p.logprobs.then_some(&s.cur);
            if !piece.is_empty() || t.is_some() || self.r.api != Api::Chat {
                let _ = token_event(self.w, self.r, self.tok, &piece, id, t);
                if !self.w.flush() {
                    s.gone = true;
                    return false;
                }
            }
        } else if !keep(self.out, &mut s.out_len, &piece) {
            // Never cut silently: the answer ends before this token, as "length".
            s.full = true;
            return false;
        }
        if s.hit.is_some() && s.hit == s.tool_stop {
            s.hit = None;
            s.calling = true;
            let open = tools::OPEN.as_bytes();
            if !keep(self.out, &mut s.out_len, open) {
                s.full = true;
                return false;
            }
        }
        if s.hit.is_some() {
            return false;
        }
        self.alive()
    }
}

/// Append `piece` to the answer in `out[..*len]`; false (nothing appended) when it
/// does not fit whole, so a token's text is never cut.
fn keep(out: &mut [u8], len: &mut usize, piece: &[u8]) -> bool {
    let Some(dst) = out.get_mut(*len..*len + piece.len()) else {
        return false;
    };
    dst.copy_from_slice(piece);
    *len += piece.len();
    true
}

/// Stream event for one token with released text `text`.
fn token_event(
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
fn legacy_top(w: &mut dyn Write, tok: &Tokenizer<'_>, t: &TokProbs) -> core::fmt::Result {
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
struct Recs<'r> {
    ids: &'r [u32],
    lps: &'r [f32],
    /// Alternatives per token (at most; a record's list ends early at [`NO_TOKEN`]).
    n_top: usize,
    /// The figures are post-sampling probabilities.
    post: bool,
}

/// Marks the end of a record's alternatives.
const NO_TOKEN: u32 = u32::MAX;

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
struct Body<'x, 'b> {
    r: &'x Resp<'x>,
    tok: &'x Tokenizer<'b>,
    out: &'x [u8],
    recs: Recs<'x>,
    res: &'x [Res],
    stops: &'x [heapless::Vec<u8, MAX_STOP_LEN>],
    gs: &'x GenSettings<'x>,
    /// The rendered or given prompt text (for `echo` and `__verbose`).
    shown: &'x [u8],
    verbose: bool,
    /// Calls in the text become `tool_calls`.
    tools: bool,
    /// `Bufs::tokens`: each answer's prompt, shown as llama-server shows it (the
    /// tokens' text, specials included).
    tokens: &'x [u32],
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
    fn write(&self, w: &mut dyn Write) -> core::fmt::Result {
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
                match self.tools.then(|| tools::first_call(text)).flatten() {
                    Some(at) => {
                        let content = text[..at].trim_ascii();
                        match content.is_empty() {
                            true => w.write_str("null")?,
                            false => json_bytes_str(w, content)?,
                        }
                        w.write_str(",\"tool_calls\":")?;
                        tools::write_calls(w, &text[at..], self.r.id, false)?;
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
fn guard_stopped<P: Platform>(
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
fn error_event(w: &mut dyn Write, api: Api, status: u16, m: &str) -> core::fmt::Result {
    write!(w, "data: {{\"error\":{{\"code\":{status},\"message\":")?;
    json_str(w, m)?;
    w.write_str(",\"type\":\"unavailable_error\"}}\n\n")?;
    if !matches!(api, Api::Llama | Api::Infill) {
        w.write_str("data: [DONE]\n\n")?;
    }
    Ok(())
}

/// The last events of a stream: the held-back text, the finish, usage and timings.
fn final_events(w: &mut dyn Write, b: &Body<'_, '_>, res: &Res, tail: &[u8]) -> core::fmt::Result {
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
            if chat && res.calling && tools::first_call(call).is_some() {
                // The tool call the answer switched to, as one delta.
                w.write_str("data: ")?;
                r.open(w, obj)?;
                w.write_str(",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":")?;
                tools::write_calls(w, call, r.id, true)?;
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
fn tokens_endpoint<P: Platform>(
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

/// A generation request being answered: what it asked for, its output so far and the
/// connection it is answered on. Made by [`open`], its answers run one after another
/// ([`Job::next_answer`], [`start_answer`], [`end_answer`]), sent by [`close`].
pub struct Job<'s, 'p, P: Platform> {
    /// The connection slot.
    pub i: usize,
    api: Api,
    body: (usize, usize),
    sock: crate::platform::Socket,
    prep: Prepared,
    r: Resp<'s>,
    sp: crate::sampler::SamplerParams,
    ignore_eos: bool,
    w: SockWriter<'p, P>,
    results: heapless::Vec<Res, MAX_RESULTS>,
    out_len: usize,
    n_rec: usize,
    tail: heapless::Vec<u8, 1024>,
    max_new_shown: usize,
    /// Answers started (index over prompts × `n`).
    started: usize,
}

impl<P: Platform> Job<'_, '_, P> {
    /// The generation id (`/slots`' `id_task`).
    pub fn task(&self) -> u64 {
        self.r.id
    }

    /// Answer in generation slot `slot` (its sequence).
    pub fn set_slot(&mut self, slot: usize) {
        self.r.slot = slot;
    }

    /// The prompt of its first answer (range of `Lane::tokens`), for choosing the slot
    /// whose cache holds most of it.
    pub fn first_prompt(&self) -> (usize, usize) {
        self.prep.prompts.first().copied().unwrap_or((0, 0))
    }

    /// The job's answers must follow a grammar (they cannot share a batched pass: the
    /// matcher's buffers are the server's one set).
    pub fn constrained(&self) -> bool {
        self.prep.grammar.is_some()
    }

    /// The prompt (range of `Lane::tokens`) and choice of the next answer, if any.
    fn next_answer(&self) -> Option<((usize, usize), usize)> {
        let n = self.prep.p.n.max(1);
        let prompt = *self.prep.prompts.get(self.started / n)?;
        Some((prompt, self.started % n))
    }

    /// Generate past end-of-generation tokens (the request's `ignore_eos`).
    pub fn ignore_eos(&self) -> bool {
        self.ignore_eos
    }

    /// Whether another answer is to be generated.
    pub fn has_next(&self) -> bool {
        self.next_answer().is_some()
    }
}

/// One answer being generated: its sampler, logit adjustments and sink state.
pub struct Answer<'a> {
    prompt: (usize, usize),
    reuse: usize,
    max_new: usize,
    pub sampler: Sampler,
    /// Over the lane's logits scratch (given back by [`end_answer`]).
    pub adjust: Adjust<'a>,
    pub sink: SinkState,
}

impl<'a> Answer<'a> {
    /// The sampling settings of this answer in a batched pass (no drafts: a pass holds
    /// one token of each answer; no grammar: see [`Job::constrained`]), and its sink
    /// state.
    pub fn parts<'s>(
        &'s mut self,
        ignore_eos: bool,
        guard: &'s mut MemoryGuard,
    ) -> (Settings<'s, 'a, 'static, 'static>, &'s mut SinkState) {
        let settings = Settings {
            sampler: &mut self.sampler,
            guard,
            adjust: match self.adjust.is_active() {
                true => Some(&mut self.adjust),
                false => None,
            },
            max_new: self.max_new,
            ignore_eos,
            feed_last: false,
            draft: None,
            grammar: None,
        };
        (settings, &mut self.sink)
    }
}

/// The sink of an answer of `job` (state `s`) over its lane's and sequence's buffers;
/// `io` is polled between passes when given (`None` in a batched step: the server loop
/// polls between steps).
pub fn sink<'x, 'a, 's, 'p, 'b, P: Platform>(
    io: Option<&'x mut Io<'a, 's, 'p, P>>,
    job: &'x mut Job<'s, 'p, P>,
    tok: &'x Tokenizer<'b>,
    lane: &'x mut Lane<'_>,
    seq: &'x mut SeqCache<'_>,
    s: &'x mut SinkState,
) -> ServeSink<'x, 'a, 's, 'p, 'b, 'p, P> {
    let Job { i, w, r, prep, .. } = job;
    ServeSink {
        io,
        i: *i,
        w,
        r,
        tok,
        p: &prep.p,
        stops: &prep.stops,
        rec_id: lane.rec_id,
        rec_lp: lane.rec_lp,
        out: lane.out,
        cache: seq.cache,
        s,
    }
}

/// Start the answer of `job` after its last: the longest prefix of its prompt that
/// sequence `seq` holds is kept (selected in the session), the sampler and adjustments
/// are made, and the first progress event is sent. `None` when all were started.
pub fn start_answer<'a, P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    job: &mut Job<'_, '_, P>,
    lane: &mut Lane<'a>,
    seq: &mut SeqCache<'_>,
) -> Option<Answer<'a>> {
    let ((a, b), choice) = job.next_answer()?;
    job.started += 1;
    let n_ctx = ctx.sess.opts.n_ctx;
    let q = &job.prep.p;
    let prompt = &lane.tokens[a..b];
    let n_prompt = prompt.len();
    let max_new = q
        .max_tokens
        .map_or(ctx.o.n_predict, |n| n as usize)
        .min(n_ctx - n_prompt);
    job.max_new_shown = max_new;
    // `select_seq` fails only for a sequence the session lacks, which the loop never
    // hands out.
    let _ = ctx.sess.select_seq(seq.seq);
    // Keep the longest cached prefix; at least one prompt token is evaluated, for the
    // logits of the first generated token.
    let reuse = if q.cache_prompt && ctx.sess.n_past() >= seq.n_cached {
        seq.common_prefix(prompt).min(n_prompt - 1)
    } else {
        0
    };
    // Through `truncate`: a model whose state cannot go back refuses, and the prompt is
    // evaluated from the start.
    if ctx.sess.truncate(reuse).is_err() {
        ctx.sess.reset();
    }
    let reuse = ctx.sess.n_past();
    seq.cache[reuse..n_prompt].copy_from_slice(&prompt[reuse..]);
    seq.n_cached = n_prompt;
    let mut sp = job.sp;
    sp.seed = sp.seed.wrapping_add(choice as u64);
    let mut sampler = Sampler::new(sp);
    for &t in &prompt[..reuse] {
        sampler.accept(t);
    }
    let mut adjust = Adjust::new(core::mem::take(&mut lane.logits));
    let _ = adjust.bias.extend_from_slice(&job.prep.bias);
    adjust.presence = q.presence_penalty;
    adjust.frequency = q.frequency_penalty;
    // The cached part of the prompt counts for the penalties as if evaluated (the
    // driver adds the rest), so a cached prompt is answered as an evaluated one.
    for &t in &prompt[..reuse] {
        adjust.accept(t);
    }
    let mut ans = Answer {
        prompt: (a, b),
        reuse,
        max_new,
        sampler,
        adjust,
        sink: SinkState {
            rec0: job.n_rec,
            n_rec: 0,
            out_len: job.out_len,
            n_cached: n_prompt,
            cur: TokProbs::EMPTY,
            utf8: Utf8Stream::new(),
            matcher: StopMatcher {
                held: heapless::Vec::new(),
            },
            hit: None,
            gone: false,
            full: false,
            progress: (n_prompt, reuse),
            tool_stop: job.prep.tool_stop,
            calling: false,
            uncounted: 0,
        },
    };
    // The first progress report: the cached tokens, before any pass.
    sink::<P>(None, job, ctx.tok, lane, seq, &mut ans.sink).progress_event(0);
    Some(ans)
}

/// Evaluate the answer's prompt on its sequence (selected by [`start_answer`]) and
/// sample its first token: a [`Stream`](super::slots::Stream) for batched steps. The
/// server is polled between the prompt's passes.
pub fn start_stream<'a, 's, 'p, P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    io: &mut Io<'a, 's, 'p, P>,
    job: &mut Job<'s, 'p, P>,
    lane: &mut Lane<'_>,
    seq: &mut SeqCache<'_>,
    ans: &mut Answer<'_>,
    guard: &mut MemoryGuard,
) -> Result<super::slots::Stream, crate::commands::AppError> {
    let (prompt, reuse) = (ans.prompt, ans.reuse);
    let (mut settings, st) = ans.parts(job.ignore_eos, guard);
    // The sink never reads the prompt's tokens: they are lent out of the lane.
    let tokens = core::mem::take(&mut lane.tokens);
    let toks = &tokens[prompt.0 + reuse..prompt.1];
    let n = seq.seq;
    let mut sink = sink(Some(io), job, ctx.tok, lane, seq, st);
    let got = super::slots::Stream::start(
        ctx.p,
        &mut ctx.sess,
        ctx.tok,
        n,
        &mut settings,
        toks,
        &mut sink,
    );
    lane.tokens = tokens;
    got
}

/// Account for a finished answer (`got`: its generation) and keep its result; false
/// when the connection was answered with an error or went away (the slot is freed).
/// The logits scratch goes back to the lane.
pub fn end_answer<'a, 's, 'p, P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    io: &mut Io<'_, 's, 'p, P>,
    job: &mut Job<'s, 'p, P>,
    lane: &mut Lane<'a>,
    seq: &mut SeqCache<'_>,
    mut ans: Answer<'a>,
    got: Option<generate::GenStats>,
) -> bool {
    lane.logits = core::mem::take(&mut ans.adjust.scratch);
    let p = ctx.p;
    let q = job.prep.p;
    let api = job.api;
    let i = job.i;
    let s = &mut ans.sink;
    io.m.tokens_generated += s.uncounted;
    s.uncounted = 0;
    let (gone, full, hit, calling) = (s.gone, s.full, s.hit, s.calling);
    job.out_len = s.out_len;
    let this_rec = (job.n_rec, s.n_rec);
    job.n_rec += s.n_rec;
    // Text still held: an incomplete character, or a prefix of a stop string that never
    // completed.
    let tail = &mut job.tail;
    tail.clear();
    if hit.is_none() && !full {
        let _ = s.utf8.finish(&mut |t: &str| -> Result<(), ()> {
            let _ = tail.extend_from_slice(t.as_bytes());
            Ok(())
        });
        let _ = tail.extend_from_slice(&s.matcher.held);
    }
    let n_past = ctx.sess.n_past_of(seq.seq);
    seq.n_cached = n_past.min(seq.cache.len());
    io.m.n_tokens_max = io.m.n_tokens_max.max(n_past as u64);
    let w = &mut job.w;
    let st = match got {
        Some(st) => st,
        None => {
            if q.stream {
                let _ = error_event(w, api, 500, "the model failed to evaluate");
                w.flush();
                io.free(i);
                return false;
            }
            io.fail(i, 500, &"the model failed to evaluate the prompt");
            return false;
        }
    };
    let (a, b) = ans.prompt;
    let (n_prompt, reuse) = (b - a, ans.reuse);
    io.m.prompt_tokens += (n_prompt - reuse) as u64;
    io.m.prompt_cached += reuse as u64;
    io.m.prompt_seconds += st.prompt_s;
    io.m.gen_seconds += st.gen_s;
    io.m.decode_passes +=
        ((n_prompt - reuse).div_ceil(ctx.sess.opts.n_batch.max(1)) + st.passes) as u64;
    io.m.drafts += st.drafts as u64;
    io.m.draft_tokens += st.drafted as u64;
    io.m.draft_accepted += st.accepted as u64;
    io.m.prompt_tps = generate::per_second(n_prompt - reuse, st.prompt_s);
    io.m.gen_tps = generate::per_second(st.gen_tokens, st.gen_s);
    if gone {
        io.m.disconnects += 1;
        io.free(i);
        return false;
    }
    if let End::Stopped(g) = st.end {
        let m = guard_stopped(p, io, g, st.gen_tokens);
        if !q.stream {
            io.fail(i, 503, &m.as_str());
            return false;
        }
        // The text released so far has been sent; what is held back is dropped.
        let _ = error_event(w, api, 503, &m);
        w.flush();
        io.free(i);
        return false;
    }
    if !q.stream {
        let take = job.tail.len().min(lane.out.len() - job.out_len);
        lane.out[job.out_len..job.out_len + take].copy_from_slice(&job.tail[..take]);
        job.out_len += take;
    }
    let start = job.results.last().map_or(0, |x: &Res| x.text.0 + x.text.1);
    let fin = match (hit, st.end) {
        (Some(k), _) => Finish::Word(k),
        (None, End::Eos) => Finish::Eos,
        _ => Finish::Length,
    };
    let _ = job.results.push(Res {
        text: (start, job.out_len - start),
        rec: this_rec,
        fin,
        tm: Timings {
            prompt_n: n_prompt,
            cached: reuse,
            prompt_s: st.prompt_s,
            gen_n: st.gen_tokens,
            gen_s: st.gen_s,
        },
        truncated: st.end == End::ContextFull,
        calling,
        prompt: (a, b),
    });
    true
}

/// Take the active request in slot `i`: requests that need no generation (tokenize,
/// templates, refusals) are answered and the slot freed (`None`); a generation request
/// is prepared into `lane` and its response head sent.
pub fn open<'s, 'p, P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    setup: Setup<'_>,
    io: &mut Io<'_, 's, 'p, P>,
    bufs: &mut Bufs<'_>,
    lane: &mut Lane<'_>,
    i: usize,
) -> Option<Job<'s, 'p, P>> {
    // Take the request buffer out of the slot so the loop can poll the others meanwhile.
    let buf = core::mem::take(&mut io.slots[i].buf);
    let (api, (b0, b1), sock) = (io.slots[i].api, io.slots[i].body, io.slots[i].sock);
    if matches!(api, Api::Tokenize | Api::Detokenize) {
        let status = tokens_endpoint(ctx.tok, setup, bufs, lane, api, &buf[b0..b1], io.p, sock);
        io.slots[i].buf = buf;
        match status {
            Err(m) => io.fail(i, 400, &m),
            Ok(()) => io.free(i),
        }
        return None;
    }
    let mut why = Msg::new();
    let prep = prepare(ctx, setup, bufs, lane, api, &buf[b0..b1], &mut why);
    io.slots[i].buf = buf;
    let n_ctx = ctx.sess.opts.n_ctx;
    let prep = match prep {
        Ok(p) => p,
        Err(Refusal::Status(status)) => {
            if why.is_empty() {
                why = msg(&"the prompt is invalid (a token id out of range, a bad element, or multimodal data this server does not take)");
            }
            io.fail(i, status, &why.as_str());
            return None;
        }
        Err(Refusal::Context { n_prompt }) => {
            io.m.client_errors += 1;
            let mut fields: heapless::String<64> = heapless::String::new();
            let _ = write!(fields, ",\"n_prompt_tokens\":{n_prompt},\"n_ctx\":{n_ctx}");
            http::respond_error_with(
                io.p,
                sock,
                400,
                "exceed_context_size_error",
                &format_args!("the request exceeds the available context size, try increasing it: the prompt has {n_prompt} tokens, the context holds {n_ctx} (with room for one generated token)"),
                &fields,
            );
            io.free(i);
            return None;
        }
    };
    if matches!(api, Api::ApplyTemplate | Api::InputTokens) {
        let shown: &[u8] = prep.shown.map_or(&[][..], |(o, n)| &lane.text[o..o + n]);
        let n = prep.prompts.first().map_or(0, |&(a, b)| b - a);
        http::respond(io.p, sock, 200, "application/json", "", &|w| {
            if api == Api::InputTokens {
                return write!(w, "{{\"input_tokens\":{n}}}");
            }
            w.write_str("{\"prompt\":")?;
            json_bytes_str(w, shown)?;
            w.write_char('}')
        });
        io.free(i);
        return None;
    }
    io.m.generations += 1;
    let r = Resp {
        api,
        id: io.m.generations,
        model: io.info.model_id,
        slot: 0,
    };
    let o = ctx.o;
    let q = prep.p;
    let mut sp = o.sampler;
    sp.temp = q.temperature.unwrap_or(sp.temp);
    sp.top_p = q.top_p.unwrap_or(sp.top_p);
    sp.top_k = q.top_k.map_or(sp.top_k, |k| k as usize);
    sp.min_p = q.min_p.unwrap_or(sp.min_p);
    sp.repeat_penalty = q.repeat_penalty.unwrap_or(sp.repeat_penalty);
    sp.seed = q.seed.unwrap_or(sp.seed);
    let ignore_eos = q.ignore_eos.unwrap_or(o.ignore_eos);
    let mut w = SockWriter::new(io.p, sock);
    if q.stream {
        let _ = http::write_head(
            &mut w,
            200,
            "text/event-stream",
            None,
            "X-Accel-Buffering: no\r\n",
        );
        if api == Api::Chat {
            let _ = w.write_str("data: ");
            let _ = r.open(&mut w, "chat.completion.chunk");
            let _ = w.write_str(",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        }
        w.flush();
    }
    Some(Job {
        i,
        api,
        body: (b0, b1),
        sock,
        prep,
        r,
        sp,
        ignore_eos,
        w,
        results: heapless::Vec::new(),
        out_len: 0,
        n_rec: 0,
        tail: heapless::Vec::new(),
        max_new_shown: 0,
        started: 0,
    })
}

/// Send the response of `job`, whose answers are all done, and free its slot.
pub fn close<P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    setup: Setup<'_>,
    io: &mut Io<'_, '_, '_, P>,
    bufs: &mut Bufs<'_>,
    lane: &mut Lane<'_>,
    mut job: Job<'_, '_, P>,
) {
    let (p, tok) = (ctx.p, ctx.tok);
    let (q, api, sock, i) = (job.prep.p, job.api, job.sock, job.i);
    let (b0, b1) = job.body;
    let gs = GenSettings {
        sp: job.sp,
        p: &q,
        n_predict: job.max_new_shown as i64,
        ignore_eos: job.ignore_eos,
        eog: tok.eog_ids(),
    };
    let shown: &[u8] = match job.prep.shown {
        Some((o, n)) => &lane.text[o..o + n],
        None => b"",
    };
    let body = Body {
        r: &job.r,
        tok,
        out: lane.out,
        recs: Recs {
            ids: lane.rec_id,
            lps: lane.rec_lp,
            n_top: q.top.min(MAX_TOP),
            post: q.post_sampling,
        },
        res: &job.results,
        stops: &job.prep.stops,
        gs: &gs,
        shown,
        verbose: setup.verbose,
        tools: job.prep.tools,
        tokens: lane.tokens,
    };
    let w = &mut job.w;
    if q.stream {
        if let Some(res) = job.results.first() {
            let _ = final_events(w, &body, res, &job.tail);
        }
        w.flush();
    } else {
        let req = &io.slots[i].buf[b0..b1];
        let fields = super::jraw::root(req)
            .and_then(|r| r.get("response_fields"))
            .filter(|f| f.kind() == Kind::Arr && f.items().next().is_some());
        let llama = matches!(api, Api::Llama | Api::Infill);
        let mut whole = SliceWriter {
            buf: &mut *bufs.scratch,
            len: 0,
        };
        match fields {
            // llama-server's `response_fields`: only the listed fields, `a/b` taken
            // out of `a` (the full body is written to the tokenizer scratch first,
            // which is free once the prompt is tokenized).
            Some(f) if llama && body.write(&mut whole).is_ok() => {
                let n = whole.len;
                let full = super::jraw::root(&whole.buf[..n]);
                http::respond(p, sock, 200, "application/json", "", &|w| match full {
                    Some(v) if v.kind() == Kind::Arr => {
                        w.write_char('[')?;
                        for (k, one) in v.items().enumerate() {
                            if k > 0 {
                                w.write_char(',')?;
                            }
                            project(w, one, f)?;
                        }
                        w.write_char(']')
                    }
                    Some(v) => project(w, v, f),
                    None => w.write_str("{}"),
                });
            }
            _ => {
                http::respond(p, sock, 200, "application/json", "", &|w| body.write(w));
            }
        }
    }
    io.free(i);
}

/// Generate every answer of `job` on sequence `seq` with the shared driver alone
/// (drafts and grammar as configured), the server polled between passes; false when
/// the connection was freed on the way.
#[allow(clippy::too_many_arguments)]
pub fn run_alone<'s, 'p, P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    io: &mut Io<'_, 's, 'p, P>,
    bufs: &mut Bufs<'_>,
    job: &mut Job<'s, 'p, P>,
    lane: &mut Lane<'_>,
    seq: &mut SeqCache<'_>,
    guard: &mut MemoryGuard,
) -> bool {
    while let Some(mut ans) = start_answer(ctx, job, lane, seq) {
        let got = {
            // A fresh matcher per answer, at the start of the grammar.
            let mut parts = job
                .prep
                .grammar
                .as_ref()
                .and_then(|g| bufs.grammar.split(g));
            let mut constrain = parts.as_mut().map(|(m, vocab, masked)| Constrain {
                matcher: m,
                vocab,
                scratch: masked,
                masked: 0,
            });
            let Answer {
                sampler,
                adjust,
                sink: st,
                max_new,
                prompt: (a, b),
                reuse,
            } = &mut ans;
            let settings = Settings {
                sampler,
                guard: &mut *guard,
                adjust: adjust.is_active().then_some(adjust),
                max_new: *max_new,
                ignore_eos: job.ignore_eos,
                feed_last: false,
                draft: ctx.draft.as_mut(),
                grammar: constrain.as_mut(),
            };
            let tokens = core::mem::take(&mut lane.tokens);
            let toks = &tokens[*a + *reuse..*b];
            let mut sink = sink(Some(&mut *io), job, ctx.tok, lane, seq, st);
            let got = generate::generate(ctx.p, ctx.tok, &mut ctx.sess, settings, toks, &mut sink);
            lane.tokens = tokens;
            got
        };
        if !end_answer(ctx, io, job, lane, seq, ans, got.ok()) {
            return false;
        }
    }
    true
}

/// Serve the active request in slot `i` alone, then free the slot. `guard` is checked
/// before the prompt and before each token's pass: when it stops the generation, the
/// client gets a 503 error (non-streamed) or an error event (streamed) saying why, and
/// the server goes on with the next request.
#[allow(clippy::too_many_arguments)]
pub fn serve_one<P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    setup: Setup<'_>,
    io: &mut Io<'_, '_, '_, P>,
    bufs: &mut Bufs<'_>,
    lane: &mut Lane<'_>,
    seq: &mut SeqCache<'_>,
    guard: &mut MemoryGuard,
    i: usize,
) {
    let Some(mut job) = open(ctx, setup, io, bufs, lane, i) else {
        return;
    };
    job.r.slot = seq.seq;
    if run_alone(ctx, io, bufs, &mut job, lane, seq, guard) {
        close(ctx, setup, io, bufs, lane, job);
    }
}

/// The members of `obj` named in `fields` (a list of names; `a/b` is member `b` of
/// member `a`, written as `"a/b"`), in the order given; missing ones are left out.
fn project(w: &mut dyn Write, obj: Val<'_>, fields: Val<'_>) -> core::fmt::Result {
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
