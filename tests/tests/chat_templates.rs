//! Chat templates against llama.cpp, byte for byte (expected outputs in
//! `tests/data/templates/expected.json`, made by `tools/gen_chat_templates.py`).
//!
//! - Named formats: each of llama.cpp's built-in names, and the format detected from each
//!   Jinja text, against `llama_chat_apply_template` (llama-cpp-python 0.3.36).
//! - Jinja: pinch's interpreter against jinja2 in llama-cpp-python's
//!   `Jinja2ChatFormatter` environment, on the same conversations; where jinja2 fails
//!   (the template raises, or content parts meet string concatenation) pinch must fail.
use pinch_runtime_min::chat::jinja::{self, JinjaError};
use pinch_runtime_min::chat::{ChatMessage, Named};
use serde_json::Value;
use std::collections::BTreeMap;

fn data() -> Value {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/data/templates/expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn template_text(source: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data/templates/");
    if let Some((file, name)) = source.split_once('#') {
        let cases: Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{dir}{file}")).unwrap())
                .unwrap();
        let c = cases.as_array().unwrap().iter().find(|c| c["name"] == name);
        return c.unwrap()["template"].as_str().unwrap().to_string();
    }
    std::fs::read_to_string(format!("{dir}{source}")).unwrap()
}

/// A message, owned: role and content (text, or text parts).
type OwnedMsg = (String, Result<String, Vec<String>>);

/// The conversations, owned; messages borrow from them.
struct Convs {
    text: BTreeMap<String, Vec<OwnedMsg>>,
}

impl Convs {
    fn new(d: &Value) -> Convs {
        let mut text = BTreeMap::new();
        for (k, v) in d["conversations"].as_object().unwrap() {
            let msgs = v
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    let role = m["role"].as_str().unwrap().to_string();
                    let c = match &m["content"] {
                        Value::String(s) => Ok(s.clone()),
                        Value::Array(parts) => Err(parts
                            .iter()
                            .map(|p| p["text"].as_str().unwrap().to_string())
                            .collect()),
                        _ => panic!("content"),
                    };
                    (role, c)
                })
                .collect();
            text.insert(k.clone(), msgs);
        }
        Convs { text }
    }
}

fn with_messages<R>(convs: &Convs, name: &str, f: impl FnOnce(&[ChatMessage<'_>]) -> R) -> R {
    let owned = &convs.text[name];
    let parts: Vec<Vec<&str>> = owned
        .iter()
        .map(|(_, c)| match c {
            Ok(_) => vec![],
            Err(p) => p.iter().map(|s| s.as_str()).collect(),
        })
        .collect();
    let msgs: Vec<ChatMessage<'_>> = owned
        .iter()
        .zip(&parts)
        .map(|((r, c), p)| match c {
            Ok(s) => ChatMessage::new(r, s),
            Err(_) => ChatMessage::parts(r, p),
        })
        .collect();
    f(&msgs)
}

fn render_named(n: Named, m: &[ChatMessage<'_>], add: bool) -> String {
    let mut s = String::new();
    n.render(m, add, &mut s).unwrap();
    s
}

#[test]
fn every_named_template_renders_as_llama_cpp() {
    let d = data();
    let convs = Convs::new(&d);
    let mut names = std::collections::BTreeSet::new();
    for e in d["named"].as_array().unwrap() {
        let name = e["template"].as_str().unwrap();
        let n = Named::from_name(name).unwrap_or_else(|| panic!("pinch lacks {name}"));
        let add = e["add_generation_prompt"].as_bool().unwrap();
        let got = with_messages(&convs, e["conv"].as_str().unwrap(), |m| {
            render_named(n, m, add)
        });
        assert_eq!(
            got,
            e["out"].as_str().unwrap(),
            "{name} {} add={add}",
            e["conv"]
        );
        names.insert(name);
    }
    let builtin = d["builtin_names"].as_array().unwrap();
    assert_eq!(names.len(), builtin.len());
    println!("{} named templates checked: {names:?}", names.len());
}

#[test]
fn detects_the_format_of_each_jinja_text_as_llama_cpp() {
    let d = data();
    let convs = Convs::new(&d);
    let mut n_checked = 0;
    for e in d["detected"].as_array().unwrap() {
        let src = e["source"].as_str().unwrap();
        let text = template_text(src);
        let add = e["add_generation_prompt"].as_bool().unwrap();
        let det = Named::detect(&text);
        match e["out"].as_str() {
            None => assert_eq!(det, None, "{src}: llama.cpp detects nothing"),
            Some(want) => {
                let n = det.unwrap_or_else(|| panic!("{src}: pinch detects nothing"));
                let got = with_messages(&convs, e["conv"].as_str().unwrap(), |m| {
                    render_named(n, m, add)
                });
                assert_eq!(got, want, "{src} as {} {} add={add}", n.name(), e["conv"]);
            }
        }
        n_checked += 1;
    }
    assert!(n_checked > 100);
}

#[test]
fn jinja_templates_render_as_jinja2() {
    let d = data();
    let convs = Convs::new(&d);
    let mut ok = BTreeMap::<String, (usize, usize)>::new();
    let (mut same_text, mut both_fail) = (0, 0);
    let mut failures = vec![];
    let mut buf = vec![0u8; 1 << 16];
    for e in d["jinja"].as_array().unwrap() {
        let src = e["source"].as_str().unwrap();
        let text = template_text(src);
        let add = e["add_generation_prompt"].as_bool().unwrap();
        let conv = e["conv"].as_str().unwrap();
        let got = with_messages(&convs, conv, |m| {
            let vars = jinja::Vars {
                messages: m,
                add_generation_prompt: add,
                bos_token: e["bos_token"].as_str().unwrap(),
                eos_token: e["eos_token"].as_str().unwrap(),
                tools: None,
            };
            jinja::render(&text, &vars, &mut buf)
                .map(|n| String::from_utf8(buf[..n].to_vec()).unwrap())
        });
        let entry = ok.entry(src.to_string()).or_default();
        entry.1 += 1;
        match (e["out"].as_str(), got) {
            (Some(want), Ok(g)) if g == want => {
                entry.0 += 1;
                same_text += 1;
            }
            (None, Err(_)) => {
                entry.0 += 1;
                both_fail += 1;
            }
            (want, got) => failures.push(format!(
                "{src} {conv} add={add}:\n  want {want:?}\n  got  {got:?}"
            )),
        }
    }
    for (k, (a, b)) in &ok {
        println!("{a:3}/{b:3} {k}");
    }
    let full = ok.values().filter(|(a, b)| a == b).count();
    println!(
        "{full} of {} Jinja templates agree on every case: {same_text} renders byte-identical, \
         {both_fail} refused by both",
        ok.len()
    );
    assert!(same_text > 700, "too few renders compared: {same_text}");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn raise_exception_is_a_typed_error() {
    let vars = jinja::Vars {
        messages: &[ChatMessage::new("system", "x")],
        add_generation_prompt: true,
        bos_token: "",
        eos_token: "",
        tools: None,
    };
    let t = "{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}";
    let mut buf = [0u8; 256];
    assert!(matches!(
        jinja::render(t, &vars, &mut buf),
        Err(JinjaError::Raised { .. })
    ));
}
