//! The routing trace: which experts each token used in each MoE layer, in a compact
//! binary file that `pinch moe-trace` writes and `pinch moe-sim` replays.
//!
//! Layout (little-endian): `b"PMOE"`, version `u32` (1), MoE layers `u32`, experts per
//! layer `u32`, experts per token `u32`; then one record per token: for each MoE layer in
//! order, the token's experts as `u16` ids. Nothing else: a file is valid when its length
//! is the header plus whole records and every id is below the expert count.

/// Header bytes.
pub const HEADER: usize = 20;
const MAGIC: &[u8; 4] = b"PMOE";
const VERSION: u32 = 1;

/// Why a trace file was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceError {
    /// Shorter than the header, or not a trace (magic).
    NotATrace,
    UnsupportedVersion(u32),
    /// Zero or too many layers, experts or picks.
    BadShape {
        layers: u32,
        experts: u32,
        picks: u32,
    },
    /// The body is not whole records.
    Truncated {
        body: usize,
        record: usize,
    },
    /// An expert id at this byte offset is outside the layer.
    BadId {
        offset: usize,
        id: u16,
    },
    /// The writer's buffer is full.
    Full,
}

impl core::fmt::Display for TraceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TraceError::NotATrace => write!(f, "not a pinch MoE trace (no PMOE header)"),
            TraceError::UnsupportedVersion(v) => {
                write!(f, "trace version {v}; this pinch reads version {VERSION}")
            }
            TraceError::BadShape {
                layers,
                experts,
                picks,
            } => write!(
                f,
                "trace header: {layers} layers, {experts} experts, {picks} per token (each must be >= 1, experts <= {}, picks <= experts)",
                super::MAX_EXPERTS
            ),
            TraceError::Truncated { body, record } => write!(
                f,
                "trace body of {body} bytes is not whole records of {record} bytes (truncated?)"
            ),
            TraceError::BadId { offset, id } => {
                write!(f, "trace: expert id {id} at byte {offset} is outside the layer")
            }
            TraceError::Full => write!(f, "trace buffer full"),
        }
    }
}

impl core::error::Error for TraceError {}

/// A parsed trace (borrowing the file's bytes).
#[derive(Clone, Copy, Debug)]
pub struct Trace<'a> {
    pub layers: usize,
    pub experts: usize,
    pub picks: usize,
    body: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<'a> Trace<'a> {
    /// Check every field and every id once; afterwards reads cannot fail.
    pub fn parse(bytes: &'a [u8]) -> Result<Trace<'a>, TraceError> {
        if bytes.len() < HEADER || &bytes[..4] != MAGIC {
            return Err(TraceError::NotATrace);
        }
        let version = u32_at(bytes, 4);
        if version != VERSION {
            return Err(TraceError::UnsupportedVersion(version));
        }
        let (layers, experts, picks) = (u32_at(bytes, 8), u32_at(bytes, 12), u32_at(bytes, 16));
        if layers == 0
            || layers as usize > crate::model::config::MAX_LAYERS
            || experts == 0
            || experts as usize > super::MAX_EXPERTS
            || picks == 0
            || picks > experts
        {
            return Err(TraceError::BadShape {
                layers,
                experts,
                picks,
            });
        }
        let t = Trace {
            layers: layers as usize,
            experts: experts as usize,
            picks: picks as usize,
            body: &bytes[HEADER..],
        };
        let record = t.record_bytes();
        if !t.body.len().is_multiple_of(record) {
            return Err(TraceError::Truncated {
                body: t.body.len(),
                record,
            });
        }
        for (i, c) in t.body.chunks_exact(2).enumerate() {
            let id = u16::from_le_bytes([c[0], c[1]]);
            if id as usize >= t.experts {
                return Err(TraceError::BadId {
                    offset: HEADER + 2 * i,
                    id,
                });
            }
        }
        Ok(t)
    }

    fn record_bytes(&self) -> usize {
        2 * self.layers * self.picks
    }

    /// Tokens recorded.
    pub fn tokens(&self) -> usize {
        self.body.len() / self.record_bytes()
    }

    /// The experts token `t` used in MoE layer `l` (into `out`, `picks` long).
    pub fn picks_of(&self, t: usize, l: usize, out: &mut [u16]) {
        let at = t * self.record_bytes() + 2 * l * self.picks;
        for (o, c) in out
            .iter_mut()
            .zip(self.body[at..at + 2 * self.picks].chunks_exact(2))
        {
            *o = u16::from_le_bytes([c[0], c[1]]);
        }
    }
}

/// Writes a trace into a caller's buffer, token by token.
pub struct TraceWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
    layers: usize,
    picks: usize,
    /// Layers written for the current token.
    at_layer: usize,
    /// Records reserved for out of order writing (see [`Self::reserve`]).
    pending: usize,
}

