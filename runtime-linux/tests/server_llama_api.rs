//! `pinch serve`'s llama-server API beyond OpenAI's, over real TCP with the tiny random
//! Qwen3 fixture: the endpoints, fields, parameters and flags that llama.cpp's own server
//! tests check (`cargo xtask compat` runs those; these keep the behaviour tested without
//! Python).
mod server_util;

use serde_json::{json, Value};
use server_util::*;

fn chat(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

#[test]
fn tokenize_and_detokenize_round_trip_with_pieces() {
    let s = Server::start(&["-c", "256"]);
    let (st, v) = s.post_json(
        "/tokenize",
        &json!({"content": "abc de \u{5abd} \u{1f917}"}),
    );
    assert_eq!(st, 200, "{v}");
    let ids: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert!(ids.len() > 3);
    let (st, d) = s.post_json("/detokenize", &json!({ "tokens": ids }));
    assert_eq!(st, 200);
    assert_eq!(d["content"], "abc de \u{5abd} \u{1f917}");
    let (_, p) = s.post_json("/tokenize", &json!({"content": "abc", "with_pieces": true}));
    for t in p["tokens"].as_array().unwrap() {
        assert!(t["id"].is_u64() && t["piece"].is_string(), "{t}");
    }
    let (st, e) = s.post_json("/detokenize", &json!({"tokens": [1, 999_999]}));
    assert_eq!(st, 400, "{e}");
}

#[test]
fn several_prompts_and_n_choices_and_token_prompts() {
    let s = Server::start(&["-c", "256", "--temp", "0"]);
    let (_, t) = s.post_json("/tokenize", &json!({"content": "hello there"}));
    let toks = t["tokens"].clone();
    let (st, v) = s.post_json(
        "/completion",
        &json!({"prompt": [toks, "hello there"], "n_predict": 4, "ignore_eos": true}),
    );
    assert_eq!(st, 200, "{v}");
    let list = v
        .as_array()
        .expect("a list of prompts gets a list of answers");
    assert_eq!(list.len(), 2);
    assert_eq!(
        list[0]["content"], list[1]["content"],
        "same tokens, same answer"
    );
    assert_eq!(list[1]["index"], 1);
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "n": 3, "max_tokens": 2}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(6));
    // Mixed ids and text in one prompt.
    let (st, v) = s.post_json(
        "/completion",
        &json!({"prompt": [1, 2, "abc", 3], "n_predict": 1}),
    );
    assert_eq!(st, 200, "{v}");
    assert!(v["content"].is_string());
}

#[test]
fn echo_repeats_the_prompt_and_penalties_change_a_repetitive_answer() {
    let s = Server::start(&["-c", "256", "--temp", "0"]);
    let req = json!({"prompt": "abc abc", "max_tokens": 24, "ignore_eos": true});
    let (_, plain) = s.post_json("/v1/completions", &req);
    let mut echo = req.clone();
    echo["echo"] = json!(true);
    let (_, e) = s.post_json("/v1/completions", &echo);
    let text = plain["choices"][0]["text"].as_str().unwrap();
    assert_eq!(
        e["choices"][0]["text"].as_str().unwrap(),
        format!("abc abc{text}")
    );
    // A strong frequency penalty over 24 greedy tokens of a random model changes them.
    let mut pen = req.clone();
    pen["frequency_penalty"] = json!(2.0);
    pen["presence_penalty"] = json!(2.0);
    let (st, p) = s.post_json("/v1/completions", &pen);
    assert_eq!(st, 200, "{p}");
    assert_ne!(p["choices"][0]["text"], plain["choices"][0]["text"]);
    let mut bad = req.clone();
    bad["presence_penalty"] = json!(3.0);
    assert_eq!(s.post_json("/v1/completions", &bad).0, 400);
}

