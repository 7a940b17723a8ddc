"""Checkpoint files under the real tensor names (docs/MODEL.md §7): list, write random, check, load.

    python -m gpu.model.checkpoint list  --config full                 # name<TAB>[shape], sorted
    python -m gpu.model.checkpoint write --config tiny --out tiny.safetensors [--seed N]
    python -m gpu.model.checkpoint check --config tiny --file tiny.safetensors

Loading streams: the header is checked first (every expected name present with its shape, nothing
unexpected except the codec encoder subtree, which is ignored), then the tensors are read one at
a time with `safe_open`, cast to the profile's dtype (§4; integer buffers int32) and moved to the
device before the next is read, so peak host memory is one fp32 tensor beyond the loaded model.
Every problem is reported by name in one error. `list` only reads the configs' shape tables.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.talker.text import CharTable
from gpu.model.voicechat_weights import (IGNORED_PREFIXES, integer_names, load_dtype, param_shapes,
                                         random_weights)


class CheckpointError(ValueError):
    """A checkpoint that does not match the model's layout; the message names every tensor."""


def format_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def layout_problems(found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> list[str]:
    """Missing, unexpected and mis-shaped tensors of a file (name → shape) against the layout."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(n for n in set(found) - set(expected) if not n.startswith(IGNORED_PREFIXES))
    misshaped = sorted(n for n in set(found) & set(expected) if tuple(found[n]) != tuple(expected[n]))
    problems = [f"missing: {n} (expected {format_shape(expected[n])})" for n in missing]
    problems += [f"unexpected: {n} {format_shape(found[n])}" for n in unexpected]
    problems += [f"mis-shaped: {n} is {format_shape(found[n])}, expected {format_shape(expected[n])}"
                 for n in misshaped]
    return problems


def file_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """name → shape from the file's header (no tensor data read)."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt", device="cpu") as f:
        return {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}


def check_file(path: str | Path, cfg: VoiceChatConfig) -> dict[str, tuple[int, ...]]:
    """Raise CheckpointError naming every problem; return the file's name → shape."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    found = file_shapes(path)
    problems = layout_problems(found, param_shapes(cfg))
    if problems:
        kinds = {k: sum(p.startswith(k) for p in problems) for k in ("missing", "unexpected", "mis-shaped")}
        counts = ", ".join(f"{n} {k}" for k, n in kinds.items())
        raise CheckpointError(f"checkpoint {path} does not match the {cfg.name} model ({counts}):"
                              "\n  " + "\n  ".join(problems))
    return found


def load_checkpoint(path: str | Path, cfg: VoiceChatConfig, profile: Profile,
                    device: torch.device | str = "cpu", char_table: CharTable | None = None):
    """A VoiceChat with the file's weights, cast to `profile`'s dtypes on `device`."""
    from safetensors import safe_open
    from gpu.model.voicechat import VoiceChat
    check_file(path, cfg)
    dtype_of = load_dtype(cfg, profile)
    tensors = {}
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for name in sorted(param_shapes(cfg)):
            tensors[name] = f.get_tensor(name).to(device=device, dtype=dtype_of(name))
    model = VoiceChat(cfg, profile, device, char_table)
    model.load(tensors)
    return model


def available_host_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def write_random(path: str | Path, cfg: VoiceChatConfig, seed: int = 0) -> int:
    """Write §8 random weights under the checkpoint names (fp32, integer buffers int32); returns
    the number of elements. Holds the whole model in host memory (~45 GB for `full`)."""
    from safetensors.torch import save_file
    weights = random_weights(cfg, seed)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path), metadata={"config": cfg.name, "seed": str(seed),
                                            "source": "wave random weights (docs/MODEL.md §8)"})
    return sum(t.numel() for t in weights.values())


def _cmd_list(args) -> int:
    cfg = VoiceChatConfig.named(args.config)
    shapes = param_shapes(cfg)
    out = sys.stdout
    for name in sorted(shapes):
        out.write(f"{name}\t{format_shape(shapes[name])}\n")
    total = sum(math.prod(s) for s in shapes.values())
    print(f"{len(shapes)} tensors, {total:,} elements ({len(integer_names(cfg))} integer buffers)",
          file=sys.stderr)
    return 0


def _cmd_write(args) -> int:
    cfg = VoiceChatConfig.named(args.config)
    need, have = 4 * sum(math.prod(s) for s in param_shapes(cfg).values()), available_host_memory()
    if have is not None and need > have:
        print(f"writing the {cfg.name} checkpoint holds {need / 1e9:.1f} GB in memory; "
              f"{have / 1e9:.1f} GB are available", file=sys.stderr)
        return 1
    n = write_random(args.out, cfg, args.seed)
    print(f"wrote {args.out}: {len(param_shapes(cfg))} tensors, {n:,} elements, seed {args.seed}")
    return 0


def _cmd_check(args) -> int:
    cfg = VoiceChatConfig.named(args.config)
    try:
        found = check_file(args.file, cfg)
    except (CheckpointError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 1
    ignored = sum(1 for n in found if n.startswith(IGNORED_PREFIXES))
    print(f"ok: {args.file} matches the {cfg.name} model ({len(found) - ignored} tensors"
          + (f", {ignored} codec-encoder tensors ignored" if ignored else "") + ")")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpu.model.checkpoint", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("list", "print every tensor name and shape"),
                           ("write", "write a random checkpoint"), ("check", "check a file's layout")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--config", choices=("full", "tiny"), default="tiny")
        if name == "write":
            p.add_argument("--out", required=True)
            p.add_argument("--seed", type=int, default=0)
        if name == "check":
            p.add_argument("--file", required=True)
    args = ap.parse_args(argv)
    return {"list": _cmd_list, "write": _cmd_write, "check": _cmd_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
