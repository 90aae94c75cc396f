//! llama.cpp's built-in chat formats: each known by a name, detected from marker strings
//! in a Jinja template, and rendered by fixed code (`llm_chat_detect_template` /
//! `llm_chat_apply_template` in llama.cpp's `src/llama-chat.cpp`, commit 0c1e570).
//!
//! llama.cpp falls back to these when it does not run the Jinja template itself; pinch
//! uses them when its interpreter cannot render a template, when `--chat-template NAME`
//! asks for one, and for the end-of-turn text. Each renders exactly what llama.cpp's
//! `llama_chat_apply_template` returns (checked byte for byte in
//! `tests/tests/chat_templates.rs`); message content given as parts is joined with `\n`
//! as llama.cpp's server does.
use super::{ChatError, ChatMessage};
use core::fmt::Write;

macro_rules! named_templates {
    ($($v:ident = $name:literal,)*) => {
        /// A built-in format (the names are llama.cpp's).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum Named { $($v,)* }

        impl Named {
            /// Every format with a name, in llama.cpp's order.
            pub const ALL: &'static [Named] = &[$(Named::$v,)*];

            /// llama.cpp's name (`--chat-template NAME`).
            pub fn name(self) -> &'static str {
                match self { $(Named::$v => $name,)* }
            }
        }
    };
}

named_templates! {
    ChatMl = "chatml",
    Llama2 = "llama2",
    Llama2Sys = "llama2-sys",
    Llama2SysBos = "llama2-sys-bos",
    Llama2SysStrip = "llama2-sys-strip",
    MistralV1 = "mistral-v1",
    MistralV3 = "mistral-v3",
    MistralV3Tekken = "mistral-v3-tekken",
    MistralV7 = "mistral-v7",
    MistralV7Tekken = "mistral-v7-tekken",
    Phi3 = "phi3",
    Phi4 = "phi4",
    Falcon3 = "falcon3",
    Zephyr = "zephyr",
    Monarch = "monarch",
    Gemma = "gemma",
    Orion = "orion",
    OpenChat = "openchat",
    Vicuna = "vicuna",
    VicunaOrca = "vicuna-orca",
    DeepSeek = "deepseek",
    DeepSeek2 = "deepseek2",
    DeepSeek3 = "deepseek3",
    DeepSeekOcr = "deepseek-ocr",
    CommandR = "command-r",
    Llama3 = "llama3",
    ChatGlm3 = "chatglm3",
    ChatGlm4 = "chatglm4",
    GlmEdge = "glmedge",
    MiniCpm = "minicpm",
    Exaone3 = "exaone3",
    Exaone4 = "exaone4",
    ExaoneMoe = "exaone-moe",
    RwkvWorld = "rwkv-world",
    Granite3 = "granite",
    Granite40 = "granite-4.0",
    Granite41 = "granite-4.1",
    GigaChat = "gigachat",
    Megrez = "megrez",
    Yandex = "yandex",
    Bailing = "bailing",
    BailingThink = "bailing-think",
    Bailing2 = "bailing2",
    Llama4 = "llama4",
    SmolVlm = "smolvlm",
    HunyuanMoe = "hunyuan-moe",
    OpenAiMoe = "gpt-oss",
    HunyuanDense = "hunyuan-dense",
    HunyuanVl = "hunyuan-vl",
    KimiK2 = "kimi-k2",
    SeedOss = "seed_oss",
    Grok2 = "grok-2",
    PanguEmbed = "pangu-embedded",
    SolarOpen = "solar-open",
    // Detected, but llama.cpp gives it no name.
    Dots1 = "dots1",
}

/// llama.cpp's `trim`: C `isspace` on both ends.
fn trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'))
}

/// A message's content as one string (parts joined with `\n`).
struct Text<'m>(&'m ChatMessage<'m>);

impl core::fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(&self.0.content, f)
    }
}

/// Trimmed content: parts are joined first, then trimmed, so write them to `out`
/// through a trimming adapter.
fn write_trimmed(out: &mut dyn Write, m: &ChatMessage<'_>) -> core::fmt::Result {
    match m.content {
        super::Content::Text(t) => out.write_str(trim(t)),
        super::Content::Parts(_) => {
            let mut t = TrimWriter {
                out,
                started: false,
                spaces: 0,
                pending: [0; 64],
            };
            write!(t, "{}", m.content)?;
            Ok(())
        }
    }
}

