"""The SIP end-to-end tests' kit: the real node (sim backend) and bridge as subprocesses on free
loopback ports (`node_and_bridge`, behind each test module's `stack` fixture), their output
lines and JSON events (`Proc`), sipp run on a scenario (`run_sipp`) and the scenarios' pieces
(`HEAD`, `SDP`, `ACK`, `BYE`, `WAIT_BYE`). sipp is required: without it these tests FAIL (CI
installs it: `apt-get install sip-tester`).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def _sipp() -> str:
    path = shutil.which("sipp")
    if path is None:
        pytest.fail("sipp is not installed: `apt-get install -y sip-tester` (.ci/run does it); "
                    "the SIP end-to-end tests need it and do not skip")
    return path


def _free_port(kind=socket.SOCK_DGRAM, even=False) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not even or (port % 2 == 0 and port + 2 < 65536):
            return port
    raise RuntimeError("no free port")


class Proc:
    """A subprocess whose stdout lines are collected by a thread."""

    def __init__(self, args, name):
        self.name, self.lines, self.cond = name, [], threading.Condition()
        self.p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def events(self, kind=None):
        out = []
        for line in list(self.lines):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and (kind is None or ev.get("event") == kind):
                out.append(ev)
        return out

    def wait_for(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0 or self.p.poll() is not None:
                    raise AssertionError(f"{self.name}: no {what} within {timeout}s; output:\n"
                                         + "\n".join(self.lines[-40:]))
                self.cond.wait(min(left, 0.2))

    def stop(self, timeout=10.0):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        time.sleep(0.1)                       # let the reader thread take the last lines


def node_and_bridge(tmp_path_factory):
    """One node (`--max-sessions 3`) and one bridge for a whole test module, as the body of its
    module-scoped `stack` fixture."""
    sipp = _sipp()
    node_ep = f"tcp://127.0.0.1:{_free_port(socket.SOCK_STREAM)}"
    sip_port = _free_port()
    node = Proc([PY, "-m", "wave_actors.node", "--bind", node_ep, "--backend", "sim",
                 "--max-sessions", "3"], "node")
    bridge = None
    try:
        node.wait_for(lambda: any("listening" in ln for ln in node.lines), 30, "listening line")
        bridge = Proc([PY, "-m", "transports.sip", "--node", node_ep,
                       "--listen", f"127.0.0.1:{sip_port}", "--rtp-timeout", "2.5"], "bridge")
        bridge.wait_for(lambda: bridge.events("listening"), 30, "listening event")
        yield {"sipp": sipp, "port": sip_port, "bridge": bridge, "node": node,
               "dir": tmp_path_factory.mktemp("sipp")}
    finally:
        if bridge is not None:
            bridge.stop()
        node.stop()


def run_sipp(stack, scenario: str, calls: int, extra=(), timeout=30) -> subprocess.CompletedProcess:
    d = stack["dir"]
    for part in ("node", "bridge"):
        if stack[part].p.poll() is not None:
            pytest.fail(f"the {part} exited before sipp ran; its last lines:\n"
                        + "\n".join(stack[part].lines[-20:]))
    name = f"sc{len(list(d.glob('*.xml')))}"
    (d / f"{name}.xml").write_text(scenario)
    args = [stack["sipp"], f"127.0.0.1:{stack['port']}", "-sf", f"{name}.xml",
            "-m", str(calls), "-l", str(calls), "-r", "20", "-i", "127.0.0.1",
            "-p", str(_free_port()), "-mi", "127.0.0.1", "-mp", str(_free_port(even=True)),
            "-trace_stat", "-stf", f"{name}.csv", "-trace_err", "-error_file", f"{name}.err",
            "-timeout", f"{timeout - 5}s", "-timeout_error", "-nostdin", *extra]
    proc = subprocess.run(args, cwd=d, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)
    proc.stats = _trace_stat(d / f"{name}.csv")
    err = d / f"{name}.err"
    proc.errors = err.read_text() if err.exists() else ""
    return proc


def _trace_stat(path: Path) -> dict:
    rows = [ln.split(";") for ln in path.read_text().splitlines() if ln.strip()]
    return dict(zip(rows[0], rows[-1]))


HEAD = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="{name}">
  <send retrans="500"><![CDATA[

      INVITE sip:wave@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: wave <sip:wave@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

{sdp}
    ]]></send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
"""
SDP = """      v=0
      o=sipp 53655765 2353687637 IN IP4 [local_ip]
      s=-
      c=IN IP4 [media_ip]
      t=0 0
      m=audio {port} RTP/AVP {fmt}
      a=rtpmap:{fmt} {codec}/8000
      a=ptime:20
"""
ACK = """  <send><![CDATA[

      ACK sip:wave@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch{offset}]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: wave <sip:wave@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0

    ]]></send>
"""
BYE = """  <send retrans="500"><![CDATA[

      BYE sip:wave@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: wave <sip:wave@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      Max-Forwards: 70
      Content-Length: 0

    ]]></send>
  <recv response="200" crlf="true"/>
</scenario>
"""
WAIT_BYE = """  <recv request="BYE" timeout="8000"/>
  <send><![CDATA[

      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]></send>
</scenario>
"""
