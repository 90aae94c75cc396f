//! Gemma 3 270M: the vocab of the real model file against llama.cpp's tokenization
//! (tests/data/gemma3-270m/tokenization.json, produced with llama.cpp 0c1e570).
//!
//! The model is not in git: `cargo xtask fetch-model gemma3-270m` puts it in `models/`.
//! Without it this test fails, unless `PINCH_SKIP_MODEL_TESTS=1`.
use pinch_runtime_min::chat::{ChatMessage, ChatTemplate};
use pinch_runtime_min::gguf::{Gguf, GgufError};
use pinch_runtime_min::tokenizer::{Tokenizer, Utf8Stream};
use pinch_runtime_min::Arena;
use std::io::Read;
use std::path::PathBuf;

// ---- a minimal JSON reader (objects, arrays, strings, integers, bools, null) ----

#[derive(Debug, Clone)]
enum Json {
    Null,
    Bool,
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, k: &str) -> &Json {
        match self {
            Json::Obj(v) => {
                &v.iter()
                    .find(|(kk, _)| kk == k)
                    .unwrap_or_else(|| panic!("no key {k}"))
                    .1
            }
            _ => panic!("not an object"),
        }
    }
    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(v) => v,
            _ => panic!("not an array"),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            _ => panic!("not a string: {self:?}"),
        }
    }
    fn ids(&self) -> Vec<u32> {
        self.arr()
            .iter()
            .map(|x| match x {
                Json::Num(n) => *n as u32,
                _ => panic!("not a number"),
            })
            .collect()
    }
}

struct P<'s> {
    s: &'s [u8],
    i: usize,
}

impl P<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn value(&mut self) -> Json {
        self.ws();
        match self.s[self.i] {
            b'{' => {
                self.i += 1;
                let mut v = Vec::new();
                loop {
                    self.ws();
                    if self.s[self.i] == b'}' {
                        self.i += 1;
                        return Json::Obj(v);
                    }
                    let k = self.string();
                    self.ws();
                    assert_eq!(self.s[self.i], b':');
                    self.i += 1;
                    let val = self.value();
                    v.push((k, val));
                    self.ws();
                    if self.s[self.i] == b',' {
                        self.i += 1;
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut v = Vec::new();
                loop {
                    self.ws();
                    if self.s[self.i] == b']' {
                        self.i += 1;
                        return Json::Arr(v);
                    }
                    v.push(self.value());
                    self.ws();
                    if self.s[self.i] == b',' {
                        self.i += 1;
                    }
                }
            }
            b'"' => Json::Str(self.string()),
            b't' => {
                self.i += 4;
                Json::Bool
            }
            b'f' => {
                self.i += 5;
                Json::Bool
            }
            b'n' => {
                self.i += 4;
                Json::Null
            }
            _ => {
                let st = self.i;
                while self.i < self.s.len() && b"+-0123456789.eE".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                Json::Num(
                    std::str::from_utf8(&self.s[st..self.i])
                        .unwrap()
                        .parse()
                        .unwrap(),
                )
            }
        }
    }
    fn hex4(&mut self) -> u32 {
        let h = std::str::from_utf8(&self.s[self.i..self.i + 4]).unwrap();
        self.i += 4;
        u32::from_str_radix(h, 16).unwrap()
    }
    fn string(&mut self) -> String {
        assert_eq!(self.s[self.i], b'"');
        self.i += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let c = self.s[self.i];
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).unwrap(),
                b'\\' => {
                    let e = self.s[self.i];
                    self.i += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'u' => {
                            let mut cp = self.hex4();
                            if (0xD800..0xDC00).contains(&cp) {
                                assert_eq!(&self.s[self.i..self.i + 2], b"\\u");
                                self.i += 2;
                                let lo = self.hex4();
                                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                            }
                            let ch = char::from_u32(cp).unwrap();
                            out.extend_from_slice(ch.to_string().as_bytes());
                        }
                        other => out.push(other),
                    }
                }
                _ => out.push(c),
            }
        }
    }
}

fn parse_json(s: &str) -> Json {
    P {
        s: s.as_bytes(),
        i: 0,
    }
    .value()
}

fn hex_bytes(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

// ---- the test ----

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/gemma-3-270m-q4_k_m.gguf")
}

/// Read just enough of the file for the header (the vocab is in it).
fn load_header(path: &std::path::Path) -> Tokenizer<'static> {
    let mut f = std::fs::File::open(path).unwrap();
    let file_len = f.metadata().unwrap().len();
    let mut buf = Vec::new();
    let mut want = 8u64 << 20;
    loop {
        let have = buf.len() as u64;
        if want > have {
            (&mut f).take(want - have).read_to_end(&mut buf).unwrap();
        }
        match Gguf::parse(&buf, file_len) {
            Ok(_) => break,
            Err(GgufError::NeedMore { need }) => want = need.max(want * 2).min(file_len),
            Err(e) => panic!("gguf: {e:?}"),
        }
    }
    let bytes: &'static [u8] = Vec::leak(buf);
    let g = Gguf::parse(bytes, file_len).unwrap();
    let region: &'static mut [u8] = Vec::leak(vec![0u8; 96 << 20]);
    let mut arena = Arena::new(region);
    Tokenizer::from_gguf(&g, &mut arena).expect("gemma3 tokenizer loads")
}

