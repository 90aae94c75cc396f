//! `pinch serve`: an HTTP server for the OpenAI and llama-server APIs and a web page,
//! written against the `Platform` socket calls so it runs wherever the engine runs.
//!
//! # Design: one thread, a table of connection slots, N generation slots
//!
//! The engine thread does everything. The platform gives it non-blocking sockets
//! (`tcp_accept`, `tcp_recv`; `tcp_send` may wait a bounded time for a slow reader), and
//! [`Io::poll`] moves every connection one step: it accepts new connections into free
//! slots, reads request bytes into each slot's fixed buffer, parses the head with
//! `httparse` and, once the body is complete, answers at once whatever does not need
//! the model (`/health`, `/v1/models`, `/metrics`, the page, every 4xx) or checks the
//! body of a generation request and puts its slot in the queue. The server loop runs
//! the queued generations, and the generation calls `poll` between
//! weight passes (each prompt batch and each token), so health checks, metrics, 503s
//! and new queue entries are answered while a generation runs, and a client that
//! disconnects (seen by `tcp_recv` or a failed send) stops its generation at the next
//! token. No threads, no locks, no allocation: a few more syscalls per token.
//! The session's KV cache is kept between requests: a prompt that starts with the
//! tokens of the previous request (the next turn of a chat) evaluates only the rest.
//!
//! With `--parallel N` the session holds N sequences (`-c / N` positions each) and
//! [`batch`] runs the loop instead: up to N requests at once, each in a generation
//! slot of its own (buffers, sequence, cached tokens; a new request takes the free slot
//! whose cache holds most of its prompt), the next token of all of them decoded in one
//! weight pass, connections polled between passes. Without it, [`answer::serve_one`]
//! answers one request at a time as before (with drafts, `--draft`).
//!
//! Limits: [`http::MAX_HEAD`] bytes and [`http::MAX_HEADERS`] lines of head (431),
//! [`MAX_BODY`] bytes of body (413), [`READ_TIMEOUT_NS`] to send a whole request (408),
//! `--queue` waiting generations (503 with `Retry-After`), queue + N + [`SPARE_SLOTS`]
//! connections at once (503 beyond). Bodies that are not JSON, have fields of the wrong
//! type or out of range, name another model (404), or whose prompt does not fit the
//! context get a 4xx with a JSON error; nothing a client sends can panic the loop.
//!
//! # Memory
//!
//! Everything is carved from the arena once, at start: the slot buffers
//! (head + body limit each), the tokenizer scratch for the longest prompt text accepted
//! and the grammar's sorted vocabulary and parser scratch (shared), and per generation
//! slot a [`gen::Lane`]: prompt text and token buffers, output, per-token records for
//! non-streamed log-probabilities, and the slot's grammar, matcher and mask
//! ([`constrain::SlotGrammar`], 456 KiB plus 4 bytes per vocabulary token). A request
//! allocates nothing.
//!
//! - [`http`]: request heads and response heads, buffered socket output.
//! - [`json`]: request bodies (`serde-json-core`) and JSON output helpers.
//! - [`gen`]: a request's prompt and settings, stop strings, the three output formats.
//! - [`answer`]: one request from its body to its response, its sink.
//! - [`batch`]: the loop of `--parallel N`; [`slots`]: its batched step.
//! - [`metrics`]: counters and the Prometheus text.
pub mod answer;
pub mod batch;
pub mod constrain;
pub mod gen;
pub mod http;
pub mod jraw;
pub mod json;
pub mod metrics;
pub mod slots;
pub mod tools;

use core::fmt::Write;

use crate::commands::out::json_str;
use crate::platform::{Platform, Recv, Socket};
use http::{HttpError, Method};
use json::Api;
use metrics::{Live, Metrics};

/// The web page served at `/`.
pub const PAGE: &str = include_str!("page.html");
/// Longest request body.
pub const MAX_BODY: usize = 64 * 1024;
/// Time a client has to send a whole request.
pub const READ_TIMEOUT_NS: u64 = 10_000_000_000;
/// Connections beyond the running and queued requests (for health checks, metrics and
/// requests still being read).
pub const SPARE_SLOTS: usize = 4;
/// Most listening addresses (`--host 127.0.0.1,::1`).
pub const MAX_LISTEN: usize = 4;
/// Most slots (running + queued + spare).
pub const MAX_SLOTS: usize = 40;

/// Most generation slots (`--parallel`): the session's most sequences.
pub const MAX_GEN_SLOTS: usize = crate::model::forward::MAX_SEQS;

/// What one generation slot is doing, as `/slots` reports it.
#[derive(Clone, Copy, Debug, Default)]
pub struct GenSlot {
    /// The generation it runs (`None`: idle).
    pub task: Option<u64>,
    /// Positions its sequence holds.
    pub n_past: usize,
    /// Tokens generated for the running answer, and how many it may still generate
    /// (`None`: idle, or not followed: one slot without `--parallel`).
    pub n_decoded: usize,
    pub n_remain: Option<usize>,
}

/// What a connection slot is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Free,
    Reading,
    Queued,
    Active,
}

