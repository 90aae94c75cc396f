//! Constrained output and tool calls through `pinch serve` over real TCP, with the tiny
//! random Qwen3 fixture (whose free text is noise, so whatever shape comes out is the
//! grammar's doing): `grammar`, `json_schema`, `response_format`, their 400s, and
//! `tools` with `tool_choice: "required"` returned as `tool_calls`, streamed and not, in
//! the Hermes format and in Llama 3's.
mod server_util;

use serde_json::{json, Value};
use server_util::*;

/// The Qwen3 fixture with `qwen3.context_length` set to `n`, in a temporary file
/// (the path without `.gguf`, as `Server::start_model` takes it).
fn raised_context(n: u32) -> String {
    let mut b = std::fs::read(model_path(MODEL)).unwrap();
    let key = b"qwen3.context_length";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(&b[at..at + 4], &4u32.to_le_bytes(), "a u32 value");
    b[at + 4..at + 8].copy_from_slice(&n.to_le_bytes());
    // One file per call: the tests run in parallel, and a shared file rewritten by one
    // while another's server reads it was seen empty (a flaky "header runs past the end").
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("pinch-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("qwen3-long-{n}-{call}.gguf"));
    std::fs::write(&path, b).unwrap();
    path.with_extension("").to_string_lossy().into_owned()
}

fn ask(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 80, "temperature": 1.0, "seed": 5});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Two tools whose arguments a forced call must follow.
fn two_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "city", "parameters": {"type": "object",
            "properties": {"c": {"type": "string", "maxLength": 6}}, "required": ["c"]}}},
        {"type": "function", "function": {"name": "test", "parameters": {"type": "object",
            "properties": {"success": {"type": "boolean", "const": true}}, "required": ["success"]}}}
    ])
}

/// `tool_choice: "required"` on four seeds: each answer that finishes is one call of one
/// of [`two_tools`] with arguments that parse and follow its schema, without content
/// (and at least one finishes); a named function, streamed: the call as one
/// `tool_calls` delta, none of it as content.
fn forced_calls_follow_the_schemas(s: &Server) {
    let tools = two_tools();
    let mut called = 0;
    for seed in 0..4 {
        let body = ask(
            json!({"tools": tools, "tool_choice": "required", "seed": seed, "max_tokens": 200}),
        );
        let (st, v) = s.post_json("/v1/chat/completions", &body);
        assert_eq!(st, 200, "{v}");
        let choice = &v["choices"][0];
        if choice["finish_reason"] != "tool_calls" {
            // Cut by max_tokens inside the call: no call is made up.
            assert_eq!(choice["finish_reason"], "length", "{v}");
            continue;
        }
        called += 1;
        assert!(choice["message"]["content"].is_null(), "{v}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(calls[0]["type"], "function");
        let f = &calls[0]["function"];
        let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
        match f["name"].as_str().unwrap() {
            "city" => {
                let c = args["c"].as_str().unwrap_or_else(|| panic!("{args}"));
                assert!(c.chars().count() <= 6, "{args}");
            }
            "test" => assert_eq!(args, json!({"success": true})),
            other => panic!("{other}"),
        }
    }
    assert!(called > 0, "no call finished in 200 tokens");
    let body = ask(json!({"tools": tools, "stream": true, "max_tokens": 200,
        "tool_choice": {"type": "function", "function": {"name": "test"}}}));
    let chunks = s.post("/v1/chat/completions", &body.to_string()).chunks();
    let call = chunks
        .iter()
        .find_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
        .unwrap_or_else(|| panic!("no tool_calls delta: {chunks:?}"));
    assert_eq!(call[0]["function"]["name"], "test");
    assert_eq!(call[0]["function"]["arguments"], "{\"success\":true}");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
    assert!(!chunks.iter().any(|c| c["choices"][0]["delta"]["content"]
        .as_str()
        .is_some_and(|t| t.contains('{'))));
}

#[test]
fn grammar_and_schemas_shape_the_answer_and_bad_ones_are_400() {
    let s = Server::start(&["-c", "512"]);
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &ask(json!({"grammar": "root ::= \"a\"{5,5}"})),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "aaaaa");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
        "n": {"type": "integer"}}, "required": ["name", "n"]});
    for (k, body) in [
        ("json_schema", ask(json!({"json_schema": schema}))),
        (
            "response_format",
            ask(
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}),
            ),
        ),
    ] {
        let mut parsed = 0;
        for seed in 0..4 {
            let mut b = body.clone();
            b["seed"] = json!(seed);
            b["max_tokens"] = json!(200);
            let (st, v) = s.post_json("/v1/chat/completions", &b);
            assert_eq!(st, 200, "{k}: {v}");
            let c = v["choices"][0]["message"]["content"].as_str().unwrap();
            if v["choices"][0]["finish_reason"] == "stop" {
                let o: Value =
                    serde_json::from_str(c).unwrap_or_else(|e| panic!("{k}: {e}: {c:?}"));
                assert!(o["name"].is_string() && o["n"].is_i64(), "{k}: {o}");
                parsed += 1;
            }
        }
        assert!(parsed > 0, "{k}: no answer finished in 200 tokens");
    }
    let (st, v) = s.post_json(
        "/completion",
        &json!({"prompt": "x", "n_predict": 40, "json_schema": {"const": "42"}}),
    );
    // The schema's grammar (as llama.cpp's) allows whitespace after the value.
    let c = v["content"].as_str().unwrap_or_default();
    let parsed: Option<Value> = serde_json::from_str(c).ok();
    assert_eq!((st, parsed), (200, Some(json!("42"))), "{v}");

    for (body, needle) in [
        (
            json!({"grammar": "root ::= this is (not valid GBNF"}),
            "at byte 32",
        ),
        (json!({"grammar": "root ::= x"}), "'x'"),
        (json!({"json_schema": {"type": "hiccup"}}), "'type'"),
        (
            json!({"json_schema": {"type": "string", "pattern": "a+"}}),
            "'pattern'",
        ),
        (
            json!({"response_format": {"type": "json_object", "schema": 123}}),
            "schema",
        ),
    ] {
        let (st, v) = s.post_json("/v1/chat/completions", &ask(body.clone()));
        assert_eq!(st, 400, "{body}: {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(needle), "{body}: {m}");
    }
}

