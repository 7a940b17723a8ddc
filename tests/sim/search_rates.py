"""How often a fresh property search finds each planted bug: the property tests of
`tests/sim/test_invariants.py` run as they are (hypothesis, no example database) on the code
with one bug planted, `--searches` times each; a search that fails has found it.

    python -m tests.sim.search_rates [--searches 10] [--only NAME] [--json OUT]

The mutation tests (`test_mutations.py`) plant the same bugs and check each on one input that
reaches it; this measures whether the search alone would have found it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import pytest

from tests.sim import test_invariants as inv
from tests.sim.test_mutations import newest_first
from wave_actors.core.reorder import SkipLedger
from wave_actors.core.sched.start_queue import StartQueue
from wave_actors.bench.provenance import provenance


# name → (what to patch, its buggy stand-in, the property test that should find it)
PLANTED = {
    "a skipped seq counted twice": ((SkipLedger, "take", lambda self, seq: None),
                                    inv.test_every_frame_sent_is_heard_or_counted),
    "newest start served first": ((StartQueue, "plan", newest_first),
                                  inv.test_opened_within_the_beats_its_start_shape_needs),
}


def found_by_search(name: str) -> bool:
    (owner, attr, bug), prop = PLANTED[name]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(owner, attr, bug)
        try:
            prop()
        except Exception:
            return True
    return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--searches", type=int, default=10)
    ap.add_argument("--only", choices=sorted(PLANTED))
    ap.add_argument("--json", metavar="OUT", help="write the counts here")
    args = ap.parse_args(argv)
    rows = []
    for name in [args.only] if args.only else PLANTED:
        t0 = time.perf_counter()
        hits = sum(found_by_search(name) for _ in range(args.searches))
        took = time.perf_counter() - t0
        rows.append({"bug": name, "found": hits, "searches": args.searches,
                     "property": PLANTED[name][1].__name__, "seconds": round(took, 1)})
        print(f"{name}: found in {hits} of {args.searches} fresh searches ({took:.0f} s)",
              flush=True)
    if args.json:
        prov = provenance()
        Path(args.json).write_text(json.dumps({
            "command": "python -m tests.sim.search_rates " + " ".join(sys.argv[1:]),
            "commit": prov["commit"], "provenance": prov,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "planted": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
