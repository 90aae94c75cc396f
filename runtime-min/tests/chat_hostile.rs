//! Nothing a template or a message contains can panic or hang the interpreter: hostile
//! templates end in a typed error within the fixed limits.
use pinch_runtime_min::chat::jinja::{self, JinjaError, Vars};
use pinch_runtime_min::chat::{ChatError, ChatMessage, Kind, Named, Source, Template};

fn render(t: &str, msgs: &[ChatMessage<'_>], buf: &mut [u8]) -> Result<usize, JinjaError> {
    let vars = Vars {
        messages: msgs,
        add_generation_prompt: true,
        bos_token: "<s>",
        eos_token: "</s>",
        tools: None,
    };
    jinja::render(t, &vars, buf)
}

const CONV: [ChatMessage<'static>; 3] = [
    ChatMessage::new("system", "sys é"),
    ChatMessage::new("user", "日本語 {{ not a tag }} {% if %}"),
    ChatMessage::new("assistant", "\u{0}\u{7f}\u{10ffff}"),
];

fn err(t: &str) -> JinjaError {
    let mut buf = vec![0u8; 4096];
    render(t, &CONV, &mut buf).expect_err(t)
}

#[test]
fn deep_nesting_is_too_complex() {
    let ifs = "{% if true %}".repeat(2000) + &"{% endif %}".repeat(2000);
    assert!(matches!(err(&ifs), JinjaError::TooComplex { .. }));
    for (open, close) in [
        ("(", ")"),
        ("[", "]"),
        ("not ", ""),
        ("- ", ""),
        ("{'a': ", "}"),
    ] {
        let e = format!("{{{{ {}1{} }}}}", open.repeat(5000), close.repeat(5000));
        assert!(matches!(err(&e), JinjaError::TooComplex { .. }), "{open}");
    }
    let fors = "{% for x in messages %}".repeat(100) + &"{% endfor %}".repeat(100);
    assert!(matches!(err(&fors), JinjaError::TooComplex { .. }));
}

#[test]
fn huge_loops_stop_at_the_work_limit() {
    for t in [
        "{% for i in range(4000000000) %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% for i in range(-5, 999999999999) %}{% set x = i %}{% endfor %}",
    ] {
        assert!(matches!(err(t), JinjaError::TooComplex { .. }), "{t}");
    }
    assert!(matches!(
        err("{{ range(99999999999999) }}"),
        JinjaError::TooComplex { .. }
    ));
    assert!(matches!(
        err("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
        JinjaError::TooComplex { .. }
    ));
}

#[test]
fn growing_strings_fill_the_buffer() {
    let t = "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}";
    assert_eq!(err(t), JinjaError::BufferFull);
    let mut small = [0u8; 10];
    assert_eq!(
        render("{{ messages[1].content }}", &CONV, &mut small),
        Err(JinjaError::BufferFull)
    );
    assert_eq!(render("", &CONV, &mut []), Ok(0));
    assert_eq!(render("x", &CONV, &mut []), Err(JinjaError::BufferFull));
}

#[test]
fn arithmetic_errors_are_typed() {
    for t in [
        "{{ 9223372036854775807 + 1 }}",
        "{{ -9223372036854775807 - 2 }}",
        "{{ 3037000500 * 3037000500 }}",
        "{{ 1 // 0 }}",
        "{{ 1 % 0 }}",
        "{{ 'a' + 1 }}",
        "{{ messages + 'x' }}",
        "{{ 'a' - 'b' }}",
        "{{ range(1, 2, 0) }}",
        "{{ messages[::0] }}",
        "{{ 'abc'[::0] }}",
        "{{ undefined_function(1) }}",
        "{% set x.y = 1 %}",
        "{{ messages < 1 }}",
    ] {
        assert!(
            matches!(err(t), JinjaError::Type { .. }),
            "{t}: {:?}",
            err(t)
        );
    }
    assert!(matches!(
        err("{{ 2 ** 99 }}"),
        JinjaError::Unsupported { .. }
    ));
    assert!(matches!(
        err("{{ 99999999999999999999 }}"),
        JinjaError::Unsupported { .. }
    ));
    assert!(matches!(err("{{ 1 / 2 }}"), JinjaError::Unsupported { .. }));
    assert!(matches!(err("{{ 1.5 }}"), JinjaError::Unsupported { .. }));
}

#[test]
fn broken_syntax_is_a_syntax_error() {
    for t in [
        "{{",
        "{{ x",
        "{%",
        "{% if x %}",
        "{% if x %}{% else %}",
        "{% for %}",
        "{% for x %}",
        "{% for x in y %}",
        "{% endif %}",
        "{% endfor %}",
        "{# open",
        "{{ 'open }}",
        "{{ (1 }}",
        "{{ [1, 2 }}",
        "{{ x[ }}",
        "{{ x. }}",
        "{% set %}",
        "{% set x %}",
        "{% macro %}",
        "{{ ) }}",
        "{{ 1 2 }}",
        "{% break %}",
        "{% if x %}{% endfor %}",
        "{{ ? }}",
        "{{ x[] }}",
    ] {
        assert!(
            matches!(err(t), JinjaError::Syntax { .. }),
            "{t}: {:?}",
            err(t)
        );
    }
    assert!(matches!(
        err("{% raw %}x{% endraw %}"),
        JinjaError::Unsupported { .. }
    ));
    assert!(matches!(
        err("{% include 'x' %}"),
        JinjaError::Unsupported { .. }
    ));
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

const SOUP: &[&str] = &[
    "{%",
    "%}",
    "{{",
    "}}",
    "{#",
    "#}",
    "-",
    "+",
    " ",
    "\n",
    "\t",
    "if ",
    " for ",
    " in ",
    "set ",
    "endif",
    "endfor",
    "else",
    "elif ",
    "macro ",
    "endmacro",
    "endset",
    "break",
    "continue",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "'",
    "\"",
    "\\",
    "x",
    "y",
    "messages",
    "loop",
    "loop.index0",
    ".content",
    ".role",
    "['role']",
    "[0]",
    "[-1]",
    "[1:]",
    "[::-1]",
    "ns",
    "namespace(a=1)",
    "ns.a",
    "range(",
    "9999999",
    "0",
    "-1",
    "|",
    "trim",
    "tojson",
    "length",
    "join",
    "default(",
    "selectattr(",
    "items()",
    ".split(",
    ".strip()",
    ".",
    ":",
    ",",
    "=",
    "==",
    "~",
    "*",
    "**",
    "//",
    "%",
    "not ",
    " and ",
    " or ",
    " is ",
    "defined",
    "none",
    "string",
    "raise_exception(",
    "é",
    "日本",
    "\u{0}",
    "\u{10ffff}",
    " if ",
    " else ",
    "true",
    "add_generation_prompt",
    "bos_token",
    "1.5",
    "{'k': 1}",
    "generation",
];

#[test]
fn random_templates_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut buf = vec![0u8; 2048];
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..30_000 {
        let n = 1 + rng.next() % 40;
        let t: String = (0..n).map(|_| rng.pick(SOUP)).collect();
        let size = [0, 1, 7, 64, 2048][(rng.next() % 5) as usize];
        match render(&t, &CONV, &mut buf[..size]) {
            Ok(len) => {
                assert!(len <= size);
                ok += 1;
            }
            Err(_) => failed += 1,
        }
    }
    // Both outcomes occur: the generator reaches real rendering, not only syntax errors.
    assert!(ok > 1000 && failed > 1000, "ok {ok}, failed {failed}");
}

#[test]
fn hostile_messages_render_verbatim() {
    let evil = "{{ raise_exception('x') }}{% for i in range(999999999) %}";
    let parts = [evil, "é"];
    let msgs = [
        ChatMessage::new("user", evil),
        ChatMessage::parts("user", &parts),
    ];
    let mut buf = vec![0u8; 4096];
    let t = "{% for m in messages %}{{ m.content if m.content is string else m.content|map(attribute='text')|join }}{% endfor %}";
    let n = render(t, &msgs, &mut buf).unwrap();
    assert_eq!(
        std::str::from_utf8(&buf[..n]).unwrap(),
        format!("{evil}{evil}é")
    );
    for n in Named::ALL {
        let mut s = String::new();
        n.render(&msgs, true, &mut s).unwrap();
    }
}

#[test]
fn select_prefers_override_then_jinja_then_detected_then_default() {
    let qwen = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}";
    let t = Template::choose(Some(qwen), None, None, "", "").unwrap();
    assert_eq!(
        (t.kind, t.source, t.named),
        (Kind::Jinja(qwen), Source::GgufJinja, Named::ChatMl)
    );
    // The interpreter cannot run it (a filter it lacks): the detected format.
    let odd = "{{ messages|wordcount }}<start_of_turn>";
    let t = Template::choose(Some(odd), None, None, "", "").unwrap();
    assert_eq!(
        (t.kind, t.source),
        (Kind::Named(Named::Gemma), Source::Detected)
    );
    let t = Template::choose(Some("{{ x|wordcount }}"), Some("gemma3"), None, "", "").unwrap();
    assert_eq!(
        (t.kind, t.source),
        (Kind::Named(Named::Gemma), Source::Default)
    );
    let t = Template::choose(None, Some("llama"), None, "", "").unwrap();
    assert_eq!(
        (t.kind, t.source),
        (Kind::Named(Named::ChatMl), Source::Default)
    );
    let t = Template::choose(Some(qwen), None, Some("llama3"), "", "").unwrap();
    assert_eq!(
        (t.kind, t.source),
        (Kind::Named(Named::Llama3), Source::Override)
    );
    let t = Template::choose(None, None, Some("{{ bos_token }}x"), "<s>", "").unwrap();
    assert_eq!(t.source, Source::Override);
    let mut buf = [0u8; 64];
    let n = t.render(&CONV, true, &mut buf).unwrap();
    assert_eq!(t.strip_bos(std::str::from_utf8(&buf[..n]).unwrap()), "x");
    assert_eq!(
        Template::choose(None, None, Some("nosuch"), "", ""),
        Err(ChatError::UnknownName)
    );
    assert_eq!(
        Template::choose(None, None, Some("{{ x|wordcount }}"), "", ""),
        Err(ChatError::UnsupportedTemplate)
    );
}
