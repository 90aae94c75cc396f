//! Load on `pinch serve` over loopback: 20 clients send `/completion` requests back to
//! back. Every request must be answered (200, or 503 when the queue is full), the
//! server must survive, and its peak RSS must stay under `--budget`. A 10 s run is part
//! of the suite; the 60 s run is `#[ignore]`d (run it with `--ignored`).
mod rss_sampler;
mod server_util;

use server_util::*;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 20;
const BUDGET: u64 = 64 << 20;

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    busy: AtomicU64,
    tokens: AtomicU64,
}

fn load(secs: u64) {
    let mut s = Server::start(&["-c", "512", "--budget", "64M", "--queue", "4"]);
    let port = s.port;
    let sampler = rss_sampler::Sampler::start(s.child.id());
    let tally = Arc::new(Tally::default());
    let end = Instant::now() + Duration::from_secs(secs);
    let workers: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let tally = tally.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while Instant::now() < end {
                    let body = format!(r#"{{"prompt":"client {c} request {n}: once upon a time","n_predict":16,"seed":{n}}}"#);
                    let mut conn = connect(port);
                    conn.write_all(post_text("/completion", &body).as_bytes()).expect("send");
                    let r = read_response(&mut conn);
                    match r.status {
                        200 => {
                            tally.ok.fetch_add(1, Ordering::Relaxed);
                            let toks = r.json()["tokens_predicted"].as_u64().unwrap();
                            assert!(toks <= 16);
                            tally.tokens.fetch_add(toks, Ordering::Relaxed);
                        }
                        503 => {
                            assert_eq!(r.header("retry-after").as_deref(), Some("1"));
                            tally.busy.fetch_add(1, Ordering::Relaxed);
                            // Back off a little, as Retry-After asks (shortened).
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        other => panic!("unexpected status {other}: {}", String::from_utf8_lossy(&r.body)),
                    }
                    n += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("client thread failed");
    }
    assert!(s.alive(), "server died: {}", s.log.lock().unwrap());
    let sampled = sampler.finish();
    let peak = s.peak_rss();
    let ok = tally.ok.load(Ordering::Relaxed);
    let busy = tally.busy.load(Ordering::Relaxed);
    let tokens = tally.tokens.load(Ordering::Relaxed);
    let served = s.metric("pinch_generations_total") as u64;
    eprintln!(
        "load {secs}s x {CLIENTS} clients: {ok} answered 200, {busy} answered 503, {tokens} tokens ({:.0} tok/s), peak RSS {:.1} MiB of {} MiB budget",
        tokens as f64 / secs as f64,
        peak as f64 / 1048576.0,
        BUDGET >> 20
    );
    assert!(ok > 0, "no request was served");
    assert_eq!(
        served, ok,
        "every generation the server ran reached its client"
    );
    assert!(peak < BUDGET, "peak RSS {peak} over the budget {BUDGET}");
    sampled.assert_under(BUDGET, "server under load");
    eprintln!(
        "RSS sampled every {:?} under load: max {:.1} MiB over {} samples",
        rss_sampler::EVERY,
        sampled.max as f64 / 1048576.0,
        sampled.samples
    );
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn twenty_clients_for_ten_seconds() {
    load(10);
}

#[test]
#[ignore = "60 s; run with --ignored"]
fn twenty_clients_for_sixty_seconds() {
    load(60);
}