#[test]
fn a_required_tool_call_comes_back_as_tool_calls() {
    // The tools' prompt is ~900 tokens in the fixture's byte-level vocabulary: its
    // context is raised to 2048 (random weights: later positions mean no less).
    let model = raised_context(2048);
    let s = Server::start_model(&model, &["-c", "2048"]);
    forced_calls_follow_the_schemas(&s);
    // Bad tool lists.
    for bad in [
        json!({"tools": 5}),
        json!({"tools": [{"type": "function"}]}),
        json!({"tool_choice": "required"}),
    ] {
        let (st, v) = s.post_json("/v1/chat/completions", &ask(bad.clone()));
        assert_eq!(st, 400, "{bad}: {v}");
    }
}

/// A Jinja chat template that reads `tools` gets the request's tools
/// (`/apply-template`, the prompt without generating): Qwen 2.5's template writes them
/// once, in its own words, and pinch adds no tool text of its own.
#[test]
fn a_template_that_reads_tools_writes_them_itself() {
    let tpl = repo().join("tests/data/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    // The template's tool text is ~600 tokens in the fixture's byte-level vocabulary.
    let model = raised_context(2048);
    let t = tpl.to_str().unwrap();
    let s = Server::start_model(&model, &["-c", "2048", "--chat-template-file", t]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather in Zürich", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "tools": tools});
    let (code, v) = s.post_json("/apply-template", &body);
    assert_eq!(code, 200, "{v}");
    let p = v["prompt"].as_str().unwrap();
    // Keys in the order of the request body (serde_json writes them sorted).
    let want_tool = "<tools>\n{\"function\": {\"description\": \"Weather in Zürich\", \
        \"name\": \"get_weather\", \"parameters\": {\"properties\": {\"city\": {\"type\": \
        \"string\"}}, \"required\": [\"city\"], \"type\": \"object\"}}, \"type\": \"function\"}\n</tools>";
    assert!(p.starts_with("<|im_start|>system\nYou are Qwen"), "{p}");
    assert!(p.contains(want_tool), "{p}");
    assert_eq!(p.matches("# Tools").count(), 1, "{p}");
    // tool_choice "none": the template sees no tools.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let (code, v) = s.post_json("/apply-template", &none);
    assert_eq!(code, 200, "{v}");
    assert!(!v["prompt"].as_str().unwrap().contains("# Tools"), "{v}");
}

/// Llama 3's tool format (`--chat-template llama3`: a built-in template that does not
/// read `tools`): the prompt is the one Llama 3.1's template writes with tools (jinja2's
/// rendering in `tests/data/templates/tools-expected.json`, made by
/// `tools/gen_chat_tools.py`), earlier calls and tool results are written as it writes
/// them, and a forced call is a bare JSON object returned as `tool_calls`.
#[test]
fn llama3_tools_are_prompted_and_called_as_llama_31_does() {
    let model = raised_context(2048);
    let s = Server::start_model(&model, &["-c", "2048", "--chat-template", "llama3"]);
    let p = repo().join("tests/data/templates/tools-expected.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    // The tools as the generator's text writes them: serde_json would sort their keys,
    // and the template keeps the request's order.
    let tools_json = d["tools_json"].as_str().unwrap();
    for conv in ["user", "system_user"] {
        let want = d["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["source"] == "meta-llama-Llama-3.1-8B-Instruct.jinja" && c["conv"] == conv)
            .unwrap()["out"]
            .as_str()
            .unwrap()
            .strip_prefix("<s>")
            .unwrap();
        let body = format!(
            "{{\"messages\": {}, \"tools\": {tools_json}}}",
            d["convs"][conv]
        );
        let r = s.post("/apply-template", &body);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["prompt"].as_str().unwrap(), want, "{conv}");
    }
    // A call and its result in the history: Llama 3.1's `{"name": .., "parameters": ..}`
    // (the assistant's text left out, as its template does) and an `ipython` turn.
    let tools: Value = serde_json::from_str(tools_json).unwrap();
    let body = json!({"tools": tools, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]});
    let (code, v) = s.post_json("/apply-template", &body);
    assert_eq!(code, 200, "{v}");
    let prompt = v["prompt"].as_str().unwrap();
    assert!(prompt.ends_with("Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"), "{prompt}");
    assert!(
        !prompt.contains("<tool_call>") && !prompt.contains("Checking."),
        "{prompt}"
    );
    // Llama 3.1's own template, run by the interpreter (it reads `tools`), writes the
    // same prompt from the history pinch passes it (after its BOS text).
    let tpl = repo().join("tests/data/templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
    let j = Server::start_model(
        &model,
        &["-c", "2048", "--chat-template-file", tpl.to_str().unwrap()],
    );
    let (code, v) = j.post_json("/apply-template", &body);
    assert_eq!(code, 200, "{v}");
    let own = v["prompt"].as_str().unwrap();
    let at = own.find("<|start_header_id|>").unwrap();
    assert_eq!(&own[at..], prompt);
    drop(j);

    // tool_choice "required": the grammar makes the answer a bare call object, which
    // is what a stream watches for (`{"name"`).
    forced_calls_follow_the_schemas(&s);
}

/// Forced tool calls (`tool_choice` required, and a named function) batched with a
/// schema-constrained and a free request on a `--parallel 2` server: each answer is
/// the one a one-slot server gives it (each slot runs its own grammar).
#[test]
fn tool_calls_in_a_batch_answer_as_alone() {
    let model = raised_context(2048);
    let tools = json!([
        {"type": "function", "function": {"name": "city", "parameters": {"type": "object",
            "properties": {"c": {"type": "string", "maxLength": 6}}, "required": ["c"]}}},
        {"type": "function", "function": {"name": "test", "parameters": {"type": "object",
            "properties": {"success": {"type": "boolean", "const": true}}, "required": ["success"]}}}
    ]);
    let schema = json!({"type": "object", "properties": {"n": {"type": "boolean"}},
        "required": ["n"]});
    let bodies = [
        ask(json!({"tools": tools, "tool_choice": "required", "seed": 1, "max_tokens": 120})),
        ask(json!({"json_schema": schema, "seed": 2, "max_tokens": 60})),
        ask(json!({"tools": tools, "seed": 3, "max_tokens": 120,
            "tool_choice": {"type": "function", "function": {"name": "city"}}})),
        ask(json!({"seed": 4, "max_tokens": 60})),
    ];
    let answers = |s: &Server| -> Vec<Value> {
        let mut conns: Vec<_> = bodies
            .iter()
            .map(|b| {
                let mut c = connect(s.port);
                let t = post_text("/v1/chat/completions", &b.to_string());
                std::io::Write::write_all(&mut c, t.as_bytes()).unwrap();
                c
            })
            .collect();
        conns
            .iter_mut()
            .map(|c| {
                let r = read_response(c);
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                let mut v = r.json();
                // A call's id carries the generation's number, which is the order the
                // server took the requests in, not part of the answer.
                if let Some(calls) = v["choices"][0]["message"]["tool_calls"].as_array_mut() {
                    calls.iter_mut().for_each(|c| c["id"] = Value::Null);
                }
                json!({"choice": v["choices"][0], "n": v["usage"]["completion_tokens"]})
            })
            .collect()
    };
    let one = Server::start_model(&model, &["-c", "2048"]);
    let want = answers(&one);
    drop(one);
    // The forced calls came back as calls (or were cut by max_tokens, never made up).
    for k in [0, 2] {
        let c = &want[k]["choice"];
        match c["finish_reason"].as_str().unwrap() {
            "tool_calls" => {
                let f = &c["message"]["tool_calls"][0]["function"];
                let _: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
            }
            other => assert_eq!(other, "length", "request {k}: {c}"),
        }
    }
    assert_eq!(
        want[2]["choice"]["message"]["tool_calls"][0]["function"]["name"], "city",
        "{}",
        want[2]
    );
    let s = Server::start_model(&model, &["-c", "4096", "--parallel", "2", "--queue", "4"]);
    let got = answers(&s);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "request {k}: differs from its answer alone");
    }
    assert!(s.metric("pinch_batch_rows_max") >= 2.0);
}
