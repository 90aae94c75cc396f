//! Formatted output through the platform (no allocation).
use crate::platform::Platform;

/// `core::fmt::Write` to the platform's stdout (or stderr), buffered per call.
pub struct Out<'p, P: Platform> {
    pub p: &'p P,
    pub err: bool,
    buf: heapless::Vec<u8, 1024>,
}

impl<'p, P: Platform> Out<'p, P> {
    pub fn stdout(p: &'p P) -> Self {
        Out {
            p,
            err: false,
            buf: heapless::Vec::new(),
        }
    }
    pub fn stderr(p: &'p P) -> Self {
        Out {
            p,
            err: true,
            buf: heapless::Vec::new(),
        }
    }
    /// Write raw bytes (e.g. decoded token text) straight through.
    pub fn bytes(&mut self, b: &[u8]) {
        self.flush();
        if self.err {
            self.p.stderr(b)
        } else {
            self.p.stdout(b)
        }
    }
    pub fn flush(&mut self) {
        if !self.buf.is_empty() {
            if self.err {
                self.p.stderr(&self.buf)
            } else {
                self.p.stdout(&self.buf)
            }
            self.buf.clear();
        }
    }
}

impl<P: Platform> core::fmt::Write for Out<'_, P> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for chunk in s.as_bytes().chunks(512) {
            if self.buf.len() + chunk.len() > self.buf.capacity() {
                self.flush();
            }
            let _ = self.buf.extend_from_slice(chunk);
        }
        Ok(())
    }
}

impl<P: Platform> Drop for Out<'_, P> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Writes `s` as a JSON string literal (quotes and escapes included).
pub fn json_str(w: &mut dyn core::fmt::Write, s: &str) -> core::fmt::Result {
    w.write_char('"')?;
    for c in s.chars() {
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
    w.write_char('"')
}

/// Human-readable byte count (MiB with one decimal).
pub struct Mib(pub u64);

impl core::fmt::Display for Mib {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:.1} MiB", self.0 as f64 / (1u64 << 20) as f64)
    }
}

/// The line every command that loads a model ends with on stderr: `peak RSS 266.2 MiB`
/// (the OS's high-water mark of resident memory, VmHWM on Linux), when known.
pub fn print_peak_rss<P: Platform>(p: &P) {
    if let Some(r) = p.peak_rss() {
        use core::fmt::Write;
        let _ = writeln!(Out::stderr(p), "peak RSS {}", Mib(r));
    }
}