/// One connection and its request buffer.
pub struct Slot<'a> {
    pub sock: Socket,
    pub buf: &'a mut [u8],
    pub len: usize,
    pub since: u64,
    pub state: State,
    pub api: Api,
    /// Range of the body in `buf`.
    pub body: (usize, usize),
    /// `100 Continue` has been sent.
    pub continued: bool,
    /// The request carried the `--api-key` (or none is needed).
    pub authorized: bool,
    /// The request's `Origin` (for CORS), cut at 128 bytes.
    pub origin: heapless::String<128>,
}

/// What the server says about itself.
#[derive(Clone, Copy, Debug)]
pub struct Info<'s> {
    /// The model id clients see (file name without `.gguf`).
    pub model_id: &'s str,
    /// Other names a request may use for the model (path, file name, `general.name`).
    pub aliases: [&'s str; 3],
    pub budget: Option<u64>,
    pub n_ctx: usize,
    /// The model file as given.
    pub path: &'s str,
    /// `--alias`: comma-separated names (the first in sort order is the id).
    pub alias: Option<&'s str>,
    /// `--api-key`: requests other than `/health`, `/v1/health` and the page's files
    /// need `Authorization: Bearer KEY` or `X-Api-Key: KEY`.
    pub api_key: Option<&'s str>,
    /// `--parallel`: generation slots, each with `n_ctx` positions of its own (answers
    /// in different slots are decoded together).
    pub n_parallel: usize,
    pub webui: bool,
    pub slots: bool,
    pub metrics: bool,
    /// `--cors-origins localhost`: only loopback origins are reflected.
    pub cors_local_only: bool,
    /// `--tags`.
    pub tags: Option<&'s str>,
    /// When the server started (Unix seconds), if the platform has a clock.
    pub start_unix: Option<u64>,
    /// `-v`: every chat answer carries `__verbose.prompt` (llama-server's `--verbose`).
    pub verbose: bool,
    /// Defaults reported by `/props`.
    pub n_predict: usize,
    pub seed: u64,
}

impl Info<'_> {
    /// Whether a request naming `m` is for this model. llama-server answers any name
    /// when it serves one model (clients send theirs: `gpt-3.5-turbo`, `davinci-002`);
    /// so does pinch.
    fn knows(&self, _m: &serde_json_core::str::EscapedStr<'_>) -> bool {
        true
    }
}

/// Where a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Page,
    Health,
    Models,
    Metrics,
    Preflight,
    Props,
    Slots,
    /// `GET /v1/models/{id}`.
    Model,
    /// Files the page's service worker and manifest requests ask for.
    Asset(&'static str, &'static str),
    Gen(Api),
    WrongMethod,
    NotFound,
}

fn route(method: Method, path: &str) -> Route {
    let (get, post) = (method == Method::Get, method == Method::Post);
    if method == Method::Options {
        return Route::Preflight;
    }
    if get && (path.starts_with("/v1/models/") || path.starts_with("/models/")) {
        return Route::Model;
    }
    match path {
        "/props" if get => Route::Props,
        "/slots" if get => Route::Slots,
        "/sw.js" if get => Route::Asset("application/javascript", "// pinch: no offline cache\n"),
        "/manifest.webmanifest" if get => Route::Asset(
            "application/manifest+json",
            "{\"name\":\"pinch\",\"start_url\":\"/\",\"display\":\"standalone\"}",
        ),
        "/_app/version.json" if get => Route::Asset(
            "application/json",
            concat!("{\"version\":\"", env!("CARGO_PKG_VERSION"), "\"}"),
        ),
        "/tokenize" if post => Route::Gen(Api::Tokenize),
        "/detokenize" if post => Route::Gen(Api::Detokenize),
        "/infill" if post => Route::Gen(Api::Infill),
        "/apply-template" if post => Route::Gen(Api::ApplyTemplate),
        "/v1/chat/completions/input_tokens" | "/chat/completions/input_tokens" if post => {
            Route::Gen(Api::InputTokens)
        }
        "/completions" if post => Route::Gen(Api::Llama),
        "/" | "/index.html" if get => Route::Page,
        "/health" | "/v1/health" if get => Route::Health,
        "/v1/models" | "/models" if get => Route::Models,
        "/metrics" if get => Route::Metrics,
        "/v1/chat/completions" | "/chat/completions" if post => Route::Gen(Api::Chat),
        "/v1/completions" if post => Route::Gen(Api::Completions),
        "/completion" if post => Route::Gen(Api::Llama),
        "/props" | "/slots" | "/tokenize" | "/detokenize" | "/infill" => Route::WrongMethod,
        "/"
        | "/index.html"
        | "/health"
        | "/v1/health"
        | "/v1/models"
        | "/models"
        | "/metrics"
        | "/v1/chat/completions"
        | "/chat/completions"
        | "/v1/completions"
        | "/completions"
        | "/completion" => Route::WrongMethod,
        _ => Route::NotFound,
    }
}

