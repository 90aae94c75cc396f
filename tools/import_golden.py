#!/usr/bin/env python3
"""Copy the tiny fixtures and llama.cpp goldens the tests use into tests/data/tiny/.

Source: ../shared/fixtures (GGUF files made by gen_tiny.py + llama-quantize) and
../shared/golden/tiny (llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f).
For each fixture a small `<gguf>.meta` text file carries what the tests need from
index.json, one `key: values` per line, so the Rust tests need no JSON parser.
Run: python3 tools/import_golden.py ../shared tests/data/tiny [arch ...]
"""
import json, shutil, sys, os

src, dst = sys.argv[1], sys.argv[2]
arches = set(sys.argv[3:]) or {"llama", "qwen3", "gemma3"}
os.makedirs(dst, exist_ok=True)
idx = json.load(open(os.path.join(src, "golden/tiny/index.json")))
for e in idx["entries"]:
    if e["arch"] not in arches:
        continue
    g = e["gguf"]
    shutil.copy(os.path.join(src, "fixtures", g), os.path.join(dst, g))
    lines = [f"arch: {e['arch']}", f"quant: {e['quant']}",
             "token_ids: " + " ".join(map(str, e["token_ids"]))]
    for cfg in ("f32kv", "dequant-f32kv"):
        r = e["runs"].get(cfg)
        if r is None:
            continue
        for kind in ("batched_logits", "sequential_logits", "greedy_logits"):
            shutil.copy(os.path.join(src, "golden/tiny", r[kind]["file"]), os.path.join(dst, r[kind]["file"]))
        lines.append(f"{cfg}.greedy_ids: " + " ".join(map(str, r["greedy_ids"])))
        lines.append(f"{cfg}.greedy_margins: " + " ".join(repr(float(x)) for x in r["greedy_top1_margins"]))
    open(os.path.join(dst, g + ".meta"), "w").write("\n".join(lines) + "\n")
    print("imported", g)
