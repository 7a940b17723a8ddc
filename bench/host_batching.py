"""Output work of one beat on the host, per session against batched (CPU only).

Every beat each live session turns 2 frames of 1764 float32 samples at 22050 Hz into its
client's rate and wire format. Today each session does that alone: its own soxr stream
(`transports.audio.StreamResampler`) and `transports.audio.encode` per frame. When a worker holds
many sessions of one (rate, format), the same work can be one array operation per frame:

  per-session  N single-channel soxr streams + N `encode` calls per frame;
  batched      one soxr stream of N channels over the [samples, N] block per frame, then one
               vectorised encode of the [N, samples] block, split into each session's bytes.

Both paths start from the beat's [N, 1764] block (the backend's output) and end with one
`bytes` per session, so the transpose in and the split out are paid by the batched path. The
batched results are checked against the per-session ones on fresh streams: max abs difference
of the resampled samples and byte equality of the payloads. Times are the median of --reps
beats after a warm-up, in us per session per beat.

    python bench/host_batching.py [--reps 30] [--out bench/results/host-batching-cpu.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transports.audio import StreamResampler, encode, encode_rows  # noqa: E402
from wave_actors.core.frames import FRAMES_PER_BEAT, OUT_RATE, SAMPLES_OUT  # noqa: E402

SESSIONS = (16, 64, 256)
CASES = ((8000, "pcmu"), (16000, "pcm_s16le"), (24000, "pcm_s16le"), (22050, "pcm_s16le"))
WARMUP_BEATS = 5
CHECK_BEATS = 6
CAVEAT = ("A multi-channel soxr stream has a fixed channel count: sessions joining or leaving "
          "a (rate, format) group would need per-channel state handling (not built here).")


class BatchResampler:
    """One soxr stream for N sessions of one output rate: channel i is session i."""

    def __init__(self, n: int, in_rate: int, out_rate: int):
        self.n = n
        self._stream = (None if in_rate == out_rate else
                        soxr.ResampleStream(in_rate, out_rate, n, dtype="float32", quality="HQ"))

    def __call__(self, block: np.ndarray) -> np.ndarray:
        """[N, samples] in, [N, samples out] back (a view of soxr's [samples, N] output)."""
        if self._stream is None:
            return block
        return self._stream.resample_chunk(np.ascontiguousarray(block.T, np.float32)).T


def beat_frames(n: int, beats: int, seed: int) -> np.ndarray:
    """[beats, FRAMES_PER_BEAT, N, SAMPLES_OUT]: a distinct tone + noise per session, so a
    swapped channel shows; a little of it past full scale, so clipping is exercised."""
    rng = np.random.default_rng(seed)
    t = np.arange(beats * FRAMES_PER_BEAT * SAMPLES_OUT) / OUT_RATE
    f = rng.uniform(100.0, 4000.0, (n, 1))
    x = 0.8 * np.sin(2 * np.pi * f * t) + 0.25 * rng.standard_normal((n, t.size))
    x = x.astype(np.float32).reshape(n, beats, FRAMES_PER_BEAT, SAMPLES_OUT)
    return np.ascontiguousarray(x.transpose(1, 2, 0, 3))


def per_session_beat(streams, beat: np.ndarray, fmt: str, times: list | None = None) -> list:
    out, t_rs = [], 0.0
    for frame in beat:
        for i, rs in enumerate(streams):
            t0 = time.perf_counter()
            y = rs(frame[i])
            t_rs += time.perf_counter() - t0
            out.append(encode(y, fmt))
    if times is not None:
        times.append(t_rs)
    return out


def batched_beat(batch: BatchResampler, beat: np.ndarray, fmt: str,
                 times: list | None = None) -> list:
    out, t_rs = [], 0.0
    for frame in beat:
        t0 = time.perf_counter()
        y = batch(frame)
        t_rs += time.perf_counter() - t0
        out += encode_rows(y, fmt)
    if times is not None:
        times.append(t_rs)
    return out


def check(n: int, rate: int, fmt: str, beats: int = CHECK_BEATS) -> tuple:
    """(max abs difference of resampled samples, payloads byte-identical) on fresh streams."""
    x = beat_frames(n, beats, seed=n + rate)
    streams = [StreamResampler(OUT_RATE, rate) for _ in range(n)]
    batch = BatchResampler(n, OUT_RATE, rate)
    diff, same = 0.0, True
    for beat in x:
        for frame in beat:
            one = [rs(frame[i]) for i, rs in enumerate(streams)]
            many = batch(frame)
            if any(len(o) != many.shape[1] for o in one):
                return float("inf"), False
            if many.shape[1]:
                diff = max(diff, float(np.max(np.abs(np.stack(one) - many))))
            same &= [encode(o, fmt) for o in one] == encode_rows(many, fmt)
    return diff, same


def timed(run, beats: np.ndarray, reps: int) -> tuple:
    """(median seconds a beat, median seconds of resampling in it) over reps beats."""
    for beat in beats[:WARMUP_BEATS]:
        run(beat)
    total, rs = [], []
    for k in range(reps):
        beat = beats[WARMUP_BEATS + k]
        t0 = time.perf_counter()
        run(beat, rs)
        total.append(time.perf_counter() - t0)
    return statistics.median(total), statistics.median(rs)


def measure(n: int, rate: int, fmt: str, reps: int) -> dict:
    beats = beat_frames(n, WARMUP_BEATS + reps, seed=n)
    streams = [StreamResampler(OUT_RATE, rate) for _ in range(n)]
    batch = BatchResampler(n, OUT_RATE, rate)
    a, a_rs = timed(lambda b, t=None: per_session_beat(streams, b, fmt, t), beats, reps)
    b, b_rs = timed(lambda b_, t=None: batched_beat(batch, b_, fmt, t), beats, reps)
    diff, same = check(n, rate, fmt)
    us = 1e6 / n
    return {"sessions": n, "rate": rate, "format": fmt,
            "per_session_us": round(a * us, 2), "batched_us": round(b * us, 2),
            "speedup": round(a / b, 2),
            "per_session_resample_us": round(a_rs * us, 2),
            "batched_resample_us": round(b_rs * us, 2),
            "max_abs_diff": diff, "bytes_equal": same}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/host_batching.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30, help="timed beats a case (median; >= 20)")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'N':>4} {'rate':>6} {'format':<10} {'per-sess us':>11} {'batched us':>10} "
          f"{'x':>6} {'rs a/b us':>13} {'max|diff|':>9} bytes")
    for n in SESSIONS:
        for rate, fmt in CASES:
            r = measure(n, rate, fmt, args.reps)
            rows.append(r)
            print(f"{n:>4} {rate:>6} {fmt:<10} {r['per_session_us']:>11.1f} "
                  f"{r['batched_us']:>10.1f} {r['speedup']:>6.2f} "
                  f"{r['per_session_resample_us']:>6.1f}/{r['batched_resample_us']:<6.1f} "
                  f"{r['max_abs_diff']:>9.2g} {'equal' if r['bytes_equal'] else 'DIFFER'}")
    print("us: per session per beat (2 frames); rs a/b: the resampling part of each.")
    print("Caveat:", CAVEAT)
    if args.out:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, cwd=Path(__file__).parent).stdout.strip()
        except OSError:
            commit = ""
        doc = {"command": "python " + " ".join(["bench/host_batching.py", *sys.argv[1:]]),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": commit or "—",
               "machine": f"{platform.processor() or platform.machine()} / "
                          f"{os.cpu_count()} CPUs",
               "soxr": soxr.__version__, "numpy": np.__version__,
               "channels_note": CAVEAT, "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