/// The connection side of the server: slots, queue and counters.
pub struct Io<'a, 's, 'p, P: Platform> {
    pub p: &'p P,
    /// Listening sockets (`--host a,b`: one per address).
    pub listeners: heapless::Vec<Socket, MAX_LISTEN>,
    pub slots: heapless::Vec<Slot<'a>, MAX_SLOTS>,
    queue: heapless::Deque<u8, MAX_SLOTS>,
    /// Generations that may wait (`--queue`).
    pub queue_cap: usize,
    /// Generations running (at most `--parallel`).
    pub running: usize,
    /// What each generation slot (`--parallel`) is doing, for `/slots`.
    pub gen_slots: [GenSlot; MAX_GEN_SLOTS],
    pub m: Metrics,
    pub info: Info<'s>,
}

impl<'a, 's, 'p, P: Platform> Io<'a, 's, 'p, P> {
    /// A server on `listener` with slot buffers `bufs` (each [`http::MAX_HEAD`] +
    /// [`MAX_BODY`] bytes).
    pub fn new(
        p: &'p P,
        listeners: &[Socket],
        bufs: impl Iterator<Item = &'a mut [u8]>,
        queue_cap: usize,
        info: Info<'s>,
    ) -> Self {
        let mut slots = heapless::Vec::new();
        for buf in bufs {
            let _ = slots.push(Slot {
                sock: Socket(0),
                buf,
                len: 0,
                since: 0,
                state: State::Free,
                api: Api::Llama,
                body: (0, 0),
                continued: false,
                authorized: false,
                origin: heapless::String::new(),
            });
        }
        Io {
            p,
            listeners: listeners.iter().copied().take(MAX_LISTEN).collect(),
            slots,
            queue: heapless::Deque::new(),
            queue_cap,
            running: 0,
            gen_slots: [GenSlot::default(); MAX_GEN_SLOTS],
            m: Metrics::default(),
            info,
        }
    }

    /// Requests waiting.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Move every connection one step; true when anything happened.
    pub fn poll(&mut self) -> bool {
        let mut busy = false;
        for l in 0..self.listeners.len() {
            for _ in 0..16 {
                match self.p.tcp_accept(self.listeners[l]) {
                    Ok(Some(s)) => {
                        busy = true;
                        self.admit(s);
                    }
                    _ => break,
                }
            }
        }
        for i in 0..self.slots.len() {
            match self.slots[i].state {
                State::Reading => busy |= self.read(i),
                State::Queued => {
                    if self.client_gone(i) {
                        self.m.disconnects += 1;
                        let mut rest = heapless::Deque::new();
                        while let Some(q) = self.queue.pop_front() {
                            if q as usize != i {
                                let _ = rest.push_back(q);
                            }
                        }
                        self.queue = rest;
                        self.free(i);
                        busy = true;
                    }
                }
                State::Free | State::Active => {}
            }
        }
        busy
    }

    /// The next queued request, now active.
    pub fn start_next(&mut self) -> Option<usize> {
        let i = self.queue.pop_front()? as usize;
        self.slots[i].state = State::Active;
        self.running += 1;
        Some(i)
    }

    /// Close slot `i` and make it free.
    pub fn free(&mut self, i: usize) {
        let s = &mut self.slots[i];
        if s.state == State::Active {
            self.running -= 1;
        }
        if s.state != State::Free {
            self.p.tcp_close(s.sock);
        }
        s.state = State::Free;
        s.len = 0;
    }

    /// True when the client of slot `i` has closed its side or reset. Input it sends
    /// after its request is dropped.
    pub fn client_gone(&mut self, i: usize) -> bool {
        let mut sink = [0u8; 256];
        loop {
            match self.p.tcp_recv(self.slots[i].sock, &mut sink) {
                Ok(Recv::Data(n)) if n > 0 => continue,
                Ok(Recv::Pending) => return false,
                _ => return true,
            }
        }
    }

    /// Figures for `/metrics`.
    pub fn live(&self) -> Live {
        Live {
            rss: self.p.rss(),
            peak_rss: self.p.peak_rss(),
            available: self.p.available_memory(),
            budget: self.info.budget,
            queue: self.queue.len(),
            queue_capacity: self.queue_cap,
            generating: self.running > 0,
            processing: self.running,
            n_ctx: self.info.n_ctx,
        }
    }

    /// Answer slot `i` with an error and close it.
    pub fn fail(&mut self, i: usize, status: u16, msg: &dyn core::fmt::Display) {
        if (400..500).contains(&status) {
            self.m.client_errors += 1;
        }
        http::respond_error(self.p, self.slots[i].sock, status, msg);
        self.free(i);
    }

    fn admit(&mut self, s: Socket) {
        let now = self.p.now_ns();
        match self.slots.iter().position(|x| x.state == State::Free) {
            Some(i) => {
                let sl = &mut self.slots[i];
                sl.sock = s;
                sl.len = 0;
                sl.since = now;
                sl.state = State::Reading;
                sl.continued = false;
            }
            None => {
                self.m.rejected_busy += 1;
                http::respond_error(
                    self.p,
                    s,
                    503,
                    &"server busy: too many connections, retry later",
                );
                self.p.tcp_close(s);
            }
        }
    }

