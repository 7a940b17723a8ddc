"""Sessions in worker processes (`NodeConfig.workers`), on real ipc and TCP sockets with real
clients: sessions are sharded across the workers, audio goes through them to the clock and back
out, `closed.stats` counts every frame, and a worker killed mid-call ends only its own sessions
(each client told, its slot freed) while the other worker's sessions keep their beat and a new
worker takes the dead one's place.

Bugs these catch: outputs routed to the wrong worker or session (a session hears another's
frames, checked by the frame codes); frames lost between a worker and the clock without a count
(frames_in + dropped_in < frames sent); a dead worker's sessions left open or its slots held (no
`closed`, free slots not back); a death that ends the other worker's sessions too; a pool that
does not replace its worker (the next opens all land on one worker, or fail); a stalled worker
handed rows the engine had already refilled (delivered instead of dropped and counted); an
engine that serves one node after another (the bench's runs) handing the second node's sessions
frames the first left in its shared ring, whose stamps name the same generations."""
from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from sim.executor import tone_hz
from tests.nodekit import TracingSimSpec, coded_frame, decode_code
from tests.tcpkit import client_of, events_until, node_on_tcp
from transports import audio as A
from transports.client import Audio, Closed, Error
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.frames import BEAT_S
from wave_actors.engine.host import EngineHost

# worker processes and engines started per test: outside the edit-test loop (make test-fast)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def _stream(session, n_frames: int, session_no: int) -> None:
    for f in range(n_frames):
        await session.send_audio(coded_frame(session_no, f))
        await asyncio.sleep(BEAT_S / 2)


async def _audio_until(session, count: int, timeout: float = 15.0) -> list[Audio]:
    got = await events_until(session, lambda ev, got: sum(isinstance(e, Audio) for e in got)
                             >= count, timeout)
    return [e for e in got if isinstance(e, Audio)]


def _dominant_hz(audio: list[Audio], fmt: str, rate: int) -> float:
    x = np.concatenate([A.decode(a.payload, fmt) for a in audio[-8:]])
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


_OUTPUTS = [("pcmu", 8000), ("pcmu", 8000), ("pcmu", 8000), ("pcm_s16le", 24000)]


@pytest.mark.parametrize("outputs,frames", [(True, True), (True, False), (False, False)],
                         ids=["shared", "copied-frames", "copied"])
def test_sessions_are_sharded_and_every_frame_is_counted(outputs, frames):
    # Every way audio crosses the processes: the frames written into the engine's shared ring
    # (found there at each release) or sent with their samples; a beat's PCM read out of the
    # engine's shared output buffers, or copied into the message (where shared memory is
    # missing).
    async def main():
        host = EngineHost(TracingSimSpec("sim", ExecutorOptions(max_sessions=4),
                                         share_outputs=outputs, share_frames=frames))
        await asyncio.get_running_loop().run_in_executor(None, host.start)
        async with node_on_tcp(max_sessions=4, backend=host, workers=2) as node:
            async with client_of(node) as c:
                # Output formats mixed within a worker: a worker encodes each beat's audio
                # of one format and length as one array (a row to the wrong session would
                # give it another's tone).
                sessions = [await c.open(f"s{i}", output_format=fmt, output_sample_rate=rate)
                            for i, (fmt, rate) in enumerate(_OUTPUTS)]
                per_worker = sorted(len(w.rids) for w in node.host.pool.workers.values())
                await asyncio.gather(*(_stream(s, 20, i) for i, s in enumerate(sessions)))
                heard = [await _audio_until(s, 12) for s in sessions]
                closed = [await s.close() for s in sessions]
            clock = node.clock_actor
            path = (clock.outputs_shared, clock.frames_shared, clock.frames_overwritten,
                    node.host.pool.stale_rows, clock.frames_read_by_executor)
        trace = host.call("trace")
        host.close()
        return trace, per_worker, sessions, heard, closed, path

    trace, per_worker, sessions, heard, closed, path = asyncio.run(main())
    # The sim reads a shared ring's frames itself (as a device would), ungathered.
    assert path == (outputs, frames, 0, 0, frames)
    assert per_worker == [2, 2]
    slot_of = {i: s.opened["slot"] for i, s in enumerate(sessions)}
    handed = {i: [] for i in slot_of}
    for _beat, slot, first, _last in trace:
        if first != 0.0:
            no, frame = decode_code(first)
            assert slot_of[no] == slot, "a frame reached another session's slot"
            handed[no].append(frame)
    for no, frames in handed.items():
        assert frames == sorted(set(frames)) and frames, f"session {no}: {frames}"
    for s, audio in zip(sessions, heard):           # each hears its own slot's tone
        hz = _dominant_hz(audio, s.opened["output_format"], s.opened["output_sample_rate"])
        assert abs(hz - tone_hz(s.opened["slot"])) < 8.0, (hz, s.opened["slot"])
    for c in closed:
        st = c.stats
        assert st["frames_in"] + st["dropped_in"] >= 20, st      # every frame heard or counted
        assert st["frames_out"] >= 12


