//! Chat templates: a conversation rendered as the prompt text a chat model expects.
//!
//! Two ways, as in llama.cpp:
//! - [`jinja`]: the model's own Jinja template (`tokenizer.chat_template`), run by a small
//!   interpreter without allocation. This is what llama-server does by default (`--jinja`).
//! - [`named`]: llama.cpp's built-in formats (`llm_chat_apply_template`), fixed code per
//!   format, chosen by name or detected from marker strings in the Jinja text.
//!
//! [`Template::select`] picks one: `--chat-template NAME|FILE` first; else the GGUF's
//! Jinja template if the interpreter renders it; else the format detected from it; else
//! one implied by the architecture, else ChatML. [`Template::source`] says which, for the
//! line `pinch chat` and `pinch serve` print.
//!
//! The rendered text contains control-token text, so tokenize it with `parse_special`.
//! A Jinja template often writes `bos_token` itself; [`Template::strip_bos`] drops it when
//! the tokenizer adds BOS (llama.cpp does the same).
pub mod jinja;
pub mod named;

pub use named::Named;

/// The format type of the first chat API (kept for existing callers): the built-in
/// formats.
pub type ChatTemplate = Named;

/// A message's content: text, or OpenAI-style text parts (`[{type: text, text}]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content<'m> {
    Text(&'m str),
    Parts(&'m [&'m str]),
}

impl core::fmt::Display for Content<'_> {
    /// The text; parts joined with `\n` (as llama.cpp's server joins them).
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Content::Text(t) => f.write_str(t),
            Content::Parts(p) => {
                for (i, t) in p.iter().enumerate() {
                    if i > 0 && !t.is_empty() {
                        f.write_str("\n")?;
                    }
                    f.write_str(t)?;
                }
                Ok(())
            }
        }
    }
}

/// One message of a conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatMessage<'m> {
    /// `system`, `user` or `assistant` (other roles are passed on as given).
    pub role: &'m str,
    pub content: Content<'m>,
}

impl<'m> ChatMessage<'m> {
    pub const fn new(role: &'m str, content: &'m str) -> ChatMessage<'m> {
        ChatMessage {
            role,
            content: Content::Text(content),
        }
    }

    /// A message whose content is a list of text parts.
    pub const fn parts(role: &'m str, parts: &'m [&'m str]) -> ChatMessage<'m> {
        ChatMessage {
            role,
            content: Content::Parts(parts),
        }
    }
}

/// Why no prompt could be rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChatError {
    /// The template matches no format llama.cpp knows, and the interpreter cannot run it.
    UnsupportedTemplate,
    /// The model has no `tokenizer.chat_template` and its architecture implies none.
    NoTemplate,
    /// `--chat-template` names no built-in format (see [`Named::ALL`]).
    UnknownName,
    /// The Jinja template failed (syntax, unsupported feature, `raise_exception`, limits).
    Jinja(jinja::JinjaError),
    /// The output sink refused the text (e.g. a fixed-size buffer is full).
    Write,
}

impl core::fmt::Display for ChatError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ChatError::UnsupportedTemplate => write!(f, "chat template format is not supported"),
            ChatError::NoTemplate => write!(f, "model has no chat template"),
            ChatError::UnknownName => {
                f.write_str("unknown chat template name; known: ")?;
                for (i, n) in Named::ALL
                    .iter()
                    .filter(|n| **n != Named::Dots1)
                    .enumerate()
                {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(n.name())?;
                }
                Ok(())
            }
            ChatError::Jinja(e) => write!(f, "chat template: {e}"),
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

impl From<jinja::JinjaError> for ChatError {
    fn from(e: jinja::JinjaError) -> Self {
        match e {
            jinja::JinjaError::BufferFull => ChatError::Write,
            e => ChatError::Jinja(e),
        }
    }
}

/// Where the selected template came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `--chat-template NAME`, or a Jinja text given with `--chat-template(-file)`.
    Override,
    /// The GGUF's `tokenizer.chat_template`, run by the interpreter.
    GgufJinja,
    /// The built-in format detected from the GGUF's template (the interpreter could not
    /// run it).
    Detected,
    /// No usable template: implied by the architecture, or ChatML.
    Default,
}

/// How a prompt is rendered: a Jinja text or a built-in format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind<'t> {
    Jinja(&'t str),
    Named(Named),
}

/// The chat template a model's prompts are rendered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Template<'t> {
    pub kind: Kind<'t>,
    /// The built-in format closest to it (detected from the Jinja text), for its
    /// end-of-turn text.
    pub named: Named,
    pub source: Source,
    pub bos_token: &'t str,
    pub eos_token: &'t str,
}

/// A conversation every chat template should accept; a template that cannot render it
/// is not used.
const PROBE: [ChatMessage<'static>; 4] = [
    ChatMessage::new("system", "s"),
    ChatMessage::new("user", "u"),
    ChatMessage::new("assistant", "a"),
    ChatMessage::new("user", "v"),
];

/// Whether the interpreter renders `text` (on [`PROBE`], with and without its first
/// message: some templates refuse a system role).
fn jinja_works(text: &str, bos: &str, eos: &str) -> bool {
    let mut buf = [0u8; 8192];
    [&PROBE[..], &PROBE[1..]].iter().any(|m| {
        let vars = jinja::Vars {
            messages: m,
            add_generation_prompt: true,
            bos_token: bos,
            eos_token: eos,
            tools: None,
        };
        jinja::render(text, &vars, &mut buf).is_ok()
    })
}

