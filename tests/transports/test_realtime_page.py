"""The bridge's talk page (`/`): its HTTP answers, and a real browser talking through it.

The unit test reads the page's files from an in-process bridge over plain HTTP. The browser test
runs the sim node and the bridge as subprocesses, then headless Chromium with a fake microphone
fed from a WAV written here, driven over the DevTools protocol (`browserkit`): it enters the
key, connects, holds the talk button, and reads what the page shows. Every wait is bounded.
"""
import asyncio
import base64
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.transports.browserkit import (CHROMIUM, Cdp, kill_group, launch_chromium,
                                         page_target, voice_like_wav)
from tests.transports.realtimekit import ROOT, free_port, http_get, start, start_node, stop
from transports.realtime.server import Bridge, BridgeConfig

KEY = "page-key-123"
WEB = ROOT / "transports" / "realtime" / "web"


# ---- plain HTTP against an in-process bridge ---------------------------------------------

def test_page_served_and_endpoint_unchanged():
    """Catches: the page or one of its files missing, served with a wrong Content-Type (a
    module script or worklet the browser then refuses), without its CSP, or a CSP that would
    block the page's own script or its socket; the page's WebSocket path not the bridge's; and
    the page hook swallowing the endpoint's answers (401 without a key, 426 for a plain GET with
    one, 404 elsewhere) or answering a WebSocket handshake on `/` with HTML."""
    async def go():
        bridge = await Bridge(BridgeConfig(node=f"tcp://127.0.0.1:{free_port()}", port=0,
                                           path="/v1/rt-test", api_key=KEY)).start()
        port = bridge.port
        try:
            status, headers, body = await http_get(port, "/?x=1")
            assert status == 200
            assert headers["content-type"] == "text/html; charset=utf-8"
            assert int(headers["content-length"]) == len(body)
            assert headers["x-content-type-options"] == "nosniff"
            policy = dict(d.strip().split(" ", 1) for d in
                          headers["content-security-policy"].split(";"))
            assert policy["default-src"] == "'none'"
            assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
            assert policy["frame-ancestors"] == "'none'"
            assert policy["connect-src"].split() == [
                "'self'", f"ws://127.0.0.1:{port}", f"wss://127.0.0.1:{port}"]
            page = body.decode()
            assert '<meta name="wave-realtime-path" content="/v1/rt-test">' in page
            assert "<script>" not in page and "style=" not in page     # nothing inline
            # every file the page names is served, with the type a browser will accept
            wanted = {"/web/mic-worklet.js": "text/javascript"}
            wanted.update({src: "text/javascript" for src in re.findall(r'src="([^"]+)"', page)})
            wanted.update({h: "text/css" for h in re.findall(r'stylesheet" href="([^"]+)"', page)})
            assert set(wanted) == {"/web/app.js", "/web/mic-worklet.js", "/web/style.css"}
            for path, kind in wanted.items():
                status, headers, body = await http_get(port, path)
                assert status == 200, path
                assert headers["content-type"] == f"{kind}; charset=utf-8", path
                assert "content-security-policy" in headers
                assert body == (WEB / path.rsplit("/", 1)[1]).read_bytes()
            # the endpoint answers as it did before the page existed
            status, headers, body = await http_get(port, "/v1/rt-test")
            assert status == 401 and b"invalid_api_key" in body
            status, _, body = await http_get(port, "/v1/rt-test",
                                             {"Authorization": f"Bearer {KEY}"})
            assert status == 426 and b"WebSocket" in body
            for path in ("/web/", "/web/../server.py", "/index.html", "/favicon.ico"):
                status, headers, _ = await http_get(port, path)
                assert status == 404 and headers["content-type"] == "application/json", path
            with pytest.raises(InvalidStatus) as exc:
                async with connect(f"ws://127.0.0.1:{port}/", open_timeout=5,
                                   subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]):
                    pass
            assert exc.value.response.status_code == 404
            # the way the page passes its key: the subprotocol next to `realtime`
            async with connect(f"ws://127.0.0.1:{port}/v1/rt-test", open_timeout=5,
                               subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
                assert ws.subprotocol == "realtime"
                first = json.loads(await asyncio.wait_for(ws.recv(), 5))
                assert first["type"] == "session.created"
        finally:
            await bridge.stop()
    asyncio.run(asyncio.wait_for(go(), 60))


# ---- a real browser ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (Debian's `chromium` "
                    "package; .ci/run installs it)")
