//! RSS sampled while a child process runs: a thread reads `/proc/PID/status`'s `VmRSS`
//! every [`EVERY`] and keeps the highest value, so a test of `--budget` fails when the
//! process went over the budget at any moment it was watched, not only when the peak it
//! reports itself (VmHWM at its end) says so.
#![allow(dead_code)]
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Time between two samples.
pub const EVERY: Duration = Duration::from_millis(2);

/// What the sampler saw.
#[derive(Clone, Copy, Debug)]
pub struct Rss {
    /// Highest `VmRSS` sampled, in bytes.
    pub max: u64,
    /// Samples taken (the process was alive for each).
    pub samples: u64,
}

impl Rss {
    /// Panic when the sampled RSS went over `budget` bytes, or nothing was sampled.
    pub fn assert_under(&self, budget: u64, what: &str) {
        assert!(self.samples > 0, "{what}: RSS was never sampled");
        assert!(
            self.max <= budget,
            "{what}: RSS reached {} bytes ({:.1} MiB) while running, over the budget {budget} ({:.1} MiB); {} samples",
            self.max,
            self.max as f64 / 1048576.0,
            budget as f64 / 1048576.0,
            self.samples
        );
    }
}

/// A sampling thread watching one process.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// `VmRSS` of `pid` in bytes, if the process is still there.
pub fn vm_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

impl Sampler {
    /// Start sampling `pid` until [`Sampler::finish`] (or the process ends).
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(AtomicU64::new(0));
        let (s, m, n) = (stop.clone(), max.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match vm_rss(pid) {
                    Some(rss) => {
                        m.fetch_max(rss, Ordering::Relaxed);
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                    None => break,
                }
                std::thread::sleep(EVERY);
            }
        });
        Sampler {
            stop,
            max,
            samples,
            thread: Some(thread),
        }
    }

    /// Stop and report.
    pub fn finish(mut self) -> Rss {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Rss {
            max: self.max.load(Ordering::Relaxed),
            samples: self.samples.load(Ordering::Relaxed),
        }
    }
}

/// `cmd.output()`, with the child's RSS sampled while it runs.
pub fn output_sampled(cmd: &mut Command) -> (Output, Rss) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the command");
    let sampler = Sampler::start(child.id());
    let out = child.wait_with_output().expect("wait for the command");
    (out, sampler.finish())
}
