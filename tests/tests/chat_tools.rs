//! Chat templates that read `tools`, rendered with a request's tools: pinch's Jinja
//! interpreter against jinja2 (`tests/data/templates/tools-expected.json`, made by
//! `tools/gen_chat_tools.py`; llama.cpp's `llama_chat_apply_template` takes no tools), and
//! Qwen 2.5's output against a string written out by hand from its template.
use pinch_runtime_min::chat::jinja::{self, JinjaError};
use pinch_runtime_min::chat::{ChatMessage, Template};
use serde_json::Value;
use std::collections::BTreeMap;

fn dir() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/data/templates/")
}

fn data() -> Value {
    let p = format!("{}tools-expected.json", dir());
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn render(text: &str, msgs: &[ChatMessage<'_>], tools: Option<&str>) -> Result<String, JinjaError> {
    let mut buf = vec![0u8; 1 << 17];
    let vars = jinja::Vars {
        messages: msgs,
        add_generation_prompt: true,
        bos_token: "<s>",
        eos_token: "</s>",
        tools,
    };
    jinja::render(text, &vars, &mut buf).map(|n| String::from_utf8(buf[..n].to_vec()).unwrap())
}

/// The templates small instruct models ship with a tool format; each must render every
/// case exactly as jinja2 does.
const MUST: [&str; 6] = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
];

/// Where jinja2 is not the reference llama.cpp's interpreter (minja) is, and why: pinch
/// renders these and its output is not compared.
const JINJA2_ONLY: [(&str, &str); 2] = [
    // `"..." | safe + text`: jinja2's Markup HTML-escapes the other operand (`&#34;`).
    (
        "meetkai-functionary-medium-v3.1.jinja",
        "jinja2 Markup escaping",
    ),
    // `map(attribute=...) | tojson`: jinja2's map is a generator json.dumps refuses.
    (
        "llama-cpp-deepseek-r1.jinja",
        "jinja2 cannot tojson a map() generator",
    ),
];

#[test]
fn templates_with_tools_render_as_jinja2() {
    let d = data();
    let tools = d["tools_json"].as_str().unwrap();
    let mut per: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    let mut wrong = vec![];
    for c in d["cases"].as_array().unwrap() {
        let src = c["source"].as_str().unwrap();
        let text = std::fs::read_to_string(format!("{}{src}", dir())).unwrap();
        let conv = d["convs"][c["conv"].as_str().unwrap()].as_array().unwrap();
        let msgs: Vec<ChatMessage<'_>> = conv
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let got = render(&text, &msgs, Some(tools));
        if let Some((_, why)) = JINJA2_ONLY.iter().find(|k| k.0 == src) {
            println!(
                "not compared: {src} {} ({why}); pinch: {}",
                c["conv"],
                match &got {
                    Ok(g) => format!("{} bytes", g.len()),
                    Err(e) => format!("{e}"),
                }
            );
            continue;
        }
        let e = per.entry(src.to_string()).or_default();
        e.2 += 1;
        match (c["out"].as_str(), &got) {
            (Some(want), Ok(g)) if g == want => e.0 += 1,
            (None, Err(_)) => e.0 += 1,
            // Refused by pinch (an unsupported feature), rendered by jinja2.
            (Some(_), Err(err)) => {
                e.1 += 1;
                println!("refused: {src} {}: {err}", c["conv"]);
                if MUST.contains(&src) {
                    wrong.push(format!("{src} {}: pinch refuses: {err}", c["conv"]));
                }
            }
            (want, got) => wrong.push(format!(
                "{src} {}:\n  jinja2 {want:?}\n  pinch  {got:?}",
                c["conv"]
            )),
        }
    }
    for (k, (ok, refused, n)) in &per {
        println!(
            "{ok:2}/{n:2} same{} {k}",
            if *refused > 0 {
                format!(", {refused} refused by pinch")
            } else {
                String::new()
            }
        );
    }
    let same: usize = per.values().map(|v| v.0).sum();
    let total: usize = per.values().map(|v| v.2).sum();
    println!("{same}/{total} cases as jinja2 ({} templates)", per.len());
    for m in MUST {
        assert!(per.contains_key(m), "{m} has no cases");
    }
    assert!(total > 100, "{total} cases");
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Qwen 2.5's tool prompt, written out by hand from its template: the system message,
/// then each tool as `json.dumps` writes it (`", "` and `": "`, keys in the request's
/// order, escapes re-made, non-ASCII kept), then the call format.
#[test]
fn qwen25_tool_prompt_is_the_hand_checked_text() {
    let text = std::fs::read_to_string(format!("{}Qwen-Qwen2.5-7B-Instruct.jinja", dir())).unwrap();
    let tools = r#"[ {"type":"function","function":{"name":"get_weather",
        "description":"Weather in \"Paris\" or Z\u00fcrich","parameters":{"type":"object",
        "properties":{"city":{"type":"string"}},"required":["city"]}}} ]"#;
    let msgs = [ChatMessage::new("user", "Hi")];
    let want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n\
# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in \\\"Paris\\\" or Zürich\", \
\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n\
</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(render(&text, &msgs, Some(tools)).unwrap(), want);
    // Without tools the same template takes its other branch.
    let plain = render(&text, &msgs, None).unwrap();
    assert!(!plain.contains("# Tools") && plain.starts_with("<|im_start|>system\nYou are Qwen"));
}

/// Llama 3.1 writes each tool with `tojson(indent=4)`: json.dumps' indented form.
#[test]
fn tojson_indent_is_json_dumps_indent() {
    let t =
        "{{ tools[0] | tojson(indent=2) }}|{{ tools[1] | tojson(indent=2) }}|{{ tools | length }}";
    let tools = r#"[{"a": [1, {"b": null}], "c": {}, "d": [], "e": 1.5e3}, []]"#;
    let got = render(t, &[], Some(tools)).unwrap();
    assert_eq!(
        got,
        "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {},\n  \"d\": [],\n  \"e\": 1.5e3\n}|[]|2"
    );
}

#[test]
fn tools_walk_like_python_dicts() {
    let t = "{% for t in tools %}{{ t.function.name }}({% for k, v in t.function.parameters.properties | items %}{{ k }}:{{ v['type'] }}{% if 'enum' in v %}={{ v.enum | join('|') }}{% endif %};{% endfor %}){% if t.function.strict is defined %}!{% endif %}{% if t.function.parameters is mapping %}M{% endif %}{% endfor %}";
    let tools = r#"[{"function": {"name": "f", "parameters": {"properties": {"x": {"type": "string", "enum": ["a", "b"]}, "n": {"type": "integer"}}}}}, {"function": {"name": "g\u0041", "strict": true, "parameters": {"properties": {}}}}]"#;
    assert_eq!(
        render(t, &[], Some(tools)).unwrap(),
        "f(x:string=a|b;n:integer;)MgA()!M"
    );
}

#[test]
fn invalid_tools_json_is_a_typed_error() {
    for bad in ["[", "[1,]", "{\"a\" 1}", "[\"\\x\"]", "tru", "[1] 2"] {
        assert!(
            matches!(
                render("{{ tools }}", &[], Some(bad)),
                Err(JinjaError::Type { .. })
            ),
            "{bad:?}"
        );
    }
    let deep = "[".repeat(100) + &"]".repeat(100);
    assert!(matches!(
        render("{{ tools }}", &[], Some(&deep)),
        Err(JinjaError::TooComplex { .. })
    ));
}

