//! The tune profile: the settings `pinch tune` chose, as `key=value` lines that
//! `run`, `chat` and `serve` read with `--tune FILE` (flags on the command line win).
//!
//! ```text
//! # pinch tune profile
//! threads=2
//! budget=300M
//! batch=64
//! ```
//!
//! One setting per line; blank lines and lines starting with `#` are skipped; spaces
//! around the key and the value are ignored. Every key is known (a misspelt one is an
//! error, not silently ignored), each at most once, each value checked. The settings
//! are `threads`, `budget` (bytes, or `700M` / `1.2G`), `batch`, `head_rows`, `kv`
//! (`f16` / `f32`), `expert_pool`, `ctx` and `read_bw` (bytes/s, or `278M`); `model`,
//! `model_bytes`, `predicted_tps` and `ceiling_tps` record what tune saw and predicted
//! and change nothing. The parser never panics on any input (a fuzz target runs it).
use core::fmt::Write;

use crate::cli::{parse_rate, parse_size, Opts};
use crate::model::KvType;

/// The largest profile file read (a profile is a dozen short lines).
pub const MAX_BYTES: usize = 4096;

/// What is wrong with a profile line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProfileErrorKind {
    /// The file is larger than [`MAX_BYTES`].
    TooLarge,
    /// The line is not valid UTF-8.
    NotUtf8,
    /// The line has no `=`.
    NoEquals,
    UnknownKey,
    /// The key was already given on an earlier line.
    Duplicate,
    BadValue,
}

/// A profile that cannot be used: the line (from 1; 0 for the whole file) and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileError {
    pub line: usize,
    pub kind: ProfileErrorKind,
}

impl core::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: ", self.line)?;
        }
        match self.kind {
            ProfileErrorKind::TooLarge => {
                write!(f, "larger than {MAX_BYTES} bytes: not a tune profile")
            }
            ProfileErrorKind::NotUtf8 => write!(f, "not UTF-8 text"),
            ProfileErrorKind::NoEquals => write!(f, "expected key=value"),
            ProfileErrorKind::UnknownKey => write!(
                f,
                "unknown key (known: threads, budget, batch, head_rows, kv, expert_pool, ctx, read_bw, model, model_bytes, predicted_tps, ceiling_tps)"
            ),
            ProfileErrorKind::Duplicate => write!(f, "key given twice"),
            ProfileErrorKind::BadValue => write!(f, "bad value"),
        }
    }
}

impl core::error::Error for ProfileError {}

/// The settings of a profile (`None`: not in the file).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Profile<'t> {
    pub threads: Option<usize>,
    pub budget: Option<u64>,
    pub batch: Option<usize>,
    pub head_rows: Option<usize>,
    pub kv: Option<KvType>,
    pub expert_pool: Option<usize>,
    pub ctx: Option<usize>,
    pub read_bw: Option<u64>,
    /// The model tune measured (its file name) and its size in bytes.
    pub model: Option<&'t str>,
    pub model_bytes: Option<u64>,
    pub predicted_tps: Option<f64>,
    pub ceiling_tps: Option<f64>,
}

/// A count: digits only, at least `min`, at most `max`.
fn count(v: &str, min: usize, max: usize) -> Option<usize> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().filter(|n| (min..=max).contains(n))
}

/// A non-negative finite number.
fn rate(v: &str) -> Option<f64> {
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0)
}

/// Store `v` in `slot` unless it was set already.
fn set<T>(slot: &mut Option<T>, v: Option<T>) -> Result<(), ProfileErrorKind> {
    if slot.is_some() {
        return Err(ProfileErrorKind::Duplicate);
    }
    *slot = Some(v.ok_or(ProfileErrorKind::BadValue)?);
    Ok(())
}

