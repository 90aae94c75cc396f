//! Weight streaming: the units a weight pass reads from the file, in order of use, and
//! the two ways of getting them into stream zones.
//!
//! A pass (one batch through the layers, then the LM head for the positions that want
//! logits) uses the streamed layers in order and then, per head group, the head's
//! streamed chunks. That order is fixed by the model's diagram, so the schedule is
//! computed rather than recorded: unit `i` is always the same span of the file.
//!
//! - With an I/O thread ([`Platform::io_thread`]), a reader fills free zones ahead of
//!   use with direct reads and hands each one over full; the compute thread waits only
//!   when the unit it needs is not in yet, and gives each zone back right after use.
//!   Zones move between the two as `&mut [u8]` through two small locked queues, so
//!   neither side ever sees bytes the other is writing (no unsafe code).
//! - Without one, the compute thread reads each unit itself just before use.
//!
//! A wrong or failed read costs an error naming the offset, never wrong numbers:
//! `--verify-stream` re-reads every unit through the page cache and compares.
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::model::weights::Weights;
use crate::model::ModelError;
use crate::platform::{Platform, PlatformError};
use crate::residency::{Span, IO_ALIGN, STREAM_ZONES};

/// Reads `buf.len()` bytes at an offset of the model file (`direct`: uncached); returns
/// the count, short only at the end of the file.
pub type ReadFn<'r> = dyn Fn(u64, &mut [u8], bool) -> Result<usize, PlatformError> + Sync + 'r;

/// Zones a session owns between passes.
pub type Zones<'z> = heapless::Vec<&'z mut [u8], STREAM_ZONES>;

/// Bytes of the verify buffer (`--verify-stream` compares in pieces of this size).
pub const VERIFY_CHUNK: usize = 64 << 10;

/// What streaming cost so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Bytes read from storage into zones.
    pub bytes: u64,
    /// Units read.
    pub units: u64,
    /// Weight passes that streamed.
    pub passes: u64,
    /// Time the compute thread waited for a unit.
    pub wait_ns: u64,
    /// Units compared with the file (`--verify-stream`).
    pub verified: u64,
}

impl StreamStats {
    /// What was added since `earlier`.
    pub fn since(&self, earlier: &StreamStats) -> StreamStats {
        StreamStats {
            bytes: self.bytes - earlier.bytes,
            units: self.units - earlier.units,
            passes: self.passes - earlier.passes,
            wait_ns: self.wait_ns - earlier.wait_ns,
            verified: self.verified - earlier.verified,
        }
    }
}

/// The units of one pass.
#[derive(Clone, Copy)]
pub struct Schedule<'w, 'a> {
    pub w: &'w Weights<'a>,
    /// Head groups computed in this pass (0 when no position wants logits).
    pub head_groups: usize,
}

