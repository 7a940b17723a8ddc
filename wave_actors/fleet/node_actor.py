"""One GPU's node as a Ray actor: today's node (`python -m wave_actors.node`) in a child
process with its own ZeroMQ endpoint, joined to the directory once it listens. Its log goes
to the actor's (Ray's worker logs); a node that never listens fails the actor with its last
lines. Ray restarts an actor that dies; the fresh one starts a fresh node.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import ray

from transports.fleet_client import DIRECTORY
from wave_actors.fleet.metrics import NodeReading, read_node

START_TIMEOUT_S = 120.0     # a node's model and graphs are built before it listens
STDERR_KEPT = 40            # lines of a node's log kept to say why it did not start
PORT_TRIES = 3              # starts of a node whose metrics port was taken meanwhile
ADDRESS_IN_USE = "Address already in use"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """The node process ends with its actor's process (Linux: PR_SET_PDEATHSIG), so a killed
    actor leaves no node serving calls that no directory knows of."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


# `exited` waits in a group of its own, so a reading or a stop never queues behind it
@ray.remote(num_gpus=1, num_cpus=0, max_restarts=-1, max_task_retries=0,
            concurrency_groups={"exit": 1})
class NodeActor:
    """One GPU's node: `python -m wave_actors.node NODE_ARGS --bind tcp://IP:PORT` in a child
    process, joined to the directory once it listens."""

    def __init__(self, name: str, port: int | str, node_args: list[str], namespace: str,
                 start_timeout_s: float = START_TIMEOUT_S):
        self.name, self.start_timeout_s = name, start_timeout_s
        host = ray.util.get_node_ip_address()
        bind = f"tcp://{host}:{port}"
        self._events: list[tuple[str, str]] = []    # the node's session lines, unacknowledged
        self._events_base = 0               # how many before them were acknowledged
        self._events_lock = threading.Lock()
        self._live: set[str] = set()        # the node's sessions, from the same lines
        self.namespace = namespace
        for attempt in range(PORT_TRIES):
            # a port free when drawn may be taken by another process before the node binds it
            self.metrics_port = _free_port()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "wave_actors.node", *node_args, "--bind", bind,
                 "--metrics-port", str(self.metrics_port), "--report-sessions"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                preexec_fn=_die_with_parent, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            self._said: collections.deque[str] = collections.deque(maxlen=STDERR_KEPT)
            self._stderr = threading.Thread(target=self._read_stderr,
                                            args=(self.proc, self._said), daemon=True)
            self._stderr.start()
            try:
                facts = self._listening()
                break
            except RuntimeError:
                if attempt + 1 == PORT_TRIES or not any(ADDRESS_IN_USE in line
                                                        for line in self._said):
                    raise
        self.endpoint, self.slots = facts["listening"], int(facts["max_sessions"])
        self.gpu_share = float(facts["gpu_share"])
        directory = ray.get_actor(DIRECTORY, namespace=namespace)
        self.incarnation = ray.get(directory.join.remote(name, self.endpoint, self.slots))

    def _listening(self) -> dict:
        box: dict = {}

        def read() -> None:
            for line in self.proc.stdout:
                if line.startswith("{") and '"listening"' in line:
                    box.update(json.loads(line))
                    break
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if not box:
            if reader.is_alive():
                why = f"not listening after {self.start_timeout_s:.0f} s"
            else:                       # its output ended: the node is exiting
                try:
                    why = f"exited with code {self.proc.wait(5)} before it listened"
                except subprocess.TimeoutExpired:
                    why = "closed its output before it listened"
            self.proc.kill()
            self._stderr.join(5.0)      # its log read to the end (the pipe closes at its exit)
            said = [line for line in self._said if not line.startswith("sessions ")]
            # the node's own one-line reason first, then how its log ended
            reason = [line for line in said if line.startswith("node: ")][-1:]
            raise RuntimeError(f"node {self.name}: {why}; its last words:\n"
                               + "".join(reason + said[-6:]).rstrip())
        # the rest of its output is read at once, so a full pipe never blocks the node
        threading.Thread(target=self._read_events, daemon=True).start()
        return box

    @staticmethod
    def _read_stderr(proc: subprocess.Popen, said: collections.deque) -> None:
        """The node's log, passed on to this actor's (Ray's worker logs keep it), its last
        lines kept for the error of a node that never listened."""
        for line in proc.stderr:
            said.append(line)
            sys.stderr.write(line)

    def _read_events(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(('{"opened"', '{"closed"')):
                try:
                    (event, session), = json.loads(line).items()
                except ValueError:
                    continue
                with self._events_lock:
                    self._events.append((event, str(session)))
                    (self._live.add if event == "opened" else self._live.discard)(str(session))

    def info(self) -> dict:
        if self.proc.poll() is not None:
            raise RuntimeError(f"node {self.name}: its process exited ({self.proc.returncode})")
        return {"name": self.name, "endpoint": self.endpoint, "slots": self.slots,
                "gpu_share": self.gpu_share, "incarnation": self.incarnation,
                "pid": os.getpid(), "node_pid": self.proc.pid}

    @ray.method(concurrency_group="exit")
    def exited(self) -> int:
        """Returns the node process's exit code when it exits. The driver keeps one of these
        asked of each node: it fails the moment the actor dies (a call in flight does), so a
        loss is heard then, not when the next reading is asked of a restarting actor."""
        return self.proc.wait()

    def rejoin(self) -> bool:
        """Tell a restarted directory what this node holds (False: it knew the node already)."""
        self.info()
        with self._events_lock:
            live = sorted(self._live)
        directory = ray.get_actor(DIRECTORY, namespace=self.namespace)
        return ray.get(directory.restore.remote(self.name, self.endpoint, self.slots,
                                                self.incarnation, live))

    def load(self, acked: tuple[int, int] = (0, 0)) -> NodeReading | None:
        """The node's metrics, read on this host (raises if the node's process is gone; None
        if it runs but did not answer in time), with what it said of its sessions past `acked`
        (an earlier reading's `events_mark`). They are kept until acknowledged, so a reading
        the watch gave up waiting for loses none; a mark from an earlier incarnation
        acknowledges nothing of this one."""
        self.info()
        try:
            reading = read_node(self.metrics_port)
        except OSError:
            return None         # its process runs but its registry did not answer: slow
        upto = acked[1] if acked[0] == self.incarnation else 0
        with self._events_lock:
            drop = min(max(0, upto - self._events_base), len(self._events))
            del self._events[:drop]
            self._events_base += drop
            reading.events = list(self._events)
            reading.events_mark = (self.incarnation, self._events_base + len(self._events))
        return reading

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM: the node refuses new opens, closes what is left, and exits."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
