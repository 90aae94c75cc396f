//! Chat templates: a conversation rendered as the prompt text a chat model expects.
//!
//! llama.cpp does not run the Jinja template stored in `tokenizer.chat_template` for its
//! built-in formats; it sniffs the template for marker strings and renders a fixed format
//! (`llm_chat_detect_template` / `llm_chat_apply_template` in `src/llama-chat.cpp`). We do
//! the same for the three formats pinch's models use:
//!
//! | format  | detected by                                   | turn |
//! |---------|-----------------------------------------------|------|
//! | ChatML  | `<\|im_start\|>`                              | `<\|im_start\|>{role}\n{content}<\|im_end\|>\n` |
//! | Gemma   | `<start_of_turn>`                             | `<start_of_turn>{user\|model}\n{content}<end_of_turn>\n` |
//! | Llama 3 | `<\|start_header_id\|>` and `<\|end_header_id\|>` | `<\|start_header_id\|>{role}<\|end_header_id\|>\n\n{content}<\|eot_id\|>` |
//!
//! Gemma has no system role: system messages are joined and put at the start of the next
//! user turn, followed by a blank line. Gemma and Llama 3 trim each message's content.
//!
//! The rendered text contains control-token text, so tokenize it with `parse_special`.
//! Output goes to any `core::fmt::Write`; nothing is allocated.
use core::fmt::Write;

/// One message of a conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatMessage<'m> {
    /// `system`, `user` or `assistant` (other roles are written as given).
    pub role: &'m str,
    pub content: &'m str,
}

impl<'m> ChatMessage<'m> {
    pub const fn new(role: &'m str, content: &'m str) -> ChatMessage<'m> {
        ChatMessage { role, content }
    }
}

/// A supported chat format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    ChatMl,
    Gemma,
    Llama3,
}

/// Why no prompt could be rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChatError {
    /// The template is one llama.cpp knows but pinch does not implement (Mistral,
    /// Phi-3, ...), or matches no known format.
    UnsupportedTemplate,
    /// The model has no `tokenizer.chat_template` and its architecture implies none.
    NoTemplate,
    /// The output sink refused the text (e.g. a fixed-size buffer is full).
    Write,
}

impl core::fmt::Display for ChatError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ChatError::UnsupportedTemplate => write!(f, "chat template format is not supported"),
            ChatError::NoTemplate => write!(f, "model has no chat template"),
            ChatError::Write => write!(f, "chat prompt does not fit the output"),
        }
    }
}

impl core::error::Error for ChatError {}

impl From<core::fmt::Error> for ChatError {
    fn from(_: core::fmt::Error) -> Self {
        ChatError::Write
    }
}

/// llama.cpp's `trim`: C `isspace` on both ends.
fn trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'))
}

impl ChatTemplate {
    /// Sniff a `tokenizer.chat_template` (or a format name: `chatml`, `gemma`,
    /// `llama3`) the way llama.cpp does, checking its markers in its order.
    pub fn detect(tmpl: &str) -> Result<ChatTemplate, ChatError> {
        match tmpl {
            "chatml" => return Ok(ChatTemplate::ChatMl),
            "gemma" => return Ok(ChatTemplate::Gemma),
            "llama3" => return Ok(ChatTemplate::Llama3),
            _ => {}
        }
        let has = |s: &str| tmpl.contains(s);
        let unsupported = Err(ChatError::UnsupportedTemplate);
        if has("<|im_start|>") {
            // Phi-4 and SmolVLM reuse the marker with a different format.
            if has("<|im_sep|>") || has("<end_of_utterance>") {
                return unsupported;
            }
            return Ok(ChatTemplate::ChatMl);
        }
        // Formats llama.cpp checks before Gemma's marker.
        if tmpl.starts_with("mistral")
            || has("[INST]")
            || (has("<|assistant|>") && (has("<|end|>") || has("<|user|>")))
            || has("[gMASK]<sop>")
            || (has("<|user|>") && has("<|endoftext|>"))
            || has("bos_token + message['role']")
        {
            return unsupported;
        }
        if has("<start_of_turn>") {
            return Ok(ChatTemplate::Gemma);
        }
        if has("GPT4 Correct ")
            || (has("USER: ") && has("ASSISTANT: "))
            || (has("### Instruction:") && has("<|EOT|>"))
            || (has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>"))
        {
            return unsupported;
        }
        if has("<|start_header_id|>") && has("<|end_header_id|>") {
            return Ok(ChatTemplate::Llama3);
        }
        unsupported
    }

    /// The format for a model: its `tokenizer.chat_template` if present, otherwise one
    /// implied by `general.architecture` (Gemma GGUFs often ship without a template;
    /// llama.cpp would fall back to ChatML there, which Gemma was not trained on).
    pub fn from_metadata(
        template: Option<&str>,
        architecture: Option<&str>,
    ) -> Result<ChatTemplate, ChatError> {
        if let Some(t) = template {
            return ChatTemplate::detect(t);
        }
        match architecture {
            Some(a) if a.starts_with("gemma") => Ok(ChatTemplate::Gemma),
            Some(a) if a.starts_with("qwen") => Ok(ChatTemplate::ChatMl),
            _ => Err(ChatError::NoTemplate),
        }
    }

    /// [`Self::from_metadata`] on a GGUF header.
    pub fn from_gguf(g: &crate::gguf::Gguf<'_>) -> Result<ChatTemplate, ChatError> {
        ChatTemplate::from_metadata(g.get_str("tokenizer.chat_template"), g.architecture())
    }

    /// Text that ends an assistant turn (a stop string besides the EOG tokens).
    pub fn end_of_turn(&self) -> &'static str {
        match self {
            ChatTemplate::ChatMl => "<|im_end|>",
            ChatTemplate::Gemma => "<end_of_turn>",
            ChatTemplate::Llama3 => "<|eot_id|>",
        }
    }