impl Schedule<'_, '_> {
    fn streamed_layers(&self) -> usize {
        self.w.layers.iter().filter(|l| l.stream.is_some()).count()
    }
    fn head_chunks(&self) -> usize {
        self.w.head_stream.map_or(0, |h| {
            (h.rows - self.w.output.rows).div_ceil(h.chunk_rows.max(1))
        })
    }
    pub fn len(&self) -> usize {
        self.streamed_layers() + self.head_groups * self.head_chunks()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The aligned file span of unit `i`, and where its useful bytes start in it.
    pub fn unit(&self, i: usize) -> (Span, usize) {
        let nl = self.streamed_layers();
        if i < nl {
            let lw = self.w.layers.iter().filter_map(|l| l.stream).nth(i);
            return (lw.map_or(Span::default(), |s| s.span), 0);
        }
        let c = (i - nl) % self.head_chunks().max(1);
        let Some(h) = self.w.head_stream else {
            return (Span::default(), 0);
        };
        let r = self.head_chunk_rows(c);
        let exact = Span {
            offset: h.offset + (r.start * h.row_bytes) as u64,
            len: (r.len() * h.row_bytes) as u64,
        };
        let a = exact.aligned();
        (a, (exact.offset - a.offset) as usize)
    }
    /// Head rows of streamed chunk `c`.
    pub fn head_chunk_rows(&self, c: usize) -> core::ops::Range<usize> {
        match self.w.head_stream {
            Some(h) => {
                let start = self.w.output.rows + c * h.chunk_rows;
                start..(start + h.chunk_rows).min(h.rows)
            }
            None => 0..0,
        }
    }
    pub fn head_chunks_per_group(&self) -> usize {
        self.head_chunks()
    }
}

/// Read unit span `s` into the front of `zone` with direct reads; optionally compare
/// with a buffered read of the same bytes.
pub(crate) fn fill(
    read: &ReadFn,
    zone: &mut [u8],
    s: Span,
    verify: Option<&mut [u8]>,
) -> Result<u64, ModelError> {
    let len = s.len as usize;
    let dst = zone
        .get_mut(..len)
        .ok_or(ModelError::BadShape("stream unit larger than its zone"))?;
    let mut done = 0;
    while done < len {
        let got =
            read(s.offset + done as u64, &mut dst[done..], true).map_err(ModelError::Platform)?;
        if got == 0 {
            break; // the aligned span may run past the end of the file
        }
        done += got;
    }
    // ... but by less than one I/O block: a read that ends earlier means the file
    // shrank under us, and the unit's bytes past it would be stale.
    if (len - done) as u64 >= IO_ALIGN {
        return Err(ModelError::ShortRead {
            offset: s.offset + done as u64,
        });
    }
    if let Some(buf) = verify {
        let mut at = 0;
        while at < done {
            let n = (done - at).min(buf.len());
            let piece = &mut buf[..n];
            let mut got = 0;
            while got < n {
                let k = read(s.offset + (at + got) as u64, &mut piece[got..], false)
                    .map_err(ModelError::Platform)?;
                if k == 0 {
                    return Err(ModelError::ShortRead {
                        offset: s.offset + (at + got) as u64,
                    });
                }
                got += k;
            }
            if let Some(j) = piece.iter().zip(&dst[at..at + n]).position(|(a, b)| a != b) {
                return Err(ModelError::StreamMismatch {
                    offset: s.offset + (at + j) as u64,
                });
            }
            at += n;
        }
    }
    Ok(done as u64)
}

/// Where zones wait between the reader and the compute thread.
pub struct Exchange<'z> {
    free: spin::Mutex<Zones<'z>>,
    ready: spin::Mutex<heapless::Deque<Filled<'z>, STREAM_ZONES>>,
    stop: AtomicBool,
    reader_done: AtomicBool,
    bytes: AtomicU64,
    units: AtomicU64,
    verified: AtomicU64,
}

type Filled<'z> = (&'z mut [u8], usize, Result<(), ModelError>);

