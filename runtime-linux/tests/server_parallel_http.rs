//! `pinch serve --parallel N` over HTTP: requests sent together are decoded in shared
//! weight passes (continuous batching), and each answer is byte for byte the answer the
//! same request gets alone (here: from a one-slot server, as `serve` runs without
//! `--parallel`), streamed or not, greedy or sampled.
mod server_util;

use serde_json::{json, Value};
use server_util::*;
use std::io::Write;

/// The requests: a long greedy completion, a streamed chat, a sampled legacy
/// completion with a stop string and penalties, two answers (`n`) of one prompt, and
/// one under a grammar (batched like the others, on its own matcher).
fn requests() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/completion",
            json!({"prompt": "Once upon a time", "n_predict": 120, "temperature": 0,
                   "ignore_eos": true, "return_tokens": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Tell me about rivers."}],
                   "max_tokens": 90, "temperature": 0, "stream": true}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "The weather today", "max_tokens": 100, "temperature": 0.9,
                   "seed": 11, "stop": ["\n\n"], "logit_bias": {"13": -2.0},
                   "presence_penalty": 0.5}),
        ),
        (
            "/completion",
            json!({"prompt": "A list of colours:", "n_predict": 60, "temperature": 0.7,
                   "seed": 5, "n": 2, "ignore_eos": true}),
        ),
        (
            "/completion",
            json!({"prompt": "Name:", "n_predict": 30, "temperature": 0.5, "seed": 2,
                   "grammar": "root ::= [a-z]+ \" \" [a-z]+"}),
        ),
    ]
}

/// What a response says, without its timings and ids: the text and token counts of
/// each answer, why it ended.
fn answer(path: &str, r: &Resp) -> Value {
    assert_eq!(
        r.status,
        200,
        "{path}: {}",
        String::from_utf8_lossy(&r.body)
    );
    if r.head.contains("text/event-stream") {
        let chunks = r.chunks();
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        let finish: Vec<Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0].get("finish_reason").cloned())
            .filter(|f| !f.is_null())
            .collect();
        return json!({"text": text, "finish": finish});
    }
    let v = r.json();
    let one = |a: &Value| {
        json!({
            "content": a.get("content"),
            "tokens": a.get("tokens"),
            "n": a.get("tokens_predicted"),
            "stop_type": a.get("stop_type"),
        })
    };
    match path {
        "/completion" if v.is_array() => {
            Value::Array(v.as_array().unwrap().iter().map(one).collect())
        }
        "/completion" => one(&v),
        _ => json!({"choices": v["choices"], "usage": v["usage"]["completion_tokens"]}),
    }
}

/// Each request on its own (one after the other) on `s`.
fn alone(s: &Server) -> Vec<Value> {
    alone_these(s, &requests())
}

fn alone_these(s: &Server, reqs: &[(&str, Value)]) -> Vec<Value> {
    reqs.iter()
        .map(|(path, body)| answer(path, &s.post(path, &body.to_string())))
        .collect()
}

/// All requests written before any answer is read, so they are in the server at once.
fn together(s: &Server) -> Vec<Value> {
    together_these(s, &requests())
}

fn together_these(s: &Server, reqs: &[(&str, Value)]) -> Vec<Value> {
    let mut conns: Vec<_> = reqs
        .iter()
        .map(|(path, body)| {
            let mut c = connect(s.port);
            c.write_all(post_text(path, &body.to_string()).as_bytes())
                .unwrap();
            c
        })
        .collect();
    reqs.iter()
        .zip(conns.iter_mut())
        .map(|((path, _), c)| answer(path, &read_response(c)))
        .collect()
}

#[test]
fn requests_decoded_together_give_each_its_answer_alone() {
    let one = Server::start(&["-c", "256"]);
    let want = alone(&one);
    drop(one);
    for n in ["2", "4"] {
        // `-c` is split across the slots: 256 positions each.
        let c = (256 * n.parse::<usize>().unwrap()).to_string();
        let s = Server::start(&["-c", &c, "--parallel", n, "--queue", "4"]);
        let slots = s.get("/slots").json();
        assert_eq!(slots.as_array().unwrap().len(), n.parse::<usize>().unwrap());
        assert_eq!(slots[0]["n_ctx"], 256);
        let got = together(&s);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g, w,
                "--parallel {n}, request {k}: differs from its answer alone"
            );
        }
        // They were decoded together: passes carried several answers at once.
        let rows = s.metric("pinch_batch_rows_max");
        assert!(
            rows >= 2.0,
            "--parallel {n}: at most {rows} answers per pass"
        );
        assert!(s.metric("pinch_batched_passes_total") > 10.0);
        // Alone on the parallel server: the same answers again (a slot's cache reused
        // or not), and idle slots afterwards.
        assert_eq!(alone(&s), want, "--parallel {n}: one at a time");
        let slots = s.get("/slots").json();
        assert!(slots
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["is_processing"] == false));
    }
}

