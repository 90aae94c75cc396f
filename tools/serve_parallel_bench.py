"""`pinch serve --parallel` through HTTP: aggregate tokens/s of 1, 2, 4 concurrent
`/completion` requests on a `--parallel 4` server against the same requests one after
another on a one-slot server, repetitions alternating the two.

    python3 tools/serve_parallel_bench.py THREADS REPS [PINCH [MODEL]]
"""
import json, os, subprocess, sys, threading, time, http.client, statistics, re
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
T = sys.argv[1] if len(sys.argv) > 1 else "1"
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
BIN = sys.argv[3] if len(sys.argv) > 3 else os.path.join(ROOT, "target/release/pinch")
MODEL = sys.argv[4] if len(sys.argv) > 4 else os.path.join(ROOT, "models/gemma-3-270m-q4_k_m.gguf")
NP = 64

def start(extra):
    p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--host", "127.0.0.1", "--port", "0", "-t", T] + extra,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while True:
        line = p.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if m:
            return p, int(m.group(1))
        if not line:
            raise SystemExit("server did not start")

def post(port, k):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": f"Story number {k}: once upon a time", "n_predict": NP,
                       "temperature": 0, "ignore_eos": True, "cache_prompt": False})
    c.request("POST", "/completion", body, {"Content-Type": "application/json"})
    v = json.loads(c.getresponse().read())
    return v["tokens_predicted"], v["timings"]["predicted_per_second"]

def together(port, n):
    res = [None] * n
    def run(k): res[k] = post(port, k)
    ts = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    t0 = time.time()
    for t in ts: t.start()
    for t in ts: t.join()
    wall = time.time() - t0
    return sum(r[0] for r in res) / wall, statistics.mean(r[1] for r in res)

def alone(port, n):
    t0 = time.time()
    res = [post(port, k) for k in range(n)]
    wall = time.time() - t0
    return sum(r[0] for r in res) / wall, statistics.mean(r[1] for r in res)

par, pp = start(["--parallel", "4", "-c", "4096"])
one, po = start(["-c", "1024"])
post(pp, 99); post(po, 99)  # warm up
rows = {}
for rep in range(REPS):
    for n in (1, 2, 4):
        rows.setdefault(("par", n), []).append(together(pp, n))
        rows.setdefault(("one", n), []).append(alone(po, n))
par.kill(); one.kill()
med = lambda xs: statistics.median(xs)
base = med([a for a, _ in rows[("one", 1)]])
print(f"threads {T}, n_predict {NP}, {REPS} reps")
print("| streams | --parallel 4: aggregate t/s | per-stream t/s | one at a time (--parallel 1): aggregate t/s | ratio |")
for n in (1, 2, 4):
    a = med([x for x, _ in rows[("par", n)]]); s = med([y for _, y in rows[("par", n)]])
    o = med([x for x, _ in rows[("one", n)]])
    print(f"| {n} | {a:.1f} | {s:.1f} | {o:.1f} | {a/o:.2f}x |")
print("median per-rep ratio (--parallel 4 together / one at a time, same rep):",
      {n: round(med([p[0] / o[0] for p, o in zip(rows[("par", n)], rows[("one", n)])]), 2) for n in (1, 2, 4)})
print(json.dumps({f"{k[0]}{k[1]}": v for k, v in rows.items()}))
