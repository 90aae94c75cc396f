//! The template's text read on demand: where the next tag is, how much whitespace the
//! text around a tag keeps, and the tokens inside a tag.
//!
//! Nothing is stored: the evaluator keeps only byte offsets and reads a loop body's text
//! again on each iteration. Whitespace follows the environment chat templates are
//! rendered in (Hugging Face's and llama-cpp-python's): `trim_blocks` and `lstrip_blocks`
//! on, `{%-`/`-%}` strip all whitespace on their side, `{%+`/`+%}` keep it.
use super::JinjaError;

/// A token inside a `{{ }}` or `{% %}` tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tok<'a> {
    Name(&'a str),
    /// A string literal's text between its quotes, escapes not yet applied.
    Str(&'a str),
    Int(i64),
    /// A floating-point literal (read, but not evaluated: no floats here).
    Float,
    /// Operators and punctuation, longest match first.
    Op(&'static str),
    /// The tag's closing `}}` or `%}` (with its `-`/`+` mark).
    End,
}

const OPS: [&str; 25] = [
    "**", "//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".", ",", ":", "|", "~", "+",
    "-", "*", "/", "%", "<", ">", "=",
];

/// Reads the tokens of one tag from byte offset `pos`.
#[derive(Clone, Copy, Debug)]
pub struct Lexer<'a> {
    pub src: &'a str,
    pub pos: usize,
    /// `b'}'` inside `{{ }}`, `b'%'` inside `{% %}`.
    pub close: u8,
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str, pos: usize, close: u8) -> Lexer<'a> {
        Lexer { src, pos, close }
    }

    fn skip_space(&mut self) {
        let b = self.src.as_bytes();
        while self.pos < b.len() && b[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    /// The length of the closing mark at the current position, if there is one.
    fn closer_len(&self) -> Option<usize> {
        let rest = &self.src.as_bytes()[self.pos..];
        let end = [self.close, b'}'];
        if rest.starts_with(&end) {
            return Some(2);
        }
        if (rest.starts_with(b"-") || rest.starts_with(b"+")) && rest[1..].starts_with(&end) {
            return Some(3);
        }
        None
    }

    /// The next token, moving past it.
    pub fn token(&mut self) -> Result<Tok<'a>, JinjaError> {
        self.skip_space();
        let at = self.pos;
        let b = self.src.as_bytes();
        let Some(&c) = b.get(at) else {
            return Err(JinjaError::Syntax {
                at: at as u32,
                what: "tag not closed",
            });
        };
        if let Some(n) = self.closer_len() {
            self.pos += n;
            return Ok(Tok::End);
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let mut e = at + 1;
            while e < b.len() && (b[e].is_ascii_alphanumeric() || b[e] == b'_') {
                e += 1;
            }
            self.pos = e;
            return Ok(Tok::Name(&self.src[at..e]));
        }
        if c.is_ascii_digit() {
            let mut e = at;
            let mut v: i64 = 0;
            while e < b.len() && (b[e].is_ascii_digit() || b[e] == b'_') {
                if b[e] != b'_' {
                    v = v
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(i64::from(b[e] - b'0')))
                        .ok_or(JinjaError::Unsupported {
                            at: at as u32,
                            what: "integer literal too large",
                        })?;
                }
                e += 1;
            }
            if e + 1 < b.len() && b[e] == b'.' && b[e + 1].is_ascii_digit() {
                e += 1;
                while e < b.len() && (b[e].is_ascii_alphanumeric() || b[e] == b'_') {
                    e += 1;
                }
                self.pos = e;
                return Ok(Tok::Float);
            }
            self.pos = e;
            return Ok(Tok::Int(v));
        }
        if c == b'\'' || c == b'"' {
            let mut e = at + 1;
            while e < b.len() && b[e] != c {
                e += if b[e] == b'\\' { 2 } else { 1 };
            }
            if e >= b.len() {
                return Err(JinjaError::Syntax {
                    at: at as u32,
                    what: "string literal not closed",
                });
            }
            self.pos = e + 1;
            return Ok(Tok::Str(&self.src[at + 1..e]));
        }
        for op in OPS {
            if b[at..].starts_with(op.as_bytes()) {
                self.pos += op.len();
                return Ok(Tok::Op(op));
            }
        }
        Err(JinjaError::Syntax {
            at: at as u32,
            what: "unexpected character in a tag",
        })
    }

    /// The next token without moving past it.
    pub fn peek(&self) -> Result<Tok<'a>, JinjaError> {
        let mut l = *self;
        l.token()
    }
}