/// Constrained requests of every kind (GBNF, `json_schema`, `response_format`
/// `json_object` and `json_schema`, streamed and not, `n` answers each on a fresh
/// matcher) among free ones: sampled at temperature, so a matcher state that leaked from
/// one answer to another, or a mask computed on another answer's logits, shows.
fn constrained() -> Vec<(&'static str, Value)> {
    let schema = json!({"type": "object", "properties": {
        "ok": {"type": "boolean"}, "name": {"type": "string", "maxLength": 6}},
        "required": ["ok", "name"]});
    let chat = |seed: u64, extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 120, "temperature": 0.8, "seed": seed});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        ("/v1/chat/completions", b)
    };
    vec![
        (
            "/completion",
            json!({"prompt": "Name:", "n_predict": 30, "temperature": 0.9, "seed": 3,
                   "grammar": "root ::= [a-z]+ \" \" [a-z]+", "return_tokens": true}),
        ),
        chat(1, json!({"json_schema": schema})),
        (
            "/completion",
            json!({"prompt": "Once upon a time", "n_predict": 90, "temperature": 0,
                   "ignore_eos": true, "return_tokens": true}),
        ),
        chat(9, json!({"response_format": {"type": "json_object"}})),
        chat(
            3,
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
                   "stream": true}),
        ),
        (
            "/completion",
            json!({"prompt": "Answer:", "n_predict": 12, "temperature": 1.0, "seed": 4,
                   "n": 2, "grammar": "root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3}"}),
        ),
        chat(5, json!({"json_schema": schema})),
    ]
}

/// The text of a chat answer (streamed or not) and whether it ended at the grammar's
/// end.
fn chat_text(a: &Value) -> (String, bool) {
    match a.get("text") {
        Some(t) => (
            t.as_str().unwrap().to_string(),
            a["finish"] == json!(["stop"]),
        ),
        None => (
            a["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
            a["choices"][0]["finish_reason"] == "stop",
        ),
    }
}

#[test]
fn constrained_requests_are_batched_and_answer_as_alone() {
    let reqs = constrained();
    let one = Server::start(&["-c", "256"]);
    let want = alone_these(&one, &reqs);
    drop(one);
    // The JSON answers that reached the grammar's end are JSON of the schema's shape.
    let mut parsed = 0;
    for (k, ((path, body), w)) in reqs.iter().zip(&want).enumerate() {
        if *path != "/v1/chat/completions" {
            continue;
        }
        let (text, stopped) = chat_text(w);
        if !stopped {
            continue;
        }
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("request {k}: {e}: {text:?}"));
        assert!(v.is_object(), "request {k}: {v}");
        if body.get("json_schema").is_some() || body["response_format"]["type"] == "json_schema" {
            assert!(
                v["ok"].is_boolean() && v["name"].is_string(),
                "request {k}: {v}"
            );
        }
        parsed += 1;
    }
    assert!(parsed >= 2, "only {parsed} JSON answers finished: {want:?}");
    for n in ["2", "4"] {
        let c = (256 * n.parse::<usize>().unwrap()).to_string();
        let s = Server::start(&["-c", &c, "--parallel", n, "--queue", "8"]);
        let got = together_these(&s, &reqs);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g, w,
                "--parallel {n}, request {k}: differs from its answer alone"
            );
        }
        assert!(s.metric("pinch_batch_rows_max") >= 2.0, "--parallel {n}");
    }
    // Only constrained requests: they share passes too (before, each ran alone).
    let only: Vec<_> = reqs
        .iter()
        .filter(|(_, b)| b["temperature"] != 0)
        .cloned()
        .collect();
    let s = Server::start(&["-c", "1024", "--parallel", "4", "--queue", "8"]);
    let got = together_these(&s, &only);
    let want_only: Vec<_> = reqs
        .iter()
        .zip(&want)
        .filter(|((_, b), _)| b["temperature"] != 0)
        .map(|(_, w)| w.clone())
        .collect();
    assert_eq!(got, want_only);
    let rows = s.metric("pinch_batch_rows_max");
    assert!(
        rows >= 2.0,
        "constrained answers alone in their passes ({rows})"
    );
}

#[test]
fn parallel_slots_are_refused_for_recurrent_models() {
    for model in ["tiny-qwen35-Q8_0", "tiny-lfm2-Q8_0"] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_pinch"))
            .args([
                "serve",
                "-m",
                &model_path(model),
                "--port",
                "0",
                "--parallel",
                "2",
            ])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{model}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--parallel above 1 needs a model without recurrent layers"),
            "{model}: {err}"
        );
    }
}