def test_an_engine_serving_one_node_after_another_hands_each_its_own_frames():
    # The bench's runs: one engine, a node a run, whose clocks number their sessions alike. The
    # second node's sessions must hear their own frames, not what the first left in the ring.
    async def main():
        host = EngineHost(TracingSimSpec("sim", ExecutorOptions(max_sessions=2)))
        await asyncio.get_running_loop().run_in_executor(None, host.start)
        seen, slots = [], []
        for first in (0, 2):
            async with node_on_tcp(max_sessions=2, backend=host, workers=1) as node:
                async with client_of(node) as c:
                    sessions = [await c.open(f"s{first + i}") for i in range(2)]
                    await asyncio.gather(*(_stream(s, 20, first + i)
                                           for i, s in enumerate(sessions)))
                    for s in sessions:
                        await s.close()
            slots.append({first + i: s.opened["slot"] for i, s in enumerate(sessions)})
            seen.append(len(host.call("trace")))
        trace = host.call("trace")
        host.close()
        return trace[seen[0]:], slots[1]

    trace, slot_of = asyncio.run(main())
    handed = {no: [] for no in slot_of}
    for _beat, slot, first, _last in trace:
        if first != 0.0:
            no, frame = decode_code(first)
            assert no in slot_of and slot_of[no] == slot, f"the first node's frame {no}/{frame}"
            handed[no].append(frame)
    for no, frames in handed.items():
        assert frames == sorted(set(frames)) and len(frames) >= 15, (no, frames)


def test_a_dead_worker_ends_only_its_sessions_and_is_replaced():
    async def main():
        async with node_on_tcp(max_sessions=4, workers=2) as node:
            async with client_of(node) as c:
                sessions = [await c.open(f"s{i}") for i in range(4)]
                pool = node.host.pool
                victim = pool.workers[0]
                doomed = {r.actor.rid for r in node.routes.values() if r.actor.worker is victim}
                doomed_ids = {r.session for r in node.routes.values() if r.actor.rid in doomed}
                streams = [asyncio.create_task(_stream(s, 40, i)) for i, s in enumerate(sessions)]
                await asyncio.sleep(1.0)
                os.kill(victim.proc.pid, signal.SIGKILL)
                ended = {}
                for s in sessions:
                    if s.id in doomed_ids:
                        got = await events_until(s, lambda ev, got: isinstance(ev, Closed), 10)
                        ended[s.id] = got
                for t in streams:
                    t.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
                survivors = [s for s in sessions if s.id not in doomed_ids]
                for s in survivors:                     # what they heard before the death
                    while not s.events.empty():
                        s.events.get_nowait()
                later = [await _audio_until(s, 5) for s in survivors]
                for _ in range(100):                    # the replacement comes up
                    if pool.workers[0].alive:
                        break
                    await asyncio.sleep(0.1)
                free_after_death = node.clock_actor.free_slots
                again = [await c.open(f"n{i}") for i in range(2)]
                spread = sorted(len(w.rids) for w in pool.workers.values())
                for s in [*survivors, *again]:
                    await s.close()
        return doomed_ids, ended, later, pool.restarts, free_after_death, spread

    doomed_ids, ended, later, restarts, free_after_death, spread = asyncio.run(main())
    assert len(doomed_ids) == 2
    for sid, got in ended.items():
        assert any(isinstance(e, Error) and e.code == "internal" for e in got), got
        assert isinstance(got[-1], Closed)
    for audio in later:                           # the other worker's sessions kept talking
        assert len(audio) >= 5
    assert restarts == 1
    assert free_after_death == 2                  # the dead worker's slots are free again
    assert spread == [2, 2]                       # the new opens went to the new worker


