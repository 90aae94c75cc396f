//! Parser and matcher tests: grammars from llama.cpp's README and tests, errors by
//! variant, and random/hostile text that must never panic or hang.
use super::*;

/// A store and matcher buffers on the heap-free stack of the test.
struct Bufs {
    elems: [u32; 4096],
    sets: [u32; 4096],
    rules: [u32; 512],
    work: [u32; 2048],
    nodes: [u32; 8192],
    spare: [u32; 8192],
    fwd: [u32; 4096],
    tops: [u32; 4096],
}

impl Bufs {
    fn new() -> Box<Bufs> {
        Box::new(Bufs {
            elems: [0; 4096],
            sets: [0; 4096],
            rules: [0; 512],
            work: [0; 2048],
            nodes: [0; 8192],
            spare: [0; 8192],
            fwd: [0; 4096],
            tops: [0; 4096],
        })
    }

    /// The store and the matcher's buffers.
    fn parts(&mut self) -> (Store<'_>, MatcherBufs<'_>) {
        let store = Store {
            elems: &mut self.elems,
            sets: &mut self.sets,
            rules: &mut self.rules,
            work: &mut self.work,
        };
        let mb = MatcherBufs {
            nodes: &mut self.nodes,
            spare: &mut self.spare,
            fwd: &mut self.fwd,
            tops: &mut self.tops,
        };
        (store, mb)
    }
}

extern crate std;
use std::boxed::Box;

fn with<R>(src: &str, f: impl FnOnce(Result<&mut Matcher<'_, '_>, GrammarError>) -> R) -> R {
    let mut b = Bufs::new();
    let (mut store, mb) = b.parts();
    let parsed = match parse(src, &mut store) {
        Ok(p) => p,
        Err(e) => return f(Err(e)),
    };
    let g = parsed.view(&store);
    let mut m = Matcher::new(g, mb).expect("start state fits");
    f(Ok(&mut m))
}

/// Whether `text` is a whole sentence of the grammar, fed in pieces of `step` bytes.
pub(crate) fn accepts(src: &str, text: &str, step: usize) -> bool {
    with(src, |m| {
        let m = m.unwrap();
        for chunk in text.as_bytes().chunks(step.max(1)) {
            if !m.accept(chunk) {
                return false;
            }
        }
        m.can_end()
    })
}

fn err(src: &str) -> GrammarError {
    with(src, |m| match m {
        Err(e) => e,
        Ok(_) => panic!("{src:?} parsed"),
    })
}

