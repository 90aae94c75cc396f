#!/usr/bin/env python3
"""Open the `pinch serve` page in Debian's headless Chromium, send a prompt, watch the
answer stream in, and check that tinted tokens, the token popup and live statistics
appeared; save a screenshot.

usage: page_test.py URL SCREENSHOT.png [--chromium PATH]

URL is the server's base address (http://127.0.0.1:PORT/). The page sends the prompt in
its `#prompt=` fragment by itself and opens the candidates popup of token `probe` when
the answer is complete. Chromium is driven over the DevTools protocol (a tiny WebSocket
client, standard library only): the page is sampled every 20 ms while it streams, so the
test sees tokens arrive before the answer ends. Only 127.0.0.1 is ever contacted.
Prints one JSON line with what it saw; exits non-zero when a check fails.
"""
import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1000,760",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class WebSocket:
    """Just enough RFC 6455 for DevTools: masked text frames out, text frames in."""

    def __init__(self, url):
        m = re.match(r"ws://127\.0\.0\.1:(\d+)(/.*)", url)
        if not m:
            raise ValueError("not a loopback DevTools URL: " + url)
        self.sock = socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (
            "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (m.group(2), m.group(1), key)
        )
        self.sock.sendall(req.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("DevTools closed the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ConnectionError("DevTools refused the WebSocket: " + head.decode(errors="replace"))
        self.next_id = 0

    def _exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            out += chunk
        return out

    def send(self, obj):
        data = json.dumps(obj).encode()
        head = bytes([0x81])
        n = len(data)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self):
        msg = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            op = b0 & 0x0F
            if op == 8:
                raise ConnectionError("DevTools closed the WebSocket")
            if op in (0, 1, 2):
                msg += payload
                if b0 & 0x80:
                    return json.loads(msg)

    def call(self, method, **params):
        self.next_id += 1
        self.send({"id": self.next_id, "method": method, "params": params})
        while True:
            r = self.recv()
            if r.get("id") == self.next_id:
                if "error" in r:
                    raise RuntimeError("%s: %s" % (method, r["error"]))
                return r.get("result", {})

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")


SNAPSHOT = """(function () {
  var toks = document.querySelectorAll('.tok'), tinted = 0, i, text = '';
  for (i = 0; i < toks.length; i++) { if (toks[i].style.background) { tinted++; } text += toks[i].textContent; }
  var g = function (id) { var e = document.getElementById(id); return e ? e.textContent : null; };
  return { tokens: toks.length, tinted: tinted, text: text.slice(0, 80), tps: g('tps'), ptps: g('ptps'),
           ntok: g('ntok'), rss: g('rss'), budget: g('budget'), avail: g('avail'), state: g('state'),
           model: g('model'), popup: g('pop'),
           popupShown: document.getElementById('pop').style.display === 'block' };
})()"""


def number(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def stop_group(proc):
    """Kill Chromium's whole process group and wait until no member is left (2 s at most)."""
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.time() + 2
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def remove_profile(profile):
    """Remove the temporary profile; a file a dying child writes late makes one pass fail,
    so try a few times, and leave a note (not a failure) if something still remains."""
    for _ in range(20):
        shutil.rmtree(profile, ignore_errors=True)
        if not os.path.exists(profile):
            return
        time.sleep(0.1)
    print("note: could not remove the Chromium profile " + profile, file=sys.stderr)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    url, shot = sys.argv[1], sys.argv[2]
    if not url.startswith("http://127.0.0.1:"):
        sys.exit("only loopback servers: " + url)
    exe = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--chromium" else None
    exe = exe or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        sys.exit("chromium not found: apt-get install -y chromium")
    page = url.rstrip("/") + "/#prompt=Hello%20from%20the%20browser%20test&probe=2"
    profile = tempfile.mkdtemp(prefix="pinch-chromium-")
    # Chromium's renderer, zygote and crash-handler processes outlive the browser process
    # for a moment and keep writing into the profile; run them all in one new process
    # group so that the whole group is stopped before the profile is removed.
    proc = subprocess.Popen([exe] + FLAGS + ["--user-data-dir=" + profile, "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        port = None
        deadline = time.time() + 30
        while port is None and time.time() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = m.group(1)
        if port is None:
            sys.exit("chromium did not start its DevTools endpoint")
        targets = json.load(urllib.request.urlopen("http://127.0.0.1:%s/json/list" % port, timeout=10))
        ws_url = [t for t in targets if t.get("type") == "page"][0]["webSocketDebuggerUrl"]
        ws = WebSocket(ws_url)
        ws.call("Page.enable")
        ws.call("Runtime.enable")
        ws.call("Page.navigate", url=page)
        # Sample while it streams: counts of tokens seen before the answer ended.
        counts = []
        deadline = time.time() + 60
        snap = {}
        while time.time() < deadline:
            snap = ws.eval(SNAPSHOT) or {}
            counts.append(snap.get("tokens", 0))
            if snap.get("state") == "idle" and snap.get("tokens", 0) > 0 and snap.get("popupShown"):
                break
            time.sleep(0.02)
        png = base64.b64decode(ws.call("Page.captureScreenshot", format="png")["data"])
        with open(shot, "wb") as f:
            f.write(png)
    finally:
        stop_group(proc)
        remove_profile(profile)
    final = snap.get("tokens", 0)
    partial = sorted(set(c for c in counts if 0 < c < final))
    seen = dict(snap, partial_counts=len(partial), screenshot_bytes=len(png))
    print(json.dumps(seen))
    problems = []
    if final < 3:
        problems.append("fewer than 3 streamed tokens on the page")
    if not partial:
        problems.append("no sample saw a partial answer: tokens were not drawn while streaming")
    if snap.get("tinted") != final:
        problems.append("tokens without a probability tint")
    for key in ("tps", "ptps"):
        v = number(snap.get(key))
        if v is None or v <= 0:
            problems.append(key + " did not update: " + repr(snap.get(key)))
    if number(snap.get("ntok")) != final:
        problems.append("token counter disagrees with the tokens shown")
    if not (snap.get("rss") or "").endswith("MiB"):
        problems.append("RSS not shown: " + repr(snap.get("rss")))
    if snap.get("state") != "idle":
        problems.append("generation did not finish: " + repr(snap.get("state")))
    if "%" not in (snap.get("popup") or ""):
        problems.append("token candidates popup empty")
    if problems:
        sys.exit("page test failed: " + "; ".join(problems))


if __name__ == "__main__":
    main()
