"""`python -m chaos.run [--short|--long] [--seed N] [--out DIR]`: the chaos suite, end to end.

    python -m chaos.run --short          # well under a minute; what tests/chaos runs
    python -m chaos.run --long           # a few minutes, progress every 10 s (`make chaos`)
    python -m chaos.run --soak 30        # 30 minutes at capacity: memory and files sampled
    python -m chaos.run --soak 30 --steal      # and peers under the victims' identities

Starts a node (`--backend sim`, TCP) and the Realtime bridge as subprocesses (a crash is a dead
process, not a swallowed exception), and the SIP bridge too where `chaos.sip_fuzz` exists. A few
*victims*, each its own `NodeClient`, stream 80 ms frames of 16 kHz audio in real time, some
through a `Relay` that resets, refuses, delays and drops their TCP connections on a schedule.
Meanwhile the fuzzers run against the node (its victims' session ids and direct victims'
routing identities among their targets), the Realtime bridge and the SIP bridge, in rounds of
fresh seeds until the plan's time is up. A soak also holds the node at capacity with calls that
come and go on other lines (`soak.Churn`). Then every victim closes its session and the figures
are printed and written to `--out` (default bench/results/) as chaos-<short|long|soak>.json:

  messages tried        every message the fuzzers sent
  errors answered       the `error`/`refused` answers (SIP: responses) they got back
  crashes               node or bridge processes that died during the run
  sessions lost         victim sessions that ended without their own `close` (closed by the
                        node, unknown to it, or its close unconfirmed)
  frames unaccounted    per victim |frames sent - closed.frames_in - closed.dropped|, summed
                        (`dropped_in` for `dropped` where the node reports input drops apart);
                        a victim without `closed` stats counts every frame it sent
  out of order          audio a victim received with a seq not above the one before
  rounds failed         fuzz rounds that hung or whose fuzzer raised (a surface left unfuzzed)
  rss growth mb         (a soak) the most any process's resident memory grew after its warm-up
  churn failed          (a soak) 1 when the churning callers could not report every call closed

The exit status is 1 when crashes, sessions lost, frames unaccounted, out of order or rounds
failed is not 0, or a soak's memory grew past `soak.RSS_GROWTH_MB` or its churn failed.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib
import json
import socket
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path


from chaos import ws_fuzz, zmq_fuzz
from chaos.relay import Relay
from chaos.victims import FORMATS, Victim, VictimRun
from chaos.soak import NODE_SLOTS, RSS_GROWTH_MB, Churn, Resources, soak_plan
from wave_actors.bench.results import git_commit

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Plan:
    name: str
    seconds: float            # victims stream this long at least (longer if a round overruns)
    victims: int
    relayed: int              # victims connected through the relay
    zmq_round: int            # messages per fuzz round, per surface
    ws_round: int
    sip_round: int
    relay_cycle_s: float      # one reset / delay / refuse+reset / drop cycle this often
    progress_s: float | None
    slow_readers: int = 0     # victims that stop reading 2 s in every 20
    sample_s: float | None = None   # memory and open files sampled this often
    churn_lines: int = 0      # lines of calls coming and going (the node held at capacity)
    churn_mean_s: float = 20.0      # a churning call's mean length
    # fuzzers connect under victims' routing identities: a hostile peer's duplicate identity,
    # which libzmq keeps ~23 KB of for good (docs/FINDINGS.md): on in the short and long runs
    # (nothing may crash or lose a session), off in a soak unless asked (its memory figure is
    # then the node's own)
    steal: bool = True


PLANS = {"short": Plan("short", 12.0, 3, 2, 3000, 800, 40, 10.0, None, churn_lines=4,
                       churn_mean_s=3.0),
         "long": Plan("long", 180.0, 4, 2, 4000, 800, 60, 15.0, 10.0)}


# ---- processes ---------------------------------------------------------------------------------

def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A subprocess with its output in a log file; `died` once it exits before `stop`."""

    def __init__(self, name: str, args: list[str], ready: str, logdir: Path):
        self.name, self.args, self.ready = name, args, ready
        self.log = logdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.stopped_rc: int | None = None

    async def start(self) -> None:
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen([sys.executable, *self.args], cwd=ROOT, stdout=f,
                                         stderr=subprocess.STDOUT)
        loop = asyncio.get_running_loop()
        end = loop.time() + START_TIMEOUT_S
        while loop.time() < end and self.proc.poll() is None:
            if self.ready in self.log.read_text(errors="replace"):
                return
            await asyncio.sleep(0.05)
        self.proc.kill()
        raise RuntimeError(f"{self.name} did not start:\n{self.tail()}")

    @property
    def died(self) -> bool:
        return self.proc is not None and self.stopped_rc is None and self.proc.poll() is not None

    def stop(self) -> dict:
        """SIGTERM (it drains), then SIGKILL past 15 s; what became of it."""
        died = self.died
        if not died:
            self.proc.terminate()
            try:
                self.stopped_rc = self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.stopped_rc = self.proc.wait(5)
        text = self.log.read_text(errors="replace")
        return {"died": died, "rc": self.proc.returncode, "tracebacks": text.count("Traceback"),
                **({"log_tail": self.tail()} if died else {})}

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]