impl<'t> Profile<'t> {
    /// Parse a profile file's bytes.
    ///
    /// # Errors
    /// A [`ProfileError`] naming the first bad line.
    pub fn parse(bytes: &'t [u8]) -> Result<Profile<'t>, ProfileError> {
        if bytes.len() > MAX_BYTES {
            return Err(ProfileError {
                line: 0,
                kind: ProfileErrorKind::TooLarge,
            });
        }
        let mut p = Profile::default();
        for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let at = |kind| ProfileError { line: i + 1, kind };
            let line = core::str::from_utf8(raw)
                .map_err(|_| at(ProfileErrorKind::NotUtf8))?
                .trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or(at(ProfileErrorKind::NoEquals))?;
            p.set(k.trim(), v.trim()).map_err(at)?;
        }
        Ok(p)
    }

    fn set(&mut self, k: &str, v: &'t str) -> Result<(), ProfileErrorKind> {
        const MAX: usize = 1 << 24;
        match k {
            "threads" => set(&mut self.threads, count(v, 1, crate::tune::MAX_THREADS)),
            "budget" => set(&mut self.budget, parse_size(v).filter(|&b| b > 0)),
            "batch" => set(&mut self.batch, count(v, 1, MAX)),
            "head_rows" => set(&mut self.head_rows, count(v, 0, MAX)),
            "kv" => set(
                &mut self.kv,
                match v {
                    "f16" => Some(KvType::F16),
                    "f32" => Some(KvType::F32),
                    _ => None,
                },
            ),
            "expert_pool" => set(&mut self.expert_pool, count(v, 0, MAX)),
            "ctx" => set(&mut self.ctx, count(v, 1, MAX)),
            "read_bw" => set(&mut self.read_bw, parse_rate(v)),
            "model" => set(&mut self.model, Some(v)),
            "model_bytes" => set(&mut self.model_bytes, v.parse().ok()),
            "predicted_tps" => set(&mut self.predicted_tps, rate(v)),
            "ceiling_tps" => set(&mut self.ceiling_tps, rate(v)),
            _ => Err(ProfileErrorKind::UnknownKey),
        }
    }

    /// Put the profile's settings into `o` (called before the command line's flags
    /// are parsed, so those win).
    pub fn apply(&self, o: &mut Opts) {
        if let Some(t) = self.threads {
            o.threads = t;
        }
        if self.budget.is_some() {
            o.budget = self.budget;
        }
        if let Some(b) = self.batch {
            o.n_batch = b;
        }
        if let Some(h) = self.head_rows {
            o.head_rows = h;
        }
        if let Some(kv) = self.kv {
            o.kv = kv;
        }
        if let Some(e) = self.expert_pool {
            o.moe_pool = e;
        }
        if let Some(c) = self.ctx {
            o.n_ctx = c;
        }
        if self.read_bw.is_some() {
            o.read_bw = self.read_bw;
        }
    }

    /// Write the profile as the file [`Profile::parse`] reads.
    pub fn write(&self, w: &mut dyn Write) -> core::fmt::Result {
        writeln!(
            w,
            "# pinch tune profile: pinch run --tune FILE -m MODEL (flags given there win)"
        )?;
        if let Some(m) = self.model {
            writeln!(w, "model={m}")?;
        }
        if let Some(b) = self.model_bytes {
            writeln!(w, "model_bytes={b}")?;
        }
        if let Some(t) = self.threads {
            writeln!(w, "threads={t}")?;
        }
        if let Some(b) = self.budget {
            writeln!(w, "budget={b}")?;
        }
        if let Some(b) = self.batch {
            writeln!(w, "batch={b}")?;
        }
        if let Some(h) = self.head_rows {
            writeln!(w, "head_rows={h}")?;
        }
        if let Some(kv) = self.kv {
            writeln!(w, "kv={}", kv_name(kv))?;
        }
        if let Some(e) = self.expert_pool {
            writeln!(w, "expert_pool={e}")?;
        }
        if let Some(c) = self.ctx {
            writeln!(w, "ctx={c}")?;
        }
        if let Some(r) = self.read_bw {
            writeln!(w, "read_bw={r}")?;
        }
        if let Some(t) = self.predicted_tps {
            writeln!(w, "predicted_tps={t:.2}")?;
        }
        if let Some(t) = self.ceiling_tps {
            writeln!(w, "ceiling_tps={t:.2}")?;
        }
        Ok(())
    }
}