def test_browser_talks_through_the_page(tmp_path):
    """Catches: the page failing in a real browser (a CSP that blocks its own script, worklet
    or socket; a module or worklet error), its key not reaching the bridge the way browsers can
    send one (subprotocol), a refused key not shown, the microphone not turned into 24 kHz
    `input_audio_buffer.append`s the model hears (no user transcript) or still streaming after
    release, output deltas not decoded and played on the audio clock, transcripts not shown,
    the toggle and keyboard ways to talk broken, and the key not kept for the next visit."""
    wav = tmp_path / "mic.wav"
    voice_like_wav(wav)
    node_proc, endpoint = start_node(tmp_path)
    port = free_port()
    bridge_log = tmp_path / "bridge.log"
    bridge_proc = chrome = profile = None
    try:
        bridge_proc = start(["-m", "transports.realtime", "--node", endpoint, "--listen",
                             f"127.0.0.1:{port}"], "listening on", bridge_log,
                            env={"WAVE_API_KEY": KEY})
        url = f"http://127.0.0.1:{port}/"
        profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=tmp_path))
        chrome, devtools = launch_chromium(url, wav, profile, tmp_path / "chromium.log")

        async def go() -> dict:
            async with connect(page_target(devtools, url), max_size=None, open_timeout=10) as ws:
                cdp = Cdp(ws)
                for domain in ("Page", "Runtime", "Log"):
                    await cdp.call(f"{domain}.enable")
                # the first load settles, then a reload lets the console be seen from the start
                loaded = "document.readyState === 'complete' && !!document.getElementById('talk')"
                await cdp.holds(loaded, 20, "its first load")
                await cdp.reload(loaded, "the reloaded page", ignoreCache=True)
                await cdp.until(lambda s: s["stateName"] == "disconnected", 5, "its first state")

                # a wrong key: refused at the handshake, and the page says so
                await cdp.type_into("#key", "wrong-key")
                await cdp.click("#connect")
                snap = await cdp.until(lambda s: any("401" in e for e in s["errors"]), 15,
                                       "the refused key")
                assert snap["stateName"] == "error"

                await cdp.type_into("#key", KEY)
                await cdp.click("#connect")
                await cdp.until(lambda s: s["stateName"] == "connected", 20, "connected")
                assert await cdp.js("localStorage.getItem('wave.realtime.apiKey')") == KEY

                # hold to talk: the fake microphone streams while the button is down
                x, y = await cdp.center("#talk")
                await cdp.mouse("mouseMoved", x, y)
                await cdp.mouse("mousePressed", x, y)
                pressed = time.monotonic()
                await cdp.until(lambda s: s["talking"] == "true" and s["sent"] >= 50 and
                                s["user"], 30, "audio sent and heard")
                await cdp.mouse("mouseReleased", x, y)
                held = time.monotonic() - pressed
                snap = await cdp.until(lambda s: s["talking"] == "false", 5, "the release")
                sent = snap["sent"]
                # 24 kHz pcm16 is 48,000 bytes a second of holding: a worklet that skips or
                # botches the resampling sends twice or half that (the mic starts a little
                # after the press, hence the wide low side)
                rate = snap["sentBytes"] / held
                assert 0.5 * 48000 < rate < 1.25 * 48000, (rate, held, snap)
                snap = await cdp.until(lambda s: s["played"] >= 25 and "speaking" in s["agent"],
                                       30, "played audio and the agent's words")
                # released: the microphone stops (at most the flushed tail goes after)
                assert snap["sent"] <= sent + 3, snap
                assert snap["errors"] == [], snap
                assert not [c for c in cdp.console()
                            if "exception" in c or "Content Security Policy" in c], cdp.console()

                shot = await cdp.call("Page.captureScreenshot", format="png", timeout=20)
                png = tmp_path / "realtime-page.png"
                png.write_bytes(base64.b64decode(shot["data"]))
                artifacts = ROOT / "tests" / "artifacts"
                if artifacts.is_dir():
                    shutil.copy(png, artifacts / "realtime-page.png")

                # the other ways to talk: toggle by click, hold by keyboard
                await cdp.click("#toggle")
                await cdp.click("#talk")
                await cdp.until(lambda s: s["talking"] == "true", 5, "toggled on")
                await cdp.click("#talk")
                await cdp.until(lambda s: s["talking"] == "false", 5, "toggled off")
                await cdp.click("#toggle")
                await cdp.js("document.getElementById('talk').focus()")
                space = {"key": " ", "code": "Space", "windowsVirtualKeyCode": 32}
                await cdp.call("Input.dispatchKeyEvent", type="keyDown", **space)
                await cdp.until(lambda s: s["talking"] == "true", 5, "held by Space")
                await cdp.call("Input.dispatchKeyEvent", type="keyUp", **space)
                await cdp.until(lambda s: s["talking"] == "false", 5, "released by Space")

                # the key is asked for once: a reload finds it stored
                await cdp.reload(f"document.getElementById('key')?.value === {json.dumps(KEY)}",
                                 "the stored key filled in")
                cdp.reader.cancel()
                return snap

        snap = asyncio.run(asyncio.wait_for(go(), 150))
        assert snap["received"] >= snap["played"] >= 25
        assert snap["sentBytes"] >= 50 * 1920              # 40 ms of 24 kHz pcm16 a chunk
        assert re.search(r"slot \d+ speaking", snap["agent"]), snap["agent"]
        assert re.fullmatch(r"[a-z |]+", snap["user"]), snap["user"]
    finally:
        if chrome is not None:
            kill_group(chrome)
        if profile is not None:                 # tens of MB; the logs and screenshot stay
            shutil.rmtree(profile, ignore_errors=True)
        if bridge_proc is not None:
            stop(bridge_proc)
        stop(node_proc)
