//! HTTP/1.1 on the wire: request heads parsed with `httparse` under fixed limits, and
//! response heads, buffered socket output and JSON error bodies.
//!
//! Every response says `Connection: close`: one request per connection keeps the server
//! loop's state to a fixed table of slots, and lets a streamed body simply end when the
//! socket closes (no chunked encoding).
use core::fmt::Write;

use crate::commands::out::json_str;
use crate::platform::{Platform, Socket};

/// Most header lines a request may have.
pub const MAX_HEADERS: usize = 32;
/// Most bytes of request line plus headers.
pub const MAX_HEAD: usize = 8 * 1024;

/// Request methods the server tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Options,
    Other,
}

/// A complete request head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head<'b> {
    pub method: Method,
    /// The path without the query string.
    pub path: &'b str,
    /// Bytes of the head (the body starts here).
    pub head_len: usize,
    /// `Content-Length` (0 when absent).
    pub body_len: usize,
    /// The client waits for `100 Continue` before sending the body (curl does for
    /// bodies over 1 KiB).
    pub expect_continue: bool,
    /// `Authorization: Bearer KEY` or `X-Api-Key: KEY` (the key).
    pub api_key: Option<&'b [u8]>,
    /// The `Origin` header.
    pub origin: Option<&'b [u8]>,
}

/// A request that cannot be served, as the status it is answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpError {
    /// 400: not HTTP, or a header value that makes no sense.
    BadRequest(&'static str),
    /// 431: the head is longer than [`MAX_HEAD`] or has more than [`MAX_HEADERS`] lines.
    HeadTooLarge,
    /// 413: the body is longer than the limit.
    BodyTooLarge { limit: usize },
    /// 501: chunked request bodies are not supported.
    Chunked,
}

impl HttpError {
    pub fn status(&self) -> u16 {
        match self {
            HttpError::BadRequest(_) => 400,
            HttpError::HeadTooLarge => 431,
            HttpError::BodyTooLarge { .. } => 413,
            HttpError::Chunked => 501,
        }
    }
}

impl core::fmt::Display for HttpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HttpError::BadRequest(why) => write!(f, "bad request: {why}"),
            HttpError::HeadTooLarge => write!(
                f,
                "request head longer than {MAX_HEAD} bytes or more than {MAX_HEADERS} headers"
            ),
            HttpError::BodyTooLarge { limit } => {
                write!(f, "request body longer than {limit} bytes")
            }
            HttpError::Chunked => write!(
                f,
                "chunked request bodies are not supported: send Content-Length"
            ),
        }
    }
}

/// Parse the head at the start of `buf`; `Ok(None)` while it is incomplete.
///
/// # Errors
/// The [`HttpError`] to answer with; the connection is closed after it.
pub fn parse_head(buf: &[u8], max_body: usize) -> Result<Option<Head<'_>>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() >= MAX_HEAD {
                Err(HttpError::HeadTooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeadTooLarge),
        Err(_) => return Err(HttpError::BadRequest("malformed request head")),
    };
    if head_len > MAX_HEAD {
        return Err(HttpError::HeadTooLarge);
    }
    let method = match req.method.unwrap_or("") {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "OPTIONS" => Method::Options,
        _ => Method::Other,
    };
    let target = req.path.unwrap_or("/");
    let path = target.split(['?', '#']).next().unwrap_or("/");
    let mut body_len = 0usize;
    let mut expect_continue = false;
    let mut api_key = None;
    let mut origin = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("authorization") {
            api_key = Some(h.value.strip_prefix(b"Bearer ").unwrap_or(h.value));
        } else if h.name.eq_ignore_ascii_case("x-api-key") {
            api_key = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("origin") {
            origin = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let v = core::str::from_utf8(h.value)
                .map_err(|_| HttpError::BadRequest("Content-Length is not a number"))?;
            let v = v.trim();
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HttpError::BadRequest("Content-Length is not a number"));
            }
            // Long digit strings overflow: any such value is over the limit anyway.
            body_len = v.parse().unwrap_or(usize::MAX);
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect_continue = h.value.eq_ignore_ascii_case(b"100-continue");
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::Chunked);
        }
    }
    if body_len > max_body {
        return Err(HttpError::BodyTooLarge { limit: max_body });
    }
    Ok(Some(Head {
        method,
        path,
        head_len,
        body_len,
        expect_continue,
        api_key,
        origin,
    }))
}

/// Reason phrase of the statuses the server uses.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// `core::fmt::Write` to a socket through a small buffer. After the first failed send
/// everything is dropped and [`SockWriter::failed`] is true (the client has gone).
pub struct SockWriter<'p, P: Platform> {
    p: &'p P,
    sock: Socket,
    buf: heapless::Vec<u8, 2048>,
    failed: bool,
}

impl<'p, P: Platform> SockWriter<'p, P> {
    pub fn new(p: &'p P, sock: Socket) -> Self {
        SockWriter {
            p,
            sock,
            buf: heapless::Vec::new(),
            failed: false,
        }
    }
    /// Send what is buffered; false when the client has gone.
    pub fn flush(&mut self) -> bool {
        if !self.failed && !self.buf.is_empty() && self.p.tcp_send(self.sock, &self.buf).is_err() {
            self.failed = true;
        }
        self.buf.clear();
        !self.failed
    }
    /// Write raw bytes (bypassing the buffer when large).
    pub fn bytes(&mut self, b: &[u8]) {
        if self.buf.len() + b.len() > self.buf.capacity() {
            self.flush();
        }
        if b.len() > self.buf.capacity() {
            if !self.failed && self.p.tcp_send(self.sock, b).is_err() {
                self.failed = true;
            }
        } else {
            let _ = self.buf.extend_from_slice(b);
        }
    }
    pub fn failed(&self) -> bool {
        self.failed
    }
}

