"""Headless Chromium driven over the DevTools protocol (websockets, which Prefect already
needs): open a page, wait until it shows what it should, click, and take a screenshot."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    return None


class Browser:
    def __init__(self, width: int = 1400, height: int = 1000):
        from websockets.sync.client import connect

        exe = find_chromium()
        if exe is None:
            raise FileNotFoundError("chromium is not installed")
        self.profile = tempfile.mkdtemp(prefix="labrun-chromium-")
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        port = self._devtools_port()
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self.ids = itertools.count(1)
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.send("Page.enable")
        self.send("Runtime.enable")

    def _devtools_port(self, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if found := re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line):
                return int(found.group(1))
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError("chromium did not open its DevTools port")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == n:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("text", "script error"))
        return result["result"].get("value")

    def text(self) -> str:
        return self.js("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, *needles: str, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(n in text for n in needles):
                return text
            time.sleep(0.5)
        missing = [n for n in needles if n not in text]
        raise AssertionError(f"the page never showed {missing}; it shows:\n{text[:3000]}")

    def click_text(self, text: str, selector: str = "button, a, [role=tab]", timeout_s: float = 15) -> None:
        """A mouse click (pressed and released, as a person's) at the middle of the element
        `selector` finds whose text is `text`, once it is there, in view and uncovered: a
        person waits for a page to settle before clicking too."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.js(
                f"""(() => {{
                    const el = [...document.querySelectorAll({json.dumps(selector)})]
                        .filter(e => e.offsetParent !== null)
                        .find(e => e.innerText && e.innerText.trim() === {json.dumps(text)});
                    if (!el) return "not on the page";
                    el.scrollIntoView({{block: "center", behavior: "instant"}});
                    const r = el.getBoundingClientRect();
                    const [x, y] = [r.x + r.width / 2, r.y + r.height / 2];
                    const top = document.elementFromPoint(x, y);
                    if (!top || !(el.contains(top) || top.contains(el)))
                        return "covered by " + (top ? top.outerHTML.slice(0, 200) : "nothing");
                    return [x, y];
                }})()"""
            )
            if not isinstance(found, str):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"cannot click {text!r}: {found}")
            time.sleep(0.25)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=found[0], y=found[1], button="left",
                      clickCount=0 if kind == "mouseMoved" else 1)

    def type_into(self, selector: str, text: str) -> None:
        """Focus the first element `selector` finds and type `text` as keyboard input."""
        if not self.js(f"(() => {{ const el = document.querySelector({json.dumps(selector)}); "
                       f"if (!el) return false; el.focus(); return true; }})()"):
            raise AssertionError(f"nothing to type into at {selector!r}")
        self.send("Input.insertText", text=text)

    def choose(self, selector: str, value: str) -> None:
        """Pick `value` in the first <select> `selector` finds, as a person's choice does
        (what Playwright's select_option does: the value, then its input and change events)."""
        chosen = self.js(
            f"""(() => {{
                const el = document.querySelector({json.dumps(selector)});
                if (!el || ![...el.options].some(o => o.value === {json.dumps(value)})) return false;
                el.focus();
                el.value = {json.dumps(value)};
                el.dispatchEvent(new Event("input", {{bubbles: true}}));
                el.dispatchEvent(new Event("change", {{bubbles: true}}));
                return true;
            }})()"""
        )
        if not chosen:
            raise AssertionError(f"no option {value!r} at {selector!r}")

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
