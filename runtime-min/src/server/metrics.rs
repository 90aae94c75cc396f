//! Server counters and the `/metrics` page (Prometheus text format 0.0.4).
use core::fmt::Write;

/// What the server has done so far; gauges describe the latest generation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics {
    pub requests: u64,
    pub rejected_busy: u64,
    pub client_errors: u64,
    pub disconnects: u64,
    pub generations: u64,
    pub tokens_generated: u64,
    pub prompt_tokens: u64,
    /// Generations the memory guard stopped.
    pub guard_stops: u64,
    /// Generation speed of the running (or last) generation.
    pub gen_tps: f64,
    pub prompt_tps: f64,
    /// Prompt tokens reused from the cache (not evaluated).
    pub prompt_cached: u64,
    /// Time spent on prompts and on generated tokens.
    pub prompt_seconds: f64,
    pub gen_seconds: f64,
    /// Weight passes (prompt batches and generated tokens fed back).
    pub decode_passes: u64,
    /// Most tokens a generation held in the context.
    pub n_tokens_max: u64,
    /// Speculative decoding (`--draft`): passes that verified a draft, tokens drafted,
    /// and drafted tokens the sampler kept.
    pub drafts: u64,
    pub draft_tokens: u64,
    pub draft_accepted: u64,
    /// `--parallel`: decode passes that carried several answers, and the most answers
    /// one pass carried.
    pub batched_passes: u64,
    pub batch_rows_max: u64,
}

/// Figures that come from the platform and the queue at the time of the scrape.
#[derive(Clone, Copy, Debug, Default)]
pub struct Live {
    pub rss: Option<u64>,
    pub peak_rss: Option<u64>,
    pub available: Option<u64>,
    pub budget: Option<u64>,
    pub queue: usize,
    pub queue_capacity: usize,
    pub generating: bool,
    /// Generations running (up to `--parallel`).
    pub processing: usize,
    pub n_ctx: usize,
}

/// One sample with its help and type lines, named `{prefix}{name}`.
fn sample(
    w: &mut dyn Write,
    prefix: &str,
    name: &str,
    kind: &str,
    help: &str,
    value: &dyn core::fmt::Display,
) -> core::fmt::Result {
    write!(
        w,
        "# HELP {prefix}{name} {help}\n# TYPE {prefix}{name} {kind}\n{prefix}{name} {value}\n"
    )
}

fn metric(
    w: &mut dyn Write,
    name: &str,
    kind: &str,
    help: &str,
    value: &dyn core::fmt::Display,
) -> core::fmt::Result {
    sample(w, "pinch_", name, kind, help, value)
}

impl Metrics {
    /// llama-server's metrics, from the same counters. Its drafts are prompt-lookup
    /// drafts (`--draft`, one slot only).
    fn write_llama(&self, l: &Live, w: &mut dyn Write) -> core::fmt::Result {
        let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        // llama-server's names (`llamacpp:NAME`), for dashboards made for it.
        let llama_metric = |w: &mut dyn Write, name, kind, help, v: &dyn core::fmt::Display| {
            sample(w, "llamacpp:", name, kind, help, v)
        };
        let c = "counter";
        llama_metric(
            w,
            "prompt_tokens_total",
            c,
            "Number of prompt tokens processed.",
            &self.prompt_tokens,
        )?;
        llama_metric(
            w,
            "prompt_tokens_cached_total",
            c,
            "Number of prompt tokens reused from the cache.",
            &self.prompt_cached,
        )?;
        llama_metric(
            w,
            "prompt_seconds_total",
            c,
            "Prompt process time",
            &self.prompt_seconds,
        )?;
        llama_metric(
            w,
            "tokens_predicted_total",
            c,
            "Number of generation tokens processed.",
            &self.tokens_generated,
        )?;
        llama_metric(
            w,
            "tokens_predicted_seconds_total",
            c,
            "Predict process time",
            &self.gen_seconds,
        )?;
        llama_metric(
            w,
            "n_decode_total",
            c,
            "Total number of llama_decode() calls",
            &self.decode_passes,
        )?;
        llama_metric(
            w,
            "n_tokens_max",
            c,
            "Largest observed n_tokens.",
            &self.n_tokens_max,
        )?;
        llama_metric(
            w,
            "spec_decode_num_draft_tokens_total",
            c,
            "Draft tokens proposed.",
            &self.draft_tokens,
        )?;
        llama_metric(
            w,
            "spec_decode_num_accepted_tokens_total",
            c,
            "Draft tokens accepted.",
            &self.draft_accepted,
        )?;
        llama_metric(
            w,
            "spec_decode_num_drafts_total",
            c,
            "Drafts made.",
            &self.drafts,
        )?;
        let g = "gauge";
        llama_metric(
            w,
            "prompt_tokens_seconds",
            g,
            "Average prompt throughput in tokens/s.",
            &rate(self.prompt_tokens, self.prompt_seconds),
        )?;
        llama_metric(
            w,
            "predicted_tokens_seconds",
            g,
            "Average generation throughput in tokens/s.",
            &rate(self.tokens_generated, self.gen_seconds),
        )?;
        llama_metric(
            w,
            "requests_processing",
            g,
            "Number of requests processing.",
            &l.processing,
        )?;
        llama_metric(
            w,
            "requests_deferred",
            g,
            "Number of requests deferred.",
            &l.queue,
        )?;
        llama_metric(
            w,
            "n_busy_slots_per_decode",
            g,
            "Average number of busy slots per llama_decode() call",
            &u8::from(self.decode_passes > 0),
        )
    }

