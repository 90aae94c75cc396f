#!/usr/bin/env python3
"""Time llama.cpp (as packaged in llama-cpp-python) on a GGUF the way `pinch bench` times
pinch: prompt processing of N tokens in one batch, and generation of N tokens one at a
time after a 1-token warm-up; the same deterministic token ids pinch bench uses.

usage: llamacpp_bench.py SITE_DIR MODEL THREADS PP TG
prints one JSON line: {"pp_tps": ..., "tg_tps": ...}
PINCH_LLAMA_NO_EXTRA_BUFTS=1: run without llama.cpp's extra buffer types (AMX, repack).
"""
import json, os, sys, time

site, model, threads, pp, tg = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
sys.path.insert(0, site)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_random import deny_amx  # noqa: E402
deny_amx()  # ggml's AMX path segfaults where the VM reports AMX but does not grant it
import llama_cpp  # noqa: E402
import llama_cpp.llama  # noqa: E402
if os.environ.get("PINCH_LLAMA_NO_EXTRA_BUFTS"):
    from gen_random import no_extra_bufts  # noqa: E402
    no_extra_bufts()
from llama_cpp import Llama  # noqa: E402

llm = Llama(model_path=model, n_ctx=max(pp, tg) + 8, n_batch=512, n_ubatch=512,
            n_threads=threads, n_threads_batch=threads, verbose=False)
nv = llm.n_vocab()
toks = [(1000 + i * 7919) % nv for i in range(max(pp, tg) + 1)]
out = {}
if pp > 0:
    llm.reset()
    llm.eval(toks[:1])
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks[:pp])
    out["pp_tps"] = pp / (time.perf_counter() - t0)
if tg > 0:
    llm.reset()
    llm.eval(toks[:1])
    llm.reset()
    t0 = time.perf_counter()
    for i in range(tg):
        llm.eval(toks[i:i + 1])
    out["tg_tps"] = tg / (time.perf_counter() - t0)
print(json.dumps(out))