/// The `--cache-type-k` name of a KV type.
pub fn kv_name(kv: KvType) -> &'static str {
    match kv {
        KvType::F32 => "f32",
        _ => "f16",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ProfileError {
        Profile::parse(text.as_bytes()).unwrap_err()
    }

    #[test]
    fn round_trips_what_it_writes() {
        let p = Profile {
            threads: Some(2),
            budget: Some(300 << 20),
            batch: Some(32),
            head_rows: Some(16384),
            kv: Some(KvType::F16),
            expert_pool: Some(6),
            ctx: Some(1024),
            read_bw: Some(278_000_000),
            model: Some("gemma.gguf"),
            model_bytes: Some(253113024),
            predicted_tps: Some(11.25),
            ceiling_tps: Some(6.5),
        };
        let mut s = heapless::String::<1024>::new();
        p.write(&mut s).unwrap();
        assert_eq!(Profile::parse(s.as_bytes()).unwrap(), p);
    }

    #[test]
    fn skips_comments_blank_lines_and_spaces() {
        let p = Profile::parse(b"# x\n\n  threads = 3 \r\nbudget=700M\nkv=f32\n").unwrap();
        assert_eq!(p.threads, Some(3));
        assert_eq!(p.budget, Some(700 << 20));
        assert_eq!(p.kv, Some(KvType::F32));
        assert_eq!(Profile::parse(b"").unwrap(), Profile::default());
    }

    #[test]
    fn bad_lines_name_their_line_and_kind() {
        use ProfileErrorKind::*;
        let cases: [(&str, usize, ProfileErrorKind); 10] = [
            ("threads=2\nbatch", 2, NoEquals),
            ("# c\n\nthreds=2", 3, UnknownKey),
            ("threads=2\nthreads=3", 2, Duplicate),
            ("threads=0", 1, BadValue),
            ("threads=-1", 1, BadValue),
            ("threads=99", 1, BadValue),
            ("batch=+4", 1, BadValue),
            ("kv=q8", 1, BadValue),
            ("budget=lots", 1, BadValue),
            ("read_bw=0", 1, BadValue),
        ];
        for (text, line, kind) in cases {
            assert_eq!(err(text), ProfileError { line, kind }, "{text:?}");
        }
        assert_eq!(
            Profile::parse(b"threads=1\n\xff=2").unwrap_err(),
            ProfileError {
                line: 2,
                kind: NotUtf8
            }
        );
        assert_eq!(
            Profile::parse(&[b'#'; MAX_BYTES + 1]).unwrap_err().kind,
            TooLarge
        );
        assert_eq!(err("predicted_tps=inf").kind, BadValue);
        assert_eq!(err("predicted_tps=-1").kind, BadValue);
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        // A small deterministic sweep of odd inputs (the fuzz target runs the rest).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let alphabet = b"=#\n \r0123456789.MGkthreadsbudgetkvf16\xff\xc3";
        for len in 0..200 {
            let mut buf = [0u8; 200];
            for b in buf.iter_mut().take(len) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = alphabet[(x % alphabet.len() as u64) as usize];
            }
            let _ = Profile::parse(&buf[..len]);
        }
    }

    #[test]
    fn applies_only_what_it_holds() {
        let mut o = Opts::parse(&["run", "-m", "m.gguf"]).unwrap();
        let before = o.clone();
        Profile::default().apply(&mut o);
        assert_eq!(
            (o.threads, o.budget, o.n_batch),
            (before.threads, before.budget, before.n_batch)
        );
        let p = Profile::parse(b"threads=3\nbudget=100M\nbatch=16\nctx=512\nread_bw=300M\nhead_rows=8192\nexpert_pool=4").unwrap();
        p.apply(&mut o);
        assert_eq!(o.threads, 3);
        assert_eq!(o.budget, Some(100 << 20));
        assert_eq!(
            (o.n_batch, o.n_ctx, o.head_rows, o.moe_pool),
            (16, 512, 8192, 4)
        );
        assert_eq!(o.read_bw, Some(300_000_000));
    }
}