def test_a_worker_stalled_past_its_outputs_counts_them_and_its_sessions_go_on():
    # A worker stopped for longer than a beat finds the engine's output buffers refilled when it
    # reads its beat messages: those rows are dropped and counted (never delivered torn), its
    # sessions hear the next beats again, and the other worker's session loses nothing.
    async def main():
        async with node_on_tcp(max_sessions=2, workers=2) as node:
            async with client_of(node) as c:
                sessions = [await c.open(f"s{i}") for i in range(2)]
                streams = [asyncio.create_task(_stream(s, 60, i)) for i, s in enumerate(sessions)]
                await _audio_until(sessions[0], 4)
                victim = next(r.actor.worker for r in node.routes.values()
                              if r.session == sessions[0].id)
                os.kill(victim.proc.pid, signal.SIGSTOP)
                await asyncio.sleep(4 * BEAT_S)                  # the engine refills both buffers
                os.kill(victim.proc.pid, signal.SIGCONT)
                stale_seen = 0
                for _ in range(50):
                    if (stale_seen := node.host.pool.stale_rows):
                        break
                    await asyncio.sleep(0.1)
                for s in sessions:
                    while not s.events.empty():
                        s.events.get_nowait()
                later = [await _audio_until(s, 5) for s in sessions]
                for t in streams:
                    t.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
                closed = [await s.close() for s in sessions]
            counted = node.counters.stale_rows
            metric = node.metrics.registry.get_sample_value(
                "wave_dropped_total", {"reason": "output_overwritten"})
        return stale_seen, counted, metric, later, closed

    stale_seen, counted, metric, later, closed = asyncio.run(main())
    assert stale_seen > 0
    assert counted == stale_seen and metric == counted
    assert all(len(audio) >= 5 for audio in later)
    assert all(c.stats is not None for c in closed)


def test_a_dead_engine_ends_every_session_and_a_new_one_serves():
    """The engine process (executor and beat clock) killed mid-call: every session's client
    gets `error internal` and `closed`, the node starts a new engine process, and a new call is
    served there. Catches: sessions left open on a clock that is gone; a node that keeps asking
    the dead process (opens time out, or hang); a restart that reuses the dead incarnation's
    slots (the new call's outputs never come)."""
    async def main():
        async with node_on_tcp(max_sessions=4, workers=2) as node:
            host = node.engine
            first_pid = host.proc.pid
            async with client_of(node) as c:
                sessions = [await c.open(f"s{i}") for i in range(3)]
                streams = [asyncio.create_task(_stream(s, 60, i)) for i, s in enumerate(sessions)]
                await _audio_until(sessions[0], 3)
                os.kill(first_pid, signal.SIGKILL)
                ended = [await events_until(s, lambda ev, got: isinstance(ev, Closed), 20)
                         for s in sessions]
                for t in streams:
                    t.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
                for _ in range(200):                    # the new engine comes up
                    if host.alive and node.clock_actor is not None \
                            and node.clock_actor.stats.beats:
                        break
                    await asyncio.sleep(0.1)
                fresh = await c.open("after")
                streamer = asyncio.create_task(_stream(fresh, 30, 9))
                heard = await _audio_until(fresh, 5)
                streamer.cancel()
                await asyncio.gather(streamer, return_exceptions=True)
                await fresh.close()
        return ended, heard, host.restarts

    ended, heard, restarts = asyncio.run(main())
    for got in ended:
        assert any(isinstance(e, Error) and e.code == "internal" for e in got), got
        assert isinstance(got[-1], Closed)
    assert restarts == 1
    assert len(heard) >= 5


def test_a_front_that_stops_reading_never_blocks_the_engines_clock():
    """The engine reports each beat over a pipe to the front. Catches a report that waits for
    a front whose loop has stopped reading (the clock would stop with it): past what the pipe
    holds, reports are dropped and counted, and the next one read carries the count."""
    import multiprocessing as mp
    import time
    from types import SimpleNamespace
    from wave_actors.engine.process import EngineServer
    front, engine = mp.Pipe()
    server = EngineServer(SimpleNamespace(), engine)
    rec = SimpleNamespace(beat=0, pad=b"x" * 300)
    began = time.monotonic()
    for k in range(2000):                        # ~0.7 MB of reports, far past a pipe's 64 KB
        server.report(("beat", 0, rec, {"underruns": 0}, []))
    assert time.monotonic() - began < 5.0
    assert server.reports_lost > 0
    got = []
    while front.poll():
        got.append(front.recv())
    assert 0 < len(got) == 2000 - server.reports_lost
    server.report(("beat", 0, rec, {"underruns": 0}, []))
    assert front.recv()[3]["reports_lost"] == server.reports_lost
