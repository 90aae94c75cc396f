//! `pinch serve`: an HTTP server for the OpenAI and llama-server APIs and a web page,
//! written against the `Platform` socket calls so it runs wherever the engine runs.
//!
//! # Design: one thread, one generation, a table of connection slots
//!
//! The engine thread does everything. The platform gives it non-blocking sockets
//! (`tcp_accept`, `tcp_recv`; `tcp_send` may wait a bounded time for a slow reader), and
//! [`Io::poll`] moves every connection one step: it accepts new connections into free
//! slots, reads request bytes into each slot's fixed buffer, parses the head with
//! `httparse` and, once the body is complete, answers at once whatever does not need
//! the model (`/health`, `/v1/models`, `/metrics`, the page, every 4xx) or checks the
//! body of a generation request and puts its slot in the queue. The server loop runs
//! the queued generations one at a time, and the generation calls `poll` between
//! weight passes (each prompt batch and each token), so health checks, metrics, 503s
//! and new queue entries are answered while a generation runs, and a client that
//! disconnects (seen by `tcp_recv` or a failed send) stops its generation at the next
//! token. No threads, no locks, no allocation: a few more syscalls per token.
//!
//! Limits: [`http::MAX_HEAD`] bytes and [`http::MAX_HEADERS`] lines of head (431),
//! [`MAX_BODY`] bytes of body (413), [`READ_TIMEOUT_NS`] to send a whole request (408),
//! `--queue` waiting generations (503 with `Retry-After`), queue + 1 + [`SPARE_SLOTS`]
//! connections at once (503 beyond). Bodies that are not JSON, have fields of the wrong
//! type or out of range, name another model (404), or whose prompt does not fit the
//! context get a 4xx with a JSON error; nothing a client sends can panic the loop.
//!
//! # Memory
//!
//! Everything is carved from the arena once, at start: the slot buffers
//! (head + body limit each), the prompt text and token buffers, the tokenizer scratch
//! for the longest prompt text accepted, and per-token records for non-streamed
//! log-probabilities. A request allocates nothing.
//!
//! - [`http`]: request heads and response heads, buffered socket output.
//! - [`json`]: request bodies (`serde-json-core`) and JSON output helpers.
//! - [`gen`]: one generation: prompt, sampling, stop strings, the three output formats.
//! - [`metrics`]: counters and the Prometheus text.
pub mod gen;
pub mod http;
pub mod json;
pub mod metrics;

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
/// Most slots (running + queued + spare).
pub const MAX_SLOTS: usize = 40;

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
}

impl Info<'_> {
    fn knows(&self, m: &serde_json_core::str::EscapedStr<'_>) -> bool {
        m.0.is_empty()
            || json::escaped_eq(m, self.model_id)
            || self
                .aliases
                .iter()
                .any(|a| !a.is_empty() && json::escaped_eq(m, a))
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
    Gen(Api),
    WrongMethod,
    NotFound,
}

fn route(method: Method, path: &str) -> Route {
    let (get, post) = (method == Method::Get, method == Method::Post);
    if method == Method::Options {
        return Route::Preflight;
    }
    match path {
        "/" | "/index.html" if get => Route::Page,
        "/health" | "/v1/health" if get => Route::Health,
        "/v1/models" | "/models" if get => Route::Models,
        "/metrics" if get => Route::Metrics,
        "/v1/chat/completions" | "/chat/completions" if post => Route::Gen(Api::Chat),
        "/v1/completions" | "/completions" if post => Route::Gen(Api::Completions),
        "/completion" if post => Route::Gen(Api::Llama),
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
    pub listener: Socket,
    pub slots: heapless::Vec<Slot<'a>, MAX_SLOTS>,
    queue: heapless::Deque<u8, MAX_SLOTS>,
    /// Generations that may wait (`--queue`).
    pub queue_cap: usize,
    /// The slot whose generation runs.
    pub active: Option<usize>,
    pub m: Metrics,
    pub info: Info<'s>,
}

impl<'a, 's, 'p, P: Platform> Io<'a, 's, 'p, P> {
    /// A server on `listener` with slot buffers `bufs` (each [`http::MAX_HEAD`] +
    /// [`MAX_BODY`] bytes).
    pub fn new(
        p: &'p P,
        listener: Socket,
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
            });
        }
        Io {
            p,
            listener,
            slots,
            queue: heapless::Deque::new(),
            queue_cap,
            active: None,
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
        for _ in 0..16 {
            match self.p.tcp_accept(self.listener) {
                Ok(Some(s)) => {
                    busy = true;
                    self.admit(s);
                }
                _ => break,
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
        self.active = Some(i);
        Some(i)
    }

    /// Close slot `i` and make it free.
    pub fn free(&mut self, i: usize) {
        let s = &mut self.slots[i];
        if s.state != State::Free {
            self.p.tcp_close(s.sock);
        }
        s.state = State::Free;
        s.len = 0;
        if self.active == Some(i) {
            self.active = None;
        }
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
            generating: self.active.is_some(),
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
            Ok(Some(h)) => (
                route(h.method, h.path),
                (h.head_len, h.head_len + h.body_len),
            ),
        };
        sl.body = body;
        self.m.requests += 1;
        self.dispatch(i, r);
        true
    }

    fn dispatch(&mut self, i: usize, r: Route) {
        let (p, sock) = (self.p, self.slots[i].sock);
        match r {
            Route::Page => {
                http::respond(p, sock, 200, "text/html; charset=utf-8", "", &|w| {
                    w.write_str(PAGE)
                });
            }
            Route::Health => {
                http::respond(p, sock, 200, "application/json", "", &|w| {
                    w.write_str("{\"status\":\"ok\"}")
                });
            }
            Route::Models => {
                let info = self.info;
                http::respond(p, sock, 200, "application/json", "", &|w| {
                    w.write_str("{\"object\":\"list\",\"data\":[{\"id\":")?;
                    json_str(w, info.model_id)?;
                    write!(w, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"pinch\",\"meta\":{{\"n_ctx\":{}}}}}]}}", info.n_ctx)
                });
            }
            Route::Metrics => {
                let (m, l) = (self.m, self.live());
                http::respond(p, sock, 200, "text/plain; version=0.0.4", "", &|w| {
                    m.write(&l, w)
                });
            }
            Route::Preflight => {
                http::respond(p, sock, 204, "", "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nAccess-Control-Allow-Headers: Content-Type, Authorization\r\n", &|_| Ok(()));
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
            Err(e) => Some((400, msg(&e))),
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
        let limit = self.queue_cap + usize::from(self.active.is_none());
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