#[test]
fn template_takes_tools_only_when_its_text_reads_them() {
    let q = std::fs::read_to_string(format!("{}Qwen-Qwen2.5-7B-Instruct.jinja", dir())).unwrap();
    let t = Template::choose(Some(&q), None, None, "", "<|im_end|>").unwrap();
    assert!(t.takes_tools());
    let plain = "{% for m in messages %}{{ m.content }}{% endfor %}";
    let t = Template::choose(Some(plain), None, None, "", "").unwrap();
    assert!(!t.takes_tools());
    let mut out = [0u8; 4096];
    let msgs = [ChatMessage::new("user", "Hi")];
    let n = Template::choose(Some(&q), None, None, "", "<|im_end|>")
        .unwrap()
        .render_with_tools(
            &msgs,
            true,
            Some(r#"[{"type": "function", "function": {"name": "f"}}]"#),
            &mut out,
        )
        .unwrap();
    let s = core::str::from_utf8(&out[..n]).unwrap();
    assert!(
        s.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n</tools>"),
        "{s}"
    );
}

/// Every cut of the tools' JSON, and every buffer size up to the full prompt, ends in a
/// prompt or a typed error (never a panic).
#[test]
fn cut_tools_and_small_buffers_are_typed_errors() {
    let d = data();
    let tools = d["tools_json"].as_str().unwrap();
    let msgs = [ChatMessage::new("user", "Hi")];
    for name in [MUST[0], MUST[4]] {
        let text = std::fs::read_to_string(format!("{}{name}", dir())).unwrap();
        for cut in (0..tools.len()).filter(|&c| tools.is_char_boundary(c)) {
            let r = render(&text, &msgs, Some(&tools[..cut]));
            assert!(r.is_err() || cut == 0, "{name}: cut {cut} rendered");
        }
        let full = render(&text, &msgs, Some(tools)).unwrap().len();
        let mut buf = vec![0u8; 2 * full + 4096];
        for n in (0..buf.len()).step_by(97) {
            let vars = jinja::Vars {
                messages: &msgs,
                add_generation_prompt: true,
                bos_token: "<s>",
                eos_token: "</s>",
                tools: Some(tools),
            };
            match jinja::render(&text, &vars, &mut buf[..n]) {
                Ok(k) => assert_eq!(k, full),
                Err(e) => assert_eq!(e, JinjaError::BufferFull, "{name} with {n} bytes"),
            }
        }
    }
}

/// pinch's own Llama 3 tool prompt (for a Llama 3 template that does not read `tools`,
/// e.g. `--chat-template llama3`) is the prompt Llama 3.1 / 3.2 / 3.3's templates write
/// with the same tools, as jinja2 renders them, after the BOS text.
#[test]
fn the_builtin_llama3_tool_prompt_is_llama_31s() {
    use pinch_runtime_min::server::{jraw, tools};
    let d = data();
    let list = jraw::root(d["tools_json"].as_str().unwrap().as_bytes()).unwrap();
    let mut n = 0;
    for case in d["cases"].as_array().unwrap() {
        let src = case["source"].as_str().unwrap();
        if !src.starts_with("meta-llama-Llama-3.") {
            continue;
        }
        let conv = d["convs"][case["conv"].as_str().unwrap()]
            .as_array()
            .unwrap();
        let msgs: Vec<ChatMessage<'_>> = conv
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let mut got = String::new();
        tools::llama3_prompt(&mut got, &msgs, list, true).unwrap();
        let want = case["out"].as_str().unwrap().strip_prefix("<s>").unwrap();
        assert_eq!(got, want, "{src} {}", case["conv"]);
        n += 1;
    }
    assert_eq!(n, 6, "Llama 3.1, 3.2 and 3.3 on two conversations");
    // Later turns: a tool result in an `ipython` turn (the template quotes a string).
    let msgs = [
        ChatMessage::new("user", "Weather?"),
        ChatMessage::new(
            "assistant",
            "{\"name\": \"get_weather\", \"parameters\": {}}",
        ),
        ChatMessage::new("ipython", "{\"t\": 20}"),
    ];
    let mut got = String::new();
    tools::llama3_prompt(&mut got, &msgs, list, true).unwrap();
    assert!(got.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"t\\\": 20}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"), "{got}");
    assert_eq!(
        tools::llama3_prompt(&mut String::new(), &msgs[..0], list, true),
        Err(tools::PromptError::NoUserMessage)
    );
}
