//! Fuzz target for chat templates: template sniffing on arbitrary text, and rendering
//! of hostile conversations (any roles, contents full of control-token text, empty and
//! whitespace-only system messages) in every supported format.
//!
//! Input: byte 0 picks the format and `add_generation_prompt`; byte 1 the size of a
//! bounded output; the rest is split at 0xFF bytes into alternating role and content
//! fields (lossy UTF-8), at most 64 messages as the server allows. Also sniffed as a
//! `tokenizer.chat_template`. Checked: rendering into a bounded sink fails with
//! `ChatError::Write` exactly when the unbounded rendering is longer, and otherwise
//! gives the same text; every content's trimmed text appears in the output (Gemma's
//! system texts only when a user turn follows).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_fuzz::Bounded;
use pinch_runtime_min::chat::{ChatError, ChatMessage, ChatTemplate, Content};

const FORMATS: [ChatTemplate; 3] = [
    ChatTemplate::ChatMl,
    ChatTemplate::Gemma,
    ChatTemplate::Llama3,
];

fuzz_target!(|data: &[u8]| {
    let [sel, cap, rest @ ..] = data else {
        return;
    };
    let whole = String::from_utf8_lossy(rest);
    let _ = ChatTemplate::detect(&whole);
    let _ = ChatTemplate::from_metadata(Some(&whole), Some(&whole));
    let _ = ChatTemplate::from_metadata(None, Some(&whole));

    let fields: Vec<String> = rest
        .split(|&b| b == 0xFF)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let msgs: Vec<ChatMessage> = fields
        .chunks(2)
        .take(64)
        .map(|c| ChatMessage::new(&c[0], c.get(1).map_or("", |s| s)))
        .collect();
    let t = FORMATS[(sel % 3) as usize];
    let gen = sel & 4 != 0;

    let mut full = Bounded {
        text: String::new(),
        cap: usize::MAX,
    };
    t.render(&msgs, gen, &mut full)
        .expect("an unbounded sink never fails");
    // Gemma drops system text that no later user turn takes up (as llama.cpp does).
    for m in msgs
        .iter()
        .filter(|m| t != ChatTemplate::Gemma || m.role != "system")
    {
        let text = match m.content {
            Content::Text(t) => t,
            Content::Parts(_) => continue,
        };
        let content =
            text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'));
        assert!(
            full.text.contains(content),
            "content missing from the prompt"
        );
    }
    let cap = *cap as usize * 4;
    let mut small = Bounded {
        text: String::new(),
        cap,
    };
    match t.render(&msgs, gen, &mut small) {
        Ok(()) => assert_eq!(small.text, full.text),
        Err(ChatError::Write) => assert!(full.text.len() > cap),
        Err(e) => panic!("bounded render gave {e}"),
    }
});
