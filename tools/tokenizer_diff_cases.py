#!/usr/bin/env python3
"""Tokenizer differential vectors: llama.cpp's tokenize and detokenize on random and
hostile strings, for every vocab file in tests/data/vocab, written to
tests/data/vocab/diff/ for runtime-min/tests/tokenizer_diff.rs (which needs no Python).

    PYTHONPATH=$HOME/.cache/pinch/llama-cpp-python python3 tools/tokenizer_diff_cases.py \
        [--out DIR] [--random N] [--seed S] [MODEL.gguf ...]

Without flags it writes the committed vectors (100 random strings, seed 20261201);
`cargo xtask tokenizer-diff --random N --seed S` writes N random strings of another seed
into target/ and runs the same Rust test on them (a longer hunt than CI's), also on the
vocabs of the real models in models/ (given as MODEL.gguf: their files start with a
`file <path>` line).

llama-cpp-python 0.3.36 (= llama.cpp 0c1e570). The strings are seeded, so a rerun
writes the same files.

Files (see tests/data/vocab/diff/README.md):
    strings.txt     one test string a line, hex (the same strings for every vocab)
    <vocab>.tsv     per vocab file, tab-separated lines:
        s <hex>                      one more string (this vocab's special-token texts and
                                     look-alikes), numbered after strings.txt's
        e <i> <ids00> <ids11> <d00(ids00)> <d00(ids11)> <d11(ids11)>
          (ids11 is `=` when it equals ids00, `B=` when it is BOS then ids00)
        x <i> <reason>               llama.cpp raised on string i (counted, reported)
        v <first> <end> <d00> <d11>  detokenize of the ids first..end-1
      ids00 = tokenize(add_special=0, parse_special=0), ids11 = tokenize(1, 1), space
      separated; dRS = detokenize(ids, remove_special=R, unparse_special=S), written
      `=` when it equals string i's bytes, else as its 64-bit FNV-1a hash (16 hex).
    pre-<name>.tsv  the same for a copy of ggml-vocab-llama-bpe.gguf whose
                    tokenizer.ggml.pre is <name> (a pre-tokenizer llama.cpp ships no vocab
                    file for), without `s` and `v` lines; its first line is
                    `base <file> <name>`, and ids00 is `=` when it equals the base file's.
                    For the SentencePiece-style pre-tokenizers the copy is of the sdist's
                    Gemma 4 vocab, with tokenizer.ggml.model = gpt2 and the pre key added;
                    first line `sdist-gpt2 <file> <name>`.
"""
import ctypes
import glob
import os
import random
import struct
import sys
import tempfile

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCABS = os.path.join(ROOT, "tests", "data", "vocab")
# Vocab files too large to copy into the repo: read from llama.cpp's `models/` in the
# llama-cpp-python sdist (what `cargo xtask test` downloads into ~/.cache/pinch/sdist).
SDIST_MODELS = os.path.expanduser(
    "~/.cache/pinch/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/models")
# With extra strings: the test inputs of llama.cpp's .inp files (nomic-bert-moe, the only
# UGM (t5) vocab llama.cpp ships, has none of its own; gemma-4's are also checked against
# its .out by runtime-min/tests/tokenizer_vectors.rs).
SDIST_VOCABS = [
    ("ggml-vocab-nomic-bert-moe.gguf", os.path.join(VOCABS, "ggml-vocab-llama-spm.gguf.inp")),
    ("ggml-vocab-gemma-4.gguf", os.path.join(SDIST_MODELS, "ggml-vocab-gemma-4.gguf.inp")),
]
# The SentencePiece-style BPE pre-tokenizers no vocab file uses, checked on a copy of
# Gemma 4's vocab with tokenizer.ggml.model = gpt2 and tokenizer.ggml.pre = <name>.
SDIST_PRE = ("ggml-vocab-gemma-4.gguf", ["granite-embed-multi-311m", "sarvam-moe"])
OUT = os.path.join(VOCABS, "diff")
SEED = 20261201
N_RANDOM = 100
RUN = 1024  # tokens per whole-vocab detokenize run

# Pre-tokenizers checked on a copy of the Llama 3 vocab: one name per distinct regex list
# and set of flags in runtime-min/src/tokenizer/pretok.rs that no vocab file here covers.
PRE_NAMES = [
    "default", "dbrx", "chatglm-bpe", "glm4", "jais-2", "deepseek-v3", "spark2_5", "youtu",
    "smollm", "stablelm2", "bloom", "poro-chat", "viking", "tekken", "chameleon", "gpt-4o",
    "granite-embed-multi-97m", "tiny_aya", "kimi-k2", "superbpe", "bailingmoe",
    "seed-coder", "ufakzeka", "afmoe", "laguna", "exaone-moe", "minicpm5", "command-r",
    "olmo", "jais", "codeshell", "exaone", "trillion", "llama4", "hunyuan",
    "grok-2",
]

