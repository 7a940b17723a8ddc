"""Start policies as plug-ins of the simulator (and the bench): `python -m sim.run --policy …`
builds the named policy with its parameters, runs it on virtual time through the production
node, and the result JSON says which policy made it."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.simrun import sim_run as run
from wave_actors.core.policy_spec import PolicyError, make_policy
from wave_actors.core.sched.start_policy import BudgetedStarts, EagerStarts

ROOT = Path(__file__).resolve().parents[2]


def sim_run(tmp_path: Path, *policy: str) -> dict:
    return run(tmp_path, "--sessions", "6", "--beats", "30", "--churn", "3", "--seed", "1",
               "--policy", *policy, timeout=120)


@pytest.mark.slow
def test_two_built_in_start_policies_run_and_the_result_names_each(tmp_path):
    eager = sim_run(tmp_path, "eager")
    budgeted = sim_run(tmp_path, "budgeted", "margin_s=0.004", "max_hold=12")
    assert eager["policy"]["start"]["name"] == "eager"
    assert eager["policy"]["start"]["class"].endswith(":EagerStarts")
    start = budgeted["policy"]["start"]
    assert (start["name"], start["class"], start["params"]) == (
        "budgeted", "wave_actors.core.sched.start_policy:BudgetedStarts",
        {"margin_s": 0.004, "max_hold": 12, "smoothing": 0.3})
    assert budgeted["policy"]["clock"]["params"]["release_hold_s"] == 0.003
    assert "--policy budgeted margin_s=0.004 max_hold=12" in budgeted["command"]
    for result in (eager, budgeted):
        assert result["per_run"][0]["opens"] >= 6 and result["beats"] == 30


def test_a_policy_is_named_by_module_and_class_with_typed_parameters():
    policy = make_policy(["wave_actors.core.sched.start_policy:BudgetedStarts", "max_hold=7",
                          "margin_s=0.01"])
    assert isinstance(policy, BudgetedStarts) and policy.max_hold == 7 and policy.margin_s == 0.01
    assert isinstance(make_policy(["eager"]), EagerStarts)
    # runs recorded before the policies moved to core.sched name them by their old module
    old = make_policy(["wave_actors.core.start_policy:BudgetedStarts", "max_hold=3"])
    assert isinstance(old, BudgetedStarts) and old.max_hold == 3


@pytest.mark.parametrize("words,says", [
    (["nosuch"], "module:Class"),
    (["wave_actors.core.sched.start_policy:Nope"], "Nope"),
    (["budgeted", "max_hold"], "key=value"),
    (["budgeted", "speed=3"], "speed"),
    (["budgeted", "max_hold=-1"], "max_hold"),
])
def test_a_bad_policy_is_refused_with_the_reason(words, says):
    with pytest.raises(PolicyError, match=says):
        make_policy(words)


def test_the_cli_refuses_a_bad_policy_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sim.run", "--sessions", "2", "--beats", "4",
                          "--out", str(tmp_path), "--policy", "budgeted", "speed=3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "speed" in out.stderr and "Traceback" not in out.stderr
