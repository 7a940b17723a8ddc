"""What the bench prints of each run as it ends: the headline, each window, the worst beats,
the opens, the host's share and the calls, read off the run's `RunResult`."""
from __future__ import annotations

from wave_actors.bench.records import _worst
from wave_actors.bench.results import RunResult
from wave_actors.core.frames import BEAT_S


def print_run(args, n: int, r: int, res: RunResult) -> None:
    """Run r of the N-session measurement, as it ended."""
    print(f"  N={n:4d} run {r + 1}/{args.runs}: p50 {res.p50_ms:7.2f} ms  p99 "
          f"{res.p99_ms:7.2f} ms  late {res.late_beats:3d}/{res.beats} (all beats)  "
          f"underruns {res.underruns}  dropped {res.dropped}  (backend p50 "
          f"{res.compute_p50_ms:.1f} / p99 {res.compute_p99_ms:.1f} ms, measured beats)",
          flush=True)
    print(f"           by window: {_by_window(res.windows)}", flush=True)
    if res.first_frame and res.first_frame["p99"] < res.p99_ms:
        f = res.first_frame
        print(f"           first frame routed {f['p50']:.2f} / {f['p99']:.2f} ms after the "
              f"release (p50 / p99), while the second computes", flush=True)
    if res.trace.get("latency_ms"):
        print(f"           worst beats: {_worst(res.trace)}", flush=True)
    if res.outside and res.outside[0]["latency_ms"] > 1e3 * BEAT_S:
        b = res.outside[0]
        print(f"           worst {b['window']} beat: {b['latency_ms']} ms (backend "
              f"{b['compute_ms']}, after {b['after_ms']}, {b['sessions']} live)", flush=True)
    print(f"           {res.opens} sessions opened, waiting {res.open_p50_ms:.0f} ms at p50 / "
          f"{res.open_p99_ms:.0f} ms at p99 / {res.open_max_ms:.0f} ms at most for `opened` "
          f"(their start on the model)"
          + (f"; refused by reason: {res.refusals_by_reason}" if res.refusals else ""),
          flush=True)
    if res.burst:
        b = res.burst
        print(f"           burst of {b['sessions']}: {b['opened']} opened, waiting "
              f"{b['open_p50_ms']:.0f} / {b['open_p99_ms']:.0f} / {b['open_max_ms']:.0f} ms "
              f"(p50 / p99 / max) for `opened`; {b['refused']} refused", flush=True)
    if res.host:
        _print_host(res.host)
    if res.ramp:
        rp = res.ramp
        print(f"           ramp: {rp['beats']} beats before the measured ones (start-only "
              f"beats too), backend "
              f"{rp['compute_ms']['p50']:.1f} / {rp['compute_ms']['p99']:.1f} / "
              f"{rp['compute_ms']['max']:.1f} ms; slowest: "
              + "  ".join(f"{b['compute_ms']:.0f} ms @{b['beat']} ({b['sessions']} live, "
                          f"{b['rows']} rows, {b['resets']} resets, {b['rolls']} rolls)"
                          for b in rp["slowest"][:4]), flush=True)
    if res.live:
        print(f"           live sessions in the measured beats: {res.live['min']} to "
              f"{res.live['max']} (p50 {res.live['p50']:.0f}) of {res.live['offered']} "
              f"offered", flush=True)
    if res.deadlines:
        d = res.deadlines
        load = (f" ({d['offered_erlangs']} Erlangs)" if d["offered_erlangs"] is not None
                else "")
        print(f"           calls: {d['calls']} offered{load}, "
              f"{d['blocked']} blocked ({100 * d['blocking']:.2f} %), "
              f"{d['calls_with_late_beats']} heard a late beat in their whole life "
              f"(longest run {d['longest_late_run_beats']} beats); "
              f"{d['glitch_s_per_call_hour']} glitch-seconds a call-hour; open wait p50 / p99 "
              f"{d['open_wait'].get('p50_ms')} / {d['open_wait'].get('p99_ms')} ms",
              flush=True)
    if res.open_phases:
        print("           of it in the node (p50 / p99 ms): " + ", ".join(
            f"{k} {v.get('p50')} / {v.get('p99')}" for k, v in res.open_phases.items()),
            flush=True)
    if res.backlog_ms > 1000 * BEAT_S and not args.workload:
        print(f"           the measured beats began {res.backlog_ms / 1000:.2f} s behind the "
              f"release schedule: the node was still behind after {args.warmup_max} beats of "
              f"warm-up (a start-up backlog not drained yet, or beats slower than "
              f"{1000 * BEAT_S:.0f} ms; a larger --warmup-max waits longer for a backlog)",
              flush=True)


def _print_host(h: dict) -> None:
    """The host's share of the measured beats: waking, before and after the executor, CPU."""
    print(f"           host: the loop woke for the release {h['wake_ms']['p50']:.1f} / "
          f"{h['wake_ms']['p99']:.1f} / {h['wake_ms']['max']:.1f} ms late (p50 / p99 / "
          f"max); release to executor p99 {h['before_ms']['p99']:.1f} ms; executor done "
          f"to outputs routed p99 {h['after_ms']['p99']:.1f} ms; both p99 "
          f"{h['before_after_ms']['p99']:.1f} ms", flush=True)
    print(f"           CPU a beat: the loop's thread {h['loop_cpu_ms']['p50']:.1f} / "
          f"{h['loop_cpu_ms']['p99']:.1f} ms (p50 / p99; "
          f"{h['loop_cpu_us_per_session']:.0f} µs a live session), the process "
          f"{h['process_cpu_ms']['p50']:.1f} / {h['process_cpu_ms']['p99']:.1f} ms, "
          f"of it the executor's own {h['executor_cpu_ms']['p50']:.1f} ms",
          flush=True)
    pc = h.get("processes") or {}
    if pc.get("workers"):
        print(f"           processes: {pc['workers']} session workers "
              f"{pc['worker_cpu_us_per_session_beat']} µs a session a beat; the front "
              f"{pc['front_cpu_ms_per_beat']} ms a beat, the engine "
              f"{pc['engine_cpu_ms_per_beat']} ms a beat", flush=True)
    for st in h.get("stalls", [])[:3]:
        top = st["stacks"][0] if st["stacks"] else {"samples": 0, "frames": []}
        print(f"           stall: woke {st['late_ms']:.1f} ms late; {top['samples']} of "
              f"{st['samples']} samples in " + " <- ".join(top["frames"][:3]), flush=True)


def _by_window(windows: dict) -> str:
    """'ramp 40 beats, 2 late, p99 171.0 ms; measured ...': each window of a run."""
    def one(name: str) -> str:
        w = windows.get(name) or {"beats": 0}
        if not w["beats"]:
            return f"{name} 0 beats"
        return (f"{name} {w['beats']} beats, {w['late_beats']} late, p50 / p99 "
                f"{w['p50_ms']:.1f} / {w['p99_ms']:.1f} ms")
    return "; ".join(one(k) for k in ("ramp", "measured", "drain"))