# Code point ranges to draw from: ASCII, Latin, IPA, combining marks, Greek, Cyrillic,
# Armenian, Hebrew, Arabic, Syriac, Thaana, Devanagari and other Indic, Thai, Lao,
# Tibetan, Myanmar, Georgian, Hangul Jamo, Ethiopic, Cherokee, Khmer, Mongolian,
# punctuation, currency, letterlike, arrows and math, box drawing, symbols, CJK radicals
# and punctuation, kana, Bopomofo, CJK, Yi, Cyrillic ext, Hangul, private use,
# compatibility ideographs, presentation forms, half/full width, specials, Linear B,
# Deseret, math alphanumerics, emoji, CJK ext B, compatibility supplement, tags, CJK ext
# G, supplementary private use.
RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x250, 0x2FF), (0x300, 0x36F), (0x370, 0x3FF),
    (0x400, 0x52F), (0x530, 0x58F), (0x590, 0x5FF), (0x600, 0x6FF), (0x700, 0x74F),
    (0x780, 0x7BF), (0x900, 0x97F), (0x980, 0xDFF), (0xE00, 0xE7F), (0xE80, 0xEFF),
    (0xF00, 0xFFF), (0x1000, 0x109F), (0x10A0, 0x10FF), (0x1100, 0x11FF), (0x1200, 0x139F),
    (0x13A0, 0x13FF), (0x1780, 0x17FF), (0x1800, 0x18AF), (0x1AB0, 0x1AFF), (0x1E00, 0x1FFF),
    (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2100, 0x218F), (0x2190, 0x22FF), (0x2500, 0x257F),
    (0x2600, 0x27BF), (0x2E80, 0x2FDF), (0x3000, 0x303F), (0x3040, 0x30FF), (0x3100, 0x312F),
    (0x3130, 0x318F), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA000, 0xA4CF), (0xA640, 0xA69F),
    (0xAC00, 0xD7AF), (0xE000, 0xE0FF), (0xF900, 0xFAFF), (0xFB00, 0xFDFF), (0xFE00, 0xFE6F),
    (0xFF00, 0xFFEF), (0xFFF0, 0xFFFD), (0x10000, 0x1007F), (0x10400, 0x1044F),
    (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0x2F800, 0x2FA1F),
    (0xE0000, 0xE007F), (0x30000, 0x3134F), (0x10FFF0, 0x10FFFF),
]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\x0b", "\x0c"]
CONTROL = [chr(c) for c in range(0, 0x20)] + ["\x7f", "\u200b", "\u200d", "\ufeff", "\u202e"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "。", "，", "、", "।", "۔", "،", "—", "“", "”", "‘", "’", "！", "？", "・"]
WORDS = ["Hello", "world", "don't", "I'M", "we'LL", "it's", "CamelCase", "snake_case", "ÜBER", "naïve",
         "日本語", "中文", "한국어", "Привет", "مرحبا", "नमस्ते", "ไทย", "ελληνικά", "e\u0301", "🦙", "👍🏽", "❤️\u200d🔥",
         "IMGIMGABZ", "<sentinel:12>", "def f(x):", "    return x", "http://a.b/c?d=1", "1,000,000", "3.14159"]
INVALID = [b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xff", b"\xfe", b"\xc0\xaf",
           b"\xed\xa0\x80", b"\xe0\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xc3\x28"]
# Special-token texts of common vocabs, whole and damaged: most are not in a given vocab.
LOOKALIKES = ["<s>", "</s>", "<unk>", "<pad>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
              "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "[INST]", "[/INST]",
              "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<|fim_prefix|>", "<PRE>",
              "<｜begin▁of▁sentence｜>", "<|user|>", "<|assistant|>", "<|system|>", "<mask>"]


def rand_cp(rng):
    a, b = rng.choice(RANGES)
    c = rng.randint(a, b)
    if 0xD800 <= c <= 0xDFFF:
        c = 0xFFFD
    return chr(c)