impl<'z> Exchange<'z> {
    pub fn new(zones: Zones<'z>) -> Exchange<'z> {
        Exchange {
            free: spin::Mutex::new(zones),
            ready: spin::Mutex::new(heapless::Deque::new()),
            stop: AtomicBool::new(false),
            reader_done: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            units: AtomicU64::new(0),
            verified: AtomicU64::new(0),
        }
    }

    /// The reader: fill zones with the schedule's units in order until done or stopped.
    pub fn reader<P: Platform>(
        &self,
        p: &P,
        sched: &Schedule,
        read: &ReadFn,
        mut verify: Option<&mut [u8]>,
    ) {
        for i in 0..sched.len() {
            let zone = loop {
                if self.stop.load(Ordering::Acquire) {
                    self.reader_done.store(true, Ordering::Release);
                    return;
                }
                if let Some(z) = self.free.lock().pop() {
                    break z;
                }
                p.yield_now();
            };
            let (span, lead) = sched.unit(i);
            let res = fill(read, zone, span, verify.as_deref_mut());
            let failed = res.is_err();
            let res = res.map(|n| {
                self.bytes.fetch_add(n, Ordering::Relaxed);
                self.units.fetch_add(1, Ordering::Relaxed);
                if verify.is_some() {
                    self.verified.fetch_add(1, Ordering::Relaxed);
                }
            });
            // At most STREAM_ZONES zones exist, so the queue always has room.
            let _ = self.ready.lock().push_back((zone, lead, res));
            if failed {
                break;
            }
        }
        self.reader_done.store(true, Ordering::Release);
    }

    /// Stop the reader (at the end of a pass or on an error) and take the zones back.
    pub fn finish(self) -> (Zones<'z>, StreamStats) {
        let mut zones = self.free.into_inner();
        for (z, _, _) in self.ready.into_inner() {
            let _ = zones.push(z);
        }
        let stats = StreamStats {
            bytes: self.bytes.into_inner(),
            units: self.units.into_inner(),
            verified: self.verified.into_inner(),
            passes: 1,
            wait_ns: 0,
        };
        (zones, stats)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// How the forward pass gets its streamed units.
pub enum Source<'x, 'z, 's, 'a, P: Platform> {
    /// Nothing is streamed.
    None,
    /// The compute thread reads each unit itself.
    Sync {
        p: &'x P,
        zones: &'x mut Zones<'z>,
        sched: Schedule<'s, 'a>,
        read: &'x ReadFn<'x>,
        verify: Option<&'x mut [u8]>,
        next: usize,
        stats: StreamStats,
    },
    /// A reader thread fills zones ahead of use.
    Async {
        p: &'x P,
        ex: &'x Exchange<'z>,
        next: usize,
        wait_ns: u64,
    },
}

impl<'z, P: Platform> Source<'_, 'z, '_, '_, P> {
    /// The next unit of the schedule: its zone and where its bytes start in it.
    pub fn fetch(&mut self) -> Result<(&'z mut [u8], usize), ModelError> {
        match self {
            Source::None => Err(ModelError::BadShape("streamed weights without a stream")),
            Source::Sync {
                p,
                zones,
                sched,
                read,
                verify,
                next,
                stats,
            } => {
                let zone = zones
                    .pop()
                    .ok_or(ModelError::BadShape("no free stream zone"))?;
                let (span, lead) = sched.unit(*next);
                *next += 1;
                let t0 = p.now_ns();
                match fill(*read, zone, span, verify.as_deref_mut()) {
                    Ok(n) => {
                        stats.bytes += n;
                        stats.units += 1;
                        stats.verified += verify.is_some() as u64;
                        stats.wait_ns += p.now_ns().saturating_sub(t0);
                        Ok((zone, lead))
                    }
                    Err(e) => {
                        let _ = zones.push(zone);
                        Err(e)
                    }
                }
            }
            Source::Async {
                p,
                ex,
                next,
                wait_ns,
            } => {
                let t0 = p.now_ns();
                loop {
                    if let Some((zone, lead, res)) = ex.ready.lock().pop_front() {
                        *next += 1;
                        *wait_ns += p.now_ns().saturating_sub(t0);
                        return match res {
                            Ok(()) => Ok((zone, lead)),
                            Err(e) => {
                                let _ = ex.free.lock().push(zone);
                                Err(e)
                            }
                        };
                    }
                    if ex.reader_done.load(Ordering::Acquire) && ex.ready.lock().is_empty() {
                        return Err(ModelError::BadShape(
                            "the weight stream ended before the pass did",
                        ));
                    }
                    p.yield_now();
                }
            }
        }
    }

    /// Give a zone back after its last use in the pass.
    pub fn release(&mut self, zone: &'z mut [u8]) {
        match self {
            Source::None => {}
            Source::Sync { zones, .. } => {
                let _ = zones.push(zone);
            }
            Source::Async { ex, .. } => {
                let _ = ex.free.lock().push(zone);
            }
        }
    }
}

/// Round `n` up to whole direct-read blocks.
pub fn io_round(n: u64) -> u64 {
    n.div_ceil(IO_ALIGN) * IO_ALIGN
}