impl<'t> Template<'t> {
    /// Choose the template (see the module doc). `gguf_template`: the model's
    /// `tokenizer.chat_template`; `override_`: the `--chat-template` value (a name or a
    /// Jinja text; the caller reads a file's text); `bos`/`eos`: the texts of the
    /// model's BOS and EOS tokens.
    pub fn choose(
        gguf_template: Option<&'t str>,
        architecture: Option<&str>,
        override_: Option<&'t str>,
        bos_token: &'t str,
        eos_token: &'t str,
    ) -> Result<Template<'t>, ChatError> {
        let make = |kind, named, source| Template {
            kind,
            named,
            source,
            bos_token,
            eos_token,
        };
        if let Some(o) = override_ {
            if let Some(n) = Named::from_name(o) {
                return Ok(make(Kind::Named(n), n, Source::Override));
            }
            if !o.contains("{{") && !o.contains("{%") {
                return Err(ChatError::UnknownName);
            }
            let named = Named::detect(o);
            if jinja_works(o, bos_token, eos_token) {
                return Ok(make(
                    Kind::Jinja(o),
                    named.unwrap_or(Named::ChatMl),
                    Source::Override,
                ));
            }
            return named
                .map(|n| make(Kind::Named(n), n, Source::Override))
                .ok_or(ChatError::UnsupportedTemplate);
        }
        if let Some(t) = gguf_template {
            let named = Named::detect(t);
            if jinja_works(t, bos_token, eos_token) {
                return Ok(make(
                    Kind::Jinja(t),
                    named.unwrap_or(Named::ChatMl),
                    Source::GgufJinja,
                ));
            }
            if let Some(n) = named {
                return Ok(make(Kind::Named(n), n, Source::Detected));
            }
        }
        let n = Named::from_metadata(None, architecture).unwrap_or(Named::ChatMl);
        Ok(make(Kind::Named(n), n, Source::Default))
    }

    /// [`Self::choose`] for a GGUF model: its template, architecture and BOS/EOS texts.
    pub fn select(
        g: &crate::gguf::Gguf<'t>,
        override_: Option<&'t str>,
    ) -> Result<Template<'t>, ChatError> {
        let token = |key: &str| -> &'t str {
            let id = g.get_u32(key);
            let toks = g.get_array("tokenizer.ggml.tokens");
            match (id, toks) {
                (Some(id), Some(t)) => t.str_at(id as usize).unwrap_or(""),
                _ => "",
            }
        };
        Template::choose(
            g.get_str("tokenizer.chat_template"),
            g.architecture(),
            override_,
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
        )
    }

    /// Render `messages` into `out`; returns the prompt's length (`out[..n]`).
    /// `out` is also the Jinja interpreter's scratch space: give it room beyond the
    /// prompt (twice the prompt is plenty for real templates).
    pub fn render(
        &self,
        messages: &[ChatMessage<'_>],
        add_generation_prompt: bool,
        out: &mut [u8],
    ) -> Result<usize, ChatError> {
        self.render_with_tools(messages, add_generation_prompt, None, out)
    }

    /// Whether the template writes the request's tools itself (a Jinja template that
    /// reads `tools`); for the others the caller describes the tools in a message.
    pub fn takes_tools(&self) -> bool {
        matches!(self.kind, Kind::Jinja(t) if t.contains("tools"))
    }

    /// [`Self::render`] with the request's `tools` (their JSON text, a list of
    /// `{"type": "function", "function": {...}}`) bound to the Jinja variable `tools`;
    /// built-in formats ignore them (see [`Self::takes_tools`]). The parsed tools take
    /// room in `out` beside the prompt (about their JSON size).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage<'_>],
        add_generation_prompt: bool,
        tools: Option<&str>,
        out: &mut [u8],
    ) -> Result<usize, ChatError> {
        match self.kind {
            Kind::Jinja(text) => {
                let vars = jinja::Vars {
                    messages,
                    add_generation_prompt,
                    bos_token: self.bos_token,
                    eos_token: self.eos_token,
                    tools,
                };
                Ok(jinja::render(text, &vars, out)?)
            }
            Kind::Named(n) => {
                let mut w = SliceWriter { buf: out, len: 0 };
                n.render(messages, add_generation_prompt, &mut w)?;
                Ok(w.len)
            }
        }
    }

    /// The prompt without a leading BOS text, for a tokenizer that adds BOS itself.
    pub fn strip_bos<'p>(&self, prompt: &'p str) -> &'p str {
        if self.bos_token.is_empty() {
            return prompt;
        }
        prompt.strip_prefix(self.bos_token).unwrap_or(prompt)
    }

    /// Text that ends an assistant turn (a stop string besides the EOG tokens).
    pub fn end_of_turn(&self) -> &'static str {
        self.named.end_of_turn()
    }

    /// What was chosen, for a log line: `jinja (from the GGUF)`, `llama3 (detected)`...
    pub fn describe(&self) -> Describe<'_, 't> {
        Describe(self)
    }
}

/// [`Template::describe`]'s display.
pub struct Describe<'a, 't>(&'a Template<'t>);

impl core::fmt::Display for Describe<'_, '_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let t = self.0;
        let what = match t.source {
            Source::Override => "from --chat-template",
            Source::GgufJinja => "the GGUF's template",
            Source::Detected => {
                "detected from the GGUF's template, which the interpreter cannot run"
            }
            Source::Default => "default: the GGUF has no usable template",
        };
        match t.kind {
            Kind::Jinja(_) => write!(f, "Jinja ({what})"),
            Kind::Named(n) => write!(f, "{} ({what})", n.name()),
        }
    }
}

/// `core::fmt::Write` into a byte slice; an error when full.
struct SliceWriter<'b> {
    buf: &'b mut [u8],
    len: usize,
}

impl core::fmt::Write for SliceWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let b = s.as_bytes();
        let end = self.len + b.len();
        if end > self.buf.len() {
            return Err(core::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(b);
        self.len = end;
        Ok(())
    }
}
