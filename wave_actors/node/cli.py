"""`python -m wave_actors.node`: serve the wire protocol until stopped, or run the demo.

    python -m wave_actors.node --bind tcp://127.0.0.1:5555 --backend sim --max-sessions 64
    python -m wave_actors.node --demo            # what `make run` does

The demo starts the node and a few conversations streamed from the bundled WAV through the real
ZMQ socket, shows a live status line, writes each reply to out/demo-reply-N.wav and ends with a
summary after --demo-seconds.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import signal
import sys
from pathlib import Path

from wave_actors.core.sched.clock_policy import ClockPolicy
from transports import protocol as P
from wave_actors.core.contract import ExecutorOptions, SessionSpec
from wave_actors.core.policy_spec import PolicyError, make_policy
from wave_actors.core.timebase import Clock, new_loop
from wave_actors.core.registry import (NAMES, SERVING_PROFILES, described, entry,
                                       make_executor)
from wave_actors.engine.host import EngineHost
from wave_actors.engine.process import ExecutorSpec
from wave_actors.node.config import NodeConfig
from wave_actors.node.node import Node
from wave_actors.engine.serving_process import serving_process

CPU_SLOTS = 8          # slots of a node on an executor that does not size its own
DEMO_WAV = Path(__file__).resolve().parents[2] / "assets" / "demo_user.wav"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m wave_actors.node", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    _model_args(ap)
    _session_args(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demo", action="store_true", help="serve demo conversations, then stop")
    ap.add_argument("--demo-sessions", type=int, default=2)
    ap.add_argument("--demo-seconds", type=float, default=20.0)
    ap.add_argument("--demo-wav", default=str(DEMO_WAV))
    ap.add_argument("--out", default="out")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    _check(ap, args)
    return args


def _model_args(ap: argparse.ArgumentParser) -> None:
    """Where the node listens and what it serves: backend, slots, model, context, weights."""
    ap.add_argument("--bind", default="tcp://127.0.0.1:5555")
    ap.add_argument("--backend", choices=NAMES, default=default_backend(), help=described())
    ap.add_argument("--max-sessions", type=int,
                    help="slots: callers served at once (default: on a GPU backend, what the "
                         "device serves on time, from its memory and its measured beat; "
                         f"otherwise {CPU_SLOTS})")
    ap.add_argument("--profile", default="reference",
                    choices=SERVING_PROFILES,
                    help="precision profile (docs/MODEL.md): dense-ssm16 is dense with its "
                         "Mamba SSM state stored in bf16 (dense-ssm16-sr: rounded "
                         "stochastically); dense-compact is dense-ssm16-sr with the talker's "
                         "KV in fp8")
    ap.add_argument("--config", choices=("tiny", "full"),
                    help="model size (default: full on a GPU backend, tiny on the cpu one)")
    ap.add_argument("--snapshot-mb", type=float, default=-1.0,
                    help="memory for prompt snapshots: a session whose prompt was seen starts "
                         "by one copy, not a prefill (default: the backend's, 500 on a GPU; "
                         "0: every start prefills)")
    ap.add_argument("--warm-prompt", action="append", default=[], metavar="TEXT",
                    help="instructions whose prompt the node starts before it serves, so its "
                         "first callers start from a snapshot (repeat it for more; the empty "
                         "prompt is always warmed unless --no-warm)")
    ap.add_argument("--warm-prompts", metavar="FILE",
                    help="JSON: a list of {\"instructions\": ..., \"tools\": [...]} as callers "
                         "send them in `open`, warmed as --warm-prompt")
    ap.add_argument("--no-warm", action="store_true",
                    help="warm no prompt: every prompt's first caller prefills it")
    ap.add_argument("--max-context", type=int, default=1500,
                    help="frames of attention context each slot holds; a longer call rolls its "
                         "oldest frames out (its prompt stays) and talks on")
    ap.add_argument("--context-roll", type=int, default=0,
                    help="frames one roll drops (a multiple of 2; 0: an eighth of --max-context)")
    ap.add_argument("--start-rows", type=int, default=0,
                    help="starting sessions each beat advances by one prompt chunk (0: the "
                         "backend's default; the graph backend captures its beats with them)")
    ap.add_argument("--gpu-share", type=_share, default=1.0,
                    help="a GPU node's share of its GPU, as 0.5 or 1/2, where nodes share one "
                         "(the fleet's --per-gpu sets it): it sizes its slots within that share "
                         "of the device's memory and of the beat (default 1: the whole GPU)")
    ap.add_argument("--checkpoint", help="safetensors file under the real tensor names")
    ap.add_argument("--tokenizer", help="tokenizer.json of the text tokenizer")
    ap.add_argument("--cost-model", help="sim: JSON of cost-model parameters")
    ap.add_argument("--context-offset", type=int, default=0,
                    help="sim: model every session as already holding this many frames")


def _share(text: str) -> float:
    """A share of a GPU: a number (0.5) or a fraction (1/2), more than 0 and at most 1."""
    try:
        num, _, den = text.partition("/")
        share = float(num) / float(den) if den else float(num)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a share such as 0.5 or 1/2, got {text!r}") \
            from None
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"a share of one GPU is more than 0 and at most 1, "
                                         f"not {text!r}")
    return share


def _session_args(ap: argparse.ArgumentParser) -> None:
    """Keys, metrics, workers and what a session is allowed: timeouts, input, start policy."""
    ap.add_argument("--curve-keys", help="directory with server.key_secret and clients/*.key")
    ap.add_argument("--metrics-port", type=int)
    ap.add_argument("--report-sessions", action="store_true",
                    help='print {"opened": SESSION} and {"closed": SESSION} lines as sessions '
                         'open and end (a fleet\'s node actor reads them: a call whose bridge '
                         'died frees its slot)')
    ap.add_argument("--workers", type=_workers, default="auto",
                    help="session worker processes, the clock and executor then in a process "
                         "of their own (0: every session on the node's own loop; default "
                         f"auto: a worker for every {CORES_PER_WORKER} cores, at most "
                         f"{MAX_AUTO_WORKERS}, none below {CORES_PER_WORKER * 2} cores)")
    d = NodeConfig()
    ap.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s,
                    help="s: a session that hears nothing of its own this long is closed")
    ap.add_argument("--heartbeat", type=float, default=d.heartbeat_s,
                    help=f"s: clients send something this often; {d.heartbeat_liveness} missed "
                         f"detach their sessions (docs/PROTOCOL.md)")
    ap.add_argument("--resume-grace", type=float, default=d.resume_grace_s,
                    help="s: a detached session waits this long for `resume`")
    ap.add_argument("--input-hold", type=float, default=d.input_hold_s,
                    help="s: input a session may send ahead of real time, held for the model "
                         "(it hears in real time); past it frames are dropped, counted, and "
                         "`input_overflow` sent")
    ap.add_argument("--prebuffer", type=int, default=ClockPolicy().prebuffer,
                    help="frames queued before a session starts consuming")
    ap.add_argument("--policy", nargs="+", metavar="WORD",
                    help="start policy: guarded | eager | budgeted | headroom | forecast | module:Class, "
                         "then key=value "
                         "parameters (default: guarded: start rows and snapshot copies only where "
                         "the beat has room for them)")


def _check(ap: argparse.ArgumentParser, args) -> None:
    """Defaults that depend on the backend, flags out of range, the policies built."""
    if args.config is None:
        args.config = "full" if entry(args.backend).caps.device else "tiny"
    if not (args.snapshot_mb >= 0 or args.snapshot_mb == -1):
        ap.error("--snapshot-mb must be 0 or more (or -1, the backend's default)")
    if args.max_sessions is not None and args.max_sessions < 1:
        ap.error("--max-sessions must be at least 1 (leave it out for a GPU backend to size "
                 "its slots)")
    if args.demo and args.demo_sessions > (args.max_sessions or CPU_SLOTS):
        ap.error("--demo-sessions must not exceed --max-sessions")
    try:
        args.warm = warm_specs(args)
    except ValueError as exc:
        ap.error(str(exc))
    try:
        args.start_policy = make_policy(args.policy) if args.policy else None
        args.clock_policy = ClockPolicy(prebuffer=args.prebuffer)
        NodeConfig(idle_timeout_s=args.idle_timeout, heartbeat_s=args.heartbeat,
                   resume_grace_s=args.resume_grace, workers=args.workers,
                   input_hold_s=args.input_hold)
    except (PolicyError, ValueError) as exc:
        ap.error(str(exc))


def warm_specs(args) -> tuple[SessionSpec, ...]:
    """The prompts the node warms (`node/warm.py`): the empty one, each --warm-prompt, each
    entry of --warm-prompts; none with --no-warm. Each is checked as an `open`'s fields are."""
    if args.no_warm:
        if args.warm_prompt or args.warm_prompts:
            raise ValueError("--no-warm with --warm-prompt or --warm-prompts: choose one")
        return ()
    entries = [{"instructions": text} for text in args.warm_prompt]
    if args.warm_prompts:
        try:
            listed = json.loads(Path(args.warm_prompts).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--warm-prompts {args.warm_prompts}: {exc}") from None
        if not isinstance(listed, list):
            raise ValueError(f"--warm-prompts {args.warm_prompts}: expected a JSON list of "
                             "{\"instructions\": ..., \"tools\": [...]} objects")
        entries += listed
    specs = [SessionSpec()]
    for i, entry in enumerate(entries, 1):
        try:
            spec = open_fields(entry)
        except P.ProtocolError as exc:
            raise ValueError(f"warm prompt {i}: {exc.message}") from None
        if spec not in specs:
            specs.append(spec)
    return tuple(specs)


def open_fields(entry) -> SessionSpec:
    """A warm prompt's {"instructions", "tools"}, checked as an `open`'s."""
    if not isinstance(entry, dict) or set(entry) - {"instructions", "tools"}:
        raise P.ProtocolError(P.BAD_HEADER, "expected an object with only \"instructions\" "
                                            "and \"tools\"")
    fields = dict(entry)
    P.check_prompt_fields(fields)
    return SessionSpec(fields["instructions"], fields["tools"])


def default_backend() -> str:
    """The embedded default: the reference model on the CPU where it is installed."""
    return "cpu" if importlib.util.find_spec("torch") is not None else "sim"


def slots_asked(args) -> int:
    """--max-sessions, else 0 on a device backend (it sizes its slots), else CPU_SLOTS."""
    if args.max_sessions is not None:
        return args.max_sessions
    return 0 if entry(args.backend).caps.device else CPU_SLOTS


CORES_PER_WORKER = 4     # a worker, the front, the engine and callers' bridges share the cores
MAX_AUTO_WORKERS = 4


def auto_workers(cores: int | None) -> int:
    """Workers for a machine of `cores`: none on a small one (a worker process there only
    competes with the node's own), else a worker for every CORES_PER_WORKER cores."""
    cores = cores or 1
    if cores < 2 * CORES_PER_WORKER:
        return 0
    return min(MAX_AUTO_WORKERS, cores // CORES_PER_WORKER)


def _workers(text: str) -> int:
    if text == "auto":
        return auto_workers(os.cpu_count())
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count or auto, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return n


def slots_line(facts: dict, args) -> str:
    """How the node's slot count was decided, for the operator."""
    slots = facts.get("slots")
    if not slots:
        how = "--max-sessions" if args.max_sessions is not None else "the default"
        return f"slots: {facts['max_sessions']} ({how})"
    return f"slots: {sized_slots(slots)}"


def sized_slots(slots: dict) -> str:
    """A device executor's `describe()["slots"]` in words: the count, how it was decided and
    the measured beats it rests on."""
    return (f"{slots['sessions']}, by {slots['decided_by']}; device memory holds "
            f"{slots['memory_ceiling']}; beat at full context (ms by sessions): "
            f"{slots['beat_ms_at_context']}, budget {slots['budget_ms']} ms")


def build(args) -> Node:
    opts = ExecutorOptions(max_sessions=slots_asked(args), profile=args.profile,
                           config=args.config, max_context=args.max_context,
                           context_offset=args.context_offset, context_roll=args.context_roll,
                           cost_model=args.cost_model, checkpoint=args.checkpoint,
                           tokenizer=args.tokenizer, seed=args.seed, start_rows=args.start_rows,
                           snapshot_mb=args.snapshot_mb, gpu_share=args.gpu_share)
    clock = Clock()
    if args.workers:
        # The executor is built in the engine process (progress logged while a GPU model
        # builds); the node drives it there and `serve` closes it.
        executor = EngineHost(ExecutorSpec(args.backend, opts)).start()
    else:
        executor = make_executor(args.backend, opts, clock)
    cfg = NodeConfig(bind=args.bind, max_sessions=executor.max_sessions,
                     clock_policy=args.clock_policy, start_policy=args.start_policy,
                     idle_timeout_s=args.idle_timeout, heartbeat_s=args.heartbeat,
                     resume_grace_s=args.resume_grace, curve_keys=args.curve_keys,
                     metrics_port=args.metrics_port, keep_records=False,
                     workers=args.workers, input_hold_s=args.input_hold,
                     warm_prompts=args.warm)
    return Node(cfg, executor, clock)


def status_line(st: dict) -> str:
    return (f"sessions {st['sessions']:3d} | beats {st['beats']:6d} | p50 {st['p50_ms']:6.1f} ms"
            f" | p99 {st['p99_ms']:6.1f} ms | late {st['late_beats']} | underruns "
            f"{st['underruns']} | dropped {st['dropped']} | refused {st['refusals']}")


async def show_status(node: Node, every: float = 0.5) -> None:
    tty = sys.stdout.isatty()
    n = 0
    while True:
        await asyncio.sleep(every)
        n += 1
        line = status_line(node.status())
        if tty:
            print("\r" + line, end="", flush=True)
        elif n % 4 == 0:
            print(line, flush=True)


async def serve(args) -> int:
    node = build(args)
    try:
        await node.start()
        with serving_process():          # the model, its state and its graphs are built
            return await _serve(node, args)
    finally:
        if node.engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, node.engine.close)


async def _serve(node: Node, args) -> int:
    facts = node.describe()
    print(json.dumps({"listening": node.endpoint, "gpu_share": args.gpu_share, **facts}),
          flush=True)
    if args.report_sessions:
        node.session_listeners.append(
            lambda event, session: print(json.dumps({event: session}), flush=True))
    print(slots_line(facts, args), file=sys.stderr, flush=True)
    if args.gpu_share < 1 and not entry(args.backend).caps.device:
        print(f"--gpu-share {args.gpu_share:g}: the {args.backend} backend has no GPU to share; "
              "it changes nothing here", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    status = loop.create_task(show_status(node, 1.0))
    demo_failed = None
    if args.demo:
        from wave_actors.node.demo import run_demo
        demo = loop.create_task(run_demo(node.endpoint, args))
        await asyncio.wait([demo, loop.create_task(stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if not demo.done():                 # stopped first: the demo's calls end with it
            demo.cancel()
            await asyncio.gather(demo, return_exceptions=True)
        elif (exc := demo.exception()) is not None:    # a demo call failed: `make run` must say so
            demo_failed = f"{type(exc).__name__}: {exc}"
    else:
        await asyncio.wait([loop.create_task(stop.wait()),
                            loop.create_task(node.stopped.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
    status.cancel()
    final = status_line(node.status())
    print("\ndraining…", flush=True)
    await node.drain()
    print(final, flush=True)
    if node.failed:
        print(f"node: {node.failed}", file=sys.stderr, flush=True)
        return 1
    if demo_failed:
        print(f"demo: a call failed: {demo_failed}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    loop = new_loop()
    asyncio.set_event_loop(loop)
    try:
        sys.exit(loop.run_until_complete(serve(args)))
    except (OSError, MemoryError, RuntimeError, ValueError) as exc:
        # A configuration that cannot run here (no GPU, too big, port taken): say why, once.
        sys.exit(f"node: {exc}")
    finally:
        loop.close()
