//! One generation for the server: the request body becomes a prompt (chat template or
//! plain text), tokens are sampled one at a time with the server loop polled between
//! them, stop strings are held back until they cannot match, and the result goes out as
//! server-sent events or one JSON body in the shape of the API that was called.
//!
//! Log-probabilities are those of the model's distribution (softmax of the raw logits,
//! temperature 1), as OpenAI and llama-server report them, whatever the sampling
//! settings.
use core::fmt::Write;

use super::http::{self, SockWriter};
use super::json::{
    self, json_byte_list, json_bytes_str, json_f32, Api, Params, MAX_STOP, MAX_STOP_LEN, MAX_TOP,
};
use super::{msg, Io};
use crate::chat::{ChatMessage, ChatTemplate};
use crate::commands::out::json_str;
use crate::commands::run::SliceWriter;
use crate::commands::{secs, Ctx};
use crate::guard::{GuardStop, MemoryGuard};
use crate::model::Logits;
use crate::platform::Platform;
use crate::sampler::{top_n, Candidate, Sampler};
use crate::tokenizer::{TokenizerError, Utf8Stream};

/// Buffers of the generation side, carved once from the arena.
pub struct Bufs<'a> {
    /// Unescaped strings (first half) and the rendered prompt (second half).
    pub text: &'a mut [u8],
    pub scratch: &'a mut [u8],
    pub tokens: &'a mut [u32],
    /// Generated text of a non-streamed response.
    pub out: &'a mut [u8],
    /// Per generated token: the chosen id and its alternatives ([`MAX_TOP`] + 1 each).
    pub rec_id: &'a mut [u32],
    pub rec_lp: &'a mut [f32],
    /// Longest prompt text accepted (the tokenizer scratch is sized for it).
    pub prompt_limit: usize,
    /// The tokens whose keys and values are in the session's cache, positions
    /// `0..n_cached` (`n_ctx` long): a request that starts with the same tokens (the next
    /// turn of a chat, a retry) only evaluates the rest, as llama-server's `cache_prompt`.
    pub cache: &'a mut [u32],
    pub n_cached: usize,
}

/// Bytes of text per context token the server accepts in a prompt (English averages
/// about 4; the limit only keeps the tokenizer scratch bounded).
pub const PROMPT_BYTES_PER_TOKEN: usize = 12;

/// The prompt text limit for a context of `n_ctx` tokens.
pub fn prompt_limit(n_ctx: usize) -> usize {
    (n_ctx * PROMPT_BYTES_PER_TOKEN).clamp(8 << 10, super::MAX_BODY)
}

/// A request turned into tokens and settings.
struct Prepared {
    n_prompt: usize,
    p: Params,
    stops: heapless::Vec<heapless::Vec<u8, MAX_STOP_LEN>, MAX_STOP>,
}

/// Why a request cannot run: the status; the message is written to the caller's
/// buffer (a large error value would be copied through every `?`).
type Refusal = u16;
type Msg = heapless::String<256>;