#[test]
fn logit_bias_bans_the_greedy_token() {
    let s = Server::start(&["-c", "256", "--temp", "0"]);
    let req =
        json!({"prompt": "once upon", "n_predict": 1, "ignore_eos": true, "return_tokens": true});
    let (_, v) = s.post_json("/completion", &req);
    let first = v["tokens"][0].as_u64().unwrap();
    let mut banned = req.clone();
    banned["logit_bias"] = json!([[first, false]]);
    let (st, w) = s.post_json("/completion", &banned);
    assert_eq!(st, 200, "{w}");
    assert_ne!(w["tokens"][0].as_u64().unwrap(), first);
    // OpenAI's object form, with a large negative bias.
    let mut obj = req.clone();
    obj["logit_bias"] = json!({ first.to_string(): -100 });
    let (_, w) = s.post_json("/completion", &obj);
    assert_ne!(w["tokens"][0].as_u64().unwrap(), first);
}

#[test]
fn response_fields_timings_cache_and_settings() {
    let s = Server::start(&["-c", "256", "-n", "8"]);
    let req = json!({"prompt": "the same prompt again", "n_predict": 3, "ignore_eos": true});
    let (_, a) = s.post_json("/completion", &req);
    let (_, b) = s.post_json("/completion", &req);
    assert_eq!(a["timings"]["cache_n"], 0);
    assert!(b["timings"]["cache_n"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(
        b["timings"]["cache_n"].as_u64().unwrap() + b["timings"]["prompt_n"].as_u64().unwrap(),
        a["timings"]["prompt_n"].as_u64().unwrap()
    );
    for k in [
        "truncated",
        "has_new_line",
        "stop_type",
        "generation_settings",
        "tokens",
    ] {
        assert!(b.get(k).is_some(), "{k} missing: {b}");
    }
    assert_eq!(b["generation_settings"]["n_predict"], 3);
    let (_, c) = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    assert!(c["system_fingerprint"].as_str().unwrap().starts_with('b'));
    let (_, c2) = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    assert!(
        c2["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let mut picked = req.clone();
    picked["response_fields"] = json!(["content", "generation_settings/n_predict"]);
    let (_, p) = s.post_json("/completion", &picked);
    assert_eq!(p.as_object().unwrap().len(), 2, "{p}");
    assert_eq!(p["generation_settings/n_predict"], 3);
}

#[test]
fn llama_server_errors_and_refusals() {
    let s = Server::start(&["-c", "256"]);
    let long = "word ".repeat(1000);
    let (st, v) = s.post_json("/completion", &json!({ "prompt": long }));
    assert_eq!(st, 400);
    assert_eq!(v["error"]["type"], "exceed_context_size_error", "{v}");
    assert_eq!(v["error"]["n_ctx"], 256);
    assert!(v["error"]["n_prompt_tokens"].as_u64().unwrap() > 256);
    let two = json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "assistant", "content": "c"}]});
    assert_eq!(s.post_json("/v1/chat/completions", &two).0, 400);
    // Any model name is this model (llama-server with one model does the same).
    let mut named = chat("x");
    named["model"] = json!("gpt-4");
    named["max_tokens"] = json!(1);
    assert_eq!(s.post_json("/v1/chat/completions", &named).0, 200);
    // Content as a list of text parts.
    let parts = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "max_tokens": 1});
    assert_eq!(s.post_json("/v1/chat/completions", &parts).0, 200);
    // The fixture has no fill-in-the-middle tokens.
    let (st, v) = s.post_json(
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_eq!(st, 501, "{v}");
    assert_eq!(
        s.post_json("/infill", &json!({"input_extra": [{"filename": 1}]}))
            .0,
        400
    );
}

#[test]
fn api_key_alias_and_switched_off_endpoints() {
    let s = Server::start(&[
        "-c",
        "256",
        "--api-key",
        "sekret",
        "--alias",
        "zeta,alpha",
        "--no-webui",
        "--no-slots",
        "--no-metrics",
        "--parallel",
        "2",
    ]);
    assert_eq!(s.get("/health").status, 200);
    let r = s.post("/completion", r#"{"prompt":"x","n_predict":1}"#);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let ok = request(
        s.port,
        "GET /v1/models HTTP/1.1\r\nAuthorization: Bearer sekret\r\n\r\n",
    );
    assert_eq!(ok.status, 200);
    let m = ok.json();
    assert_eq!(m["data"][0]["id"], "alpha", "first alias in sort order");
    assert_eq!(m["data"][0]["aliases"], json!(["zeta", "alpha"]));
    let with_key = |path: &str| {
        request(
            s.port,
            &format!("GET {path} HTTP/1.1\r\nX-Api-Key: sekret\r\n\r\n"),
        )
    };
    assert_eq!(with_key("/").status, 404);
    assert_eq!(with_key("/slots").status, 501);
    assert_eq!(with_key("/metrics").status, 501);
    let props = with_key("/props").json();
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 256);
}

