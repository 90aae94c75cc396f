//! `pinch chat`'s chat template end to end: `--chat-template NAME|FILE`,
//! `--chat-template-file`, the line saying which template was chosen, and turns after the
//! first fed as the text that follows the cache's (not the whole conversation again).
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn data(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

/// `pinch chat` on the tiny Qwen 3 fixture (no template of its own) with `input` lines.
fn chat(extra: &[&str], input: &str) -> Output {
    let model = data("tiny/tiny-qwen3-Q8_0.gguf");
    let mut args = vec![
        "chat", "-m", &model, "-n", "3", "-t", "1", "-v", "--guard", "0",
    ];
    args.extend_from_slice(extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_pinch"))
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // pinch may exit (bad flag) before reading: a broken pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The token counts of each turn's prompt (`-v` prints `[N prompt tokens: ...]`).
fn prompt_counts(e: &str) -> Vec<usize> {
    e.lines()
        .filter_map(|l| l.find(" prompt tokens:").map(|i| &l[..i]))
        .filter_map(|l| l.rsplit('[').next()?.parse().ok())
        .collect()
}

#[test]
fn says_which_template_it_chose() {
    let o = chat(&[], "hi\n");
    assert!(o.status.success(), "{}", stderr(&o));
    // No template in the fixture: the architecture's default.
    assert!(
        stderr(&o).contains("chat template: chatml (default: the GGUF has no usable template)"),
        "{}",
        stderr(&o)
    );
    let o = chat(&["--chat-template", "llama3"], "hi\n");
    assert!(stderr(&o).contains("chat template: llama3 (from --chat-template)"));
    let file = data("templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    for flag in ["--chat-template", "--chat-template-file"] {
        let o = chat(&[flag, &file], "hi\n");
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("chat template: Jinja (from --chat-template)"));
    }
}

#[test]
fn unknown_template_name_lists_the_known_ones() {
    let o = chat(&["--chat-template", "nosuch"], "hi\n");
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("unknown chat template name; known: chatml, llama2"),
        "{e}"
    );
    assert!(e.contains("bailing2") && e.contains("gemma"), "{e}");
    for flag in ["--chat-template", "--chat-template-file"] {
        let o = chat(&[flag, "/nonexistent/t.jinja"], "hi\n");
        assert_eq!(o.status.code(), Some(1));
        let e = stderr(&o);
        assert!(
            e.contains("chat template '/nonexistent/t.jinja' is not readable"),
            "{e}"
        );
        assert!(e.contains("known: chatml"), "{e}");
    }
}

#[test]
fn later_turns_feed_only_the_new_text() {
    // Qwen 2.5's Jinja template writes a default system prompt before the first turn:
    // the second turn must not repeat it (nor the first turn). Gemma 2's trims the reply.
    for t in [
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "google-gemma-2-2b-it.jinja",
    ] {
        let file = data(&format!("templates/{t}"));
        let o = chat(
            &["--chat-template-file", &file],
            "hello there\nhello there\n",
        );
        let e = stderr(&o);
        assert!(o.status.success(), "{e}");
        let n = prompt_counts(&e);
        assert_eq!(n.len(), 2, "{t}: {e}");
        // (`-v` says when a turn starts over from the full prompt.)
        assert!(!e.contains("prompt starts over"), "{t}: {e}");
        assert!(!e.contains("context full"), "{t}: {e}");
        if t.starts_with("Qwen") {
            // Its default system prompt is not written again.
            assert!(
                n[1] < n[0],
                "{t}: second turn {} tokens, first {}: {e}",
                n[1],
                n[0]
            );
        }
    }
}

/// `--grammar` and `-j` hold in `pinch chat` as in `run`: every reply of the random
/// fixture (whose free text is noise) follows the grammar, turn after turn.
#[test]
fn every_chat_reply_follows_the_grammar() {
    let o = chat(
        &["-n", "40", "--grammar", "root ::= \"yes\" | \"no\""],
        "a\nb\nc\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let replies: Vec<&str> = out
        .split("> ")
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .collect();
    assert_eq!(replies.len(), 3, "{out:?}");
    assert!(replies.iter().all(|r| *r == "yes" || *r == "no"), "{out:?}");
    let schema = r#"{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}"#;
    let o = chat(&["-n", "60", "-j", schema], "a\nb\n");
    let out = String::from_utf8_lossy(&o.stdout);
    for r in out.split("> ").map(str::trim).filter(|r| !r.is_empty()) {
        let v: serde_json::Value = serde_json::from_str(r).unwrap_or_else(|e| panic!("{e}: {r:?}"));
        assert!(v["n"].is_i64(), "{v}");
    }
}
