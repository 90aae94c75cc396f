//! TCP sockets for `pinch serve`, behind the `Platform` socket handles.
//!
//! The engine's server loop is single-threaded and never blocks on a socket, so every
//! socket here is non-blocking: accept and receive return at once, and send retries a
//! full socket buffer for at most [`SEND_TIMEOUT`] before giving up on a client that
//! does not read. The engine only sees `Socket(u32)` handles; the streams live in one
//! process-wide table (handles are never reused while open).
//!
//! Closing is graceful: the write side is shut down and the socket kept for up to
//! [`LINGER`] while what the client still sends is read and dropped. Closing a socket
//! with unread input makes Linux send a reset, which can destroy a response (a 503 or
//! 413 sent before the request was read in full) before the client reads it.
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pinch_runtime_min::platform::{PlatformError, Recv, Socket};

/// Longest wait for a client to take sent bytes.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a closed connection keeps draining input.
pub const LINGER: Duration = Duration::from_secs(2);

enum Entry {
    Listener(TcpListener),
    Stream(TcpStream),
}

struct Table {
    next: u32,
    open: BTreeMap<u32, Entry>,
    closing: Vec<(TcpStream, Instant)>,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    next: 1,
    open: BTreeMap::new(),
    closing: Vec::new(),
});

fn table() -> MutexGuard<'static, Table> {
    // A panic elsewhere while holding the lock leaves the table usable.
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

fn code(e: &std::io::Error) -> PlatformError {
    PlatformError::Net {
        code: e.raw_os_error().unwrap_or(0),
    }
}

impl Table {
    fn insert(&mut self, e: Entry) -> Socket {
        let id = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        self.open.insert(id, e);
        Socket(id)
    }

    /// Read and drop what closing sockets still receive; forget those done or too old.
    fn drain_closing(&mut self) {
        let mut sink = [0u8; 4096];
        self.closing.retain_mut(|(s, since)| {
            if since.elapsed() > LINGER {
                return false;
            }
            loop {
                match s.read(&mut sink) {
                    Ok(0) => return false,
                    Ok(_) => continue,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => return false,
                }
            }
        });
    }
}

/// Listen on `host:port`, non-blocking.
pub fn listen(host: &str, port: u16) -> Result<(Socket, u16), PlatformError> {
    let l = TcpListener::bind((host, port)).map_err(|e| code(&e))?;
    l.set_nonblocking(true).map_err(|e| code(&e))?;
    let port = l.local_addr().map_err(|e| code(&e))?.port();
    Ok((table().insert(Entry::Listener(l)), port))
}

/// A new connection, if one is waiting.
pub fn accept(listener: Socket) -> Result<Option<Socket>, PlatformError> {
    let mut t = table();
    t.drain_closing();
    let Some(Entry::Listener(l)) = t.open.get(&listener.0) else {
        return Err(PlatformError::Net { code: 0 });
    };
    match l.accept() {
        Ok((s, _)) => {
            s.set_nonblocking(true).map_err(|e| code(&e))?;
            // Tokens are streamed one small write at a time: send each at once.
            let _ = s.set_nodelay(true);
            Ok(Some(t.insert(Entry::Stream(s))))
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(None),
        // A connection reset before we accepted it is the client's business.
        Err(e) if e.kind() == ErrorKind::ConnectionAborted => Ok(None),
        Err(e) => Err(code(&e)),
    }
}

/// Non-blocking receive.
pub fn recv(conn: Socket, buf: &mut [u8]) -> Result<Recv, PlatformError> {
    let mut t = table();
    let Some(Entry::Stream(s)) = t.open.get_mut(&conn.0) else {
        return Ok(Recv::Closed);
    };
    loop {
        return match s.read(buf) {
            Ok(0) if !buf.is_empty() => Ok(Recv::Closed),
            Ok(n) => Ok(Recv::Data(n)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(Recv::Pending),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::BrokenPipe
                ) =>
            {
                Ok(Recv::Closed)
            }
            Err(e) => Err(code(&e)),
        };
    }
}

/// Send everything, retrying a full socket buffer until [`SEND_TIMEOUT`].
pub fn send(conn: Socket, mut bytes: &[u8]) -> Result<(), PlatformError> {
    // Clone the stream so the table lock is not held while waiting for a slow reader.
    let s = {
        let t = table();
        match t.open.get(&conn.0) {
            Some(Entry::Stream(s)) => s.try_clone().map_err(|e| code(&e))?,
            _ => return Err(PlatformError::Net { code: 0 }),
        }
    };
    let mut s = s;
    let start = Instant::now();
    while !bytes.is_empty() {
        match s.write(bytes) {
            Ok(0) => return Err(PlatformError::Net { code: 0 }),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if start.elapsed() > SEND_TIMEOUT {
                    return Err(code(&e));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(code(&e)),
        }
    }
    Ok(())
}

/// Close gracefully (see the module doc); listeners close at once.
pub fn close(sock: Socket) {
    let mut t = table();
    match t.open.remove(&sock.0) {
        Some(Entry::Stream(s)) => {
            let _ = s.shutdown(Shutdown::Write);
            t.closing.push((s, Instant::now()));
            t.drain_closing();
        }
        Some(Entry::Listener(_)) | None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream as Client;

    fn wait_accept(l: Socket) -> Socket {
        for _ in 0..1000 {
            if let Some(s) = accept(l).unwrap() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no connection accepted");
    }

    #[test]
    fn accepts_receives_sends_and_sees_the_peer_close() {
        let (l, port) = listen("127.0.0.1", 0).unwrap();
        assert_ne!(port, 0);
        assert_eq!(accept(l).unwrap(), None, "nothing is waiting yet");
        let mut c = Client::connect(("127.0.0.1", port)).unwrap();
        let s = wait_accept(l);
        let mut buf = [0u8; 16];
        assert_eq!(recv(s, &mut buf).unwrap(), Recv::Pending);
        c.write_all(b"ping").unwrap();
        let mut got = Recv::Pending;
        for _ in 0..1000 {
            got = recv(s, &mut buf).unwrap();
            if got != Recv::Pending {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got, Recv::Data(4));
        assert_eq!(&buf[..4], b"ping");
        send(s, b"pong").unwrap();
        let mut back = [0u8; 4];
        c.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"pong");
        drop(c);
        let mut closed = false;
        for _ in 0..1000 {
            if recv(s, &mut buf).unwrap() == Recv::Closed {
                closed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(closed, "peer close not seen");
        close(s);
        close(l);
    }

    #[test]
    fn a_response_sent_before_reading_the_request_survives_the_close() {
        let (l, port) = listen("127.0.0.1", 0).unwrap();
        let mut c = Client::connect(("127.0.0.1", port)).unwrap();
        c.write_all(&[b'x'; 20_000]).unwrap_or(());
        let s = wait_accept(l);
        send(s, b"HTTP/1.1 503 Busy\r\n\r\n").unwrap();
        close(s);
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        assert!(out.starts_with(b"HTTP/1.1 503"), "{out:?}");
        close(l);
    }
}