    /// Read more of slot `i`'s request; act on it when complete.
    fn read(&mut self, i: usize) -> bool {
        let p = self.p;
        let sl = &mut self.slots[i];
        let start = sl.len;
        match p.tcp_recv(sl.sock, &mut sl.buf[start..]) {
            Ok(Recv::Data(n)) => sl.len += n,
            Ok(Recv::Pending) => {
                if p.now_ns().saturating_sub(sl.since) > READ_TIMEOUT_NS {
                    self.fail(i, 408, &"the request was not sent in time");
                    return true;
                }
                return false;
            }
            Ok(Recv::Closed) | Err(_) => {
                self.free(i);
                return true;
            }
        }
        let (r, body) = match http::parse_head(&sl.buf[..sl.len], MAX_BODY) {
            Err(e) => {
                self.fail(i, e.status(), &e);
                return true;
            }
            Ok(None) => return true,
            Ok(Some(h)) if sl.len < h.head_len + h.body_len => {
                if h.expect_continue && !sl.continued {
                    sl.continued = true;
                    let _ = p.tcp_send(sl.sock, b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                return true;
            }
            Ok(Some(h)) => {
                sl.authorized = match self.info.api_key {
                    None => true,
                    Some(k) => h.api_key == Some(k.as_bytes()),
                };
                sl.origin.clear();
                if let Some(o) = h.origin.and_then(|o| core::str::from_utf8(o).ok()) {
                    let _ = sl.origin.push_str(&o[..o.floor_char_boundary(128)]);
                }
                (
                    route(h.method, h.path),
                    (h.head_len, h.head_len + h.body_len),
                )
            }
        };
        sl.body = body;
        self.m.requests += 1;
        self.dispatch(i, r);
        true
    }

    fn dispatch(&mut self, i: usize, r: Route) {
        let (p, sock) = (self.p, self.slots[i].sock);
        let info = self.info;
        let public = matches!(
            r,
            Route::Health | Route::Page | Route::Asset(..) | Route::Preflight
        );
        if !public && !self.slots[i].authorized {
            self.m.client_errors += 1;
            http::respond_error(
                p,
                sock,
                401,
                &"invalid API key: send 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'",
            );
            return self.free(i);
        }
        match r {
            Route::Page if !info.webui => {
                return self.fail(i, 404, &"the web page is off (--no-webui)")
            }
            Route::Page => {
                http::respond(p, sock, 200, "text/html; charset=utf-8", "", &|w| {
                    w.write_str(PAGE)
                });
            }
            Route::Asset(kind, text) => {
                http::respond(p, sock, 200, kind, "", &|w| w.write_str(text));
            }
            Route::Health => {
                http::respond(p, sock, 200, "application/json", "", &|w| {
                    w.write_str("{\"status\":\"ok\"}")
                });
            }
            Route::Models | Route::Model => {
                let one = r == Route::Model;
                http::respond(p, sock, 200, "application/json", "", &|w| {
                    if !one {
                        w.write_str("{\"object\":\"list\",\"data\":[")?;
                    }
                    w.write_str("{\"id\":")?;
                    json_str(w, info.model_id)?;
                    w.write_str(",\"aliases\":[")?;
                    for (k, a) in info.alias.unwrap_or(info.model_id).split(',').enumerate() {
                        if k > 0 {
                            w.write_char(',')?;
                        }
                        json_str(w, a.trim())?;
                    }
                    w.write_str("],\"tags\":[")?;
                    for (k, t) in info
                        .tags
                        .unwrap_or("")
                        .split(',')
                        .filter(|t| !t.trim().is_empty())
                        .enumerate()
                    {
                        if k > 0 {
                            w.write_char(',')?;
                        }
                        json_str(w, t.trim())?;
                    }
                    write!(w, "],\"object\":\"model\",\"created\":0,\"owned_by\":\"pinch\",\"meta\":{{\"n_ctx\":{}}}}}", info.n_ctx)?;
                    if !one {
                        w.write_str("]}")?;
                    }
                    Ok(())
                });
            }
            Route::Props => {
                let busy = self.running > 0;
                http::respond(p, sock, 200, "application/json", "", &|w| {
                    w.write_str("{\"model_path\":")?;
                    json_str(w, info.path)?;
                    w.write_str(",\"model_alias\":")?;
                    json_str(w, info.model_id)?;
                    write!(w, ",\"total_slots\":{},\"is_processing\":{busy},\"build_info\":\"{}\",\"default_generation_settings\":{{\"id\":0,\"n_ctx\":{},\"is_processing\":{busy},\"params\":{{\"n_predict\":{},\"seed\":{}}}}}}}",
                        info.n_parallel, gen::FINGERPRINT, info.n_ctx, info.n_predict as i64, info.seed)
                });
            }
            Route::Slots if !info.slots => {
                return self.fail(i, 501, &"the /slots endpoint is off (--no-slots)")
            }
            Route::Slots => {
                let views = self.gen_slots;
                http::respond(p, sock, 200, "application/json", "", &|w| {
                    w.write_char('[')?;
                    for k in 0..info.n_parallel.max(1) {
                        if k > 0 {
                            w.write_char(',')?;
                        }
                        let v = views.get(k).copied().unwrap_or_default();
                        // llama-server's shape: `next_token` is a list (one entry per
                        // answer of the slot), `n_remain` -1 when idle.
                        write!(
                            w,
                            "{{\"id\":{k},\"id_task\":{},\"n_ctx\":{},\"is_processing\":{},\"n_past\":{},\"next_token\":[{{\"has_next_token\":{},\"has_new_line\":false,\"n_remain\":{},\"n_decoded\":{}}}]}}",
                            v.task.map_or(-1, |t| t as i64),
                            info.n_ctx,
                            v.task.is_some(),
                            v.n_past,
                            v.task.is_some(),
                            v.n_remain.map_or(-1, |n| n as i64),
                            v.n_decoded
                        )?;
                    }
                    w.write_char(']')
                });
            }
            Route::Metrics if !info.metrics => {
                return self.fail(i, 501, &"the /metrics endpoint is off (--no-metrics)")
            }
            Route::Metrics => {
                let (m, l) = (self.m, self.live());
                let mut extra: heapless::String<64> = heapless::String::new();
                if let Some(t) = info.start_unix {
                    let _ = write!(extra, "Process-Start-Time-Unix: {t}\r\n");
                }
                http::respond(p, sock, 200, "text/plain; version=0.0.4", &extra, &|w| {
                    m.write(&l, w)
                });
            }
            Route::Preflight => {
                // llama-server's CORS: the origin reflected (with --cors-origins
                // localhost, only a loopback one), credentials allowed.
                let o = self.slots[i].origin.as_str();
                let mut extra: heapless::String<384> = heapless::String::new();
                if !o.is_empty() && (!info.cors_local_only || is_loopback_origin(o)) {
                    let _ = write!(extra, "Access-Control-Allow-Origin: {o}\r\n");
                } else if !info.cors_local_only {
                    let _ = extra.push_str("Access-Control-Allow-Origin: *\r\n");
                }
                let _ = extra.push_str("Access-Control-Allow-Credentials: true\r\nAccess-Control-Allow-Methods: GET, POST, DELETE, OPTIONS\r\nAccess-Control-Allow-Headers: *\r\n");
                http::respond(p, sock, 200, "", &extra, &|_| Ok(()));
            }
            Route::WrongMethod => {
                return self.fail(
                    i,
                    405,
                    &HttpError::BadRequest("method not allowed for this path"),
                )
            }
            Route::NotFound => return self.fail(i, 404, &"no such endpoint"),
            Route::Gen(api) => return self.enqueue(i, api),
        }
        self.free(i);
    }

    /// Check a generation request and queue it, or answer 4xx / 503.
    fn enqueue(&mut self, i: usize, api: Api) {
        let sl = &self.slots[i];
        let body = &sl.buf[sl.body.0..sl.body.1];
        let err: Option<(u16, heapless::String<256>)> = match json::parse(api, body) {
            Err(e) => Some((e.status(), msg(&e))),
            Ok(req) => match req.model {
                Some(m) if !self.info.knows(&m) => {
                    let mut s = heapless::String::new();
                    let shown = &m.0[..m.0.floor_char_boundary(64)];
                    let _ = write!(
                        s,
                        "model '{shown}' not found: this server has '{}'",
                        self.info.model_id
                    );
                    Some((404, s))
                }
                _ => None,
            },
        };
        if let Some((status, text)) = err {
            return self.fail(i, status, &text.as_str());
        }
        let limit = self.queue_cap + self.info.n_parallel.max(1).saturating_sub(self.running);
        if self.queue.len() >= limit {
            self.m.rejected_busy += 1;
            return self.fail(i, 503, &"server busy: the queue is full, retry later");
        }
        if self.queue.push_back(i as u8).is_err() {
            return self.fail(i, 503, &"server busy: the queue is full, retry later");
        }
        self.slots[i].api = api;
        self.slots[i].state = State::Queued;
    }
}

/// `http://localhost`, `http://127.0.0.1:3000`, `http://[::1]` ... (any port).
fn is_loopback_origin(o: &str) -> bool {
    let rest = o
        .strip_prefix("http://")
        .or_else(|| o.strip_prefix("https://"))
        .unwrap_or(o);
    let host = if let Some(r) = rest.strip_prefix("[::1]") {
        return r.is_empty() || r.starts_with(':');
    } else {
        rest.split(':').next().unwrap_or("")
    };
    let port_ok = rest[host.len()..].is_empty()
        || rest[host.len()..]
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    matches!(host, "localhost" | "127.0.0.1") && port_ok
}

/// A message as a short string (for errors built from `Display` values).
pub fn msg(d: &dyn core::fmt::Display) -> heapless::String<256> {
    let mut s = heapless::String::new();
    let _ = write!(s, "{d}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_method_and_path() {
        assert_eq!(route(Method::Get, "/"), Route::Page);
        assert_eq!(route(Method::Get, "/health"), Route::Health);
        assert_eq!(
            route(Method::Post, "/v1/chat/completions"),
            Route::Gen(Api::Chat)
        );
        assert_eq!(route(Method::Post, "/completion"), Route::Gen(Api::Llama));
        assert_eq!(route(Method::Get, "/v1/completions"), Route::WrongMethod);
        assert_eq!(route(Method::Post, "/health"), Route::WrongMethod);
        assert_eq!(route(Method::Get, "/nope"), Route::NotFound);
        assert_eq!(route(Method::Options, "/v1/completions"), Route::Preflight);
    }

    use crate::platform::PlatformError;
    use pinch_kernels::CpuFeatures;

    /// A scripted network: connections waiting to be accepted with the bytes each sends,
    /// a clock the test moves, and a record of what the server sent to each.
    struct FakeNet {
        st: spin::Mutex<FakeState>,
    }

    struct FakeState {
        now: u64,
        pending: heapless::Deque<u32, 16>,
        input: [&'static [u8]; 16],
        sent: [heapless::Vec<u8, 1024>; 16],
        closed: [bool; 16],
    }

    impl FakeNet {
        fn new(conns: &[&'static [u8]]) -> FakeNet {
            let mut st = FakeState {
                now: 0,
                pending: heapless::Deque::new(),
                input: [b""; 16],
                sent: Default::default(),
                closed: [false; 16],
            };
            for (i, c) in conns.iter().enumerate() {
                st.input[i + 1] = c;
                st.pending.push_back(i as u32 + 1).unwrap();
            }
            FakeNet {
                st: spin::Mutex::new(st),
            }
        }
        fn status(&self, conn: u32) -> Option<u16> {
            let st = self.st.lock();
            let s = core::str::from_utf8(&st.sent[conn as usize]).ok()?;
            s.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
        }
    }

    impl Platform for FakeNet {
        type File = ();
        fn open(&self, _: &str) -> Result<(), PlatformError> {
            Err(PlatformError::Unsupported("fake"))
        }
        fn file_size(&self, _: &()) -> u64 {
            0
        }
        fn read_at(&self, _: &(), _: u64, _: &mut [u8], _: bool) -> Result<usize, PlatformError> {
            Ok(0)
        }
        fn map<'f>(&self, _: &'f (), _: u64, _: usize) -> Option<&'f [u8]> {
            None
        }
        fn region(&self, _: usize) -> Result<&'static mut [u8], PlatformError> {
            Err(PlatformError::Unsupported("fake"))
        }
        fn available_memory(&self) -> Option<u64> {
            None
        }
        fn rss(&self) -> Option<u64> {
            None
        }
        fn peak_rss(&self) -> Option<u64> {
            None
        }
        fn workers(&self) -> usize {
            1
        }
        fn parallel(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            (0..n).for_each(f);
        }
        fn cpu(&self) -> CpuFeatures {
            CpuFeatures::SCALAR
        }
        fn now_ns(&self) -> u64 {
            self.st.lock().now
        }
        fn stdout(&self, _: &[u8]) {}
        fn stderr(&self, _: &[u8]) {}
        fn tcp_accept(&self, _: Socket) -> Result<Option<Socket>, PlatformError> {
            Ok(self.st.lock().pending.pop_front().map(Socket))
        }
        fn tcp_recv(&self, c: Socket, buf: &mut [u8]) -> Result<Recv, PlatformError> {
            let mut st = self.st.lock();
            let i = c.0 as usize;
            let input = st.input[i];
            if input.is_empty() {
                return Ok(Recv::Pending);
            }
            let n = input.len().min(buf.len());
            buf[..n].copy_from_slice(&input[..n]);
            st.input[i] = &input[n..];
            Ok(Recv::Data(n))
        }
        fn tcp_send(&self, c: Socket, bytes: &[u8]) -> Result<(), PlatformError> {
            let mut st = self.st.lock();
            let out = &mut st.sent[c.0 as usize];
            let room = out.capacity() - out.len();
            let _ = out.extend_from_slice(&bytes[..bytes.len().min(room)]);
            Ok(())
        }
        fn tcp_close(&self, c: Socket) {
            self.st.lock().closed[c.0 as usize] = true;
        }
    }

    fn info() -> Info<'static> {
        Info {
            model_id: "m",
            aliases: [""; 3],
            budget: None,
            n_ctx: 64,
            path: "m.gguf",
            alias: None,
            api_key: None,
            n_parallel: 1,
            webui: true,
            slots: true,
            metrics: true,
            cors_local_only: false,
            tags: None,
            start_unix: None,
            verbose: false,
            n_predict: 16,
            seed: 1,
        }
    }

