#!/usr/bin/env python3
"""llama-perplexity's PPL of a text, computed from llama.cpp's logits (llama-cpp-python).

The protocol of llama.cpp's tools/perplexity (written here from its description, see
tests/data/gemma3-270m/perplexity.json): the whole text is tokenized once with the
vocab's special tokens (BOS only if `tokenizer.ggml.add_bos_token` is true);
n_chunks = floor(n_tokens / n_ctx); chunk i = tokens [n_ctx*i, n_ctx*(i+1)) with its
first token replaced by BOS only when the vocab adds BOS, decoded from an empty cache;
the logits at positions n_ctx/2 .. n_ctx-2 score the next token; PPL = exp(mean NLL).
llama.cpp runs as in gen_random.py (F32 KV cache, no flash attention, one thread, AMX
kept off), so an F32 model gives the f32 oracle's exact arithmetic.

usage: llamacpp_ppl.py MODEL TEXT N_CTX [MAX_BYTES]
prints one JSON line: {"ppl", "n_chunks", "n_tokens", "add_bos", "scored", "buggy_ppl"}
where buggy_ppl is the same with BOS forced into every chunk (what `pinch ppl` did
before it read add_bos_token), for the record.
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_random  # noqa: E402  (llama.cpp runner)


def nll(row, target):
    row = row.astype(np.float64)
    m = row.max()
    return float(np.log(np.exp(row - m).sum()) - (row[target] - m))


def main(argv):
    if len(argv) < 4:
        print(__doc__)
        return 2
    model, text, n_ctx = Path(argv[1]), Path(argv[2]).read_bytes(), int(argv[3])
    if len(argv) > 4:
        text = text[: int(argv[4])]
    lc = gen_random.llama()
    vocab = lc.Llama(model_path=str(model), vocab_only=True, verbose=False)
    add_bos = lc.llama_vocab_get_add_bos(vocab._model.vocab)
    bos = vocab.token_bos()
    tokens = vocab.tokenize(text, add_bos=True, special=False)  # add_bos = add_special
    n_chunks = len(tokens) // n_ctx
    first = n_ctx // 2
    result = {}
    for name, force_bos in (("ppl", False), ("buggy_ppl", True)):
        total, count = 0.0, 0
        for c in range(n_chunks):
            chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
            if add_bos or force_bos:
                chunk[0] = bos
            rows = gen_random.logits(model, chunk, True)
            for j in range(first, n_ctx - 1):
                total += nll(rows[j], chunk[j + 1])
                count += 1
        result[name] = float(np.exp(total / count))
        result["scored"] = count
    result.update(n_chunks=n_chunks, n_tokens=len(tokens), add_bos=bool(add_bos))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