fn encode(t: &Tokenizer, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
    let mut scratch = vec![0u8; t.scratch_bytes(text.len())];
    let mut out = vec![0u32; text.len() + 8];
    let n = t
        .encode(text, add_special, parse_special, &mut scratch, &mut out)
        .unwrap();
    out.truncate(n);
    out
}

#[test]
fn gemma3_270m_matches_llama_cpp_tokenization() {
    let path = model_path();
    if !path.exists() {
        if std::env::var("PINCH_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
            eprintln!(
                "skipped: {} is missing (PINCH_SKIP_MODEL_TESTS=1)",
                path.display()
            );
            return;
        }
        panic!(
            "{} is missing: run cargo xtask fetch-model gemma3-270m (or set PINCH_SKIP_MODEL_TESTS=1)",
            path.display()
        );
    }
    let t = load_header(&path);
    assert_eq!(t.bos(), Some(2));
    assert_eq!(t.eos(), Some(1));
    assert!(!t.adds_space_prefix());
    assert!(t.is_eog(106), "<end_of_turn> ends generation");

    let golden = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/gemma3-270m/tokenization.json"),
    )
    .unwrap();
    let golden = parse_json(&golden);
    let mut failures = Vec::new();
    let strings = golden.get("strings").arr();
    assert!(strings.len() >= 10);
    for s in strings {
        let text = s.get("text").str();
        for (field, add, parse) in [
            ("ids_no_special", false, false),
            ("ids_add_special", true, false),
            ("ids_add_special_parse_special", true, true),
        ] {
            let want = s.get(field).ids();
            let got = encode(&t, text, add, parse);
            if got != want {
                failures.push(format!(
                    "{field} {text:?}\n   want {want:?}\n   got  {got:?}"
                ));
            }
        }
        // Pieces: token_to_piece(special = true) of the plain ids.
        let ids = s.get("ids_no_special").ids();
        let pieces = s.get("pieces_no_special").arr();
        assert_eq!(ids.len(), pieces.len());
        let mut joined = Vec::new();
        for (id, p) in ids.iter().zip(pieces) {
            let want = match p {
                Json::Str(x) => x.as_bytes().to_vec(),
                obj => hex_bytes(obj.get("bytes_hex").str()),
            };
            let got = t.token_to_piece(*id, true);
            if got != want.as_slice() {
                failures.push(format!("piece of {id}: want {want:?} got {got:?}"));
            }
            joined.extend_from_slice(got);
        }
        // Streaming the pieces gives back the text, never a split character.
        let mut stream = Utf8Stream::new();
        let mut text_out = String::new();
        for id in &ids {
            stream
                .push(
                    t.token_to_piece(*id, true),
                    &mut |s: &str| -> Result<(), ()> {
                        text_out.push_str(s);
                        Ok(())
                    },
                )
                .unwrap();
        }
        stream
            .finish(&mut |s: &str| -> Result<(), ()> {
                text_out.push_str(s);
                Ok(())
            })
            .unwrap();
        assert_eq!(text_out.as_bytes(), joined.as_slice());
        assert_eq!(text_out, text, "detokenized text");
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The chat prompt of one user message is one of the golden strings.
    let mut prompt = String::new();
    ChatTemplate::Gemma
        .render(
            &[ChatMessage::new("user", "What is 2+2?")],
            true,
            &mut prompt,
        )
        .unwrap();
    let golden_prompt = strings
        .iter()
        .find(|s| s.get("text").str().starts_with("<start_of_turn>"))
        .expect("golden chat string");
    assert_eq!(prompt, golden_prompt.get("text").str());
    assert_eq!(
        encode(&t, &prompt, true, true),
        golden_prompt.get("ids_add_special_parse_special").ids()
    );

    // Speed on the 42 KB evaluation text.
    let data =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/eval/wiki-excerpt.txt");
    if let Ok(text) = std::fs::read_to_string(data) {
        let t0 = std::time::Instant::now();
        let n = encode(&t, &text, true, false).len();
        let dt = t0.elapsed();
        eprintln!(
            "gemma3: {} bytes -> {n} tokens in {:.1} ms",
            text.len(),
            dt.as_secs_f64() * 1e3
        );
        assert!(dt.as_secs_f64() < 1.0, "gemma3 encode took {dt:?}");
    }
}
