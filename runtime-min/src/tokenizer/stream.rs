//! Streaming detokenization: token bytes in, only whole valid UTF-8 out.
//!
//! A token may end in the middle of a character (byte-fallback tokens, byte-level BPE
//! pieces), so output is held back until the character is complete. At most 3 bytes are
//! ever pending, kept in a fixed buffer. Invalid sequences become U+FFFD, one per maximal
//! invalid subpart, the same rule as `String::from_utf8_lossy`.

/// Incremental UTF-8 decoder over a fixed 4-byte buffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Utf8Stream {
    buf: [u8; 4],
    len: u8,
    need: u8,
}

const REPLACEMENT: &str = "\u{FFFD}";

impl Utf8Stream {
    /// An empty decoder.
    pub const fn new() -> Utf8Stream {
        Utf8Stream {
            buf: [0; 4],
            len: 0,
            need: 0,
        }
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> usize {
        self.len as usize
    }

    /// Feed `bytes`; `sink` receives the text that is complete so far, in order.
    pub fn push<E>(
        &mut self,
        mut bytes: &[u8],
        sink: &mut impl FnMut(&str) -> Result<(), E>,
    ) -> Result<(), E> {
        while !bytes.is_empty() {
            if self.len == 0 {
                // Fast path: hand over the longest valid prefix in one piece.
                let (valid, rest) = match core::str::from_utf8(bytes) {
                    Ok(s) => (s, &[][..]),
                    Err(e) => {
                        let (v, r) = bytes.split_at(e.valid_up_to());
                        // `v` is valid by construction of `valid_up_to`.
                        (core::str::from_utf8(v).unwrap_or(""), r)
                    }
                };
                if !valid.is_empty() {
                    sink(valid)?;
                }
                bytes = rest;
                if bytes.is_empty() {
                    break;
                }
                let b = bytes[0];
                bytes = &bytes[1..];
                self.start(b, sink)?;
            } else {
                let b = bytes[0];
                if self.accepts(b) {
                    bytes = &bytes[1..];
                    self.buf[self.len as usize] = b;
                    self.len += 1;
                    if self.len == self.need {
                        let n = self.len as usize;
                        self.len = 0;
                        let s = core::str::from_utf8(&self.buf[..n]).unwrap_or(REPLACEMENT);
                        sink(s)?;
                    }
                } else {
                    // The pending sequence is cut short: one U+FFFD, then retry `b`.
                    self.len = 0;
                    sink(REPLACEMENT)?;
                }
            }
        }
        Ok(())
    }

    /// End of stream: a pending incomplete character becomes U+FFFD.
    pub fn finish<E>(&mut self, sink: &mut impl FnMut(&str) -> Result<(), E>) -> Result<(), E> {
        if self.len > 0 {
            self.len = 0;
            sink(REPLACEMENT)?;
        }
        Ok(())
    }

    fn start<E>(&mut self, b: u8, sink: &mut impl FnMut(&str) -> Result<(), E>) -> Result<(), E> {
        let need = match b {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return sink(REPLACEMENT), // stray continuation or never-valid byte
        };
        self.buf[0] = b;
        self.len = 1;
        self.need = need;
        Ok(())
    }

    /// Whether `b` validly continues the pending sequence (RFC 3629 second-byte ranges).
    fn accepts(&self, b: u8) -> bool {
        if self.len == 1 {
            match self.buf[0] {
                0xE0 => (0xA0..=0xBF).contains(&b),
                0xED => (0x80..=0x9F).contains(&b),
                0xF0 => (0x90..=0xBF).contains(&b),
                0xF4 => (0x80..=0x8F).contains(&b),
                _ => b & 0xC0 == 0x80,
            }
        } else {
            b & 0xC0 == 0x80
        }
    }
}
