"""What one read of a queued message costs the front's loop (`transports.zsock.recv_now`), part
by part: a two-part message (a client's header and 2,600 bytes of audio) read without a copy,
the parts' ends found by each Frame's own flag against asking the socket (`RCVMORE`, which pyzmq
turns into an option enum on every call), and the fixed costs around it: a read that finds
nothing (zmq.Again raised and caught) and a look at the socket's events. One process, an inproc
PAIR, queues of 900 messages refilled between timings.

    python bench/zsock_recv.py [--rounds 60] [--out bench/results/zsock-recv-cpu.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transports import zsock                                   # noqa: E402
from wave_actors.bench.provenance import stamp                 # noqa: E402

QUEUE = 900                 # under the pair's default high-water mark of 1,000


def _per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def _asking_the_socket(sock: zmq.Socket) -> list:
    parts = [zsock._RECV(sock, zsock.NOBLOCK, False)]
    while zsock._GET(sock, zsock._RCVMORE):
        parts.append(zsock._RECV(sock, zsock.NOBLOCK, False))
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--out", default="bench/results/zsock-recv-cpu.json")
    args = ap.parse_args()
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://zsock-recv")
    b.connect("inproc://zsock-recv")
    message = [b"h" * 40, b"x" * 2600]

    def reads(fn) -> list[float]:
        out = []
        for _ in range(args.rounds):
            for _ in range(QUEUE):
                a.send_multipart(message)
            out.append(_per_call_us(lambda: fn(b), QUEUE))
        return out

    def nothing_there() -> None:
        try:
            zsock._RECV(b, zsock.NOBLOCK, True)
        except zmq.Again:
            pass

    ways = {"frame flag (recv_now, copy=False)": lambda s: zsock.recv_now(s, False),
            "asking the socket (RCVMORE)": _asking_the_socket}
    rows = []
    for name, fn in list(ways.items()) * 2:                  # each twice, interleaved
        got = reads(fn)
        rows.append({"read": name, "us_per_message_median": round(statistics.median(got), 2),
                     "us_min": round(min(got), 2), "us_max": round(max(got), 2),
                     "rounds": args.rounds})
    rows.append({"read": "nothing queued (zmq.Again)",
                 "us_per_message_median": round(_per_call_us(nothing_there, 100_000), 2)})
    rows.append({"read": "the socket's events (EVENTS)",
                 "us_per_message_median": round(
                     _per_call_us(lambda: zsock._GET(b, zsock._EVENTS), 100_000), 2)})
    a.close(0)
    b.close(0)
    ctx.term()
    for r in rows:
        print(f"{r['read']:36s} {r['us_per_message_median']:6.2f} µs")
    result = {"command": "python bench/zsock_recv.py " + " ".join(sys.argv[1:]),
              "device": f"CPU only ({platform.processor() or platform.machine()}), pyzmq "
                        f"{zmq.__version__}", "rows": rows,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **stamp()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("written:", args.out)


if __name__ == "__main__":
    main()