/// Drops leading whitespace and holds trailing whitespace until more text follows.
struct TrimWriter<'w> {
    out: &'w mut dyn Write,
    started: bool,
    spaces: usize,
    pending: [u8; 64],
}

impl Write for TrimWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for c in s.chars() {
            let space = matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r');
            if !self.started {
                if space {
                    continue;
                }
                self.started = true;
            }
            if space {
                if self.spaces == self.pending.len() {
                    // Too much held whitespace: write it (only a huge inner run).
                    let held = core::str::from_utf8(&self.pending).unwrap_or("");
                    self.out.write_str(held)?;
                    self.spaces = 0;
                }
                self.pending[self.spaces] = c as u8;
                self.spaces += 1;
            } else {
                if self.spaces > 0 {
                    let held = core::str::from_utf8(&self.pending[..self.spaces]).unwrap_or("");
                    self.out.write_str(held)?;
                    self.spaces = 0;
                }
                self.out.write_char(c)?;
            }
        }
        Ok(())
    }
}

impl Named {
    /// The format named `name` (llama.cpp's names, see [`Named::name`]).
    pub fn from_name(name: &str) -> Option<Named> {
        Named::ALL
            .iter()
            .copied()
            .find(|n| n.name() == name && *n != Named::Dots1)
    }

