#!/usr/bin/env python3
"""Open the `pinch serve` page in Debian's headless Chromium, send a prompt, and check
that streamed tokens and live statistics appeared; save a screenshot.

usage: page_test.py URL SCREENSHOT.png [--chromium PATH]

URL is the server's base address (http://127.0.0.1:PORT/). The page sends the prompt
given in its `#prompt=` fragment by itself, so Chromium's `--dump-dom` (after a virtual
time budget, which waits for the streamed request to finish) shows the final DOM without
a DevTools client. Standard library only. Prints one JSON line with what it saw and
exits non-zero when a check fails.
"""
import html.parser
import json
import shutil
import subprocess
import sys
import tempfile

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


class Page(html.parser.HTMLParser):
    """Collects token spans and the text of elements with an id."""

    def __init__(self):
        super().__init__()
        self.tokens = []  # (text, style)
        self.ids = {}
        self.stack = []  # (tag, id, is_token)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        is_tok = "tok" in (a.get("class") or "").split()
        if is_tok:
            self.tokens.append(["", a.get("style") or ""])
        if tag not in ("br", "input", "meta"):
            self.stack.append((tag, a.get("id"), is_tok))
            if a.get("id"):
                self.ids[a["id"]] = ""

    def handle_endtag(self, tag):
        while self.stack:
            t = self.stack.pop()
            if t[0] == tag:
                break

    def handle_data(self, data):
        for _, ident, is_tok in self.stack:
            if ident:
                self.ids[ident] += data
        if self.stack and self.stack[-1][2]:
            self.tokens[-1][0] += data


def chromium(path, args, timeout=90):
    with tempfile.TemporaryDirectory() as profile:
        cmd = [path] + FLAGS + ["--user-data-dir=" + profile] + args
        return subprocess.run(cmd, capture_output=True, timeout=timeout, text=True)


def number(s):
    try:
        return float(s)
    except ValueError:
        return None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    url, shot = sys.argv[1], sys.argv[2]
    exe = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--chromium" else None
    exe = exe or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        sys.exit("chromium not found: apt-get install -y chromium")
    page = url.rstrip("/") + "/#prompt=Hello%20from%20the%20browser%20test&probe=2"
    budget = ["--virtual-time-budget=15000", "--window-size=1000,760"]
    dom = chromium(exe, budget + ["--dump-dom", page])
    p = Page()
    p.feed(dom.stdout)
    shot_run = chromium(exe, budget + ["--screenshot=" + shot, page])
    seen = {
        "tokens": len(p.tokens),
        "tinted": sum(1 for _, style in p.tokens if "background" in style),
        "text": "".join(t for t, _ in p.tokens)[:80],
        "tps": p.ids.get("tps"),
        "ptps": p.ids.get("ptps"),
        "ntok": p.ids.get("ntok"),
        "rss": p.ids.get("rss"),
        "avail": p.ids.get("avail"),
        "state": p.ids.get("state"),
        "model": p.ids.get("model"),
        "popup": p.ids.get("pop"),
        "screenshot_rc": shot_run.returncode,
    }
    print(json.dumps(seen))
    problems = []
    if seen["tokens"] < 3:
        problems.append("fewer than 3 streamed tokens on the page")
    if seen["tinted"] != seen["tokens"]:
        problems.append("tokens without a probability tint")
    for key in ("tps", "ptps"):
        v = number(seen[key] or "")
        if v is None or v <= 0:
            problems.append(key + " did not update: " + repr(seen[key]))
    if number(seen["ntok"] or "") != seen["tokens"]:
        problems.append("token counter disagrees with the tokens shown")
    if not (seen["rss"] or "").endswith("MiB"):
        problems.append("RSS not shown: " + repr(seen["rss"]))
    if seen["state"] != "idle":
        problems.append("generation did not finish: " + repr(seen["state"]))
    if "%" not in (seen["popup"] or ""):
        problems.append("token candidates popup empty")
    if shot_run.returncode != 0:
        problems.append("screenshot failed: " + shot_run.stderr[-500:])
    if problems:
        sys.exit("page test failed: " + "; ".join(problems))


if __name__ == "__main__":
    main()