impl<P: Platform> Write for SockWriter<'_, P> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.bytes(s.as_bytes());
        Ok(())
    }
}

/// Counts bytes written (to compute `Content-Length` before sending).
#[derive(Default)]
pub struct Counter(pub usize);

impl Write for Counter {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

/// Write a response head. `len`: `Content-Length`, or `None` for a body that ends when
/// the connection closes (server-sent events).
pub fn write_head(
    w: &mut dyn Write,
    status: u16,
    content_type: &str,
    len: Option<usize>,
    extra: &str,
) -> core::fmt::Result {
    write!(w, "HTTP/1.1 {status} {}\r\n", reason(status))?;
    if !content_type.is_empty() {
        write!(w, "Content-Type: {content_type}\r\n")?;
    }
    if let Some(n) = len {
        write!(w, "Content-Length: {n}\r\n")?;
    }
    w.write_str("Connection: close\r\nCache-Control: no-cache\r\n")?;
    // A preflight answer carries its own CORS headers.
    if !extra.contains("Access-Control-Allow-") {
        w.write_str("Access-Control-Allow-Origin: *\r\n")?;
    }
    write!(w, "{extra}\r\n")
}

/// Send a whole response whose body is produced by `body` (called twice: once to count).
pub fn respond<P: Platform>(
    p: &P,
    sock: Socket,
    status: u16,
    content_type: &str,
    extra: &str,
    body: &dyn Fn(&mut dyn Write) -> core::fmt::Result,
) -> bool {
    let mut c = Counter::default();
    let _ = body(&mut c);
    let mut w = SockWriter::new(p, sock);
    let _ = write_head(&mut w, status, content_type, Some(c.0), extra);
    let _ = body(&mut w);
    w.flush()
}

/// The error kind llama-server and OpenAI clients expect for a status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        404 => "not_found_error",
        501 => "not_supported_error",
        503 => "unavailable_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// Send `{"error":{"code":STATUS,"message":MSG,"type":...}}` with `status`.
pub fn respond_error<P: Platform>(
    p: &P,
    sock: Socket,
    status: u16,
    msg: &dyn core::fmt::Display,
) -> bool {
    respond_error_with(p, sock, status, error_type(status), msg, "")
}

/// [`respond_error`] with an explicit `type` and more members (`fields`: JSON members
/// with a leading comma, or empty), e.g. llama-server's `exceed_context_size_error`
/// with `n_prompt_tokens` and `n_ctx`.
pub fn respond_error_with<P: Platform>(
    p: &P,
    sock: Socket,
    status: u16,
    kind: &str,
    msg: &dyn core::fmt::Display,
    fields: &str,
) -> bool {
    let mut text: heapless::String<512> = heapless::String::new();
    let _ = write!(text, "{msg}");
    let extra = if status == 503 {
        "Retry-After: 1\r\n"
    } else {
        ""
    };
    respond(p, sock, status, "application/json", extra, &|w| {
        write!(w, "{{\"error\":{{\"code\":{status},\"message\":")?;
        json_str(w, &text)?;
        write!(w, ",\"type\":\"{kind}\"{fields}}}}}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_post_head_with_length_and_query() {
        let req = b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 12\r\n\r\n{\"prompt\":1}";
        let h = parse_head(req, 100).unwrap().unwrap();
        assert_eq!(h.method, Method::Post);
        assert_eq!(h.path, "/v1/completions");
        assert_eq!(h.body_len, 12);
        assert_eq!(&req[h.head_len..], b"{\"prompt\":1}");
    }

    #[test]
    fn an_incomplete_head_waits_and_a_huge_one_is_refused() {
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nHost:", 10), Ok(None));
        let mut big = [b'a'; MAX_HEAD + 10];
        big[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
        big[16..20].copy_from_slice(b"X: a");
        assert_eq!(parse_head(&big, 10), Err(HttpError::HeadTooLarge));
    }

    #[test]
    fn rejects_bad_lengths_chunked_bodies_and_garbage() {
        let too_long = b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n";
        assert_eq!(
            parse_head(too_long, 100),
            Err(HttpError::BodyTooLarge { limit: 100 })
        );
        let huge = b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999999\r\n\r\n";
        assert_eq!(
            parse_head(huge, 100),
            Err(HttpError::BodyTooLarge { limit: 100 })
        );
        let neg = b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n";
        assert!(matches!(
            parse_head(neg, 100),
            Err(HttpError::BadRequest(_))
        ));
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(parse_head(chunked, 100), Err(HttpError::Chunked));
        assert!(matches!(
            parse_head(b"\x00\x01garbage\r\n\r\n", 100),
            Err(HttpError::BadRequest(_))
        ));
    }

    #[test]
    fn too_many_headers_is_431() {
        let mut req: heapless::Vec<u8, 4096> = heapless::Vec::new();
        req.extend_from_slice(b"GET / HTTP/1.1\r\n").unwrap();
        for _ in 0..MAX_HEADERS + 1 {
            req.extend_from_slice(b"X: y\r\n").unwrap();
        }
        req.extend_from_slice(b"\r\n").unwrap();
        assert_eq!(parse_head(&req, 0), Err(HttpError::HeadTooLarge));
    }

    #[test]
    fn head_lists_length_and_close() {
        let mut s: heapless::String<256> = heapless::String::new();
        write_head(
            &mut s,
            503,
            "application/json",
            Some(5),
            "Retry-After: 1\r\n",
        )
        .unwrap();
        assert!(s.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(s.contains("Content-Length: 5\r\n"));
        assert!(s.contains("Connection: close\r\n"));
        assert!(s.ends_with("Retry-After: 1\r\n\r\n"));
    }
}