def shared_strings(n_random, seed):
    """The strings every vocab is checked on: fixed hostile inputs, then seeded random."""
    rng = random.Random(seed)
    out = [b"", b" ", b"  ", b"\n", b"\t\t", b"\r\n\r\n", b"a", b"'", b"''s", b"'S", b"'ll 'VE",
           b" " * 300, b"\n" * 100, b"\t \n " * 40, b"7" * 250, b"1234567890" * 20,
           b"!" * 200, "…。，".encode() * 50, "\u3000".encode() * 30, b"a" * 500,
           "e\u0301\u0302\u0303".encode() * 20, "🦙".encode() * 40,
           "Hello world 12345 don't stop".encode(), " leading and trailing   ".encode(),
           "x  \n  y   \n\n z    ".encode(), bytes(range(1, 128)),
           "日本語のテキストと English と 한국어 mixed ١٢٣ ۴۵۶ ๑๒๓".encode(),
           "Ελληνικά Кириллица עברית العربية हिन्दी ภาษาไทย ქართული".encode()]
    out += [b"ab" + x + b"cd" for x in INVALID] + [x * 3 for x in INVALID]
    for s in LOOKALIKES:
        b = s.encode()
        out += [b, b"x " + b + b" y" + b + b, b[:-1], b" " + b.upper()]
    for _ in range(n_random):
        parts = []
        for _ in range(rng.randint(1, 16)):
            k = rng.random()
            if k < 0.35:
                parts.append("".join(rand_cp(rng) for _ in range(rng.randint(1, 8))).encode())
            elif k < 0.5:
                parts.append(rng.choice(SPACES).encode() * rng.randint(1, 6))
            elif k < 0.6:
                parts.append(rng.choice(PUNCT).encode() * rng.randint(1, 5))
            elif k < 0.7:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))).encode())
            elif k < 0.85:
                parts.append(rng.choice(WORDS).encode())
            elif k < 0.92:
                parts.append(rng.choice(CONTROL).encode())
            elif k < 0.96:
                parts.append(rng.choice(LOOKALIKES).encode())
            else:
                parts.append(rng.choice(INVALID))
        out.append(b"".join(parts))
    return out


def vocab_strings(specials, seed_name):
    """This vocab's own special-token texts (up to 24), alone, glued and cut short."""
    rng = random.Random(f"{SEED}:{seed_name}")
    rng.shuffle(specials)
    out = []
    for s in specials[:24]:
        out += [s, b"x " + s + b" y" + s + s, s[:-1] if len(s) > 1 else s + s]
    return out


def with_pre(base, name, out_dir):
    """Copy of the vocab-only GGUF `base` whose tokenizer.ggml.pre is `name`."""
    data = open(base, "rb").read()
    key = b"tokenizer.ggml.pre"
    at = data.index(struct.pack("<Q", len(key)) + key)
    p = at + 8 + len(key)
    assert struct.unpack_from("<I", data, p)[0] == 8, "tokenizer.ggml.pre is not a string"
    n = struct.unpack_from("<Q", data, p + 4)[0]
    assert struct.unpack_from("<Q", data, 8)[0] == 0, "only files without tensors"
    v = name.encode()
    new = data[:p + 4] + struct.pack("<Q", len(v)) + v + data[p + 12 + n:]
    path = os.path.join(out_dir, f"pre-{name}.gguf")
    open(path, "wb").write(new)
    return path


def gpt2_with_pre(base, name, out_dir):
    """Copy of the vocab-only GGUF `base` (which has no tokenizer.ggml.pre) whose
    tokenizer.ggml.model is `gpt2` and which has tokenizer.ggml.pre = `name`."""
    data = open(base, "rb").read()
    key = b"tokenizer.ggml.model"
    pre = b"tokenizer.ggml.pre"
    assert struct.pack("<Q", len(pre)) + pre not in data, "base has a tokenizer.ggml.pre"
    assert struct.unpack_from("<Q", data, 8)[0] == 0, "only files without tensors"
    at = data.index(struct.pack("<Q", len(key)) + key)
    p = at + 8 + len(key)
    assert struct.unpack_from("<I", data, p)[0] == 8, "tokenizer.ggml.model is not a string"
    n = struct.unpack_from("<Q", data, p + 4)[0]
    v = name.encode()
    kv = struct.pack("<Q", len(pre)) + pre + struct.pack("<IQ", 8, len(v)) + v
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    new = (data[:16] + struct.pack("<Q", n_kv + 1) + data[24:p + 4]
           + struct.pack("<Q", 4) + b"gpt2" + kv + data[p + 12 + n:])
    path = os.path.join(out_dir, f"gpt2-{name}.gguf")
    open(path, "wb").write(new)
    return path


def tokenize(vocab, data, add_special, parse_special):
    n_max = len(data) * 2 + 16
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, n_max, add_special, parse_special)
    if n < 0:
        raise RuntimeError(f"tokenize needs {-n}")
    return list(buf[:n])


