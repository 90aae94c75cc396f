#!/usr/bin/env python3
"""Tokens llama.cpp's sampler chain draws, for pinch's sampler tests.

Writes tests/data/sampling/chain.txt (fixed logits), chain-3000.txt (fixed logits over
3000 tokens, for the cases without top-k) and tests/data/sampling/tiny-llama.txt
(generation on tests/data/tiny/tiny-llama-F32.gguf). Needs llama-cpp-python 0.3.36
(= llama.cpp 0c1e570):

    PYTHONPATH=$HOME/.cache/pinch/llama-cpp-python:$HOME/.cache/pinch/py-numpy-gguf \
        python3 tools/gen_sampling_goldens.py

The chain is llama.cpp's default `common_sampler` order with DRY, top-n-sigma,
typical-p and XTC off (what llama-server and llama-cli build for these parameters;
llama-cpp-python's own `Llama.sample` builds the same order with min_keep 1, which
changes nothing here): penalties, top_k, top_p, min_p, temp_ext, dist(seed), all
through llama_cpp's low-level llama_sampler_* API. Prompt tokens are accepted into the
chain first (as llama-server's `init_sampler` and llama-cli do). Each step builds the
full-vocabulary candidate array from the logits, `llama_sampler_apply`s the chain,
takes `selected` and `llama_sampler_accept`s it: the CPU path of
`llama_sampler_sample`.

Per step the files record the token, the probability llama.cpp gave it (`p` after
`dist`), and the draw's margin: the distance of the uniform number `u` (recomputed
with a Python mt19937, checked against the draw llama.cpp made) from the nearest edge of
the chosen token's cumulative-probability interval. A small margin is a near-tie that a
last-bit difference in the logits could flip.
"""
import ctypes
import os
import random
import sys

import llama_cpp
import llama_cpp.llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "sampling")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_random import no_extra_bufts  # noqa: E402

no_extra_bufts()


