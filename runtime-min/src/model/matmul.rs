//! Matrix products over the session's workers: the input quantized once per activation
//! format (as llama.cpp does), rows split across workers, the f32 oracle beside it.
use core::ops::Range;

use pinch_kernels::matvec::{quantize_activation_on, KernelError};
use pinch_kernels::repack::matmul_rows as repack_rows;
use pinch_kernels::{ActFormat, CpuFeatures};

use crate::model::forward::{Math, MAX_WORKERS};
use crate::model::weights::Tensor;
use crate::model::ModelError;
use crate::platform::Platform;

/// Matrix products on the session's math mode and workers.
pub struct MatMul<'p, P: Platform> {
    pub p: &'p P,
    pub math: Math,
    pub threads: usize,
    pub cpu: CpuFeatures,
}

impl<P: Platform> MatMul<'_, P> {
    /// `out[t * rows + r] = dot(w row r, x[t])` for `n` activation rows of `w.cols`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        w: &Tensor,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
    ) -> Result<(), ModelError> {
        self.linear_to(w, x, n, out, w.rows, 0, act_q, tmp, row)
    }

    /// [`Self::linear`] into columns `row0..row0 + w.rows` of an output whose rows
    /// (one per activation) are `stride` long: `out[t * stride + row0 + r]`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_to(
        &self,
        w: &Tensor,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        stride: usize,
        row0: usize,
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
    ) -> Result<(), ModelError> {
        let (cols, rows) = (w.cols, w.rows);
        match self.math {
            Math::Reference => {
                let row = &mut row[..cols];
                for r in 0..rows {
                    pinch_kernels::repack::dequantize_row(
                        w.layout,
                        w.ty,
                        w.data,
                        w.row_bytes(),
                        r,
                        row,
                    )?;
                    for t in 0..n {
                        let xt = &x[t * cols..(t + 1) * cols];
                        let mut acc = 0.0f64;
                        for (a, b) in row.iter().zip(xt) {
                            acc += (*a as f64) * (*b as f64);
                        }
                        out[t * stride + row0 + r] = acc as f32;
                    }
                }
                Ok(())
            }
            Math::Fast => {
                let fmt = w.ty.act_format().ok_or(KernelError::Unsupported(w.ty))?;
                self.quantize(fmt, x, n, cols, act_q)?;
                self.linear_pre(w, fmt, n, out, stride, row0, act_q, tmp)
            }
        }
    }

    /// Several matrices of the same input (q/k/v, gate/up): the input is quantized once
    /// per activation format, not once per matrix. One token through matrices of one
    /// format runs as a single parallel pass over all their rows
    /// ([`Self::linear_many_one_pass`]).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_many(
        &self,
        x: &[f32],
        n: usize,
        jobs: &mut [(&Tensor, &mut [f32])],
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
    ) -> Result<(), ModelError> {
        if n == 1 && self.linear_many_one_pass(x, jobs, act_q, tmp)? {
            return Ok(());
        }
        let mut have = None;
        for (w, out) in jobs.iter_mut() {
            self.linear_reusing(w, x, n, out, w.rows, 0, act_q, tmp, row, &mut have)?;
        }
        Ok(())
    }

    /// [`Self::linear_many`] for one token as one split of all the matrices' rows across
    /// the workers: one dispatch and join instead of one per matrix (at two threads a
    /// small model's decode step is dozens of matrices of a few hundred KiB, where each
    /// join's wait counts). Only when every matrix pairs with the same activation format
    /// and width and [`Self::one_pass_fits`]; `Ok(false)` otherwise, with nothing done.
    /// Each row's dot is the one [`Self::linear_pre`] computes: same bits.
    fn linear_many_one_pass(
        &self,
        x: &[f32],
        jobs: &mut [(&Tensor, &mut [f32])],
        act_q: &mut [u8],
        tmp: &mut [f32],
    ) -> Result<bool, ModelError> {
        let Some(fmt) = jobs.first().and_then(|(w, _)| w.ty.act_format()) else {
            return Ok(false);
        };
        let cols = jobs[0].0.cols;
        let Some(arb) = fmt.row_bytes(cols) else {
            return Ok(false);
        };
        let same = jobs
            .iter()
            .all(|(w, _)| w.ty.act_format() == Some(fmt) && w.cols == cols);
        let mats = jobs.iter().map(|(w, o)| (*w, o.len()));
        if !same || !self.one_pass_fits(mats, arb, act_q, tmp) {
            return Ok(false);
        }
        self.quantize(fmt, x, 1, cols, act_q)?;
        let acts = &act_q[..arb];
        let mats: &[(&Tensor, &mut [f32])] = jobs;
        self.one_pass(mats.len(), &|i| (mats[i].0, acts), tmp)?;
        spread_rows(tmp, jobs.iter_mut().map(|(w, out)| (w.rows, &mut **out)));
        Ok(true)
    }

    /// One token through several matrices, each with its own input: `out = w · x` for
    /// every `(w, x, out)` of `jobs` (the experts' down projections of one MoE layer).
    /// One split of all their rows across the workers where [`Self::one_pass_fits`]
    /// (each input quantized to its own matrix's format, one after another in `act_q`),
    /// else one product per job; the same bits either way.
    pub fn linear_each(
        &self,
        jobs: &mut [(&Tensor, &[f32], &mut [f32])],
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
    ) -> Result<(), ModelError> {
        // Each job's activation format and the end of its bytes in `act_q`.
        let mut ends = [(ActFormat::F32, 0usize); MAX_EACH];
        let mut at = 0;
        let mut known = jobs.len() <= MAX_EACH;
        for ((w, _, _), end) in jobs.iter().zip(ends.iter_mut()) {
            match w
                .ty
                .act_format()
                .and_then(|f| Some((f, f.row_bytes(w.cols)?)))
            {
                Some((fmt, arb)) => {
                    at += arb;
                    *end = (fmt, at);
                }
                None => known = false,
            }
        }
        let mats = jobs.iter().map(|(w, _, o)| (*w, o.len()));
        if !known || !self.one_pass_fits(mats, at, act_q, tmp) {
            for (w, x, out) in jobs.iter_mut() {
                self.linear(w, x, 1, out, act_q, tmp, row)?;
            }
            return Ok(());
        }
        let mut start = 0;
        for ((w, x, _), &(fmt, end)) in jobs.iter().zip(&ends) {
            self.quantize(fmt, x, 1, w.cols, &mut act_q[start..end])?;
            start = end;
        }
        let acts: &[u8] = act_q;
        let mats: &[(&Tensor, &[f32], &mut [f32])] = jobs;
        let input = |i: usize| &acts[if i == 0 { 0 } else { ends[i - 1].1 }..ends[i].1];
        self.one_pass(mats.len(), &|i| (mats[i].0, input(i)), tmp)?;
        spread_rows(tmp, jobs.iter_mut().map(|(w, _, out)| (w.rows, &mut **out)));
        Ok(())
    }

    /// Whether `mats` (each with its output's length) may run as one split
    /// ([`Self::one_pass`]) with `act_bytes` of quantized inputs: several workers, fast
    /// math, at least two matrices, each with a multiple of [`ROW_GRAIN`] rows (so no
    /// worker's range starts inside a repacked row group), all rows fitting `tmp` and
    /// all inputs `act_q`.
    fn one_pass_fits<'t>(
        &self,
        mats: impl Iterator<Item = (&'t Tensor<'t>, usize)>,
        act_bytes: usize,
        act_q: &[u8],
        tmp: &[f32],
    ) -> bool {
        let (mut count, mut total, mut grained) = (0, 0, true);
        for (w, out_len) in mats {
            count += 1;
            total += w.rows;
            grained &= w.rows % ROW_GRAIN == 0 && out_len >= w.rows;
        }
        grained
            && self.math == Math::Fast
            && self.threads.min(self.p.workers()) >= 2
            && count >= 2
            && total <= tmp.len()
            && act_bytes <= act_q.len()
    }

    /// The rows of `n_mats` matrices (`mat(i)`: matrix i and its input, one quantized
    /// row in the matrix's activation format) split as one range across the workers,
    /// into `tmp` one matrix after another.
    fn one_pass<'t>(
        &self,
        n_mats: usize,
        mat: &(dyn Fn(usize) -> (&'t Tensor<'t>, &'t [u8]) + Sync),
        tmp: &mut [f32],
    ) -> Result<(), ModelError> {
        let total: usize = (0..n_mats).map(|i| mat(i).0.rows).sum();
        let err = spin::Mutex::new(None::<KernelError>);
        let cpu = self.cpu;
        par_rows(
            self.p,
            self.threads,
            total,
            1,
            &mut tmp[..total],
            &|r, o| {
                // The part of each matrix that falls in `r`, in that matrix's row numbers.
                let mut base = 0;
                for i in 0..n_mats {
                    let (w, acts) = mat(i);
                    let (lo, hi) = (r.start.max(base), r.end.min(base + w.rows));
                    if lo < hi {
                        let o = &mut o[lo - r.start..hi - r.start];
                        let local = lo - base..hi - base;
                        let (rb, arb) = (w.row_bytes(), acts.len());
                        if let Err(e) =
                            repack_rows(w.layout, w.ty, &cpu, w.data, rb, local, acts, arb, o)
                        {
                            *err.lock() = Some(e);
                        }
                    }
                    base += w.rows;
                }
            },
        );
        match err.into_inner() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// [`Self::linear_to`] where `have` is the format `act_q` already holds `x` in (if
    /// any): the input is quantized only when the format changes, and `have` updated.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_reusing(
        &self,
        w: &Tensor,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        stride: usize,
        row0: usize,
        act_q: &mut [u8],
        tmp: &mut [f32],
        row: &mut [f32],
        have: &mut Option<ActFormat>,
    ) -> Result<(), ModelError> {
        if self.math == Math::Reference {
            return self.linear_to(w, x, n, out, stride, row0, act_q, tmp, row);
        }
        let fmt = w.ty.act_format().ok_or(KernelError::Unsupported(w.ty))?;
        if *have != Some(fmt) {
            self.quantize(fmt, x, n, w.cols, act_q)?;
            *have = Some(fmt);
        }
        self.linear_pre(w, fmt, n, out, stride, row0, act_q, tmp)
    }

    /// Quantize `n` rows of `cols` values of `x` into `act_q` (rows split across the
    /// workers when there are several).
    pub fn quantize(
        &self,
        fmt: ActFormat,
        x: &[f32],
        n: usize,
        cols: usize,
        act_q: &mut [u8],
    ) -> Result<(), ModelError> {
        let arb = fmt
            .row_bytes(cols)
            .ok_or(ModelError::BadShape("activation row is not whole blocks"))?;
        let err = spin::Mutex::new(None::<KernelError>);
        par_chunks(
            self.p,
            self.threads,
            n,
            &mut act_q[..n * arb],
            arb,
            &|ts, dst| {
                for (i, t) in ts.enumerate() {
                    let r = quantize_activation_on(
                        &self.cpu,
                        fmt,
                        &x[t * cols..(t + 1) * cols],
                        &mut dst[i * arb..(i + 1) * arb],
                    );
                    if let Err(e) = r {
                        *err.lock() = Some(e);
                    }
                }
            },
        );
        match err.into_inner() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// The product of `w` with `n` activation rows already quantized (by
    /// [`Self::quantize`], format `fmt`) in `act_q`, into columns `row0..` of `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_pre(
        &self,
        w: &Tensor,
        fmt: ActFormat,
        n: usize,
        out: &mut [f32],
        stride: usize,
        row0: usize,
        act_q: &[u8],
        tmp: &mut [f32],
    ) -> Result<(), ModelError> {
        let (cols, rows) = (w.cols, w.rows);
        let arb = fmt.row_bytes(cols).ok_or(KernelError::Unsupported(w.ty))?;
        let acts = &act_q[..n * arb];
        let rb = w.row_bytes();
        let err = spin::Mutex::new(None::<KernelError>);
        let cpu = self.cpu;
        if n == 1 {
            let o1 = &mut out[row0..row0 + rows];
            par_rows(self.p, self.threads, rows, 1, o1, &|r, o| {
                if let Err(e) = repack_rows(w.layout, w.ty, &cpu, w.data, rb, r, acts, arb, o) {
                    *err.lock() = Some(e);
                }
            });
        } else {
            let tmp = &mut tmp[..rows * n];
            par_rows(self.p, self.threads, rows, n, tmp, &|r, o| {
                if let Err(e) = repack_rows(w.layout, w.ty, &cpu, w.data, rb, r, acts, arb, o) {
                    *err.lock() = Some(e);
                }
            });
            // [rows][n] -> [n][stride] at column row0, tokens split across workers, in
            // bands of 16 rows: per token, one run of 16 output floats (a cache line)
            // from 16 rows of `tmp` whose lines the next tokens reuse, so both sides
            // stay in L1. (Row by row, each row's writes touch one line per token; a
            // token-outer loop reads `tmp` with a stride of n floats: a miss per value
            // on a 262k-row head.)
            let tmp: &[f32] = tmp;
            par_chunks(
                self.p,
                self.threads,
                n,
                &mut out[..n * stride],
                stride,
                &|ts, dst| transpose_band(tmp, n, ts, rows, dst, stride, row0),
            );
        }
        match err.into_inner() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// Rows `0..rows` of `tmp` ([rows][n]) at tokens `ts`, written token-major into `dst`
/// (the tokens' rows of the output, `stride` floats each) at columns `row0..row0 + rows`.
fn transpose_band(
    tmp: &[f32],
    n: usize,
    ts: Range<usize>,
    rows: usize,
    dst: &mut [f32],
    stride: usize,
    row0: usize,
) {
    const BAND: usize = 16;
    for r0 in (0..rows).step_by(BAND) {
        let band = BAND.min(rows - r0);
        for (i, t) in ts.clone().enumerate() {
            let d = &mut dst[i * stride + row0 + r0..][..band];
            for (k, v) in d.iter_mut().enumerate() {
                *v = tmp[(r0 + k) * n + t];
            }
        }
    }
}

/// Split `n` items of `width` elements each (consecutive in `out`) across workers;
/// `f(items, their elements)`. Small jobs stay on the calling thread.
pub fn par_chunks<P: Platform, T: Send>(
    p: &P,
    threads: usize,
    n: usize,
    out: &mut [T],
    width: usize,
    f: &(dyn Fn(Range<usize>, &mut [T]) + Sync),
) {
    let none: &mut [u8] = &mut [];
    par_chunks_pair(p, threads, n, (out, width), (none, 0), &|r, a, _| f(r, a));
}

/// The work of [`par_chunks_pair`]: items, then their elements of each buffer.
pub type PairFn<'f, T, U> = dyn Fn(Range<usize>, &mut [T], &mut [U]) + Sync + 'f;

/// [`par_chunks`] over two buffers of `n` items each (`a.0` of `a.1` elements per item,
/// `b.0` of `b.1`): `f(items, their elements of a, their elements of b)`.
pub fn par_chunks_pair<P: Platform, T: Send, U: Send>(
    p: &P,
    threads: usize,
    n: usize,
    a: (&mut [T], usize),
    b: (&mut [U], usize),
    f: &PairFn<'_, T, U>,
) {
    let ((a, wa), (b, wb)) = (a, b);
    let nt = threads.min(p.workers()).clamp(1, MAX_WORKERS).min(n.max(1));
    if nt == 1 || n < 4 {
        f(0..n, a, b);
        return;
    }
    type Part<'x, T, U> = spin::Mutex<(Range<usize>, &'x mut [T], &'x mut [U])>;
    let mut parts: heapless::Vec<Part<'_, T, U>, MAX_WORKERS> = heapless::Vec::new();
    let (mut rest_a, mut rest_b) = (a, b);
    let mut start = 0;
    for i in 0..nt {
        let end = n * (i + 1) / nt;
        let (pa, ta) = core::mem::take(&mut rest_a).split_at_mut((end - start) * wa);
        let (pb, tb) = core::mem::take(&mut rest_b).split_at_mut((end - start) * wb);
        let _ = parts.push(spin::Mutex::new((start..end, pa, pb)));
        (rest_a, rest_b) = (ta, tb);
        start = end;
    }
    p.parallel(nt, &|i| {
        let mut g = parts[i].lock();
        let (r, pa, pb) = &mut *g;
        if r.start < r.end {
            f(r.clone(), pa, pb);
        }
    });
}

/// Rows not yet handed out by [`par_rows`]: the next row and their outputs.
type RowsLeft<'o> = spin::Mutex<(usize, &'o mut [f32])>;

/// Rows per chunk are kept a multiple of this, so interleaved kernels see whole groups
/// (16: the widest interleave, Q1_0x16; a chunk that split a group would make two
/// workers compute it).
const ROW_GRAIN: usize = 16;

/// Copy [`MatMul::one_pass`]'s rows, one matrix after another in `tmp`, to each
/// matrix's `(rows, output)`.
fn spread_rows<'o>(tmp: &[f32], outs: impl Iterator<Item = (usize, &'o mut [f32])>) {
    let mut base = 0;
    for (rows, out) in outs {
        out[..rows].copy_from_slice(&tmp[base..base + rows]);
        base += rows;
    }
}