def detokenize(vocab, ids, remove_special, unparse_special):
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 64 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
        if n >= 0:
            return buf.raw[:n]
        cap = -n + 16


def fnv(b):
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def dec_field(text, want):
    return "=" if text == want else fnv(text)


def test_inputs(path):
    """llama.cpp's test-tokenizer-0 inputs from an .inp file."""
    raw = open(path, "rb").read()
    sep = b"\n__ggml_vocab_test__\n"
    parts = raw.split(sep)
    return parts[:-1] if parts and parts[-1] == b"" else parts


def write_vocab(path, out_path, shared, whole_vocab, header=None, base_ids=None, more=()):
    """Writes one vocab's file; returns its ids00 by string index."""
    m = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(m.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    specials = []
    for t in range(n_vocab):
        a = llama_cpp.llama_vocab_get_attr(vocab, t)
        if a & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED):
            txt = llama_cpp.llama_vocab_get_text(vocab, t)
            if txt:
                specials.append(txt)
    extra = vocab_strings(specials, os.path.basename(out_path)) if whole_vocab else []
    extra += list(more)
    ids = lambda x: " ".join(map(str, x))
    bos = llama_cpp.llama_vocab_bos(vocab)
    n_enc = n_skip = 0
    all_a = {}
    with open(out_path, "w") as out:
        if header:
            out.write(header + "\n")
        for s in extra:
            out.write(f"s\t{s.hex()}\n")
        for i, data in enumerate(shared + extra):
            try:
                a = tokenize(vocab, data, False, False)
                b = tokenize(vocab, data, True, True)
            except Exception as e:  # llama.cpp's own limits, e.g. an invalid code point
                out.write(f"x\t{i}\t{type(e).__name__}: {e}\n")
                n_skip += 1
                continue
            d = [dec_field(detokenize(vocab, a, False, False), data),
                 dec_field(detokenize(vocab, b, False, False), data),
                 dec_field(detokenize(vocab, b, True, True), data)]
            all_a[i] = a
            fa = "=" if base_ids is not None and base_ids.get(i) == a else ids(a)
            fb = "=" if b == a else "B=" if b == [bos] + a else ids(b)
            out.write(f"e\t{i}\t{fa}\t{fb}\t" + "\t".join(d) + "\n")
            n_enc += 1
        if whole_vocab:
            for first in range(0, n_vocab, RUN):
                run = list(range(first, min(n_vocab, first + RUN)))
                h = [fnv(detokenize(vocab, run, r, r)) for r in (False, True)]
                out.write(f"v\t{first}\t{run[-1] + 1}\t{h[0]}\t{h[1]}\n")
    del m
    print(f"{os.path.basename(out_path)}: {n_enc} strings, {n_skip} raised", file=sys.stderr, flush=True)
    return all_a


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--random", type=int, default=N_RANDOM)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("models", nargs="*")
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    shared = shared_strings(args.random, args.seed)
    with open(os.path.join(out, "strings.txt"), "w") as f:
        for s in shared:
            f.write(s.hex() + "\n")
    for path in args.models:
        stem = os.path.basename(path)[: -len(".gguf")]
        write_vocab(path, os.path.join(out, f"model-{stem}.tsv"), shared, True,
                    header=f"file\t{os.path.abspath(path)}")
    for name, inp in SDIST_VOCABS:
        write_vocab(os.path.join(SDIST_MODELS, name),
                    os.path.join(out, name.replace(".gguf", ".tsv")), shared, True,
                    header=f"sdist\t{name}", more=test_inputs(inp))
    with tempfile.TemporaryDirectory() as tmp:
        name, pres = SDIST_PRE
        for pre in pres:
            p = gpt2_with_pre(os.path.join(SDIST_MODELS, name), pre, tmp)
            write_vocab(p, os.path.join(out, f"pre-{pre}.tsv"), shared, False,
                        header=f"sdist-gpt2\t{name}\t{pre}")
    base = os.path.join(VOCABS, "ggml-vocab-llama-bpe.gguf")
    base_ids = None
    for path in sorted(glob.glob(os.path.join(VOCABS, "ggml-vocab-*.gguf"))):
        stem = os.path.basename(path)[: -len(".gguf")]
        a = write_vocab(path, os.path.join(out, stem + ".tsv"), shared, True)
        if path == base:
            base_ids = a
    with tempfile.TemporaryDirectory() as tmp:
        for name in PRE_NAMES:
            p = with_pre(base, name, tmp)
            write_vocab(p, os.path.join(out, f"pre-{name}.tsv"), shared, False,
                        header=f"base\t{os.path.basename(base)}\t{name}", base_ids=base_ids)


if __name__ == "__main__":
    main()