/// Render `messages` without a template: `role: content` lines, then `assistant:`
/// (for models that ship none, such as the tiny test fixtures).
fn render_plain(messages: &[ChatMessage<'_>], w: &mut dyn Write) -> core::fmt::Result {
    for m in messages {
        writeln!(w, "{}: {}", m.role, m.content)?;
    }
    w.write_str("assistant:")
}

fn prepare<P: Platform>(
    ctx: &Ctx<'_, '_, '_, P>,
    bufs: &mut Bufs<'_>,
    api: Api,
    body: &[u8],
    why: &mut Msg,
) -> Result<Prepared, Refusal> {
    let mut refuse = |status: u16, d: &dyn core::fmt::Display| -> Refusal {
        *why = msg(d);
        status
    };
    let req = json::parse(api, body).map_err(|e| refuse(400, &e))?;
    let half = bufs.text.len() / 2;
    let (strs, render) = bufs.text.split_at_mut(half);
    let mut strs: &mut [u8] = strs;
    let text: &str = match api {
        Api::Chat => {
            let mut msgs: heapless::Vec<ChatMessage<'_>, { json::MAX_MESSAGES }> =
                heapless::Vec::new();
            for m in req.messages.iter() {
                let role = json::unescape(&m.role, &mut strs).map_err(|e| refuse(400, &e))?;
                let content = match &m.content {
                    Some(c) => json::unescape(c, &mut strs).map_err(|e| refuse(400, &e))?,
                    None => "",
                };
                let _ = msgs.push(ChatMessage::new(role, content));
            }
            let mut w = SliceWriter {
                buf: render,
                len: 0,
            };
            let ok = match ChatTemplate::from_gguf(ctx.g) {
                Ok(t) => t.render(&msgs, true, &mut w).is_ok(),
                Err(_) => render_plain(&msgs, &mut w).is_ok(),
            };
            if !ok {
                return Err(refuse(
                    400,
                    &"the conversation is too long for the request buffer",
                ));
            }
            let n = w.len;
            core::str::from_utf8(&w.buf[..n]).map_err(|_| refuse(400, &"invalid UTF-8"))?
        }
        Api::Completions | Api::Llama => {
            let mut r: &mut [u8] = render;
            let prompt = req
                .prompt
                .as_ref()
                .ok_or_else(|| refuse(400, &"'prompt' is required"))?;
            json::unescape(prompt, &mut r).map_err(|e| refuse(400, &e))?
        }
    };
    let n_ctx = ctx.sess.opts.n_ctx;
    if text.len() > bufs.prompt_limit {
        let (len, limit) = (text.len(), bufs.prompt_limit);
        return Err(refuse(
            400,
            &format_args!(
                "the prompt has {len} bytes; this server accepts {limit} (context {n_ctx} tokens)"
            ),
        ));
    }
    let need = ctx.tok.scratch_bytes(text.len());
    let scratch = bufs
        .scratch
        .get_mut(..need)
        .ok_or_else(|| refuse(400, &"prompt too long"))?;
    let n = match ctx
        .tok
        .encode(text, !ctx.o.no_bos, true, scratch, bufs.tokens)
    {
        Ok(n) => n,
        Err(TokenizerError::OutputFull { .. }) => n_ctx + 1,
        Err(e) => return Err(refuse(400, &e)),
    };
    if n >= n_ctx {
        return Err(refuse(400, &format_args!("the prompt needs {n} or more tokens but the context holds {n_ctx} (with room for one generated token)")));
    }
    if n == 0 {
        return Err(refuse(400, &"the prompt is empty"));
    }
    let mut stops = heapless::Vec::new();
    for s in req.stop.iter() {
        let mut store = [0u8; MAX_STOP_LEN];
        let mut b: &mut [u8] = &mut store;
        let t =
            json::unescape(s, &mut b).map_err(|_| refuse(400, &json::BodyError::StopTooLong))?;
        let _ = stops.push(heapless::Vec::from_slice(t.as_bytes()).unwrap_or_default());
    }
    if api == Api::Chat {
        if let Ok(t) = ChatTemplate::from_gguf(ctx.g) {
            if stops.len() < MAX_STOP {
                let _ = stops.push(
                    heapless::Vec::from_slice(t.end_of_turn().as_bytes()).unwrap_or_default(),
                );
            }
        }
    }
    Ok(Prepared {
        n_prompt: n,
        p: req.p,
        stops,
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

/// A token's probability figures.
#[derive(Clone, Copy)]
struct TokProbs {
    lp: f32,
    n: usize,
    top: [Candidate; MAX_TOP],
}

impl TokProbs {
    const EMPTY: TokProbs = TokProbs {
        lp: 0.0,
        n: 0,
        top: [Candidate { id: 0, logit: 0.0 }; MAX_TOP],
    };
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

/// Why a generation ended.
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

/// Identity and figures shared by every event of one response.
struct Resp<'s> {
    api: Api,
    id: u64,
    model: &'s str,
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
            "{{\"id\":\"{prefix}-{}\",\"object\":\"{object}\",\"created\":0,\"model\":",
            self.id
        )?;
        json_str(w, self.model)
    }
}

/// One token's log-probability entry (OpenAI chat and llama-server shape).
fn entry<P: Platform>(
    w: &mut dyn Write,
    ctx: &Ctx<'_, '_, '_, P>,
    id: u32,
    t: &TokProbs,
    with_id: bool,
) -> core::fmt::Result {
    let one = |w: &mut dyn Write, id: u32, lp: f32| -> core::fmt::Result {
        w.write_char('{')?;
        if with_id {
            write!(w, "\"id\":{id},")?;
        }
        let b = ctx.tok.token_bytes(id);
        w.write_str("\"token\":")?;
        json_bytes_str(w, b)?;
        w.write_str(",\"logprob\":")?;
        json_f32(w, lp)?;
        w.write_str(",\"bytes\":")?;
        json_byte_list(w, b)
    };
    one(w, id, t.lp)?;
    w.write_str(",\"top_logprobs\":[")?;
    for (k, c) in t.top[..t.n].iter().enumerate() {
        if k > 0 {
            w.write_char(',')?;
        }
        one(w, c.id, c.logit)?;
        w.write_char('}')?;
    }
    w.write_str("]}")
}

struct Timings {
    prompt_n: usize,
    /// Prompt tokens reused from the cache (not evaluated).
    cached: usize,
    prompt_s: f64,
    gen_n: usize,
    gen_s: f64,
}

impl Timings {
    fn write(&self, w: &mut dyn Write) -> core::fmt::Result {
        let per = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        write!(
            w,
            "{{\"prompt_n\":{},\"prompt_ms\":{:.3},\"prompt_per_second\":{:.3},\"predicted_n\":{},\"predicted_ms\":{:.3},\"predicted_per_second\":{:.3}}}",
            self.prompt_n - self.cached,
            self.prompt_s * 1e3,
            per(self.prompt_n - self.cached, self.prompt_s),
            self.gen_n,
            self.gen_s * 1e3,
            per(self.gen_n, self.gen_s)
        )
    }
    fn usage(&self, w: &mut dyn Write) -> core::fmt::Result {
        write!(
            w,
            "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}}}",
            self.prompt_n,
            self.gen_n,
            self.prompt_n + self.gen_n
        )
    }
}

/// Stream event for one token with released text `text`.
fn token_event<P: Platform>(
    w: &mut dyn Write,
    r: &Resp<'_>,
    ctx: &Ctx<'_, '_, '_, P>,
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
                    entry(w, ctx, id, t, false)?;
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
                    json_bytes_str(w, ctx.tok.token_bytes(id))?;
                    w.write_str("],\"token_logprobs\":[")?;
                    json_f32(w, t.lp)?;
                    w.write_str("],\"top_logprobs\":[{")?;
                    for (k, c) in t.top[..t.n].iter().enumerate() {
                        if k > 0 {
                            w.write_char(',')?;
                        }
                        json_bytes_str(w, ctx.tok.token_bytes(c.id))?;
                        w.write_char(':')?;
                        json_f32(w, c.logit)?;
                    }
                    w.write_str("}]}")?;
                }
                None => w.write_str("null")?,
            }
            w.write_str(",\"finish_reason\":null}]}")?;
        }
        Api::Llama => {
            w.write_str("{\"index\":0,\"content\":")?;
            json_bytes_str(w, text)?;
            write!(w, ",\"tokens\":[{id}],\"stop\":false,\"id_slot\":0")?;
            if let Some(t) = t {
                w.write_str(",\"completion_probabilities\":[")?;
                entry(w, ctx, id, t, true)?;
                w.write_str("]")?;
            }
            w.write_str("}")?;
        }
    }
    w.write_str("\n\n")
}

