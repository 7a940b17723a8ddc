"""Curves over a call from `bench/fidelity.py` results: the thinker's SSM state error, the KL of
the thinker's and the talker's token distributions, and the codec's PCM error, against session
time, one line per result (an option each).

    python3 bench/fidelity_plot.py bench/results/fidelity-ssm16-5min-h100.json --out docs/fidelity-ssm16-5min.png
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FRAME_S = 0.08
FLOOR = 1e-12        # a log axis shows an exact 0 here
PANELS = (   # (title, where in a result, key)
    ("thinker SSM state, rel. error (max)", "quantities", "thinker.ssm", "rel_max_by_frame"),
    ("thinker text KL, nats (mean)", "kl", "thinker.text", "mean_by_frame"),
    ("talker mixture KL, nats (mean)", "kl", "talker.mixture", "mean_by_frame"),
    ("codec PCM, rel. error (max)", "quantities", "codec.pcm", "rel_max_by_frame"),
)


def plot(results: list[dict], path: str) -> list[str]:
    """Writes the PNG; returns the titles of the panels drawn."""
    import matplotlib
    matplotlib.use("Agg")               # files only: no display
    import matplotlib.pyplot as plt
    # a thinker-only run has no talker or codec: a panel no result has is left out
    panels = [p for p in PANELS if any(p[2] in res[p[1]] for res in results)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.2 * len(panels)), sharex=True,
                             squeeze=False)
    axes = axes[:, 0]
    for ax, (title, part, name, key) in zip(axes, panels):
        zero = []
        for res in results:
            if name not in res[part]:
                continue
            ys = res[part][name][key]
            label = f"{res['profile']} vs {res['reference_profile']}"
            if not any(ys):                 # identical: nothing to draw on a log axis
                zero.append(label)
                continue
            step = res.get("window", 1) * FRAME_S / 60
            xs = [(i + 0.5) * step for i in range(len(ys))]
            ax.plot(xs, [max(y, FLOOR) for y in ys], lw=1, label=label)
        ax.set_title(title + ("".join(f"; {z}: identical" for z in zero)), fontsize=9)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("session time, minutes (teacher-forced)")
    if axes[0].lines:
        axes[0].legend(fontsize=8)
    r = results[0]
    fig.suptitle(f"{r['config']} config, {r['sessions']} sessions x {r['frames']} frames, "
                 f"{r.get('device_name', r['device'])}", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [p[0] for p in panels]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="fidelity JSON files")
    ap.add_argument("--out", required=True, help="PNG path")
    args = ap.parse_args(argv)
    plot([json.loads(Path(p).read_text()) for p in args.results], args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