/// The kind of a tag opening at some offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagKind {
    /// `{{ expression }}`
    Print,
    /// `{% statement %}`
    Block,
    /// `{# comment #}`
    Comment,
}

/// The next tag at or after `from`: its offset and kind.
pub fn find_tag(src: &str, from: usize) -> Option<(usize, TagKind)> {
    let b = src.as_bytes();
    let mut i = from;
    while i + 1 < b.len() {
        if b[i] == b'{' {
            let k = match b[i + 1] {
                b'{' => Some(TagKind::Print),
                b'%' => Some(TagKind::Block),
                b'#' => Some(TagKind::Comment),
                _ => None,
            };
            if let Some(k) = k {
                return Some((i, k));
            }
        }
        i += 1;
    }
    None
}

/// The part of the text `src[a..b]` that is output: `a` follows a tag's end (or is 0),
/// `b` is the start of a tag (or the end of the template).
pub fn text_span(src: &str, a: usize, b: usize) -> (usize, usize) {
    let s = src.as_bytes();
    let (mut a, mut b) = (a, b);
    // What the tag before the text removes.
    let before = &s[..a];
    let mut line_start = a == 0;
    if before.ends_with(b"-%}") || before.ends_with(b"-}}") || before.ends_with(b"-#}") {
        while a < b && s[a].is_ascii_whitespace() {
            line_start = s[a] == b'\n';
            a += 1;
        }
    } else if (before.ends_with(b"%}") && !before.ends_with(b"+%}")) || before.ends_with(b"#}") {
        // trim_blocks: the first newline after a block or comment tag.
        if s[a..b].starts_with(b"\n") {
            a += 1;
            line_start = true;
        } else if s[a..b].starts_with(b"\r\n") {
            a += 2;
            line_start = true;
        }
    }
    // What the tag after the text removes.
    let after = &s[b..];
    if after.starts_with(b"{%-") || after.starts_with(b"{{-") || after.starts_with(b"{#-") {
        while b > a && s[b - 1].is_ascii_whitespace() {
            b -= 1;
        }
    } else if (after.starts_with(b"{%") && !after.starts_with(b"{%+")) || after.starts_with(b"{#") {
        // lstrip_blocks: spaces and tabs between the line's start and the tag.
        let mut l = b;
        while l > a && matches!(s[l - 1], b' ' | b'\t' | b'\x0B' | b'\x0C' | b'\r') {
            l -= 1;
        }
        if (l > a && s[l - 1] == b'\n') || (l == a && line_start) {
            b = l;
        }
    }
    (a, b)
}

/// Where the tag opened at `at` ends (just past `%}` / `#}` / `}}` and its mark), for
/// tags skipped as a whole (comments).
pub fn comment_end(src: &str, at: usize) -> Result<usize, JinjaError> {
    match src[at + 2..].find("#}") {
        Some(i) => Ok(at + 2 + i + 2),
        None => Err(JinjaError::Syntax {
            at: at as u32,
            what: "comment not closed",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> heapless::Vec<Tok<'_>, 32> {
        let mut l = Lexer::new(s, 0, b'%');
        let mut v = heapless::Vec::new();
        loop {
            let t = l.token().unwrap();
            v.push(t).unwrap();
            if t == Tok::End {
                return v;
            }
        }
    }

    #[test]
    fn reads_operators_longest_first() {
        assert_eq!(
            toks("a//2 ** 'x\\'y' != b -%}").as_slice(),
            &[
                Tok::Name("a"),
                Tok::Op("//"),
                Tok::Int(2),
                Tok::Op("**"),
                Tok::Str("x\\'y"),
                Tok::Op("!="),
                Tok::Name("b"),
                Tok::End
            ]
        );
    }

    #[test]
    fn unclosed_tag_is_an_error() {
        let mut l = Lexer::new("x + ", 0, b'}');
        l.token().unwrap();
        l.token().unwrap();
        assert!(matches!(l.token(), Err(JinjaError::Syntax { .. })));
    }

    #[test]
    fn strips_whitespace_as_jinja_does() {
        let t = "{% if x %}\n  a  \n  {% endif %}";
        // trim_blocks eats the newline after the first tag; lstrip_blocks the indent.
        assert_eq!(text_span(t, 10, 19), (11, 17));
        let t = "x {%- y -%}  \n z";
        assert_eq!(text_span(t, 0, 2), (0, 1));
        assert_eq!(text_span(t, 11, t.len()), (15, t.len()));
    }
}