/// Final stream event(s).
fn final_event(
    w: &mut dyn Write,
    r: &Resp<'_>,
    fin: Finish,
    tm: &Timings,
    stop_word: &[u8],
) -> core::fmt::Result {
    w.write_str("data: ")?;
    match r.api {
        Api::Chat | Api::Completions => {
            if r.api == Api::Chat {
                r.open(w, "chat.completion.chunk")?;
                w.write_str(",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,")?;
            } else {
                r.open(w, "text_completion")?;
                w.write_str(",\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,")?;
            }
            write!(w, "\"finish_reason\":\"{}\"}}],\"usage\":", fin.openai())?;
            tm.usage(w)?;
            w.write_str(",\"timings\":")?;
            tm.write(w)?;
            w.write_str("}\n\ndata: [DONE]\n\n")
        }
        Api::Llama => {
            w.write_str("{\"index\":0,\"content\":\"\",\"stop\":true,\"model\":")?;
            json_str(w, r.model)?;
            write!(w, ",\"tokens_predicted\":{},\"tokens_evaluated\":{},\"tokens_cached\":{},\"stop_type\":\"{}\",\"stopping_word\":", tm.gen_n, tm.prompt_n, tm.cached, fin.llama())?;
            json_bytes_str(w, stop_word)?;
            w.write_str(",\"timings\":")?;
            tm.write(w)?;
            w.write_str("}\n\n")
        }
    }
}