    /// Write `messages` as a prompt; `add_generation_prompt` opens the assistant's turn.
    /// BOS is not written: the tokenizer adds it (`add_special`).
    pub fn render(
        &self,
        messages: &[ChatMessage<'_>],
        add_generation_prompt: bool,
        out: &mut dyn Write,
    ) -> Result<(), ChatError> {
        match self {
            ChatTemplate::ChatMl => {
                for m in messages {
                    write!(out, "<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content)?;
                }
                if add_generation_prompt {
                    out.write_str("<|im_start|>assistant\n")?;
                }
            }
            ChatTemplate::Llama3 => {
                for m in messages {
                    write!(
                        out,
                        "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.role,
                        trim(m.content)
                    )?;
                }
                if add_generation_prompt {
                    out.write_str("<|start_header_id|>assistant<|end_header_id|>\n\n")?;
                }
            }
            ChatTemplate::Gemma => {
                // System text waiting for the next user turn: indices of system messages
                // from `pending` up to the current one.
                let mut pending: Option<usize> = None;
                for (i, m) in messages.iter().enumerate() {
                    if m.role == "system" {
                        pending.get_or_insert(i);
                        continue;
                    }
                    let role = if m.role == "assistant" {
                        "model"
                    } else {
                        m.role
                    };
                    writeln!(out, "<start_of_turn>{role}")?;
                    if role != "model" {
                        if let Some(p) = pending.take() {
                            // llama.cpp concatenates trimmed system texts with no separator.
                            let mut any = false;
                            for s in messages[p..i].iter().filter(|s| s.role == "system") {
                                let t = trim(s.content);
                                any |= !t.is_empty();
                                out.write_str(t)?;
                            }
                            if any {
                                out.write_str("\n\n")?;
                            } else {
                                // An empty system text does not count as given.
                                pending = None;
                            }
                        }
                    }
                    writeln!(out, "{}<end_of_turn>", trim(m.content))?;
                }
                if add_generation_prompt {
                    out.write_str("<start_of_turn>model\n")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    type S = heapless::String<1024>;

    fn render(t: ChatTemplate, m: &[ChatMessage], gen: bool) -> S {
        let mut s = S::new();
        t.render(m, gen, &mut s).unwrap();
        s
    }

    const CONV: [ChatMessage; 4] = [
        ChatMessage::new("system", "  Be brief. "),
        ChatMessage::new("user", "Hi\n"),
        ChatMessage::new("assistant", " Hello!"),
        ChatMessage::new("user", "2+2?"),
    ];

    #[test]
    fn detects_templates_by_marker() {
        assert_eq!(
            ChatTemplate::detect("{% for m in messages %}<|im_start|>{{m.role}}"),
            Ok(ChatTemplate::ChatMl)
        );
        assert_eq!(
            ChatTemplate::detect("{{ bos_token }}<start_of_turn>user"),
            Ok(ChatTemplate::Gemma)
        );
        assert_eq!(
            ChatTemplate::detect("<|start_header_id|>' + role + '<|end_header_id|>"),
            Ok(ChatTemplate::Llama3)
        );
        assert_eq!(ChatTemplate::detect("gemma"), Ok(ChatTemplate::Gemma));
        assert_eq!(
            ChatTemplate::detect("<|im_start|>x<|im_sep|>"),
            Err(ChatError::UnsupportedTemplate)
        );
        assert_eq!(
            ChatTemplate::detect("[INST] {{ x }}"),
            Err(ChatError::UnsupportedTemplate)
        );
        assert_eq!(
            ChatTemplate::detect("hello"),
            Err(ChatError::UnsupportedTemplate)
        );
    }

    #[test]
    fn falls_back_on_architecture_only_without_template() {
        assert_eq!(
            ChatTemplate::from_metadata(None, Some("gemma3")),
            Ok(ChatTemplate::Gemma)
        );
        assert_eq!(
            ChatTemplate::from_metadata(None, Some("llama")),
            Err(ChatError::NoTemplate)
        );
        assert_eq!(
            ChatTemplate::from_metadata(Some("<|im_start|>"), Some("gemma3")),
            Ok(ChatTemplate::ChatMl)
        );
    }

    #[test]
    fn chatml_keeps_content_verbatim() {
        let s = render(ChatTemplate::ChatMl, &CONV, true);
        assert_eq!(
            s.as_str(),
            "<|im_start|>system\n  Be brief. <|im_end|>\n<|im_start|>user\nHi\n<|im_end|>\n\
             <|im_start|>assistant\n Hello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama3_trims_content() {
        let s = render(ChatTemplate::Llama3, &CONV[1..3], false);
        assert_eq!(
            s.as_str(),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        );
    }

    #[test]
    fn gemma_folds_system_into_first_user_turn() {
        let s = render(ChatTemplate::Gemma, &CONV, true);
        assert_eq!(
            s.as_str(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn gemma_joins_several_system_messages() {
        let m = [
            ChatMessage::new("system", "A."),
            ChatMessage::new("system", " B."),
            ChatMessage::new("user", "q"),
        ];
        let s = render(ChatTemplate::Gemma, &m, false);
        assert_eq!(s.as_str(), "<start_of_turn>user\nA.B.\n\nq<end_of_turn>\n");
    }

    #[test]
    fn full_output_is_an_error() {
        let mut s = heapless::String::<8>::new();
        assert_eq!(
            ChatTemplate::Gemma.render(&CONV, true, &mut s),
            Err(ChatError::Write)
        );
    }
}