    /// llama.cpp's `llm_chat_detect_template`: a name, or marker strings of a Jinja
    /// template checked in llama.cpp's order. `None`: no known format.
    pub fn detect(tmpl: &str) -> Option<Named> {
        use Named::*;
        if let Some(n) = Named::from_name(tmpl) {
            return Some(n);
        }
        let has = |s: &str| tmpl.contains(s);
        Some(if has("<|im_start|>") {
            if has("<|im_sep|>") {
                Phi4
            } else if has("<end_of_utterance>") {
                SmolVlm
            } else {
                ChatMl
            }
        } else if tmpl.starts_with("mistral") || has("[INST]") {
            if has("[SYSTEM_PROMPT]") {
                MistralV7
            } else if has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]") {
                if has(" [INST]") {
                    MistralV1
                } else if has("\"[INST]\"") {
                    MistralV3Tekken
                } else {
                    MistralV3
                }
            } else if has("content.strip()") {
                Llama2SysStrip
            } else if has("bos_token + '[INST]") {
                Llama2SysBos
            } else if has("<<SYS>>") {
                Llama2Sys
            } else {
                Llama2
            }
        } else if has("<|assistant|>") && has("<|end|>") {
            Phi3
        } else if has("[gMASK]<sop>") {
            ChatGlm4
        } else if has("<|assistant|>") && has("<|user|>") {
            if has("<|tool_declare|>") {
                ExaoneMoe
            } else if has("</s>") {
                Falcon3
            } else {
                GlmEdge
            }
        } else if has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>") {
            GlmEdge
        } else if has("<|user|>") && has("<|endoftext|>") {
            Zephyr
        } else if has("bos_token + message['role']") {
            Monarch
        } else if has("<start_of_turn>") {
            Gemma
        } else if has("'\\n\\nAssistant: ' + eos_token") {
            Orion
        } else if has("GPT4 Correct ") {
            OpenChat
        } else if has("USER: ") && has("ASSISTANT: ") {
            if has("SYSTEM: ") {
                VicunaOrca
            } else {
                Vicuna
            }
        } else if has("### Instruction:") && has("<|EOT|>") {
            DeepSeek
        } else if has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>") {
            CommandR
        } else if has("<|start_header_id|>") && has("<|end_header_id|>") {
            Llama3
        } else if has("[gMASK]sop") {
            ChatGlm3
        } else if has("<用户>") {
            MiniCpm
        } else if has("'Assistant: ' + message['content'] + eos_token") {
            DeepSeek2
        } else if has("<｜Assistant｜>") && has("<｜User｜>") && has("<｜end▁of▁sentence｜>") {
            DeepSeek3
        } else if has("[|system|]") && has("[|assistant|]") && has("[|endofturn|]") {
            if has("[|tool|]") {
                Exaone4
            } else {
                Exaone3
            }
        } else if has("rwkv-world") || has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}")
        {
            RwkvWorld
        } else if has("<|start_of_role|>") {
            if has("<tool_call>") || has("<tools>") {
                if has("g4_default_system_message") {
                    Granite40
                } else {
                    Granite41
                }
            } else {
                Granite3
            }
        } else if has("message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]") {
            GigaChat
        } else if has("<|role_start|>") {
            Megrez
        } else if has(" Ассистент:") {
            Yandex
        } else if has("<role>ASSISTANT</role>") && has("'HUMAN'") {
            Bailing
        } else if has("<role>ASSISTANT</role>") && has("\"HUMAN\"") && has("<think>") {
            BailingThink
        } else if has("<role>ASSISTANT</role>") && has("<role>HUMAN</role>") && has("<|role_end|>")
        {
            Bailing2
        } else if has("<|header_start|>") && has("<|header_end|>") {
            Llama4
        } else if has("<|endofuserprompt|>") {
            Dots1
        } else if has("<|extra_0|>") && has("<|extra_4|>") {
            HunyuanMoe
        } else if has("<|start|>") && has("<|channel|>") {
            OpenAiMoe
        } else if has("<｜hy_Assistant｜>") && has("<｜hy_begin▁of▁sentence｜>") {
            HunyuanVl
        } else if has("<｜hy_Assistant｜>") && has("<｜hy_place▁holder▁no▁3｜>") {
            HunyuanDense
        } else if has("<|im_assistant|>assistant<|im_middle|>") {
            KimiK2
        } else if has("<seed:bos>") {
            SeedOss
        } else if has("'Assistant: '  + message['content'] + '<|separator|>") {
            Grok2
        } else if has("[unused9]系统：[unused10]") {
            PanguEmbed
        } else if has("<|begin|>") && has("<|end|>") && has("<|content|>") {
            SolarOpen
        } else {
            return None;
        })
    }

    /// The format for a model: its `tokenizer.chat_template` if present, otherwise one
    /// implied by `general.architecture` (Gemma GGUFs often ship without a template;
    /// llama.cpp would fall back to ChatML there, which Gemma was not trained on).
    pub fn from_metadata(
        template: Option<&str>,
        architecture: Option<&str>,
    ) -> Result<Named, ChatError> {
        if let Some(t) = template {
            return Named::detect(t).ok_or(ChatError::UnsupportedTemplate);
        }
        match architecture {
            Some(a) if a.starts_with("gemma") => Ok(Named::Gemma),
            Some(a) if a.starts_with("qwen") || a.starts_with("lfm") => Ok(Named::ChatMl),
            _ => Err(ChatError::NoTemplate),
        }
    }

    /// [`Self::from_metadata`] on a GGUF header.
    pub fn from_gguf(g: &crate::gguf::Gguf<'_>) -> Result<Named, ChatError> {
        Named::from_metadata(g.get_str("tokenizer.chat_template"), g.architecture())
    }

    /// Text that ends an assistant turn (a stop string besides the EOG tokens).
    pub fn end_of_turn(&self) -> &'static str {
        use Named::*;
        match self {
            ChatMl | Phi4 | KimiK2 => "<|im_end|>",
            Gemma => "<end_of_turn>",
            Llama3 => "<|eot_id|>",
            Llama4 => "<|eot|>",
            Phi3 => "<|end|>",
            Granite3 | Granite40 | Granite41 => "<|end_of_text|>",
            DeepSeek2 | DeepSeek3 => "<｜end▁of▁sentence｜>",
            DeepSeek => "<|EOT|>",
            CommandR => "<|END_OF_TURN_TOKEN|>",
            Exaone3 | Exaone4 => "[|endofturn|]",
            ExaoneMoe => "<|endofturn|>",
            Bailing2 => "<|role_end|>",
            Megrez => "<|turn_end|>",
            SeedOss => "<seed:eos>",
            OpenChat => "<|end_of_turn|>",
            SmolVlm => "<end_of_utterance>",
            Zephyr => "<|endoftext|>",
            Grok2 => "<|separator|>",
            SolarOpen | OpenAiMoe => "<|end|>",
            GigaChat => "<|message_sep|>",
            PanguEmbed => "[unused10]",
            Dots1 => "<|endofresponse|>",
            HunyuanMoe => "<|eos|>",
            RwkvWorld | Yandex => "\n\n",
            _ => "</s>",
        }
    }

    /// Write `messages` as llama.cpp does; `add_generation_prompt` opens the assistant's
    /// turn (the formats that always end open ignore it, as llama.cpp does). BOS is not
    /// written unless the format writes it inside the history.
    pub fn render(
        &self,
        messages: &[ChatMessage<'_>],
        add_generation_prompt: bool,
        out: &mut dyn Write,
    ) -> Result<(), ChatError> {
        self.write(messages, add_generation_prompt, out)?;
        Ok(())
    }

    fn write(&self, chat: &[ChatMessage<'_>], add: bool, out: &mut dyn Write) -> core::fmt::Result {
        use Named::*;
        let ass = |out: &mut dyn Write, s: &str| if add { out.write_str(s) } else { Ok(()) };
        match self {
            ChatMl => {
                for m in chat {
                    writeln!(out, "<|im_start|>{}\n{}<|im_end|>", m.role, Text(m))?;
                }
                ass(out, "<|im_start|>assistant\n")
            }
            MistralV7 | MistralV7Tekken => {
                let sp = if *self == MistralV7 { " " } else { "" };
                for m in chat {
                    match m.role {
                        "system" => write!(out, "[SYSTEM_PROMPT]{sp}{}[/SYSTEM_PROMPT]", Text(m))?,
                        "user" => write!(out, "[INST]{sp}{}[/INST]", Text(m))?,
                        _ => write!(out, "{sp}{}</s>", Text(m))?,
                    }
                }
                Ok(())
            }
            MistralV1 | MistralV3 | MistralV3Tekken => {
                let lead = if *self == MistralV1 { " " } else { "" };
                let trail = if *self == MistralV3Tekken { "" } else { " " };
                let mut inside = false;
                for m in chat {
                    if !inside {
                        write!(out, "{lead}[INST]{trail}")?;
                        inside = true;
                    }
                    match m.role {
                        "system" => write!(out, "{}\n\n", Text(m))?,
                        "user" => write!(out, "{}{lead}[/INST]", Text(m))?,
                        _ => {
                            out.write_str(trail)?;
                            if *self == MistralV3 {
                                write_trimmed(out, m)?;
                            } else {
                                write!(out, "{}", Text(m))?;
                            }
                            out.write_str("</s>")?;
                            inside = false;
                        }
                    }
                }
                Ok(())
            }
            Llama2 | Llama2Sys | Llama2SysBos | Llama2SysStrip => {
                let sys = *self != Llama2;
                let strip = *self == Llama2SysStrip;
                let mut inside = true;
                out.write_str("[INST] ")?;
                for m in chat {
                    if !inside {
                        inside = true;
                        out.write_str(if *self == Llama2SysBos {
                            "<s>[INST] "
                        } else {
                            "[INST] "
                        })?;
                    }
                    let content = |out: &mut dyn Write| {
                        if strip {
                            write_trimmed(out, m)
                        } else {
                            write!(out, "{}", Text(m))
                        }
                    };
                    match m.role {
                        "system" if sys => {
                            out.write_str("<<SYS>>\n")?;
                            content(out)?;
                            out.write_str("\n<</SYS>>\n\n")?;
                        }
                        "system" => {
                            content(out)?;
                            out.write_str("\n")?;
                        }
                        "user" => {
                            content(out)?;
                            out.write_str(" [/INST]")?;
                        }
                        _ => {
                            content(out)?;
                            out.write_str("</s>")?;
                            inside = false;
                        }
                    }
                }
                Ok(())
            }
            Phi3 => {
                for m in chat {
                    writeln!(out, "<|{}|>\n{}<|end|>", m.role, Text(m))?;
                }
                ass(out, "<|assistant|>\n")
            }
            Phi4 => {
                for m in chat {
                    write!(out, "<|im_start|>{}<|im_sep|>{}<|im_end|>", m.role, Text(m))?;
                }
                ass(out, "<|im_start|>assistant<|im_sep|>")
            }
            Falcon3 => {
                for m in chat {
                    writeln!(out, "<|{}|>\n{}", m.role, Text(m))?;
                }
                ass(out, "<|assistant|>\n")
            }
            Zephyr => {
                for m in chat {
                    writeln!(out, "<|{}|>\n{}<|endoftext|>", m.role, Text(m))?;
                }
                ass(out, "<|assistant|>\n")
            }
            Monarch => {
                for (i, m) in chat.iter().enumerate() {
                    let bos = if i == 0 { "" } else { "<s>" };
                    writeln!(out, "{bos}{}\n{}</s>", m.role, Text(m))?;
                }
                ass(out, "<s>assistant\n")
            }
            Gemma => {
                // System text waiting for the next user turn: indices of system messages
                // from `pending` up to the current one.
                let mut pending: Option<usize> = None;
                for (i, m) in chat.iter().enumerate() {
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
                            // Trimmed system texts concatenated with no separator.
                            let mut any = false;
                            for s in chat[p..i].iter().filter(|s| s.role == "system") {
                                let mut probe = NonEmpty(false);
                                write_trimmed(&mut probe, s)?;
                                any |= probe.0;
                                write_trimmed(out, s)?;
                            }
                            if any {
                                out.write_str("\n\n")?;
                            } else {
                                // An empty system text does not count as given.
                                pending = None;
                            }
                        }
                    }
                    write_trimmed(out, m)?;
                    out.write_str("<end_of_turn>\n")?;
                }
                ass(out, "<start_of_turn>model\n")
            }
            Orion => {
                let mut pending: Option<usize> = None;
                for (i, m) in chat.iter().enumerate() {
                    match m.role {
                        "system" => {
                            pending.get_or_insert(i);
                        }
                        "user" => {
                            out.write_str("Human: ")?;
                            if let Some(p) = pending.take() {
                                let mut any = false;
                                for s in chat[p..i].iter().filter(|s| s.role == "system") {
                                    let mut probe = NonEmpty(false);
                                    write!(probe, "{}", Text(s))?;
                                    any |= probe.0;
                                    write!(out, "{}", Text(s))?;
                                }
                                if any {
                                    out.write_str("\n\n")?;
                                } else {
                                    pending = None;
                                }
                            }
                            write!(out, "{}\n\nAssistant: </s>", Text(m))?;
                        }
                        _ => write!(out, "{}</s>", Text(m))?,
                    }
                }
                Ok(())
            }
            OpenChat => {
                for m in chat {
                    if m.role == "system" {
                        write!(out, "{}<|end_of_turn|>", Text(m))?;
                    } else {
                        out.write_str("GPT4 Correct ")?;
                        let mut r = m.role.chars();
                        if let Some(c) = r.next() {
                            out.write_char(c.to_ascii_uppercase())?;
                        }
                        write!(out, "{}: {}<|end_of_turn|>", r.as_str(), Text(m))?;
                    }
                }
                ass(out, "GPT4 Correct Assistant:")
            }
            Vicuna | VicunaOrca => {
                for m in chat {
                    match m.role {
                        "system" if *self == VicunaOrca => writeln!(out, "SYSTEM: {}", Text(m))?,
                        "system" => write!(out, "{}\n\n", Text(m))?,
                        "user" => writeln!(out, "USER: {}", Text(m))?,
                        "assistant" => writeln!(out, "ASSISTANT: {}</s>", Text(m))?,
                        _ => {}
                    }
                }
                ass(out, "ASSISTANT:")
            }
            DeepSeek => {
                for m in chat {
                    match m.role {
                        "system" => write!(out, "{}", Text(m))?,
                        "user" => writeln!(out, "### Instruction:\n{}", Text(m))?,
                        "assistant" => writeln!(out, "### Response:\n{}\n<|EOT|>", Text(m))?,
                        _ => {}
                    }
                }
                ass(out, "### Response:\n")
            }
            CommandR => {
                for m in chat {
                    let tok = match m.role {
                        "system" => "<|SYSTEM_TOKEN|>",
                        "user" => "<|USER_TOKEN|>",
                        "assistant" => "<|CHATBOT_TOKEN|>",
                        _ => continue,
                    };
                    write!(out, "<|START_OF_TURN_TOKEN|>{tok}")?;
                    write_trimmed(out, m)?;
                    out.write_str("<|END_OF_TURN_TOKEN|>")?;
                }
                ass(out, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
            }
            Llama3 | Llama4 => {
                let (hs, he, eot) = if *self == Llama3 {
                    ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
                } else {
                    ("<|header_start|>", "<|header_end|>", "<|eot|>")
                };
                for m in chat {
                    write!(out, "{hs}{}{he}\n\n", m.role)?;
                    write_trimmed(out, m)?;
                    out.write_str(eot)?;
                }
                if add {
                    write!(out, "{hs}assistant{he}\n\n")?;
                }
                Ok(())
            }
            ChatGlm3 => {
                out.write_str("[gMASK]sop")?;
                for m in chat {
                    write!(out, "<|{}|>\n {}", m.role, Text(m))?;
                }
                ass(out, "<|assistant|>")
            }
            ChatGlm4 | GlmEdge => {
                if *self == ChatGlm4 {
                    out.write_str("[gMASK]<sop>")?;
                }
                for m in chat {
                    write!(out, "<|{}|>\n{}", m.role, Text(m))?;
                }
                ass(
                    out,
                    if *self == ChatGlm4 {
                        "<|assistant|>\n"
                    } else {
                        "<|assistant|>"
                    },
                )
            }
            MiniCpm => {
                for m in chat {
                    if m.role == "user" {
                        out.write_str("<用户>")?;
                        write_trimmed(out, m)?;
                        out.write_str("<AI>")?;
                    } else {
                        write_trimmed(out, m)?;
                    }
                }
                Ok(())
            }
            DeepSeek2 => {
                for m in chat {
                    match m.role {
                        "system" => write!(out, "{}\n\n", Text(m))?,
                        "user" => write!(out, "User: {}\n\n", Text(m))?,
                        "assistant" => write!(out, "Assistant: {}<｜end▁of▁sentence｜>", Text(m))?,
                        _ => {}
                    }
                }
                ass(out, "Assistant:")
            }
            DeepSeek3 => {
                for m in chat {
                    match m.role {
                        "system" => write!(out, "{}\n\n", Text(m))?,
                        "user" => write!(out, "<｜User｜>{}", Text(m))?,
                        "assistant" => {
                            write!(out, "<｜Assistant｜>{}<｜end▁of▁sentence｜>", Text(m))?
                        }
                        _ => {}
                    }
                }
                ass(out, "<｜Assistant｜>")
            }
            DeepSeekOcr => {
                for m in chat {
                    write!(out, "{}", Text(m))?;
                }
                Ok(())
            }
            Exaone3 | Exaone4 => {
                for m in chat {
                    let (open, close) = match m.role {
                        "system" => ("[|system|]", "[|endofturn|]\n"),
                        "user" => ("[|user|]", "\n"),
                        "assistant" => ("[|assistant|]", "[|endofturn|]\n"),
                        "tool" if *self == Exaone4 => ("[|tool|]", "[|endofturn|]\n"),
                        _ => continue,
                    };
                    out.write_str(open)?;
                    write_trimmed(out, m)?;
                    out.write_str(close)?;
                }
                ass(out, "[|assistant|]")
            }
            ExaoneMoe => {
                for m in chat {
                    let open = match m.role {
                        "system" => "<|system|>\n",
                        "user" => "<|user|>\n",
                        "assistant" => "<|assistant|>\n",
                        "tool" => "<|tool|>\n",
                        _ => continue,
                    };
                    out.write_str(open)?;
                    write_trimmed(out, m)?;
                    out.write_str("<|endofturn|>\n")?;
                }
                ass(out, "<|assistant|>\n")
            }
            RwkvWorld => {
                for (i, m) in chat.iter().enumerate() {
                    let open = match m.role {
                        "system" => "System: ",
                        "user" => "User: ",
                        "assistant" => "Assistant: ",
                        _ => continue,
                    };
                    out.write_str(open)?;
                    write_trimmed(out, m)?;
                    out.write_str("\n\n")?;
                    if m.role == "user" && i + 1 == chat.len() {
                        out.write_str("Assistant:")?;
                    }
                }
                Ok(())
            }
            Granite3 | Granite40 | Granite41 => {
                for m in chat {
                    if m.role == "assistant_tool_call" {
                        if *self == Granite3 {
                            out.write_str(
                                "<|start_of_role|>assistant_tool_call<|end_of_role|><|tool_call|>",
                            )?;
                        } else {
                            out.write_str(
                                "<|start_of_role|>assistant<|end_of_role|><|tool_call|>",
                            )?;
                        }
                    } else {
                        write!(out, "<|start_of_role|>{}<|end_of_role|>", m.role)?;
                    }
                    writeln!(out, "{}<|end_of_text|>", Text(m))?;
                }
                ass(out, "<|start_of_role|>assistant<|end_of_role|>")
            }
            GigaChat => {
                let sys = chat.first().is_some_and(|m| m.role == "system");
                out.write_str("<s>")?;
                if sys {
                    write!(out, "{}<|message_sep|>", Text(&chat[0]))?;
                }
                for m in &chat[usize::from(sys)..] {
                    match m.role {
                        "user" => write!(
                            out,
                            "user<|role_sep|>{}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>",
                            Text(m)
                        )?,
                        "assistant" => {
                            write!(out, "assistant<|role_sep|>{}<|message_sep|>", Text(m))?
                        }
                        _ => {}
                    }
                }
                ass(out, "assistant<|role_sep|>")
            }
            Megrez => {
                for m in chat {
                    write!(
                        out,
                        "<|role_start|>{}<|role_end|>{}<|turn_end|>",
                        m.role,
                        Text(m)
                    )?;
                }
                ass(out, "<|role_start|>assistant<|role_end|>")
            }
            Yandex => {
                for m in chat {
                    match m.role {
                        "user" => write!(out, " Пользователь: {}\n\n", Text(m))?,
                        "assistant" => write!(out, " Ассистент: {}\n\n", Text(m))?,
                        _ => {}
                    }
                }
                ass(out, " Ассистент:[SEP]")
            }
            Bailing | BailingThink | Bailing2 => {
                if *self == Bailing2 && chat.first().is_none_or(|m| m.role != "system") {
                    out.write_str("<role>SYSTEM</role>detailed thinking off<|role_end|>")?;
                }
                for m in chat {
                    out.write_str("<role>")?;
                    if m.role == "user" {
                        out.write_str("HUMAN")?;
                    } else {
                        for c in m.role.chars() {
                            out.write_char(c.to_ascii_uppercase())?;
                        }
                    }
                    write!(out, "</role>{}", Text(m))?;
                    if *self == Bailing2 {
                        out.write_str("<|role_end|>")?;
                    }
                }
                ass(out, "<role>ASSISTANT</role>")?;
                if *self == BailingThink {
                    ass(out, "<think>")?;
                }
                Ok(())
            }
            SmolVlm => {
                out.write_str("<|im_start|>")?;
                for m in chat {
                    match m.role {
                        "system" => write!(out, "{}\n\n", Text(m))?,
                        "user" => writeln!(out, "User: {}<end_of_utterance>", Text(m))?,
                        _ => writeln!(out, "Assistant: {}<end_of_utterance>", Text(m))?,
                    }
                }
                ass(out, "Assistant:")
            }
            Dots1 => {
                for m in chat {
                    match m.role {
                        "system" => write!(out, "<|system|>{}<|endofsystem|>", Text(m))?,
                        "user" => write!(out, "<|userprompt|>{}<|endofuserprompt|>", Text(m))?,
                        _ => write!(out, "<|response|>{}<|endofresponse|>", Text(m))?,
                    }
                }
                ass(out, "<|response|>")
            }
            HunyuanMoe => {
                for m in chat {
                    match m.role {
                        "system" => write!(out, "<|startoftext|>{}<|extra_4|>", Text(m))?,
                        "assistant" => write!(out, "{}<|eos|>", Text(m))?,
                        _ => write!(out, "<|startoftext|>{}<|extra_0|>", Text(m))?,
                    }
                }
                Ok(())
            }
            OpenAiMoe => {
                for m in chat {
                    write!(out, "<|start|>{}<|message|>{}", m.role, Text(m))?;
                    out.write_str(if m.role == "assistant" {
                        "<|return|>"
                    } else {
                        "<|end|>"
                    })?;
                }
                ass(out, "<|start|>assistant")
            }
            HunyuanDense => {
                for (i, m) in chat.iter().enumerate() {
                    if i == 0 && m.role == "system" {
                        write!(out, "{}<｜hy_place▁holder▁no▁3｜>", Text(m))?;
                    }
                    match m.role {
                        "assistant" => write!(
                            out,
                            "<｜hy_Assistant｜>{}<｜hy_place▁holder▁no▁2｜>",
                            Text(m)
                        )?,
                        "user" => write!(out, "<｜hy_User｜>{}<｜hy_Assistant｜>", Text(m))?,
                        _ => {}
                    }
                }
                Ok(())
            }
            HunyuanVl => {
                out.write_str("<｜hy_begin▁of▁sentence｜>")?;
                for (i, m) in chat.iter().enumerate() {
                    if i == 0 && m.role == "system" {
                        write!(out, "{}<｜hy_place▁holder▁no▁3｜>", Text(m))?;
                        continue;
                    }
                    match m.role {
                        "user" => write!(out, "{}<｜hy_User｜>", Text(m))?,
                        "assistant" => write!(out, "{}<｜hy_Assistant｜>", Text(m))?,
                        _ => {}
                    }
                }
                Ok(())
            }
            KimiK2 => {
                for m in chat {
                    out.write_str(match m.role {
                        "system" => "<|im_system|>system<|im_middle|>",
                        "user" => "<|im_user|>user<|im_middle|>",
                        "assistant" => "<|im_assistant|>assistant<|im_middle|>",
                        "tool" => "<|im_system|>tool<|im_middle|>",
                        _ => "",
                    })?;
                    write!(out, "{}<|im_end|>", Text(m))?;
                }
                ass(out, "<|im_assistant|>assistant<|im_middle|>")
            }
            SeedOss => {
                for m in chat {
                    writeln!(out, "<seed:bos>{}", m.role)?;
                    if m.role == "assistant" {
                        write_trimmed(out, m)?;
                    } else {
                        write!(out, "{}", Text(m))?;
                    }
                    out.write_str("<seed:eos>")?;
                }
                ass(out, "<seed:bos>assistant\n")
            }
            Grok2 => {
                for m in chat {
                    match m.role {
                        "system" | "user" => {
                            out.write_str(if m.role == "system" {
                                "System: "
                            } else {
                                "Human: "
                            })?;
                            write_trimmed(out, m)?;
                            out.write_str("<|separator|>\n\n")?;
                        }
                        "assistant" => write!(out, "Assistant: {}<|separator|>\n\n", Text(m))?,
                        _ => {}
                    }
                }
                ass(out, "Assistant:")
            }
            PanguEmbed => {
                for (i, m) in chat.iter().enumerate() {
                    if i == 0 && m.role != "system" {
                        out.write_str("[unused9]系统：[unused10]")?;
                    }
                    let who = match m.role {
                        "system" => "系统",
                        "user" => "用户",
                        "assistant" => "助手",
                        "tool" => "工具",
                        "function" => "方法",
                        _ => continue,
                    };
                    write!(out, "[unused9]{who}：{}[unused10]", Text(m))?;
                }
                ass(out, "[unused9]助手：")
            }
            SolarOpen => {
                for m in chat {
                    write!(out, "<|begin|>{}<|content|>{}<|end|>", m.role, Text(m))?;
                }
                ass(out, "<|begin|>assistant")
            }
        }
    }
}