/// Recorded log-probabilities of the generated tokens.
#[derive(Clone, Copy)]
struct Recs<'r> {
    ids: &'r [u32],
    lps: &'r [f32],
    /// Alternatives per token.
    n_top: usize,
    /// Tokens recorded.
    count: usize,
}

/// The whole non-streamed body.
#[allow(clippy::too_many_arguments)]
fn full_body<P: Platform>(
    w: &mut dyn Write,
    r: &Resp<'_>,
    ctx: &Ctx<'_, '_, '_, P>,
    text: &[u8],
    recs: Option<Recs<'_>>,
    fin: Finish,
    tm: &Timings,
    stop_word: &[u8],
) -> core::fmt::Result {
    let stride = MAX_TOP + 1;
    let n_rec = recs.map_or(0, |r| r.count);
    let rec = |j: usize| -> (u32, TokProbs) {
        let Recs {
            ids, lps, n_top: n, ..
        } = recs.unwrap_or(Recs {
            ids: &[],
            lps: &[],
            n_top: 0,
            count: 0,
        });
        let mut t = TokProbs::EMPTY;
        let base = j * stride;
        t.lp = lps[base];
        t.n = n;
        for k in 0..n {
            t.top[k] = Candidate {
                id: ids[base + 1 + k],
                logit: lps[base + 1 + k],
            };
        }
        (ids[base], t)
    };
    match r.api {
        Api::Chat => {
            r.open(w, "chat.completion")?;
            w.write_str(
                ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
            )?;
            json_bytes_str(w, text)?;
            w.write_str("},\"logprobs\":")?;
            if recs.is_some() {
                w.write_str("{\"content\":[")?;
                for j in 0..n_rec {
                    if j > 0 {
                        w.write_char(',')?;
                    }
                    let (id, t) = rec(j);
                    entry(w, ctx, id, &t, false)?;
                }
                w.write_str("]}")?;
            } else {
                w.write_str("null")?;
            }
            write!(w, ",\"finish_reason\":\"{}\"}}],\"usage\":", fin.openai())?;
            tm.usage(w)?;
        }
        Api::Completions => {
            r.open(w, "text_completion")?;
            w.write_str(",\"choices\":[{\"index\":0,\"text\":")?;
            json_bytes_str(w, text)?;
            w.write_str(",\"logprobs\":")?;
            if recs.is_some() {
                w.write_str("{\"tokens\":[")?;
                for j in 0..n_rec {
                    if j > 0 {
                        w.write_char(',')?;
                    }
                    json_bytes_str(w, ctx.tok.token_bytes(rec(j).0))?;
                }
                w.write_str("],\"token_logprobs\":[")?;
                for j in 0..n_rec {
                    if j > 0 {
                        w.write_char(',')?;
                    }
                    json_f32(w, rec(j).1.lp)?;
                }
                w.write_str("],\"top_logprobs\":[")?;
                for j in 0..n_rec {
                    if j > 0 {
                        w.write_char(',')?;
                    }
                    let t = rec(j).1;
                    w.write_char('{')?;
                    for (k, c) in t.top[..t.n].iter().enumerate() {
                        if k > 0 {
                            w.write_char(',')?;
                        }
                        json_bytes_str(w, ctx.tok.token_bytes(c.id))?;
                        w.write_char(':')?;
                        json_f32(w, c.logit)?;
                    }
                    w.write_char('}')?;
                }
                w.write_str("]}")?;
            } else {
                w.write_str("null")?;
            }
            write!(w, ",\"finish_reason\":\"{}\"}}],\"usage\":", fin.openai())?;
            tm.usage(w)?;
        }
        Api::Llama => {
            w.write_str("{\"index\":0,\"content\":")?;
            json_bytes_str(w, text)?;
            w.write_str(",\"model\":")?;
            json_str(w, r.model)?;
            write!(w, ",\"stop\":true,\"tokens_predicted\":{},\"tokens_evaluated\":{},\"tokens_cached\":{},\"stop_type\":\"{}\",\"stopping_word\":", tm.gen_n, tm.prompt_n, tm.cached, fin.llama())?;
            json_bytes_str(w, stop_word)?;
            if recs.is_some() {
                w.write_str(",\"completion_probabilities\":[")?;
                for j in 0..n_rec {
                    if j > 0 {
                        w.write_char(',')?;
                    }
                    let (id, t) = rec(j);
                    entry(w, ctx, id, &t, true)?;
                }
                w.write_str("]")?;
            }
        }
    }
    w.write_str(",\"timings\":")?;
    tm.write(w)?;
    w.write_str("}")
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
    if api != Api::Llama {
        w.write_str("data: [DONE]\n\n")?;
    }
    Ok(())
}

