"""A headless Chromium driven over the DevTools protocol, for tests of the talk page: its
launch with a WAV as the microphone, the tab's socket, and a small protocol client on
`websockets` whose every wait is bounded."""
import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request
import wave
from pathlib import Path

import numpy as np
from websockets.exceptions import ConnectionClosed

CHROMIUM = Path("/usr/bin/chromium")


def voice_like_wav(path: Path, seconds: float = 4.0, rate: int = 48000) -> None:
    """A pitched buzz in syllable-like bursts: steady enough to be heard over the sim's energy
    threshold, varying enough that the browser's noise suppression keeps it."""
    t = np.arange(int(rate * seconds)) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    buzz = sum(np.sin(k * phase) / k for k in range(1, 8))
    bursts = np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5
    x = 0.25 * buzz * bursts / np.max(np.abs(buzz))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((x * 32767).astype("<i2").tobytes())


class Cdp:
    """Just enough of the DevTools protocol: calls by id, events kept for the end."""

    def __init__(self, ws):
        self.ws, self.next_id, self.pending, self.events = ws, 0, {}, []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                msg = json.loads(raw)
                fut = self.pending.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
                elif "method" in msg:
                    self.events.append(msg)
        except ConnectionClosed:        # the browser went away: pending calls time out
            pass

    async def call(self, method: str, timeout: float = 10, **params) -> dict:
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        msg = await asyncio.wait_for(fut, timeout)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg["result"]

    async def holds(self, expression: str, timeout: float, what: str) -> None:
        """Poll a JS expression until it is true. An evaluation racing a navigation loses its
        context and raises: that counts as not yet."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if await self.js(expression):
                    return
            except RuntimeError:
                pass
            assert time.monotonic() < deadline, f"the page never showed {what} in {timeout:g} s"
            await asyncio.sleep(0.1)

    async def reload(self, ready: str, what: str, **params) -> None:
        """Reload the tab, then wait until `ready` holds. A tab whose navigation is still
        committing answers "Not attached to an active page" (-32000): retried for a while."""
        deadline = time.monotonic() + 20
        while True:
            try:
                await self.call("Page.reload", **params)
                break
            except RuntimeError as e:
                if "-32000" not in str(e) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        await self.holds(ready, 20, what)

    async def js(self, expression: str):
        r = await self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                            awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def snapshot(self) -> dict:
        return await self.js("""({
            state: document.getElementById('state').textContent,
            stateName: document.getElementById('state').dataset.state,
            errors: [...document.querySelectorAll('#errors li')].map(e => e.textContent),
            user: [...document.querySelectorAll('#transcript li.user .text')]
                    .map(e => e.textContent).join(' | '),
            agent: [...document.querySelectorAll('#transcript li.agent .text')]
                    .map(e => e.textContent).join(' | '),
            talking: document.getElementById('talk').getAttribute('aria-pressed'),
            sent: +document.getElementById('sent-chunks').textContent,
            sentBytes: +document.getElementById('sent-bytes').textContent,
            received: +document.getElementById('recv-chunks').textContent,
            played: +document.getElementById('played-chunks').textContent,
            gaps: +document.getElementById('gaps').textContent,
        })""")

    async def until(self, check, timeout: float, what: str) -> dict:
        """Page snapshots until `check(snapshot)` holds; the last one is in the failure."""
        deadline = time.monotonic() + timeout
        snap = {}
        while time.monotonic() < deadline:
            snap = await self.snapshot()
            if check(snap):
                return snap
            await asyncio.sleep(0.1)
        raise AssertionError(f"page never showed {what} in {timeout:g} s: {snap}; "
                             f"console: {self.console()}")

    async def center(self, selector: str) -> tuple[float, float]:
        r = await self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                          ".getBoundingClientRect(); return [r.x + r.width / 2, "
                          "r.y + r.height / 2]; })()")
        return r[0], r[1]

    async def mouse(self, kind: str, x: float, y: float) -> None:
        await self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                        buttons=1 if kind == "mousePressed" else 0, clickCount=1)

    async def click(self, selector: str) -> None:
        x, y = await self.center(selector)
        await self.mouse("mouseMoved", x, y)
        await self.mouse("mousePressed", x, y)
        await self.mouse("mouseReleased", x, y)

    async def type_into(self, selector: str, text: str) -> None:
        await self.click(selector)
        await self.js(f"document.querySelector({json.dumps(selector)}).select()")
        await self.call("Input.insertText", text=text)

    def console(self) -> list[str]:
        out = []
        for ev in self.events:
            if ev["method"] == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(ev["params"]["exceptionDetails"])[:400])
            elif ev["method"] == "Runtime.consoleAPICalled" and \
                    ev["params"]["type"] in ("error", "warning"):
                out.append(" ".join(str(a.get("value", a.get("description")))
                                    for a in ev["params"]["args"]))
            elif ev["method"] == "Log.entryAdded" and \
                    ev["params"]["entry"]["level"] in ("error", "warning"):
                out.append(ev["params"]["entry"]["text"])
        return out


def launch_chromium(url: str, wav: Path, profile: Path, log: Path) -> tuple[subprocess.Popen, int]:
    """Headless Chromium on `url` with the WAV as its microphone; (process, DevTools port)."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
             f"--use-file-for-fake-audio-capture={wav}", "--window-size=900,1100"]
    with open(log, "w") as out:
        proc = subprocess.Popen([str(CHROMIUM), *flags, url], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text().split()[0])
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    kill_group(proc)
    raise RuntimeError(f"chromium did not start:\n{log.read_text()[-3000:]}")


def kill_group(proc: subprocess.Popen) -> None:
    """Chromium and the renderer/utility processes it started (its own session)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass


def page_target(devtools_port: int, url: str) -> str:
    """The DevTools WebSocket of the tab showing `url`."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{devtools_port}/json/list",
                                    timeout=5) as r:
            for t in json.load(r):
                if t["type"] == "page" and t["url"].startswith(url):
                    return t["webSocketDebuggerUrl"]
        time.sleep(0.2)
    raise RuntimeError(f"no tab on {url}")