    fn sent(p: &FakeNet, conn: usize) -> heapless::String<1024> {
        let st = p.st.lock();
        let mut s = heapless::String::new();
        let _ = s.push_str(core::str::from_utf8(&st.sent[conn]).unwrap_or(""));
        s
    }

    #[test]
    fn api_key_guards_all_but_health_and_the_page_files() {
        let p = FakeNet::new(&[
            b"GET /v1/models HTTP/1.1\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer k\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nX-Api-Key: k\r\n\r\n",
            b"GET /health HTTP/1.1\r\n\r\n",
            b"GET /sw.js HTTP/1.1\r\n\r\n",
            b"GET /props HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n",
        ]);
        let mut store = [0u8; 7 * 1024];
        let mut i = info();
        i.api_key = Some("k");
        let mut io = Io::new(&p, &[Socket(0)], store.chunks_mut(1024), 1, i);
        io.poll();
        assert_eq!(p.status(1), Some(401));
        assert!(sent(&p, 1).contains("\"authentication_error\""));
        assert_eq!(p.status(2), Some(200));
        assert_eq!(p.status(3), Some(200));
        assert_eq!(p.status(4), Some(200));
        assert_eq!(p.status(5), Some(200));
        assert_eq!(p.status(6), Some(401));
    }

    #[test]
    fn preflight_reflects_the_origin_and_local_only_refuses_others() {
        let pre = |origin: &'static [u8]| origin;
        let p = FakeNet::new(&[
            pre(b"OPTIONS /completions HTTP/1.1\r\nOrigin: http://evil.com\r\n\r\n"),
            pre(b"OPTIONS /completions HTTP/1.1\r\nOrigin: http://[::1]:3000\r\n\r\n"),
        ]);
        let mut store = [0u8; 7 * 1024];
        let mut io = Io::new(&p, &[Socket(0)], store.chunks_mut(1024), 1, info());
        io.poll();
        assert_eq!(p.status(1), Some(200));
        let s = sent(&p, 1);
        assert!(
            s.contains("Access-Control-Allow-Origin: http://evil.com\r\n"),
            "{s}"
        );
        assert!(s.contains("Access-Control-Allow-Credentials: true\r\n"));
        assert!(!s.contains("Allow-Origin: *"));
        let p2 = FakeNet::new(&[
            b"OPTIONS /completions HTTP/1.1\r\nOrigin: http://localhost.evil.com\r\n\r\n",
            b"OPTIONS /completions HTTP/1.1\r\nOrigin: http://127.0.0.1:3000\r\n\r\n",
        ]);
        let mut store = [0u8; 7 * 1024];
        let mut i = info();
        i.cors_local_only = true;
        let mut io = Io::new(&p2, &[Socket(0)], store.chunks_mut(1024), 1, i);
        io.poll();
        assert!(!sent(&p2, 1).contains("Access-Control-Allow-Origin"));
        assert!(sent(&p2, 2).contains("Access-Control-Allow-Origin: http://127.0.0.1:3000\r\n"));
        for (o, ok) in [
            ("http://localhost", true),
            ("http://[::1]", true),
            ("http://localhost:80x", false),
            ("http://notlocalhost", false),
        ] {
            assert_eq!(is_loopback_origin(o), ok, "{o}");
        }
    }