#[test]
fn literals_classes_groups_and_repetitions_match_what_they_should() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (r#"root ::= "a"{5,5}"#, &["aaaaa"], &["aaaa", "aaaaaa", ""]),
        (r#"root ::= "ab" | "c""#, &["ab", "c"], &["a", "abc", "b"]),
        (r#"root ::= [a-c]+ "!""#, &["a!", "abcabc!"], &["!", "ad!"]),
        (r#"root ::= [^a-c]*"#, &["", "xyz", "é"], &["a", "xxa"]),
        (
            r#"root ::= ("x" "y"?)* "z""#,
            &["z", "xz", "xyxz"],
            &["yz", "xyy z"],
        ),
        (
            r#"root ::= "a"{2,} "b"{0,2}"#,
            &["aa", "aaab", "aabb"],
            &["a", "aabbb"],
        ),
        (
            r#"root ::= . . "\n""#,
            &["ab\n", "é\u{1F600}\n"],
            &["a\n", "abc\n"],
        ),
        (r#"root ::= "\x41\u00e9\t\\\"""#, &["Aé\t\\\""], &["Ae"]),
        (r#"root ::= [\]\-a]"#, &["]", "-", "a"], &["b"]),
        (
            "root ::= item (\",\" ws item)*\nitem ::= [0-9]+\nws ::= \" \"?  # comment\n",
            &["1", "12, 3,4"],
            &["1,", ",1"],
        ),
        ("root ::= (\n  \"a\"\n  | \"b\"\n)", &["a", "b"], &["ab"]),
        (
            "root ::= x\nx ::= \"(\" x \")\" | \"\"",
            &["", "()", "((()))"],
            &["(()", ")"],
        ),
    ];
    for (g, good, bad) in cases {
        for t in good.iter() {
            for step in [1, 2, 64] {
                assert!(
                    accepts(g, t, step),
                    "{g:?} should accept {t:?} (step {step})"
                );
            }
        }
        for t in bad.iter() {
            assert!(!accepts(g, t, 1), "{g:?} should refuse {t:?}");
        }
    }
}

#[test]
fn a_partial_character_keeps_only_stacks_it_can_complete() {
    // "é" is C3 A9: after C3, only [à-ÿ] can still match; "a" cannot.
    with(r#"root ::= [à-ÿ] | "a""#, |m| {
        let m = m.unwrap();
        assert!(m.allows(&[0xC3]));
        assert!(!m.allows(&[0xE2]));
        assert!(m.accept(&[0xC3]));
        assert!(!m.can_end());
        assert!(m.accept(&[0xA9]));
        assert!(m.can_end() && m.only_end());
    });
}

#[test]
fn only_valid_utf8_gets_through_any_character_class() {
    // After "aaaa" only "a" may follow: no lead byte can start it.
    with(r#"root ::= "a"{5,5}"#, |m| {
        let m = m.unwrap();
        assert!(m.accept(b"aaaa"));
        for b in 0x80..=0xFFu8 {
            assert!(!m.allows(&[b]), "byte {b:#x}");
        }
        assert!(m.allows(b"a"));
    });
    // Any character: overlong forms, surrogates and bytes past U+10FFFF are refused.
    with("root ::= .*", |m| {
        let m = m.unwrap();
        for bad in [
            &[0xC0u8, 0x80][..],
            &[0xE0, 0x80],
            &[0xED, 0xA0, 0x80],
            &[0xF4, 0x90],
            &[0xF5],
            &[0x80],
        ] {
            assert!(!m.allows(bad), "{bad:x?}");
        }
        for good in ["é", "€", "\u{10FFFF}", "😀"] {
            assert!(m.allows(good.as_bytes()), "{good:?}");
        }
    });
}

#[test]
fn right_recursion_and_long_input_run_in_bounded_space() {
    let long = "a".repeat(20_000);
    assert!(accepts("root ::= \"a\" root | \"\"", &long, 7));
    assert!(accepts("root ::= \"a\"*", &long, 64));
    assert!(accepts("root ::= (\"a\" | \"a\")*", &long, 3));
}

#[test]
fn errors_name_the_position_or_rule_at_fault() {
    assert!(matches!(
        err("root ::= this is (not valid GBNF"),
        GrammarError::Syntax { .. }
    ));
    match err("root ::= foo\nfoo ::= bar") {
        GrammarError::Undefined { rule, pos } => assert_eq!((rule.as_str(), pos), ("bar", 21)),
        e => panic!("{e:?}"),
    }
    assert_eq!(err("a ::= \"x\""), GrammarError::NoRoot);
    assert!(matches!(
        err("root ::= \"a\"\nroot ::= \"b\""),
        GrammarError::Duplicate { .. }
    ));
    match err("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]") {
        GrammarError::LeftRecursion { rule } => assert_eq!(rule.as_str(), "expr"),
        e => panic!("{e:?}"),
    }
    match err("root ::= a\na ::= b? a \"x\"\nb ::= \"y\"") {
        GrammarError::LeftRecursion { rule } => assert_eq!(rule.as_str(), "a"),
        e => panic!("{e:?}"),
    }
    for (src, at) in [
        ("root ::= \"abc", 13),
        ("root ::= [a-", 12),
        ("root ::= \"\\q\"", 11),
        ("root ::= *", 9),
        ("root ::= \"a\"{3,1}", 16),
        ("root = \"a\"", 5),
        ("root ::= (\"a\"", 13),
        ("root ::= \"a\") ", 12),
        ("root ::= <|tok|>", 9),
        ("root ::= [z-a]", 13),
        ("root ::= \"a\"{2000}", 17),
    ] {
        match err(src) {
            GrammarError::Syntax { pos, .. } => assert_eq!(pos, at, "{src:?}"),
            e => panic!("{src:?}: {e:?}"),
        }
    }
    let deep = std::format!("root ::= {}\"a\"{}", "(".repeat(100), ")".repeat(100));
    assert!(matches!(err(&deep), GrammarError::Syntax { .. }));
    let big = std::format!("root ::= \"{}\"", "x".repeat(5000));
    assert_eq!(err(&big), GrammarError::TooLarge { what: "elements" });
}

/// Random and hostile grammar texts: every one parses or gives an error, and a
/// grammar that parses runs on random bytes without panicking.
#[test]
fn random_and_hostile_grammars_never_panic() {
    let pieces: &[&str] = &[
        "root",
        " ::= ",
        "::=",
        "\"",
        "\"a\"",
        "[",
        "]",
        "^",
        "-",
        "(",
        ")",
        "|",
        "*",
        "+",
        "?",
        "{",
        "}",
        "{2,3}",
        ",",
        "\n",
        " ",
        "#c\n",
        "x",
        "\\",
        "\\x4",
        "\\u00e9",
        "é",
        ".",
        "<",
        "0",
        "9",
        "a-z",
        "root ::= ",
        "x ::= ",
        "\r\n",
        "\t",
    ];
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut parsed = 0;
    for _ in 0..4000 {
        let mut s = std::string::String::new();
        if rnd(2) == 0 {
            s.push_str("root ::= ");
        }
        for _ in 0..rnd(24) {
            s.push_str(pieces[rnd(pieces.len())]);
        }
        let text: std::vec::Vec<u8> = (0..rnd(12)).map(|_| rnd(256) as u8).collect();
        with(&s, |m| {
            if let Ok(m) = m {
                parsed += 1;
                for c in &text {
                    let _ = m.allows(core::slice::from_ref(c));
                    let _ = m.accept(core::slice::from_ref(c));
                }
            }
        });
    }
    assert!(parsed > 100, "only {parsed} random grammars parsed");
}

/// A strict JSON validator for the tests (RFC 8259 values).
fn json_value(b: &[u8], i: &mut usize, depth: usize) -> bool {
    let ws = |i: &mut usize| {
        while *i < b.len() && matches!(b[*i], b' ' | b'\t' | b'\n' | b'\r') {
            *i += 1;
        }
    };
    ws(i);
    if depth > 64 || *i >= b.len() {
        return false;
    }
    let ok = match b[*i] {
        b'{' | b'[' => {
            let close = if b[*i] == b'{' { b'}' } else { b']' };
            let obj = close == b'}';
            *i += 1;
            ws(i);
            if b.get(*i) == Some(&close) {
                *i += 1;
                return true;
            }
            loop {
                if obj {
                    ws(i);
                    if b.get(*i) != Some(&b'"') || !json_value(b, i, depth + 1) {
                        return false;
                    }
                    ws(i);
                    if b.get(*i) != Some(&b':') {
                        return false;
                    }
                    *i += 1;
                }
                if !json_value(b, i, depth + 1) {
                    return false;
                }
                ws(i);
                match b.get(*i) {
                    Some(&b',') => *i += 1,
                    Some(&c) if c == close => {
                        *i += 1;
                        break true;
                    }
                    _ => return false,
                }
            }
        }
        b'"' => {
            *i += 1;
            loop {
                match b.get(*i) {
                    None => return false,
                    Some(b'"') => {
                        *i += 1;
                        break true;
                    }
                    Some(b'\\') => match b.get(*i + 1) {
                        Some(b'u') => {
                            if !b
                                .get(*i + 2..*i + 6)
                                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
                            {
                                return false;
                            }
                            *i += 6;
                        }
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => *i += 2,
                        _ => return false,
                    },
                    Some(&c) if c < 0x20 => return false,
                    Some(_) => *i += 1,
                }
            }
        }
        b't' | b'f' | b'n' => {
            let word: &[u8] = match b[*i] {
                b't' => b"true",
                b'f' => b"false",
                _ => b"null",
            };
            let ok = b[*i..].starts_with(word);
            *i += word.len();
            ok
        }
        _ => {
            let s = *i;
            while *i < b.len() && matches!(b[*i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                *i += 1;
            }
            core::str::from_utf8(&b[s..*i]).is_ok_and(|t| {
                let t = t.strip_prefix('-').unwrap_or(t);
                !t.is_empty()
                    && t.as_bytes()[0].is_ascii_digit()
                    && !(t.len() > 1 && t.starts_with('0') && t.as_bytes()[1].is_ascii_digit())
                    && t.parse::<f64>().is_ok()
                    && !t.ends_with('.')
            })
        }
    };
    ok
}

fn is_json(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    json_value(b, &mut i, 0) && b[i..].iter().all(|c| c.is_ascii_whitespace())
}

fn schema_gbnf(schema: &str) -> Result<std::string::String, json_schema::SchemaError> {
    let mut s = std::string::String::new();
    json_schema::text_to_gbnf(schema, &mut s)?;
    Ok(s)
}

/// Random walks through a grammar: at each step a random character the matcher
/// allows (from a printable alphabet plus a few others), or the end when it may end.
fn random_sentences(gbnf: &str, n: usize, seed: u64, check: &mut dyn FnMut(&str)) {
    let alphabet: std::vec::Vec<char> = (0x20u8..0x7F)
        .map(|c| c as char)
        .chain(['\n', '\t', 'é', '€'])
        .collect();
    let mut seed = seed;
    let mut rnd = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for k in 0..n {
        with(gbnf, |m| {
            let m = m.unwrap_or_else(|e| panic!("{e}\n{gbnf}"));
            let mut text = std::string::String::new();
            for _ in 0..400 {
                if m.can_end() && (m.only_end() || rnd(8) == 0) {
                    break;
                }
                let allowed: std::vec::Vec<char> = alphabet
                    .iter()
                    .copied()
                    .filter(|c| {
                        let mut t = [0u8; 4];
                        m.allows(c.encode_utf8(&mut t).as_bytes())
                    })
                    .collect();
                assert!(!allowed.is_empty(), "walk {k}: stuck after {text:?}");
                let c = allowed[rnd(allowed.len())];
                let mut t = [0u8; 4];
                assert!(m.accept(c.encode_utf8(&mut t).as_bytes()));
                text.push(c);
            }
            if m.can_end() {
                check(&text);
            }
        });
    }
}

#[test]
fn schemas_become_grammars_whose_sentences_are_valid_json() {
    let schemas = [
        r#"{"const": "42"}"#,
        r#"{"items": [{"type": "integer"}]}"#,
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b", 3, null]}, "maxItems": 2}}, "required": ["name"]}"#,
        r#"{"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": ["number", "null"]}}}"#,
        r#"{"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "null"}}]}"#,
        r##"{"$defs": {"node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["next"]}}, "$ref": "#/$defs/node"}"##,
        r#"{"type": "object", "additionalProperties": {"type": "integer"}}"#,
        r#"true"#,
        r#"{}"#,
    ];
    let mut checked = 0;
    for s in schemas {
        let g = schema_gbnf(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        random_sentences(&g, 12, 0xfeed ^ s.len() as u64, &mut |t| {
            assert!(is_json(t), "schema {s}: {t:?} is not JSON");
            checked += 1;
        });
    }
    assert!(checked > 40, "{checked}");
    // What the grammars let through, exactly.
    let g = schema_gbnf(schemas[2]).unwrap();
    assert!(accepts(&g, r#"{"name": "bob", "tags": ["a", 3]}"#, 3));
    assert!(accepts(&g, r#"{"name":"bob","age":-12}"#, 1));
    assert!(!accepts(&g, r#"{"age": 1}"#, 1), "name is required");
    assert!(!accepts(&g, r#"{"name": "bobbby"}"#, 1), "maxLength 5");
    assert!(!accepts(&g, r#"{"name": "b", "tags": ["c"]}"#, 1), "enum");
    assert!(
        !accepts(&g, r#"{"name": "b", "tags": [3, 3, 3]}"#, 1),
        "maxItems"
    );
    let g = schema_gbnf(schemas[0]).unwrap();
    assert!(accepts(&g, "\"42\"", 1) && !accepts(&g, "\"43\"", 1));
    let g = schema_gbnf(schemas[3]).unwrap();
    assert!(accepts(&g, "{}", 1) && accepts(&g, r#"{"b": null}"#, 1));
    assert!(accepts(&g, r#"{"a": true, "b": 1.5e3}"#, 1));
    assert!(!accepts(&g, r#"{"b": 1, "a": true}"#, 1), "declared order");
}

#[test]
fn schemas_pinch_cannot_enforce_are_refused_by_keyword() {
    use json_schema::SchemaError as E;
    for (s, want) in [
        (r#"123"#, E::NotASchema { at: "schema" }),
        (r#"{"type": 123}"#, E::BadType),
        (r#"{"type": "hiccup"}"#, E::BadType),
        (r#"{"type": ["string", "x"]}"#, E::BadType),
        (
            r#"{"type": "string", "pattern": "^a+$"}"#,
            E::Unsupported { keyword: "pattern" },
        ),
        (
            r#"{"type": "integer", "minimum": 3}"#,
            E::Unsupported { keyword: "minimum" },
        ),
        (r#"{"allOf": [{}]}"#, E::Unsupported { keyword: "allOf" }),
        (r#"{"$ref": "https://example.com/s.json"}"#, E::BadRef),
        (r##"{"$ref": "#/$defs/missing"}"##, E::BadRef),
        (
            r#"{"type": "array", "minItems": 3, "maxItems": 1}"#,
            E::NotASchema { at: "maxItems" },
        ),
        (
            r#"{"properties": {"a": 5}}"#,
            E::NotASchema { at: "properties" },
        ),
    ] {
        assert_eq!(schema_gbnf(s).err(), Some(want), "{s}");
    }
}

/// A matcher saved after every byte and resumed over its buffers (as a batched server
/// answer is between steps) accepts and refuses exactly what one kept alive does.
#[test]
fn a_resumed_matcher_goes_on_as_the_one_it_was_saved_from() {
    let src = r#"root ::= "{" ws pair ("," ws pair)* "}"
pair ::= "\"" [a-z]+ "\"" ws ":" ws [0-9]+ ws
ws ::= [ ]*"#;
    let text = br#"{ "ab" : 12, "c":3 }"#;
    let mut b = Bufs::new();
    let (mut store, lent) = b.parts();
    let parsed = parse(src, &mut store).unwrap();
    let g = parsed.view(&store);
    let mut saved = None;
    for (k, &c) in text.iter().enumerate() {
        // The same buffers again at every byte, as a server step borrows them.
        let mb = MatcherBufs {
            nodes: &mut *lent.nodes,
            spare: &mut *lent.spare,
            fwd: &mut *lent.fwd,
            tops: &mut *lent.tops,
        };
        let mut m = match saved {
            None => Matcher::new(g, mb).unwrap(),
            Some(s) => Matcher::resume(g, mb, s).unwrap(),
        };
        // A byte the grammar never takes changes nothing.
        assert!(!m.accept(b"#"), "byte {k}");
        assert!(m.accept(&[c]), "byte {k} ({:?})", c as char);
        assert_eq!(m.can_end(), k + 1 == text.len(), "byte {k}");
        saved = Some(m.save());
    }
    // Each accepted byte swaps the node pools: every other resume finds the committed
    // nodes in the buffer lent as `spare`.
    assert!(accepts(src, core::str::from_utf8(text).unwrap(), 1));
}
