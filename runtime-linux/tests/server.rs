//! `pinch serve` over real TCP on loopback, with the tiny random Qwen3 fixture (its text
//! is nonsense, but tokens, probabilities and counts are real): every endpoint, streamed
//! and not, the error answers, the queue limit and a client that goes away mid-stream.
mod server_util;

use serde_json::{json, Value};
use server_util::*;
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

fn chat(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

fn with(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

/// The text a run of tokens decodes to (lossy, like the server's UTF-8 assembly).
fn text_of_entries(entries: &[Value]) -> String {
    let bytes: Vec<u8> = entries
        .iter()
        .flat_map(|e| {
            e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
        })
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn assert_ranked(entry: &Value, n: usize) {
    let top = entry["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), n, "{entry}");
    let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
    assert!(lps.windows(2).all(|w| w[0] >= w[1]), "not ranked: {lps:?}");
    assert!(lps.iter().all(|&l| l <= 0.0));
    let lp = entry["logprob"].as_f64().unwrap();
    assert!(lp <= 1e-6 && lp >= lps[0] - 30.0);
    // The chosen token can be no more likely than the best alternative.
    assert!(lp <= lps[0] + 1e-5, "{entry}");
}

#[test]
fn health_models_metrics_page_and_unknown_paths() {
    let s = Server::start(&["-c", "256"]);
    let r = s.get("/health");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ok"}));
    assert_eq!(r.header("connection").as_deref(), Some("close"));

    let m = s.get("/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(m["data"][0]["object"], "model");

    let page = s.get("/");
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    let html = String::from_utf8(page.body).unwrap();
    assert!(
        html.contains("<script>")
            && html.contains("/v1/chat/completions")
            && html.contains("/metrics")
    );

    let metrics = s.get("/metrics");
    assert_eq!(metrics.status, 200);
    let text = String::from_utf8(metrics.body).unwrap();
    for name in [
        "pinch_tokens_generated_total",
        "pinch_tokens_per_second",
        "pinch_prompt_tokens_per_second",
        "pinch_rss_bytes",
        "pinch_available_memory_bytes",
        "pinch_budget_bytes",
        "pinch_queue_length",
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    assert!(s.metric("pinch_rss_bytes") > 1e6, "RSS comes from /proc");

    assert_eq!(s.get("/nope").status, 404);
    assert_eq!(s.get("/completion").status, 405);
    assert_eq!(s.post("/health", "{}").status, 405);
    let pre = request(
        s.port,
        "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    // llama-server answers a preflight with 200 and its CORS headers.
    assert_eq!(pre.status, 200);
    assert!(pre
        .header("access-control-allow-methods")
        .unwrap()
        .contains("POST"));
}

#[test]
fn chat_completion_counts_tokens_and_reports_logprobs() {
    let s = Server::start(&["-c", "256"]);
    let (st, v) = s.post_json("/v1/chat/completions", &with(chat("Hello there"), json!({"max_tokens": 6, "logprobs": true, "top_logprobs": 3, "temperature": 0, "ignore_eos": true, "model": MODEL})));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    let ch = &v["choices"][0];
    assert_eq!(ch["message"]["role"], "assistant");
    assert_eq!(ch["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 6);
    assert!(u["prompt_tokens"].as_u64().unwrap() > 3);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + 6)
    );
    let entries = ch["logprobs"]["content"].as_array().unwrap();
    assert_eq!(entries.len(), 6);
    for e in entries {
        assert_ranked(e, 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(e["token"], e["top_logprobs"][0]["token"]);
    }
    assert_eq!(
        ch["message"]["content"].as_str().unwrap(),
        text_of_entries(entries)
    );

    // Without logprobs the field is null; max_tokens bounds the count.
    let (_, v) = s.post_json(
        "/v1/chat/completions",
        &with(chat("Hi"), json!({"max_tokens": 3})),
    );
    assert!(v["choices"][0]["logprobs"].is_null());
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 3);
}

#[test]
fn streamed_chat_matches_the_non_streamed_answer() {
    let s = Server::start(&["-c", "256"]);
    let req = with(
        chat("Tell me a story"),
        json!({"max_tokens": 12, "temperature": 0, "ignore_eos": true}),
    );
    let (_, whole) = s.post_json("/v1/chat/completions", &req);
    let r = s.post(
        "/v1/chat/completions",
        &with(
            req,
            json!({"stream": true, "logprobs": true, "top_logprobs": 2}),
        )
        .to_string(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("text/event-stream")
    );
    let chunks = r.chunks();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut with_probs = 0;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(lp) = c["choices"][0]["logprobs"]["content"].as_array() {
            assert_ranked(&lp[0], 2);
            with_probs += 1;
        }
    }
    // llama-server's order: the finish chunk, then one with no choices and the usage.
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    assert!(fin["choices"][0]["delta"].get("content").is_none());
    assert_eq!(last["usage"]["completion_tokens"], 12);
    assert_eq!(with_probs, 12, "one chunk per token");
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert!(last["timings"]["predicted_per_second"].as_f64().unwrap() > 0.0);
}

#[test]
fn legacy_completions_streamed_and_not() {
    let s = Server::start(&["-c", "256"]);
    let req = json!({"prompt": "Once upon a time", "max_tokens": 5, "logprobs": 2, "temperature": 0, "ignore_eos": true});
    let (st, v) = s.post_json("/v1/completions", &req);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 5);
    assert!(lp["top_logprobs"][0].as_object().unwrap().len() <= 2);
    assert_eq!(v["usage"]["completion_tokens"], 5);

    let r = s.post(
        "/v1/completions",
        &with(req, json!({"stream": true})).to_string(),
    );
    let ev = r.events();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let mut text = String::new();
    for e in &ev[..ev.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        text.push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(text, v["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn llama_server_completion_shape() {
    let s = Server::start(&["-c", "256"]);
    let (st, v) = s.post_json("/completion", &json!({"prompt": "The sky is", "n_predict": 7, "n_probs": 3, "temperature": 0, "ignore_eos": true}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["tokens_predicted"], 7);
    assert!(v["tokens_evaluated"].as_u64().unwrap() > 0);
    assert_eq!(v["stop"], true);
    assert_eq!(v["stop_type"], "limit");
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 7);
    for p in probs {
        assert_ranked(p, 3);
        assert!(p["id"].is_u64());
    }
    assert_eq!(v["content"].as_str().unwrap(), text_of_entries(probs));
    assert!(v["timings"]["prompt_per_second"].as_f64().unwrap() > 0.0);

    let r = s.post("/completion", &json!({"prompt": "The sky is", "n_predict": 7, "temperature": 0, "ignore_eos": true, "stream": true}).to_string());
    let ev: Vec<Value> = r
        .events()
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let last = ev.last().unwrap();
    assert_eq!(last["stop"], true);
    assert_eq!(last["tokens_predicted"], 7);
    let text: String = ev
        .iter()
        .map(|e| e["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, v["content"].as_str().unwrap());
    assert_eq!(
        ev.iter()
            .filter(|e| e["stop"] == false && e["tokens"].is_array())
            .count(),
        7
    );
}

#[test]
fn stop_strings_cut_the_text_and_seed_makes_sampling_repeatable() {
    let s = Server::start(&["-c", "256"]);
    let base = json!({"prompt": "abc", "n_predict": 24, "temperature": 0, "ignore_eos": true});
    let (_, v) = s.post_json("/completion", &base);
    let text = v["content"].as_str().unwrap().to_string();
    // A stop string taken from the greedy output (two characters that are real text,
    // not replacement characters for partial UTF-8).
    let chars: Vec<char> = text.chars().collect();
    let at = (1..chars.len() - 1)
        .find(|&i| chars[i] != '\u{FFFD}' && chars[i + 1] != '\u{FFFD}')
        .unwrap_or_else(|| panic!("no plain text in {text:?}"));
    let stop: String = chars[at..at + 2].iter().collect();
    let (_, cut) = s.post_json(
        "/completion",
        &with(base.clone(), json!({"stop": [stop.clone(), "never-seen"]})),
    );
    assert_eq!(
        cut["content"].as_str().unwrap(),
        &text[..text.find(&stop).unwrap()]
    );
    assert_eq!(cut["stop_type"], "word");
    assert_eq!(cut["stopping_word"], stop);
    // A single string works too, and in the OpenAI API the reason is "stop".
    let (_, c2) = s.post_json("/v1/completions", &json!({"prompt": "abc", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "stop": stop}));
    assert_eq!(c2["choices"][0]["text"], cut["content"]);
    assert_eq!(c2["choices"][0]["finish_reason"], "stop");

    let sampled = json!({"prompt": "abc", "n_predict": 16, "temperature": 1.5, "top_p": 1.0, "seed": 42, "ignore_eos": true});
    let (_, x) = s.post_json("/completion", &sampled);
    let (_, y) = s.post_json("/completion", &sampled);
    assert_eq!(x["content"], y["content"]);
    let outs: std::collections::HashSet<String> = (0..4u64)
        .map(|seed| {
            s.post_json("/completion", &with(sampled.clone(), json!({"seed": seed})))
                .1["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(outs.len() > 1, "different seeds gave the same text");
}

#[test]
fn bad_requests_get_json_errors_and_the_server_keeps_serving() {
    let s = Server::start(&["-c", "256"]);
    let cases: Vec<(&str, String, u16)> = vec![
        ("/v1/chat/completions", "{not json".into(), 400),
        ("/v1/chat/completions", "".into(), 400),
        ("/v1/chat/completions", r#"{"messages":"hi"}"#.into(), 400),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"many"}"#.into(),
            400,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":-1}"#.into(),
            400,
        ),
        ("/v1/chat/completions", r#"{"messages":[]}"#.into(), 400),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a"},{"role":"assistant","content":"b"}]}"#.into(),
            400,
        ),
        ("/v1/completions", r#"{"max_tokens":3}"#.into(), 400),
        ("/v1/completions", r#"{"prompt":[1,2,99999]}"#.into(), 400),
        ("/v1/completions", r#"{"prompt":{"x":1}}"#.into(), 400),
        (
            "/completion",
            format!(r#"{{"prompt":"{}"}}"#, "word ".repeat(3000)),
            400,
        ),
        (
            "/completion",
            format!(r#"{{"prompt":"{}"}}"#, "x".repeat(70_000)),
            413,
        ),
        ("/completion", "\u{0}\u{1}\u{2}".into(), 400),
    ];
    for (path, body, want) in &cases {
        let r = s.post(path, body);
        assert_eq!(r.status, *want, "{path} {}", &body[..body.len().min(80)]);
        let v = r.json();
        assert_eq!(v["error"]["code"].as_u64(), Some(*want as u64), "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    let long = s.post(
        "/completion",
        &format!(r#"{{"prompt":"{}"}}"#, "word ".repeat(3000)),
    );
    assert!(
        long.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("context"),
        "{:?}",
        long.json()
    );

    // Broken HTTP.
    assert_eq!(request(s.port, "BLAH\r\n\r\n").status, 400);
    let many: String = (0..40).map(|i| format!("X-{i}: y\r\n")).collect();
    assert_eq!(
        request(s.port, &format!("GET /health HTTP/1.1\r\n{many}\r\n")).status,
        431
    );
    assert_eq!(
        request(
            s.port,
            "POST /completion HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        .status,
        501
    );
    assert_eq!(
        request(
            s.port,
            "POST /completion HTTP/1.1\r\nContent-Length: x\r\n\r\n"
        )
        .status,
        400
    );
    // Raw bytes that are not UTF-8 anywhere.
    assert_eq!(request_bytes(s.port, b"\xff\xfe\xfd\r\n\r\n").status, 400);
    // A connection that closes without a request.
    drop(connect(s.port));

    assert_eq!(s.get("/health").status, 200);
    let (st, _) = s.post_json(
        "/completion",
        &json!({"prompt": "still fine", "n_predict": 2}),
    );
    assert_eq!(st, 200);
    assert!(s.metric("pinch_requests_invalid_total") >= cases.len() as f64);
}

#[test]
fn a_request_sent_too_slowly_times_out_with_408() {
    let s = Server::start(&["-c", "256"]);
    let mut c = connect(s.port);
    c.write_all(b"POST /completion HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
        .unwrap();
    let t = Instant::now();
    let r = read_response(&mut c);
    assert_eq!(r.status, 408);
    assert!(t.elapsed() >= Duration::from_secs(5), "timed out too early");
    assert_eq!(s.get("/health").status, 200);
}

/// A server on Gemma 3 270M, or `None` (skipped) without the model when
/// PINCH_SKIP_MODEL_TESTS=1 (`cargo xtask test` fetches it before the tests).
fn gemma_server(extra: &[&str]) -> Option<Server> {
    let gemma = repo().join("models/gemma-3-270m-q4_k_m");
    if !gemma.with_extension("gguf").exists()
        && std::env::var("PINCH_SKIP_MODEL_TESTS").as_deref() == Ok("1")
    {
        eprintln!("SKIPPED: no Gemma model and PINCH_SKIP_MODEL_TESTS=1");
        return None;
    }
    Some(Server::start_model(gemma.to_str().unwrap(), extra))
}

/// Open a streamed generation that runs for a long time and read its head.
fn long_stream(port: u16) -> BufReader<std::net::TcpStream> {
    let mut c = connect(port);
    let body =
        json!({"prompt": "go", "n_predict": -1, "ignore_eos": true, "stream": true}).to_string();
    c.write_all(post_text("/completion", &body).as_bytes())
        .unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    r
}

fn read_events(r: &mut BufReader<std::net::TcpStream>, n: usize) {
    let mut seen = 0;
    let mut line = String::new();
    while seen < n {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "stream ended early");
        if line.starts_with("data: ") {
            seen += 1;
        }
    }
}

#[test]
fn a_client_that_disconnects_stops_its_generation() {
    // 2048 tokens take Gemma 3 270M many seconds (the tiny fixtures' context is 256).
    let Some(s) = gemma_server(&["-c", "2048"]) else {
        return;
    };
    let mut r = long_stream(s.port);
    read_events(&mut r, 5);
    assert_eq!(s.metric("pinch_generating"), 1.0);
    let t = Instant::now();
    drop(r);
    wait_for(5, "the generation to stop", || {
        s.metric("pinch_generating") == 0.0
    });
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(s.metric("pinch_disconnects_total"), 1.0);
    let made = s.metric("pinch_tokens_generated_total");
    assert!(
        made < 1500.0,
        "kept generating after the disconnect: {made}"
    );
    let (st, v) = s.post_json("/completion", &json!({"prompt": "next", "n_predict": 3}));
    assert_eq!(st, 200, "{v}");
}

#[test]
fn the_queue_holds_n_requests_and_refuses_more_with_503() {
    // The running request must outlast the checks: the tiny fixtures' 256-token context
    // fills in a fraction of a second, so this one runs on Gemma 3 270M (2048 tokens
    // take it many seconds; `cargo xtask test` fetches it before the tests).
    let Some(s) = gemma_server(&["-c", "2048", "--queue", "1"]) else {
        return;
    };
    let mut running = long_stream(s.port);
    read_events(&mut running, 2);
    // One may wait ...
    let port = s.port;
    let waiting = std::thread::spawn(move || {
        request(
            port,
            &post_text("/completion", r#"{"prompt":"wait","n_predict":3}"#),
        )
    });
    wait_for(5, "the request to be queued", || {
        s.metric("pinch_queue_length") == 1.0
    });
    // ... the next is refused at once, with a hint when to retry.
    let t = Instant::now();
    let busy = s.post("/completion", r#"{"prompt":"no room","n_predict":3}"#);
    assert_eq!(busy.status, 503);
    assert_eq!(busy.header("retry-after").as_deref(), Some("1"));
    assert_eq!(busy.json()["error"]["code"], 503);
    assert!(t.elapsed() < Duration::from_secs(2));
    // Cheap endpoints still answer while the queue is full.
    assert_eq!(s.get("/health").status, 200);
    // When the running client leaves, the waiting one is served.
    drop(running);
    let r = waiting.join().unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["tokens_predicted"], 3);
    assert!(s.metric("pinch_requests_rejected_total") >= 1.0);
}

#[test]
fn a_queued_client_that_leaves_is_dropped_from_the_queue() {
    let s = Server::start(&["-c", "2048", "--queue", "2"]);
    let mut running = long_stream(s.port);
    read_events(&mut running, 2);
    let mut c = connect(s.port);
    c.write_all(post_text("/completion", r#"{"prompt":"x","n_predict":2}"#).as_bytes())
        .unwrap();
    wait_for(5, "queued", || s.metric("pinch_queue_length") == 1.0);
    drop(c);
    wait_for(5, "dequeued", || s.metric("pinch_queue_length") == 0.0);
    drop(running);
    wait_for(5, "idle", || s.metric("pinch_generating") == 0.0);
    assert_eq!(s.metric("pinch_disconnects_total"), 2.0);
}

#[test]
fn gemma_fixture_serves_chat_with_its_template() {
    let s = Server::start_model("tiny-gemma3-Q8_0", &["-c", "256"]);
    let (st, v) = s.post_json("/v1/chat/completions", &with(chat("Hi"), json!({"max_tokens": 4, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})));
    assert_eq!(st, 200, "{v}");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 2);
}

#[test]
fn expect_100_continue_gets_an_interim_response() {
    let s = Server::start(&["-c", "256"]);
    let body = json!({"prompt": "hi", "n_predict": 2}).to_string();
    let mut c = connect(s.port);
    write!(
        c,
        "POST /completion HTTP/1.1\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .unwrap();
    let mut interim = [0u8; 25];
    std::io::Read::read_exact(&mut c, &mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(body.as_bytes()).unwrap();
    let r = read_response(&mut c);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json()["tokens_predicted"].as_u64().map(|n| n <= 2),
        Some(true)
    );
}

/// Same tokens, log-probabilities equal up to the rounding of batched versus
/// one-token evaluation.
fn assert_close(a: &Value, b: &Value) {
    let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x["id"], y["id"]);
        let d = (x["logprob"].as_f64().unwrap() - y["logprob"].as_f64().unwrap()).abs();
        assert!(d < 1e-3, "{x} vs {y}");
    }
}

#[test]
fn a_repeated_or_extended_prompt_reuses_the_cache_with_identical_results() {
    let s = Server::start(&["-c", "512"]);
    let req = json!({"prompt": "The quick brown fox jumps over the lazy dog", "n_predict": 10, "temperature": 0, "ignore_eos": true, "n_probs": 2});
    let (_, fresh) = s.post_json(
        "/completion",
        &with(req.clone(), json!({"cache_prompt": false})),
    );
    assert_eq!(fresh["tokens_cached"], 0);
    let n = fresh["tokens_evaluated"].as_u64().unwrap();
    let (_, again) = s.post_json("/completion", &req);
    assert_eq!(
        again["tokens_cached"].as_u64(),
        Some(n - 1),
        "all but the last prompt token come from the cache"
    );
    assert_eq!(again["timings"]["prompt_n"], 1);
    assert_eq!(again["content"], fresh["content"]);
    assert_close(
        &again["completion_probabilities"],
        &fresh["completion_probabilities"],
    );
    // The next turn: the old prompt, the answer and more text.
    let longer = format!(
        "{}{} and more",
        req["prompt"].as_str().unwrap(),
        fresh["content"].as_str().unwrap()
    );
    let ext = with(req.clone(), json!({"prompt": longer}));
    let (_, cached) = s.post_json("/completion", &ext);
    let (_, uncached) = s.post_json("/completion", &with(ext, json!({"cache_prompt": false})));
    assert!(
        cached["tokens_cached"].as_u64().unwrap() >= n - 2,
        "{}",
        cached["tokens_cached"]
    );
    assert_eq!(cached["content"], uncached["content"]);
    assert_close(
        &cached["completion_probabilities"],
        &uncached["completion_probabilities"],
    );
}