    #[test]
    fn switched_off_endpoints_answer_501_and_no_webui_404() {
        let p = FakeNet::new(&[
            b"GET /slots HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET /v1/models/m HTTP/1.1\r\n\r\n",
        ]);
        let mut store = [0u8; 7 * 1024];
        let mut i = info();
        (i.slots, i.metrics, i.webui) = (false, false, false);
        let mut io = Io::new(&p, &[Socket(0)], store.chunks_mut(1024), 1, i);
        io.poll();
        assert_eq!(p.status(1), Some(501));
        assert!(sent(&p, 1).contains("not_supported_error"));
        assert_eq!(p.status(2), Some(501));
        assert_eq!(p.status(3), Some(404));
        assert_eq!(p.status(4), Some(200));
        assert!(sent(&p, 4).contains("\"id\":\"m\""));
    }

    const GEN: &[u8] = b"POST /completion HTTP/1.1\r\nContent-Length: 14\r\n\r\n{\"prompt\":\"x\"}";

    #[test]
    fn io_queues_up_to_the_limit_then_answers_503_and_serves_cheap_requests_meanwhile() {
        let p = FakeNet::new(&[
            GEN,
            GEN,
            GEN,
            b"POST /completion HTTP/1.1\r\nContent-Length: 2\r\n\r\n{]",
            b"GET /health HTTP/1.1\r\n\r\n",
            b"POST /completion HTTP/1.1\r\nContent-Length: 9\r\n\r\n{",
        ]);
        let mut store = [0u8; 7 * 1024];
        let mut io = Io::new(&p, &[Socket(0)], store.chunks_mut(1024), 1, info());
        io.poll();
        // Idle: one may run and one may wait; the third is refused.
        assert_eq!(io.queued(), 2);
        assert_eq!(p.status(3), Some(503));
        let sent3 = p.st.lock().sent[3].clone();
        assert!(core::str::from_utf8(&sent3)
            .unwrap()
            .contains("Retry-After: 1\r\n"));
        assert_eq!(p.status(4), Some(400), "malformed JSON is refused at once");
        assert_eq!(
            p.status(5),
            Some(200),
            "health is answered while requests wait"
        );
        assert_eq!(
            p.status(6),
            None,
            "an incomplete request waits for its body"
        );
        assert_eq!(io.start_next(), Some(0));
        assert_eq!(io.queued(), 1);
        assert_eq!(io.m.rejected_busy, 1);
        assert_eq!(io.m.client_errors, 1);
        // The incomplete request times out.
        p.st.lock().now = READ_TIMEOUT_NS + 1;
        io.poll();
        assert_eq!(p.status(6), Some(408));
        assert!(p.st.lock().closed[6]);
        io.free(0);
        assert_eq!(io.running, 0);
        assert_eq!(io.start_next(), Some(1));
    }