#[test]
fn stream_ends_with_usage_chunk_and_reports_progress() {
    let s = Server::start(&["-c", "256"]);
    let mut req = chat("tell me");
    req["stream"] = json!(true);
    req["max_tokens"] = json!(3);
    req["ignore_eos"] = json!(true);
    req["return_progress"] = json!(true);
    let r = s.post("/v1/chat/completions", &req.to_string());
    let chunks = r.chunks();
    let progress: Vec<&Value> = chunks
        .iter()
        .filter(|c| c.get("prompt_progress").is_some())
        .collect();
    assert!(!progress.is_empty());
    let last_p = &progress.last().unwrap()["prompt_progress"];
    assert_eq!(last_p["processed"], last_p["total"]);
    let first = chunks.iter().find(|c| c.get("choices").is_some()).unwrap();
    assert!(first["choices"][0]["delta"]["content"].is_null());
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert!(usage["timings"]["predicted_n"].is_u64());
    // Asked not to: the stream ends with the finish chunk.
    req["stream_options"] = json!({"include_usage": false});
    let chunks = s.post("/v1/chat/completions", &req.to_string()).chunks();
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

/// `post_sampling_probs`: the figures are probabilities of the distribution the token
/// was drawn from (after top-k, min-p, top-p), as llama-server names them (`prob`,
/// `top_probs`): each in (0, 1], the list cut where the sampler cut, summing to 1 when
/// shorter than `n_probs`, and the chosen token among them. Without the cuts, the list
/// is `n_probs` long; greedy leaves the argmax alone with probability 1.
#[test]
fn post_sampling_probs_are_the_sampled_distribution() {
    let s = Server::start(&["-c", "256"]);
    let ask = |extra: Value| {
        let mut req = json!({"prompt": "abc de", "n_probs": 10, "n_predict": 4,
            "temperature": 1.0, "post_sampling_probs": true, "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            req[k] = v.clone();
        }
        let (st, v) = s.post_json("/completion", &req);
        assert_eq!(st, 200, "{v}");
        v["completion_probabilities"].as_array().unwrap().clone()
    };
    let probs = ask(json!({"top_k": 3, "min_p": 0.0, "top_p": 1.0}));
    assert_eq!(probs.len(), 4);
    for t in &probs {
        assert!(
            t.get("logprob").is_none() && t.get("top_logprobs").is_none(),
            "{t}"
        );
        let p = t["prob"].as_f64().unwrap();
        assert!(p > 0.0 && p <= 1.0, "{t}");
        let top = t["top_probs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "top-k 3 leaves 3 candidates: {t}");
        let sum: f64 = top.iter().map(|c| c["prob"].as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-4, "{t}");
        let mine = top
            .iter()
            .find(|c| c["id"] == t["id"])
            .expect("the chosen token is a candidate");
        assert!((mine["prob"].as_f64().unwrap() - p).abs() < 1e-6, "{t}");
        assert!(top
            .windows(2)
            .all(|w| w[0]["prob"].as_f64() >= w[1]["prob"].as_f64()));
    }
    for t in ask(json!({"top_k": 0, "min_p": 0.0, "top_p": 1.0})) {
        assert_eq!(t["top_probs"].as_array().unwrap().len(), 10, "{t}");
    }
    for t in ask(json!({"temperature": 0.0})) {
        assert_eq!(t["prob"], 1.0, "{t}");
        assert_eq!(t["top_probs"].as_array().unwrap().len(), 1, "{t}");
    }
    // The same cuts on the chat API, in OpenAI's `logprobs.content` shape.
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
            "logprobs": true, "top_logprobs": 5, "top_k": 2, "post_sampling_probs": true}),
    );
    assert_eq!(st, 200, "{v}");
    for t in v["choices"][0]["logprobs"]["content"].as_array().unwrap() {
        assert!(t["prob"].as_f64().unwrap() > 0.0, "{t}");
        assert!(t["top_probs"].as_array().unwrap().len() <= 2, "{t}");
    }
}