# ---- the run -----------------------------------------------------------------------------------

class Chaos:
    def __init__(self, plan: Plan, seed: int, logdir: Path):
        self.plan, self.seed, self.logdir = plan, seed, logdir
        self.node_port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.node_port}"
        self.procs: dict[str, Proc] = {}
        self.relay = Relay("127.0.0.1", self.node_port)
        self.victims: list[VictimRun] = []
        self.fuzz: dict[str, list[dict]] = {"zmq": [], "ws": [], "sip": []}
        self.sip_fuzz = _optional("chaos.sip_fuzz")
        self.notes: list[str] = []
        self.resources = Resources()
        self.churn: Churn | None = None
        self.churned: dict | None = None

    async def start(self) -> None:
        node = Proc("node", ["-m", "wave_actors.node", "--bind", self.endpoint, "--backend", "sim",
                             "--max-sessions", str(NODE_SLOTS)], "listening", self.logdir)
        await node.start()
        self.procs["node"] = node
        ws_port = free_port()
        self.ws_url = f"ws://127.0.0.1:{ws_port}/v1/realtime"
        bridges = [Proc("realtime", ["-m", "transports.realtime", "--node", self.endpoint,
                                     "--listen", f"127.0.0.1:{ws_port}", "--no-auth"],
                        "listening on", self.logdir)]
        if self.sip_fuzz is not None:
            self.sip_port = free_port(socket.SOCK_DGRAM)
            bridges.append(Proc("sip", ["-m", "transports.sip", "--node", self.endpoint,
                                        "--listen", f"127.0.0.1:{self.sip_port}"],
                                "listening", self.logdir))
        else:
            self.notes.append("SIP skipped: chaos.sip_fuzz is not there")
        for p in bridges:
            await p.start()
            self.procs[p.name] = p
        relay_port = await self.relay.start()
        p = self.plan
        for i in range(p.victims):
            relayed = i < p.relayed
            fmt = FORMATS[i % len(FORMATS)]
            v = Victim(f"victim-{i}", relayed, fmt["format"],
                       slow=p.victims - i <= p.slow_readers)
            port = relay_port if relayed else self.node_port
            self.victims.append(VictimRun(v, f"tcp://127.0.0.1:{port}", fmt))
        await asyncio.gather(*(vr.open() for vr in self.victims))
        if p.churn_lines:
            self.churn = Churn(self.endpoint, p.churn_lines, self.seed, p.churn_mean_s)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.began = loop.time()
        end = self.began + self.plan.seconds
        jobs = [self._rounds("zmq", self._zmq_round, end), self._rounds("ws", self._ws_round, end),
                self._chaos_relay(end)]
        if self.sip_fuzz is not None:
            jobs.append(self._rounds("sip", self._sip_round, end))
        if self.plan.progress_s:
            jobs.append(self._progress(end))
        if self.plan.sample_s:
            jobs.append(self._sample(end))
        await asyncio.gather(*jobs)
        await asyncio.sleep(max(0.0, end - loop.time()))

    async def _rounds(self, name: str, one, end: float) -> None:
        """Fuzz rounds of fresh seeds until the plan's time is up (at least one)."""
        loop = asyncio.get_running_loop()
        n = 0
        while n == 0 or loop.time() < end - 2.0:
            seed = self.seed * 1000 + n
            try:
                self.fuzz[name].append(await asyncio.wait_for(one(seed), 120))
            except asyncio.TimeoutError:
                self.fuzz[name].append({"tried": 0, "hung": True, "seed": seed})
                self.notes.append(f"{name} fuzz round of seed {seed} hung (stopped at 120 s)")
            except Exception as exc:    # the fuzzer's own bug: said, and the run goes on
                self.fuzz[name].append({"tried": 0, "failed": True, "seed": seed})
                self.notes.append(f"{name} fuzz round of seed {seed} failed: {exc!r}")
            n += 1

    async def _zmq_round(self, seed: int) -> dict:
        # The victims' identities as they are now: a victim redials under a fresh one after a
        # silent spell, and the thieves try the new one.
        direct = [vr.client.identity for vr in self.victims
                  if not vr.v.relayed] if self.plan.steal else []
        return await zmq_fuzz.run(self.endpoint, self.plan.zmq_round, seed,
                                  targets=[vr.v.name for vr in self.victims], steal=direct)

    async def _ws_round(self, seed: int) -> dict:
        return await ws_fuzz.run(self.ws_url, self.plan.ws_round, seed)

    async def _sip_round(self, seed: int) -> dict:
        return await self.sip_fuzz.run("127.0.0.1", self.sip_port, self.plan.sip_round, seed)

    async def _chaos_relay(self, end: float) -> None:
        """Per cycle: reset all; 40 ms delay on, then off; refuse 1 s and reset; drop one."""
        loop = asyncio.get_running_loop()
        cycle = self.plan.relay_cycle_s
        steps = ((0.2, lambda r: r.reset()), (0.35, lambda r: r.set_delay(40)),
                 (0.5, lambda r: r.set_delay(0)),
                 (0.6, lambda r: (r.refuse_for(1.0), r.reset())), (0.8, lambda r: r.drop()))
        start = loop.time()
        while True:
            for at, act in steps:
                when = start + at * cycle
                if when > end - 1.0:
                    return
                await asyncio.sleep(max(0.0, when - loop.time()))
                act(self.relay)
            start += cycle

    async def _sample(self, end: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            pids = {n: p.proc.pid for n, p in self.procs.items() if not p.died}
            self.resources.sample(loop.time() - self.began, pids)
            if loop.time() + self.plan.sample_s > end:
                return
            await asyncio.sleep(self.plan.sample_s)

    async def _progress(self, end: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < end:
            await asyncio.sleep(self.plan.progress_s)
            vs = ", ".join(f"{vr.v.name} {vr.v.sent}>{vr.v.audio_in}"
                           f"{' LOST' if vr.v.lost else ''}" for vr in self.victims)
            rounds = {k: len(v) for k, v in self.fuzz.items() if v}
            dead = [n for n, p in self.procs.items() if p.died]
            print(f"[{loop.time() - self.began:5.0f} s] victims (frames out>in) {vs}; fuzz rounds "
                  f"{rounds}; relay resets {self.relay.stats['resets']}; "
                  f"dead {dead or 'none'}", flush=True)

    async def finish(self) -> None:
        if self.churn is not None:
            self.churned = await self.churn.finish()
        await asyncio.gather(*(vr.close() for vr in self.victims))
        await self.relay.close()

    def stop_procs(self) -> dict:
        return {name: p.stop() for name, p in self.procs.items()}


def _optional(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


# ---- figures -----------------------------------------------------------------------------------

def figures(ch: Chaos, procs: dict) -> dict:
    rounds = [r for runs in ch.fuzz.values() for r in runs]
    victims = [vr.v for vr in ch.victims]
    return {"messages_tried": sum(r.get("tried", 0) for r in rounds),
            "errors_answered": sum(r.get("answered", 0) for r in rounds),
            "crashes": sum(p["died"] for p in procs.values()),
            "sessions_lost": sum(v.lost is not None for v in victims),
            "frames_unaccounted": sum(abs(v.unaccounted) for v in victims),
            "out_of_order": sum(v.out_of_order for v in victims),
            # rounds that hung or whose fuzzer failed: a surface not fuzzed is no pass
            "rounds_failed": sum(bool(r.get("failed") or r.get("hung")) for r in rounds),
            **({"churn_failed": int("failed" in ch.churned)} if ch.churned is not None else {}),
            **({"rss_growth_mb": ch.resources.worst_rss_growth_mb()} if ch.plan.sample_s
               else {})}


def summarise(runs: list[dict]) -> dict:
    """Rounds of one fuzzer added up (numbers and dicts of numbers), with the round count."""
    total: dict = {"rounds": len(runs)}
    for r in runs:
        for k, v in r.items():
            if isinstance(v, bool) or k == "seed":
                total[k] = total.get(k) or v
            elif isinstance(v, (int, float)):
                total[k] = round(total.get(k, 0) + v, 2)
            elif isinstance(v, dict):
                d = total.setdefault(k, {})
                for kk, vv in v.items():
                    if isinstance(vv, (int, float)):
                        d[kk] = d.get(kk, 0) + vv
    return total


async def main_async(plan: Plan, seed: int, logdir: Path) -> tuple[dict, Chaos, dict]:
    ch = Chaos(plan, seed, logdir)
    procs: dict = {}
    try:
        await ch.start()
        print(f"chaos {plan.name}: node {ch.endpoint}, realtime {ch.ws_url}, "
              f"{plan.victims} victims ({plan.relayed} through the relay), {plan.seconds:g} s",
              flush=True)
        try:
            await ch.run()
        finally:
            await ch.finish()
    finally:
        procs = ch.stop_procs()
    return figures(ch, procs), ch, procs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--short", dest="plan", action="store_const", const="short")
    mode.add_argument("--long", dest="plan", action="store_const", const="long")
    mode.add_argument("--soak", type=float, metavar="MINUTES",
                      help="run this long, sampling memory and open files")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steal", action=argparse.BooleanOptionalAction, default=None,
                    help="fuzzers connect under the victims' routing identities (default: in "
                         "the short and long runs, not in a soak: libzmq keeps ~23 KB of each "
                         "such connection, so a soak's memory growth would not be the node's)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"),
                    help="folder for chaos-<short|long|soak>.json")
    args = ap.parse_args(argv)
    try:
        plan = soak_plan(Plan, args.soak) if args.soak else PLANS[args.plan or "short"]
    except ValueError as exc:
        ap.error(str(exc))
    if args.steal is not None:
        plan = replace(plan, steal=args.steal)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        figs, ch, procs = asyncio.run(main_async(plan, args.seed, Path(tmp)))
    grew = figs.get("rss_growth_mb")
    ok = not (figs["crashes"] or figs["sessions_lost"] or figs["frames_unaccounted"]
              or figs["out_of_order"] or figs["rounds_failed"] or figs.get("churn_failed")
              or (grew is not None and grew > RSS_GROWTH_MB))
    result = {
        "chaos": {"mode": plan.name, "seed": args.seed, **figs, "ok": ok},
        "plan": asdict(plan),
        "fuzzers": {k: summarise(v) for k, v in ch.fuzz.items() if v},
        "victims": [{**asdict(vr.v), "unaccounted": vr.v.unaccounted} for vr in ch.victims],
        "relay": ch.relay.stats, "processes": procs, "notes": ch.notes,
        **({"churn": ch.churned} if ch.churned is not None else {}),
        **({"resources": ch.resources.growth(), "samples": ch.resources.series}
           if plan.sample_s else {}),
        "command": " ".join(["python -m chaos.run", *(argv if argv is not None else sys.argv[1:])]),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = Path(args.out) / f"chaos-{plan.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    for key, value in figs.items():
        print(f"{key.replace('_', ' '):20s} {value}")
    for v in ch.victims:
        vv = v.v
        print(f"  {vv.name} ({'relay' if vv.relayed else 'direct'}): sent {vv.sent}, stats "
              f"{vv.stats}, errors {vv.errors}, resumes {vv.resumes}, unaccounted "
              f"{vv.unaccounted}{', lost: ' + vv.lost if vv.lost else ''}")
    for note in ch.notes:
        print(f"note: {note}")
    print(f"{'ok' if ok else 'FAILED'}; wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