/// A `Write` that only notes whether anything non-empty was written.
struct NonEmpty(bool);

impl Write for NonEmpty {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.0 |= !s.is_empty();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in Named::ALL.iter().filter(|n| **n != Named::Dots1) {
            assert_eq!(Named::from_name(n.name()), Some(*n));
            assert_eq!(Named::detect(n.name()), Some(*n));
        }
        assert_eq!(Named::from_name("dots1"), None);
        assert_eq!(Named::detect("hello"), None);
    }

    #[test]
    fn falls_back_on_architecture_only_without_template() {
        assert_eq!(Named::from_metadata(None, Some("gemma3")), Ok(Named::Gemma));
        assert_eq!(
            Named::from_metadata(None, Some("llama")),
            Err(ChatError::NoTemplate)
        );
        assert_eq!(
            Named::from_metadata(Some("<|im_start|>"), Some("gemma3")),
            Ok(Named::ChatMl)
        );
        assert_eq!(
            Named::from_metadata(Some("{{ x }}"), None),
            Err(ChatError::UnsupportedTemplate)
        );
    }

    #[test]
    fn full_output_is_an_error() {
        let mut s = heapless::String::<8>::new();
        let m = [ChatMessage::new("user", "hello there")];
        assert_eq!(Named::Gemma.render(&m, true, &mut s), Err(ChatError::Write));
    }

    #[test]
    fn trims_joined_parts() {
        let mut s = heapless::String::<64>::new();
        let m = [ChatMessage::parts("user", &["  a ", " b  "])];
        Named::Llama3.render(&m, false, &mut s).unwrap();
        assert_eq!(
            s.as_str(),
            "<|start_header_id|>user<|end_header_id|>\n\na \n b<|eot_id|>"
        );
    }
}