/// Most matrices [`MatMul::linear_each`] runs as one split (a MoE layer's picks and its
/// shared expert; more run one product each).
const MAX_EACH: usize = 40;

/// Split `rows` (with `n_tok` outputs each, row-major in `out`) across workers with
/// guided scheduling: each worker takes `remaining / (2 x workers)` rows at a time (a
/// multiple of 16, at least 16), so a preempted or slower core leaves a short tail instead
/// of half the matrix. Which rows a worker computes never changes their results.
pub fn par_rows<P: Platform>(
    p: &P,
    threads: usize,
    rows: usize,
    n_tok: usize,
    out: &mut [f32],
    f: &(dyn Fn(Range<usize>, &mut [f32]) + Sync),
) {
    let nt = threads
        .min(p.workers())
        .clamp(1, MAX_WORKERS)
        .min(rows.div_ceil(ROW_GRAIN).max(1));
    if nt == 1 {
        f(0..rows, out);
        return;
    }
    let left: RowsLeft<'_> = spin::Mutex::new((0, &mut out[..rows * n_tok]));
    p.parallel(nt, &|_| loop {
        let (r, o) = {
            let mut g = left.lock();
            let (next, rest) = &mut *g;
            let remaining = rows - *next;
            if remaining == 0 {
                break;
            }
            let take = (remaining / (2 * nt) / ROW_GRAIN * ROW_GRAIN)
                .max(ROW_GRAIN)
                .min(remaining);
            let (o, tail) = core::mem::take(rest).split_at_mut(take * n_tok);
            *rest = tail;
            let r = *next..*next + take;
            *next += take;
            (r, o)
        };
        f(r, o);
    });
}