class Mt19937:
    """std::mt19937, to recompute the uniform number dist drew (for the margins)."""

    def __init__(self, seed):
        self.mt = [0] * 624
        self.mt[0] = seed & 0xFFFFFFFF
        for i in range(1, 624):
            prev = self.mt[i - 1]
            self.mt[i] = (1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF
        self.i = 624

    def u32(self):
        if self.i >= 624:
            for k in range(624):
                y = (self.mt[k] & 0x80000000) | (self.mt[(k + 1) % 624] & 0x7FFFFFFF)
                self.mt[k] = self.mt[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & 0xFFFFFFFF

    def canonical(self):
        lo = float(self.u32())
        hi = float(self.u32())
        r = (lo + hi * 4294967296.0) / 18446744073709551616.0
        return r if r < 1.0 else 1.0 - 2.0**-53


# (name, temp, top_k, top_p, min_p, repeat, last_n, presence, frequency)
PARAMS = [
    ("defaults", 0.8, 40, 0.95, 0.05, 1.0, 64, 0.0, 0.0),
    ("hot", 1.5, 40, 0.95, 0.05, 1.0, 64, 0.0, 0.0),
    ("penalties", 0.8, 40, 0.95, 0.05, 1.3, 16, 0.5, 0.3),
    ("chat-penalty", 0.8, 40, 0.95, 0.05, 1.15, 256, 0.0, 0.0),
    ("raising-penalties", 1.0, 10, 1.0, 0.0, 0.9, 32, -0.5, -0.2),
    ("pure", 1.0, 0, 1.0, 0.0, 1.0, 64, 0.0, 0.0),
    ("top-p-only", 0.7, 0, 0.9, 0.0, 1.0, 64, 0.0, 0.0),
    ("min-p-only", 1.2, 0, 1.0, 0.1, 1.1, 64, 0.0, 0.0),
    ("top-k-1", 1.0, 1, 1.0, 0.0, 1.0, 64, 0.0, 0.0),
]
SEEDS = [0, 1, 42, 12345, 4294967294]
STEPS = 32


def make_chain(n_vocab, pr, seed):
    _, temp, top_k, top_p, min_p, repeat, last_n, presence, frequency = pr
    ch = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = lambda s: llama_cpp.llama_sampler_chain_add(ch, s)
    add(llama_cpp.llama_sampler_init_penalties(n_vocab, last_n, repeat, frequency, presence))
    add(llama_cpp.llama_sampler_init_top_k(top_k))
    add(llama_cpp.llama_sampler_init_typical(1.0, 0))
    add(llama_cpp.llama_sampler_init_top_p(top_p, 0))
    add(llama_cpp.llama_sampler_init_min_p(min_p, 0))
    add(llama_cpp.llama_sampler_init_temp_ext(temp, 0.0, 1.0))
    add(llama_cpp.llama_sampler_init_dist(seed))
    return ch


def step(ch, logits, rng):
    """One sampling step on `logits`: (token, p, margin)."""
    n = len(logits)
    data = (llama_cpp.llama_token_data * n)()
    for i, l in enumerate(logits):
        data[i].id = i
        data[i].logit = l
        data[i].p = 0.0
    arr = llama_cpp.llama_token_data_array(data, n, -1, False)
    llama_cpp.llama_sampler_apply(ch, ctypes.byref(arr))
    sel = arr.selected
    tok = data[sel].id
    u = rng.canonical()
    # cumulative probability before and through the chosen candidate (array order)
    before = sum(data[i].p for i in range(sel))
    through = before + data[sel].p
    assert before - 1e-6 <= u <= through + 1e-6, (u, before, through)
    margin = min(u - before, through - u) if arr.size > 1 else 1.0
    llama_cpp.llama_sampler_accept(ch, tok)
    return tok, data[sel].p, margin


def header(f, what):
    f.write("# Generated by tools/gen_sampling_goldens.py with llama-cpp-python %s "
            "(llama.cpp 0c1e570): %s\n" % (llama_cpp.__version__, what))
    f.write("# case: name temp top_k top_p min_p repeat_penalty repeat_last_n "
            "presence frequency seed; then tokens, p (llama.cpp's probability of each "
            "token), margin (distance of the draw from the chosen interval's edge)\n")


def write_case(f, pr, seed, toks, ps, margins):
    name, temp, top_k, top_p, min_p, repeat, last_n, presence, frequency = pr
    f.write("case: %s %r %d %r %r %r %d %r %r %d\n"
            % (name, temp, top_k, top_p, min_p, repeat, last_n, presence, frequency, seed))
    f.write("tokens: %s\n" % " ".join(map(str, toks)))
    f.write("p: %s\n" % " ".join("%.9g" % p for p in ps))
    f.write("margin: %s\n" % " ".join("%.3g" % m for m in margins))


def on_fixed_logits(file, what, n_vocab, sigma, rng_seed, params):
    """Sampling on one fixed vector of `n_vocab` logits (the tokens drawn change the
    penalties), for each of `params` and SEEDS."""
    g = random.Random(rng_seed)
    # f32 values, written with 9 significant digits (round-trip exact)
    logits = [float(ctypes.c_float(g.gauss(0.0, sigma)).value) for _ in range(n_vocab)]
    prompt = [g.randrange(n_vocab) for _ in range(12)]
    with open(os.path.join(OUT, file), "w") as f:
        header(f, what)
        f.write("logits: %s\n" % " ".join("%.9g" % l for l in logits))
        f.write("prompt: %s\n" % " ".join(map(str, prompt)))
        for pr in params:
            for seed in SEEDS:
                ch = make_chain(len(logits), pr, seed)
                rng = Mt19937(seed)
                for t in prompt:
                    llama_cpp.llama_sampler_accept(ch, t)
                toks, ps, ms = [], [], []
                for _ in range(STEPS):
                    t, p, m = step(ch, logits, rng)
                    toks.append(t)
                    ps.append(p)
                    ms.append(m)
                llama_cpp.llama_sampler_free(ch)
                write_case(f, pr, seed, toks, ps, ms)


def tiny_model():
    """Generation on tiny-llama-F32 (f32kv: F32 KV cache, flash attention off, 1 thread)."""
    path = os.path.join(ROOT, "tests", "data", "tiny", "tiny-llama-F32.gguf")
    meta = dict(l.split(": ", 1) for l in open(path + ".meta").read().splitlines() if ": " in l)
    prompt = [int(t) for t in meta["token_ids"].split()][:12]
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=256, n_ubatch=256,
                          n_threads=1, n_threads_batch=1, type_k=0, type_v=0,
                          flash_attn=False, logits_all=True, verbose=False)
    n_vocab = llm.n_vocab()
    with open(os.path.join(OUT, "tiny-llama.txt"), "w") as f:
        header(f, "tiny-llama-F32.gguf, f32kv")
        f.write("prompt: %s\n" % " ".join(map(str, prompt)))
        for pr in PARAMS:
            for seed in SEEDS:
                llm.reset()
                ch = make_chain(n_vocab, pr, seed)
                rng = Mt19937(seed)
                for t in prompt:
                    llama_cpp.llama_sampler_accept(ch, t)
                llm.eval(prompt)
                toks, ps, ms = [], [], []
                for _ in range(STEPS):
                    logits = [float(x) for x in llm.scores[llm.n_tokens - 1]]
                    t, p, m = step(ch, logits, rng)
                    toks.append(t)
                    ps.append(p)
                    ms.append(m)
                    llm.eval([t])
                llama_cpp.llama_sampler_free(ch)
                write_case(f, pr, seed, toks, ps, ms)


def main():
    os.makedirs(OUT, exist_ok=True)
    on_fixed_logits("chain.txt", "fixed logits", 96, 2.5, 20261202, PARAMS)
    # More tokens than pinch's 2048 candidates: the cases without top-k, where llama.cpp
    # works on the whole vocabulary.
    on_fixed_logits("chain-3000.txt", "fixed logits, 3000 tokens", 3000, 1.5, 3000,
                    [pr for pr in PARAMS if pr[2] == 0])
    tiny_model()


if __name__ == "__main__":
    main()