/// Serve the active request in slot `i`, then free the slot. `guard` is checked before
/// the prompt and before each token's pass: when it stops the generation, the client
/// gets a 503 error (non-streamed) or an error event (streamed) saying why, and the
/// server goes on with the next request.
pub fn serve_one<P: Platform>(
    ctx: &mut Ctx<'_, '_, '_, P>,
    io: &mut Io<'_, '_, '_, P>,
    bufs: &mut Bufs<'_>,
    guard: &mut MemoryGuard,
    i: usize,
) {
    // Take the request buffer out of the slot so the loop can poll the others meanwhile.
    let buf = core::mem::take(&mut io.slots[i].buf);
    let (api, (b0, b1), sock) = (io.slots[i].api, io.slots[i].body, io.slots[i].sock);
    let mut why = Msg::new();
    let prep = prepare(ctx, bufs, api, &buf[b0..b1], &mut why);
    io.slots[i].buf = buf;
    let prep = match prep {
        Ok(p) => p,
        Err(status) => return io.fail(i, status, &why.as_str()),
    };
    io.m.generations += 1;
    let r = Resp {
        api,
        id: io.m.generations,
        model: io.info.model_id,
    };
    let p = ctx.p;
    let o = ctx.o;
    let mut sp = o.sampler;
    let q = prep.p;
    sp.temp = q.temperature.unwrap_or(sp.temp);
    sp.top_p = q.top_p.unwrap_or(sp.top_p);
    sp.top_k = q.top_k.map_or(sp.top_k, |k| k as usize);
    sp.min_p = q.min_p.unwrap_or(sp.min_p);
    sp.repeat_penalty = q.repeat_penalty.unwrap_or(sp.repeat_penalty);
    sp.seed = q.seed.unwrap_or(sp.seed);
    let ignore_eos = q.ignore_eos.unwrap_or(o.ignore_eos);
    let n_ctx = ctx.sess.opts.n_ctx;
    let n_prompt = prep.n_prompt;
    let max_new = (q.max_tokens.map_or(o.n_predict, |n| n as usize)).min(n_ctx - n_prompt);
    let k = q.top;
    let want = q.logprobs;
    let stride = MAX_TOP + 1;
    let max_recs = bufs.rec_id.len() / stride;

    let mut sampler = Sampler::new(sp);
    for &t in &bufs.tokens[..n_prompt] {
        sampler.accept(t);
    }
    // Keep the longest cached prefix; at least one prompt token is evaluated, for the
    // logits of the first generated token.
    let reuse = if q.cache_prompt && ctx.sess.n_past() >= bufs.n_cached {
        let same = bufs.cache[..bufs.n_cached]
            .iter()
            .zip(&bufs.tokens[..n_prompt])
            .take_while(|(a, b)| a == b)
            .count();
        same.min(n_prompt - 1)
    } else {
        0
    };
    // Through `truncate`: a model whose state cannot go back refuses, and the prompt
    // is evaluated from the start.
    if ctx.sess.truncate(reuse).is_err() {
        ctx.sess.reset();
    }
    let reuse = ctx.sess.n_past();
    bufs.n_cached = reuse;
    let mut w = SockWriter::new(p, sock);
    let mut tm = Timings {
        prompt_n: n_prompt,
        cached: reuse,
        prompt_s: 0.0,
        gen_n: 0,
        gen_s: 0.0,
    };
    let t0 = p.now_ns();
    let mut next = 0u32;
    let mut cur = TokProbs::EMPTY;
    let nb = ctx.sess.opts.n_batch.max(1);
    let mut gone = false;
    let mut failed = false;
    if let Err(s) = guard.watch(p, &mut || ctx.sess.give_back(p)) {
        let m = guard_stopped(p, io, s, 0);
        return io.fail(i, 503, &m.as_str());
    }
    let mut start = reuse;
    while start < n_prompt {
        let end = (start + nb).min(n_prompt);
        let which = if end == n_prompt {
            Logits::Last
        } else {
            Logits::None
        };
        let res = ctx
            .sess
            .eval(p, &bufs.tokens[start..end], which, &mut |_, l| {
                next = sampler.sample(l);
                if want {
                    cur = probs(l, next, k);
                }
            });
        if res.is_err() {
            failed = true;
            break;
        }
        bufs.cache[start..end].copy_from_slice(&bufs.tokens[start..end]);
        bufs.n_cached = end;
        start = end;
        io.poll();
        if io.client_gone(i) {
            gone = true;
            break;
        }
    }
    let t1 = p.now_ns();
    tm.prompt_s = secs(t0, t1);
    let evaluated = n_prompt - reuse;
    io.m.prompt_tokens += evaluated as u64;
    io.m.prompt_tps = if tm.prompt_s > 0.0 {
        evaluated as f64 / tm.prompt_s
    } else {
        0.0
    };
    if failed {
        return io.fail(i, 500, &"the model failed to evaluate the prompt");
    }
    if gone {
        io.m.disconnects += 1;
        return io.free(i);
    }
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
            let _ = w.write_str(",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        }
        w.flush();
    }
    let mut stream = Utf8Stream::new();
    let mut matcher = StopMatcher {
        held: heapless::Vec::new(),
    };
    let mut out_len = 0usize;
    let mut fin = Finish::Length;
    let mut stopped = None;
    let stops = &prep.stops[..];
    loop {
        if tm.gen_n >= max_new {
            break;
        }
        if ctx.tok.is_eog(next) && !ignore_eos {
            fin = Finish::Eos;
            break;
        }
        let id = next;
        if want && tm.gen_n < max_recs {
            let base = tm.gen_n * stride;
            bufs.rec_id[base] = id;
            bufs.rec_lp[base] = cur.lp;
            for (kk, c) in cur.top[..cur.n].iter().enumerate() {
                bufs.rec_id[base + 1 + kk] = c.id;
                bufs.rec_lp[base + 1 + kk] = c.logit;
            }
        }
        // Released text of this token: through the UTF-8 assembler and the stop matcher.
        let mut piece: heapless::Vec<u8, 1024> = heapless::Vec::new();
        let mut hit = None;
        let _ = stream.push(ctx.tok.token_bytes(id), &mut |s: &str| -> Result<(), ()> {
            if hit.is_none() {
                hit = matcher.push(s.as_bytes(), stops, &mut |b| {
                    let _ = piece.extend_from_slice(b);
                });
            }
            Ok(())
        });
        tm.gen_n += 1;
        io.m.tokens_generated += 1;
        if q.stream {
            let _ = token_event(&mut w, &r, ctx, &piece, id, want.then_some(&cur));
            if !w.flush() {
                gone = true;
                break;
            }
        } else {
            let take = piece.len().min(bufs.out.len() - out_len);
            bufs.out[out_len..out_len + take].copy_from_slice(&piece[..take]);
            out_len += take;
        }
        if let Some(kk) = hit {
            fin = Finish::Word(kk);
            break;
        }
        if ctx.sess.n_past() >= n_ctx || tm.gen_n >= max_new {
            break;
        }
        if let Err(s) = guard.watch(p, &mut || ctx.sess.give_back(p)) {
            stopped = Some(s);
            break;
        }
        sampler.accept(id);
        let res = ctx.sess.eval(p, &[id], Logits::Last, &mut |_, l| {
            next = sampler.sample(l);
            if want {
                cur = probs(l, next, k);
            }
        });
        tm.gen_s = secs(t1, p.now_ns());
        io.m.gen_tps = if tm.gen_s > 0.0 {
            tm.gen_n as f64 / tm.gen_s
        } else {
            0.0
        };
        if res.is_err() {
            break;
        }
        if bufs.n_cached < bufs.cache.len() {
            bufs.cache[bufs.n_cached] = id;
            bufs.n_cached += 1;
        }
        io.poll();
        if io.client_gone(i) {
            gone = true;
            break;
        }
    }
    tm.gen_s = secs(t1, p.now_ns());
    io.m.gen_tps = if tm.gen_s > 0.0 {
        tm.gen_n as f64 / tm.gen_s
    } else {
        0.0
    };
    if gone {
        io.m.disconnects += 1;
        return io.free(i);
    }
    if let Some(s) = stopped {
        let m = guard_stopped(p, io, s, tm.gen_n);
        if !q.stream {
            return io.fail(i, 503, &m.as_str());
        }
        // The text released so far has been sent; what is held back is dropped.
        let _ = error_event(&mut w, api, 503, &m);
        w.flush();
        return io.free(i);
    }
    // Text still held: an incomplete character, or a prefix of a stop string that
    // never completed.
    let mut tail: heapless::Vec<u8, 1024> = heapless::Vec::new();
    if !matches!(fin, Finish::Word(_)) {
        let _ = stream.finish(&mut |s: &str| -> Result<(), ()> {
            let _ = tail.extend_from_slice(s.as_bytes());
            Ok(())
        });
        let _ = tail.extend_from_slice(&matcher.held);
    }
    let stop_word: &[u8] = match fin {
        Finish::Word(kk) => &stops[kk],
        _ => b"",
    };
    if q.stream {
        if !tail.is_empty() {
            let _ = w.write_str("data: ");
            let _ = match api {
                Api::Chat => {
                    let _ = r.open(&mut w, "chat.completion.chunk");
                    let _ = w.write_str(",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
                    let _ = json_bytes_str(&mut w, &tail);
                    w.write_str("},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
                }
                Api::Completions => {
                    let _ = r.open(&mut w, "text_completion");
                    let _ = w.write_str(",\"choices\":[{\"index\":0,\"text\":");
                    let _ = json_bytes_str(&mut w, &tail);
                    w.write_str(",\"logprobs\":null,\"finish_reason\":null}]}\n\n")
                }
                Api::Llama => {
                    let _ = w.write_str("{\"index\":0,\"content\":");
                    let _ = json_bytes_str(&mut w, &tail);
                    w.write_str(",\"stop\":false,\"id_slot\":0}\n\n")
                }
            };
        }
        let _ = final_event(&mut w, &r, fin, &tm, stop_word);
        w.flush();
    } else {
        let take = tail.len().min(bufs.out.len() - out_len);
        bufs.out[out_len..out_len + take].copy_from_slice(&tail[..take]);
        out_len += take;
        let n_rec = tm.gen_n.min(max_recs);
        let recs = want.then(|| Recs {
            ids: &bufs.rec_id[..n_rec * stride],
            lps: &bufs.rec_lp[..n_rec * stride],
            n_top: cur.n.min(k),
            count: n_rec,
        });
        let text = &bufs.out[..out_len];
        let c: &Ctx<'_, '_, '_, P> = ctx;
        http::respond(p, sock, 200, "application/json", "", &|w| {
            full_body(w, &r, c, text, recs, fin, &tm, stop_word)
        });
    }
    io.free(i);
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
    fn plain_rendering_for_models_without_a_template() {
        let mut s: heapless::String<128> = heapless::String::new();
        render_plain(&[ChatMessage::new("user", "hi")], &mut s).unwrap();
        assert_eq!(s.as_str(), "user: hi\nassistant:");
    }
}