    /// Write the Prometheus exposition text.
    pub fn write(&self, l: &Live, w: &mut dyn Write) -> core::fmt::Result {
        self.write_llama(l, w)?;
        metric(
            w,
            "requests_total",
            "counter",
            "HTTP requests answered or queued",
            &self.requests,
        )?;
        metric(
            w,
            "requests_rejected_total",
            "counter",
            "Requests refused with 503 because the queue was full",
            &self.rejected_busy,
        )?;
        metric(
            w,
            "requests_invalid_total",
            "counter",
            "Requests answered with a 4xx status",
            &self.client_errors,
        )?;
        metric(
            w,
            "disconnects_total",
            "counter",
            "Generations stopped because the client went away",
            &self.disconnects,
        )?;
        metric(
            w,
            "generations_total",
            "counter",
            "Generations run",
            &self.generations,
        )?;
        metric(
            w,
            "tokens_generated_total",
            "counter",
            "Tokens generated",
            &self.tokens_generated,
        )?;
        metric(
            w,
            "prompt_tokens_total",
            "counter",
            "Prompt tokens evaluated",
            &self.prompt_tokens,
        )?;
        metric(
            w,
            "guard_stops_total",
            "counter",
            "Generations stopped because available memory fell under the --guard floor",
            &self.guard_stops,
        )?;
        metric(
            w,
            "tokens_per_second",
            "gauge",
            "Generation speed of the running or last generation",
            &Fixed(self.gen_tps),
        )?;
        metric(
            w,
            "prompt_tokens_per_second",
            "gauge",
            "Prompt evaluation speed of the running or last generation",
            &Fixed(self.prompt_tps),
        )?;
        metric(
            w,
            "rss_bytes",
            "gauge",
            "Resident set size",
            &l.rss.unwrap_or(0),
        )?;
        metric(
            w,
            "peak_rss_bytes",
            "gauge",
            "Peak resident set size",
            &l.peak_rss.unwrap_or(0),
        )?;
        metric(
            w,
            "available_memory_bytes",
            "gauge",
            "Memory the OS could still give (MemAvailable)",
            &l.available.unwrap_or(0),
        )?;
        metric(
            w,
            "budget_bytes",
            "gauge",
            "The --budget memory cap (0: none)",
            &l.budget.unwrap_or(0),
        )?;
        metric(
            w,
            "queue_length",
            "gauge",
            "Requests waiting for the running generation",
            &l.queue,
        )?;
        metric(
            w,
            "queue_capacity",
            "gauge",
            "Requests that may wait (--queue)",
            &l.queue_capacity,
        )?;
        metric(
            w,
            "generating",
            "gauge",
            "1 while a generation runs",
            &u8::from(l.generating),
        )?;
        metric(
            w,
            "batched_passes_total",
            "counter",
            "Decode passes that carried several answers (--parallel)",
            &self.batched_passes,
        )?;
        metric(
            w,
            "batch_rows_max",
            "gauge",
            "Most answers one decode pass carried (--parallel)",
            &self.batch_rows_max,
        )?;
        metric(
            w,
            "n_ctx",
            "gauge",
            "Context length of the session",
            &l.n_ctx,
        )
    }
}

/// A float with 3 decimals (Prometheus accepts any float text).
struct Fixed(f64);

impl core::fmt::Display for Fixed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.0.is_finite() {
            write!(f, "{:.3}", self.0)
        } else {
            f.write_str("0")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_line_has_help_and_type() {
        let m = Metrics {
            tokens_generated: 42,
            gen_tps: 12.5,
            ..Default::default()
        };
        let l = Live {
            rss: Some(1000),
            budget: Some(2000),
            queue: 1,
            queue_capacity: 4,
            ..Default::default()
        };
        let mut s: heapless::String<8192> = heapless::String::new();
        m.write(&l, &mut s).unwrap();
        assert!(s.contains("\npinch_tokens_generated_total 42\n"));
        // llama-server's names beside pinch's, from the same counters.
        assert!(s.contains("\nllamacpp:tokens_predicted_total 42\n"));
        assert!(s.contains("# TYPE llamacpp:requests_processing gauge\n"));
        assert!(s.contains("\npinch_tokens_per_second 12.500\n"));
        assert!(s.contains("\npinch_budget_bytes 2000\n"));
        for line in s.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(' ').next().unwrap();
            let mut t: heapless::String<96> = heapless::String::new();
            write!(t, "# TYPE {name} ").unwrap();
            assert!(s.contains(t.as_str()), "{line}");
            assert_eq!(line.split(' ').count(), 2, "{line}");
        }
    }
}