impl<'a> TraceWriter<'a> {
    pub fn new(
        buf: &'a mut [u8],
        layers: usize,
        experts: usize,
        picks: usize,
    ) -> Result<TraceWriter<'a>, TraceError> {
        if buf.len() < HEADER {
            return Err(TraceError::Full);
        }
        buf[..4].copy_from_slice(MAGIC);
        for (i, v) in [VERSION, layers as u32, experts as u32, picks as u32]
            .iter()
            .enumerate()
        {
            buf[4 + 4 * i..8 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        Ok(TraceWriter {
            buf,
            len: HEADER,
            layers,
            picks,
            at_layer: 0,
            pending: 0,
        })
    }

    /// The next MoE layer's experts for the current token (`picks` ids; layers in order,
    /// then the next token).
    pub fn push(&mut self, ids: &[u16]) -> Result<(), TraceError> {
        let n = 2 * self.picks;
        if ids.len() != self.picks || self.len + n > self.buf.len() {
            return Err(TraceError::Full);
        }
        for (c, id) in self.buf[self.len..self.len + n]
            .chunks_exact_mut(2)
            .zip(ids)
        {
            c.copy_from_slice(&id.to_le_bytes());
        }
        self.len += n;
        self.at_layer = (self.at_layer + 1) % self.layers.max(1);
        Ok(())
    }

    /// The bytes of the whole tokens written so far (with [`Self::set`]: including the
    /// tokens of the last [`Self::reserve`]).
    pub fn bytes(&self) -> &[u8] {
        let record = 2 * self.layers * self.picks;
        let end = (self.len + self.pending * record).min(self.buf.len());
        let whole = (end - HEADER) / record.max(1) * record;
        &self.buf[..HEADER + whole]
    }

    /// Out of order writing for a batch: the next `tokens` records are written with
    /// [`Self::set`] (layer by layer, as a weight pass makes them). Commits the records
    /// of the previous reserve.
    pub fn reserve(&mut self, tokens: usize) {
        let record = 2 * self.layers * self.picks;
        self.len = (self.len + self.pending * record).min(self.buf.len());
        self.pending = tokens;
    }

    /// Token `t` of the last reserve used `ids` in MoE layer `layer`. Records past the
    /// buffer are dropped (the trace then ends early; [`Self::bytes`] has whole tokens).
    pub fn set(&mut self, t: usize, layer: usize, ids: &[u16]) {
        let record = 2 * self.layers * self.picks;
        let at = self.len + t * record + layer * 2 * self.picks;
        if t >= self.pending || layer >= self.layers || ids.len() != self.picks {
            return;
        }
        if let Some(dst) = self.buf.get_mut(at..at + 2 * self.picks) {
            for (c, id) in dst.chunks_exact_mut(2).zip(ids) {
                c.copy_from_slice(&id.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(buf: &mut [u8]) -> usize {
        let mut w = TraceWriter::new(buf, 2, 4, 2).unwrap();
        for ids in [[0u16, 1], [2, 3], [1, 0], [3, 2], [0, 3], [1, 2]] {
            w.push(&ids).unwrap();
        }
        w.bytes().len()
    }

    #[test]
    fn writes_and_reads_back() {
        let mut buf = [0u8; 64];
        let n = sample(&mut buf);
        assert_eq!(n, HEADER + 3 * 8);
        let t = Trace::parse(&buf[..n]).unwrap();
        assert_eq!((t.layers, t.experts, t.picks, t.tokens()), (2, 4, 2, 3));
        let mut got = [0u16; 2];
        t.picks_of(2, 1, &mut got);
        assert_eq!(got, [1, 2]);
        t.picks_of(1, 0, &mut got);
        assert_eq!(got, [1, 0]);
    }

    #[test]
    fn rejects_each_kind_of_bad_file() {
        let mut buf = [0u8; 64];
        let n = sample(&mut buf);
        assert_eq!(Trace::parse(&buf[..10]).err(), Some(TraceError::NotATrace));
        let mut b = buf;
        b[4] = 9;
        assert_eq!(
            Trace::parse(&b[..n]).err(),
            Some(TraceError::UnsupportedVersion(9))
        );
        let mut b = buf;
        b[16] = 5; // picks > experts
        assert!(matches!(
            Trace::parse(&b[..n]),
            Err(TraceError::BadShape { picks: 5, .. })
        ));
        assert_eq!(
            Trace::parse(&buf[..n - 2]).err(),
            Some(TraceError::Truncated {
                body: n - 2 - HEADER,
                record: 8
            })
        );
        let mut b = buf;
        b[HEADER + 6] = 4;
        assert_eq!(
            Trace::parse(&b[..n]).err(),
            Some(TraceError::BadId {
                offset: HEADER + 6,
                id: 4
            })
        );
    }
}