    /// splitmix64: reproducible pseudo-random bytes without a dependency.
    fn rng(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Mutate `seed` (flip, insert, delete, truncate) into `out`.
    fn mutate(seed: &[u8], st: &mut u64, out: &mut heapless::Vec<u8, 1024>) {
        out.clear();
        let _ = out.extend_from_slice(seed);
        for _ in 0..1 + rng(st) % 4 {
            let len = out.len().max(1);
            let at = (rng(st) as usize) % len;
            let byte = b"{}[]\",:0123456789-.eE\\u\"tfn \r\n\x00\xff"[(rng(st) % 30) as usize];
            match rng(st) % 4 {
                0 if !out.is_empty() => {
                    let last = out.len() - 1;
                    out[at.min(last)] = byte;
                }
                1 => {
                    let _ = out.insert(at.min(out.len()), byte);
                }
                2 if !out.is_empty() => {
                    out.remove(at.min(out.len() - 1));
                }
                _ => out.truncate(at),
            }
        }
    }

    #[test]
    fn mutated_requests_never_panic_the_parsers() {
        let bodies: [&[u8]; 5] = [
            br#"{"model":"m","messages":[{"role":"user","content":"hi \u00e9\n"}],"stream":true,"max_tokens":5,"stop":["a","b"],"logprobs":true,"top_logprobs":2,"x":{"y":[1,2.5e3,null,true]}}"#,
            br#"{"prompt":"abc","n_predict":-1,"n_probs":3,"stop":"END","temperature":0.7,"seed":1}"#,
            br#"{"prompt":"x","logprobs":2,"max_tokens":1}"#,
            br#"{"prompt":[[1,2],"a\ud83e\udd17",{"prompt_string":"y"},[3,"z"]],"logit_bias":[[5,-1],["ab",false]],"n":2,"response_format":{"type":"json_object","schema":{"type":["string"]}}}"#,
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}],"logit_bias":{"7":2.5},"input_extra":[{"filename":"f","text":"t"}],"input_prefix":"p"}"#,
        ];
        let heads: [&[u8]; 2] = [
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n",
            b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n",
        ];
        let mut st = 7u64;
        let mut buf = heapless::Vec::<u8, 1024>::new();
        let mut ok = 0;
        for round in 0..30_000 {
            let seed = bodies[round % bodies.len()];
            mutate(seed, &mut st, &mut buf);
            // The raw walker on its own, over every value it can reach.
            if let Some(r) = jraw::root(&buf) {
                let mut depth = 0;
                let mut stack: heapless::Vec<jraw::Val<'_>, 64> = heapless::Vec::new();
                let _ = stack.push(r);
                while let Some(v) = stack.pop() {
                    depth += 1;
                    let _ = (v.num(), v.u32(), v.bool(), v.str());
                    for x in v.items().chain(v.members().map(|(_, x)| x)) {
                        if depth < 200 {
                            let _ = stack.push(x);
                        }
                    }
                }
            }
            for api in [Api::Chat, Api::Completions, Api::Llama, Api::Infill] {
                if let Ok(p) = json::parse(api, &buf) {
                    ok += 1;
                    let mut store = [0u8; 256];
                    let mut out: &mut [u8] = &mut store;
                    let mut texts: heapless::Vec<jraw::Val<'_>, 16> = heapless::Vec::new();
                    if let Some(pr) = p.prompt {
                        let _ = texts.push(pr);
                        texts.extend(pr.items().take(8));
                    }
                    for v in texts.iter() {
                        if let Some(t) = v.str() {
                            let _ = json::unescape(&t, &mut out);
                        }
                    }
                    for m in p.messages.iter() {
                        let _ = json::unescape(&m.role, &mut out);
                        if let json::Content::Parts(v) = m.content {
                            for part in v.items() {
                                if let Some(t) = part.get("text").and_then(|t| t.str()) {
                                    let _ = json::unescape(&t, &mut out);
                                }
                            }
                        }
                    }
                }
            }
            mutate(heads[round % heads.len()], &mut st, &mut buf);
            let _ = http::parse_head(&buf, MAX_BODY);
        }
        // Some mutations keep the body valid: the parser was exercised on both paths.
        assert!(ok > 100, "{ok}");
    }

    #[test]
    fn the_page_is_small_and_self_contained() {
        assert!(PAGE.len() < 32 * 1024, "{} bytes", PAGE.len());
        for external in ["src=\"http", "href=\"http", "@import", "<link"] {
            assert!(!PAGE.contains(external), "{external}");
        }
        // iOS 12 Safari: no optional chaining, no nullish coalescing, no arrow functions.
        for modern in [
            "?.",
            "??",
            "=>",
            "ReadableStream",
            "async ",
            "await ",
            "let ",
            "const ",
        ] {
            assert!(!PAGE.contains(modern), "{modern}");
        }
    }
}
