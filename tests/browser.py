"""A real browser for the tests: headless Chromium driven over its DevTools pipe, no extra package.

``--dump-dom`` alone prints a single-page app (the MLflow UI) before its charts have loaded, and
how long they take depends on the machine; :meth:`Browser.open` instead polls a condition in the
page, in real time, until it holds. The protocol is JSON messages ending in NUL on fds 3 (to
Chromium) and 4 (from it): ``--remote-debugging-pipe``.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((shutil.which(n) for n in NAMES if shutil.which(n)), None)


class Browser:
    def __init__(self, exe: str, profile: Path, size: str = "1400,2600"):
        to_chrome, self._out = os.pipe()
        self._in, from_chrome = os.pipe()

        def pipes_on_3_and_4():  # in the child: whatever numbers the pipe ends had, Chromium wants 3 and 4
            a, b = os.dup(to_chrome), os.dup(from_chrome)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                      "--remote-debugging-pipe", f"--user-data-dir={profile}",
                                      f"--window-size={size}", "about:blank"],
                                     close_fds=False, preexec_fn=pipes_on_3_and_4,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._id, self._buf = 0, b""
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]

    def call(self, method: str, session: str | None = None, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed its DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, js: str):
        """The value of a JavaScript expression in the page."""
        return self.call("Runtime.evaluate", self.session, expression=js, returnByValue=True)["result"].get("value")

    def open(self, url: str, until: str, timeout: float = 180) -> bool:
        """Load ``url``; True once the expression ``until`` holds in the page, False after ``timeout`` s."""
        self.call("Page.navigate", self.session, url=url)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.evaluate(until):
                return True
            time.sleep(0.5)
        return False

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", self.session, format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001  (a browser that will not close is stopped)
            self.proc.kill()
            self.proc.wait()
        finally:
            os.close(self._out)
            os.close(self._in)
