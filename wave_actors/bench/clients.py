"""The benchmark's callers: sessions that stream speech-like audio at real-time pace and take
what the node sends back, in the benchmark's own process or in separate load-generator processes.

Why other processes: a caller costs about as much Python as the node spends on its session, and
in one process both share one interpreter lock. At full load the callers' work would show up in
the node's beat latency, a cost no deployment has (its callers are telephony bridges and web
clients on other machines). Virtual time keeps the callers in process: they must share
the node's loop to share its clock.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import math
import multiprocessing as mp
import queue

import numpy as np

from wave_actors.bench.deadlines import CallRecord
from wave_actors.bench.workload import Call, Workload
from transports.client import NodeClient, Refused
from wave_actors.core.timebase import Clock
from wave_actors.core.frames import FRAME_S, IN_RATE, SAMPLES_IN

OPEN_TIMEOUT_S = 900.0      # the slowest session start of a burst of N opens
RESULT_TIMEOUT_S = 120.0    # a load generator's report after it was told to stop
REDIAL_S = 1.0              # churn: a refused caller dials again after this long


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """Deterministic noise bursts with pauses: energy for the RNNT, silence for turn-taking."""
    rng = np.random.default_rng(seed)
    n = int(seconds * IN_RATE)
    env = (np.sin(np.arange(n) * 2 * np.pi / (IN_RATE * 1.7)) > -0.2).astype(np.float32)
    return (0.1 * env * rng.standard_normal(n)).astype(np.float32)


# Callers share a few clips. Drawing a call's own 8 s of audio takes milliseconds of the
# generator's loop; drawn at its `opened`, it would delay the `opened` of every caller answered
# after it in the same burst, a wait of the benchmark's own making.
CLIP_S, CLIPS = 8.0, 8


@functools.lru_cache(maxsize=CLIPS)
def _clip(k: int) -> np.ndarray:
    return speech_like(CLIP_S, k)


def caller_audio(seed: int) -> np.ndarray:
    """The speech-like audio a call of `seed` streams (looped): one of the CLIPS shared clips."""
    return _clip(seed % CLIPS)


async def drive_line(client: NodeClient, line: int, clock: Clock, stop: asyncio.Event,
                     churn_s: float = 0.0, seed: int = 0) -> tuple[list[dict], int,
                                                                   list[CallRecord]]:
    """Caller line `line` until `stop`: one session (`bench-<line>`) or, with `churn_s` > 0,
    sessions back to back, each living an exponential time of mean `churn_s`, as calls end and
    new ones come in; a refused call dials again after REDIAL_S. Call lengths and audio come
    from `seed` and the line: one seed, one run.
    Returns the sessions' `closed` stats, the refusals, and a record of each call (times on
    the clock, not from a start: the bench makes them relative), one per session dialled until
    it opened."""
    rng = np.random.default_rng([seed, line])
    stats, refusals, calls = [], 0, []
    call = None
    for k in itertools.count():
        if stop.is_set():
            break
        sid = f"bench-{line}" if k == 0 else f"bench-{line}-{k}"
        life = float(rng.exponential(churn_s)) if churn_s > 0 else math.inf
        asked = clock.now()
        if call is None:
            call = CallRecord(line, asked)
            calls.append(call)
        call.tries += 1
        try:
            # A burst of N opens at once: the GPU starts them only in beats with room, so the
            # last `opened` can take a while at full load (bench only; a real opener waits for
            # fewer).
            s = await client.open(sid, sample_rate=IN_RATE, format="pcm_f32le",
                                  timeout=OPEN_TIMEOUT_S)
        except Refused as exc:
            refusals += 1
            call.refused.append(exc.reason)
            if churn_s <= 0:
                break
            await clock.sleep(REDIAL_S)
            continue
        # the wait a caller saw is this dial's: a redial's pause is its own choice
        call.asked_s, call.opened_s = asked, clock.now()
        stats.append(await _stream(s, clock, stop, clock.now() + life,
                                   seed=int(rng.integers(1 << 31))))
        call.ended_s, call = clock.now(), None
    return stats, refusals, calls


def talking(call: Call) -> np.ndarray:
    """One talk/silence period of a workload call, sample by sample: 1 while it talks
    (`talk_s`), 0 while silent (`silence_s`)."""
    period = np.zeros(max(1, round((call.talk_s + call.silence_s) * IN_RATE)), np.float32)
    period[:round(call.talk_s * IN_RATE)] = 1.0
    return period


async def _stream(s, clock: Clock, stop: asyncio.Event, end: float, seed: int,
                  call: Call | None = None) -> dict:
    """Stream 80 ms chunks of speech-like audio until `stop` or `end`, close; `closed` stats.
    A workload's `call` shapes it: its talk/silence pattern, each frame sent up to `jitter_ms`
    late, and a `loss` share of frames lost (their sequence numbers skipped, as a network
    loses packets)."""
    rng = np.random.default_rng([seed, 0x10])
    audio = caller_audio(seed)
    pattern = None if call is None else talking(call)
    jitter_s = 0.0 if call is None else call.jitter_ms / 1e3
    loss = 0.0 if call is None else call.loss
    t0, i = clock.now(), 0
    drain = asyncio.get_running_loop().create_task(_discard(s))
    while not stop.is_set() and clock.now() < end:
        start = (i * SAMPLES_IN) % (len(audio) - SAMPLES_IN)
        if loss and rng.random() < loss:
            s.seq += 1
        else:
            chunk = audio[start:start + SAMPLES_IN]
            if pattern is not None:         # the pattern by the call's own time, frame by frame
                at = (i * SAMPLES_IN + np.arange(SAMPLES_IN)) % len(pattern)
                chunk = chunk * pattern[at]
            await s.send_audio(chunk.tobytes())
        i += 1
        late = float(rng.uniform(0.0, jitter_s)) if jitter_s else 0.0
        await clock.sleep_until(t0 + i * FRAME_S + late)
    drain.cancel()
    await asyncio.gather(drain, return_exceptions=True)
    closed = await s.close(timeout=30)
    return closed.stats


async def _discard(s) -> None:
    while True:
        await s.events.get()


async def drive_all(client: NodeClient, ids: range, clock: Clock, stop: asyncio.Event,
                    churn_s: float = 0.0, seed: int = 0
                    ) -> tuple[list[dict], int, list[CallRecord]]:
    """Caller lines `ids` until `stop` (`drive_line`): all their sessions' stats, refusals and
    call records."""
    tasks = [asyncio.get_running_loop().create_task(
        drive_line(client, i, clock, stop, churn_s, seed)) for i in ids]
    stats, refusals, calls = [], 0, []
    for t in tasks:
        got, refused, called = await t
        stats += got
        refusals += refused
        calls += called
    return stats, refusals, calls


def call_fields(call: Call) -> dict:
    """The `open` fields of a workload call: a system prompt of its length, its tools."""
    tools = [{"name": f"tool_{k}", "description": "a tool the caller declares",
              "parameters": {"type": "object", "properties": {}}} for k in range(call.tools)]
    return {"instructions": "x" * call.prompt_chars, "tools": tools}


async def drive_call(client: NodeClient, index: int, call: Call, clock: Clock, t0: float,
                     stop: asyncio.Event, seed: int = 0) -> tuple[CallRecord, dict | None]:
    """One workload call: dial at `t0 + call.at_s`, redial as its policy says while refused,
    stream for its duration, close. Its record (times from `t0`) and `closed` stats (None
    when it was never opened)."""
    await clock.sleep_until(t0 + call.at_s)
    rec = CallRecord(index, clock.now() - t0)
    pause = call.redial_after_s
    while not stop.is_set():
        rec.tries += 1
        try:
            s = await client.open(f"call-{index}-{rec.tries}", sample_rate=IN_RATE,
                                  format="pcm_f32le", timeout=OPEN_TIMEOUT_S,
                                  **call_fields(call))
        except Refused as exc:
            rec.refused.append(exc.reason)
            if rec.tries > call.redials:
                return rec, None
            await clock.sleep(pause)
            pause *= call.redial_backoff
            continue
        rec.opened_s = clock.now() - t0
        stats = await _stream(s, clock, stop, clock.now() + call.duration_s,
                              seed=seed * 1_000_003 + index, call=call)
        rec.ended_s = clock.now() - t0
        return rec, stats
    return rec, None


async def drive_workload(client: NodeClient, workload: Workload, clock: Clock,
                         stop: asyncio.Event, seed: int = 0
                         ) -> tuple[list[CallRecord], list[dict], float]:
    """Every call of the workload (`drive_call`), from now: their records, the `closed` stats
    of those opened, and the time the workload began."""
    t0 = clock.now()
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(drive_call(client, i, c, clock, t0, stop, seed))
             for i, c in enumerate(workload.calls)]
    done = [await t for t in tasks]
    return [r for r, _ in done], [st for _, st in done if st is not None], t0


# -- load-generator processes ------------------------------------------------------------------
def _generator_main(endpoint: str, first: int, count: int, churn_s: float, seed: int, stop,
                    out) -> None:
    async def run() -> tuple[list[dict], int, list[CallRecord]]:
        done = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.02)
            done.set()
        watcher = asyncio.get_running_loop().create_task(watch())
        async with NodeClient(endpoint) as client:
            result = await drive_all(client, range(first, first + count), Clock(), done,
                                     churn_s, seed)
            # Lines that were all refused end early; the generator stays until told to stop,
            # so that its exit before then always means it failed.
            await done.wait()
        watcher.cancel()
        return result
    try:
        out.put(("ok", *asyncio.run(run())))
    except BaseException as exc:                       # reported to the benchmark, not lost
        out.put(("error", repr(exc), 0, []))


class Generators:
    """`procs` processes sharing `n` caller lines (ids first..first+n-1) against the node at
    `endpoint`."""

    def __init__(self, endpoint: str, n: int, procs: int, churn_s: float = 0.0, first: int = 0,
                 seed: int = 0):
        ctx = mp.get_context("spawn")                  # no copy of the parent's GPU or sockets
        self._stop, self._out = ctx.Event(), ctx.Queue()
        shares = np.array_split(np.arange(first, first + n), max(1, min(procs, n)))
        self._procs = [ctx.Process(target=_generator_main, daemon=True, name=f"bench-load-{k}",
                                   args=(endpoint, int(s[0]), len(s), churn_s, seed,
                                         self._stop, self._out))
                       for k, s in enumerate(shares) if len(s)]
        for p in self._procs:
            p.start()

    def failed(self) -> str | None:
        """Why a generator is gone before it was told to stop (None while all run)."""
        for p in self._procs:
            if p.exitcode is not None and not self._stop.is_set():
                return f"{p.name} exited with code {p.exitcode} before the run ended"
        return None

    async def finish(self) -> tuple[list[dict], int, list[CallRecord]]:
        """Tell every generator to close its sessions; their stats, refusals and calls."""
        self._stop.set()
        loop = asyncio.get_running_loop()
        stats, refusals, calls = [], 0, []
        for _ in self._procs:
            try:
                kind, got, refused, waited = await loop.run_in_executor(
                    None, self._out.get, True, RESULT_TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError("a load generator did not report its sessions") from None
            if kind == "error":
                raise RuntimeError(f"a load generator failed: {got}")
            stats += got
            refusals += refused
            calls += waited
        for p in self._procs:        # off the loop: the node still beats for the calls ending
            await loop.run_in_executor(None, p.join, 10)
        return stats, refusals, calls

    def kill(self) -> None:
        """Stop every generator still running (after `finish`, or when the run failed)."""
        self._stop.set()
        for p in self._procs:
            if p.is_alive():
                p.join(timeout=5)
            if p.is_alive():
                p.terminate()
