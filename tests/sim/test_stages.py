"""The beat's per-stage shape: graph_stages results fitted as lines, used past the measured
batch, and the what-if speedup of one stage."""
import json

import pytest

from sim import fit, stages
from tests.sim.fit_kit import BEAT_S, bench_json

# per frame, ms: fixed + per session (the shape the GPU showed: thinker and talker dominate)
LINES = {"mel": (0.05, 0.0001), "perception": (2.0, 0.01), "rnnt": (0.7, 0.002),
         "thinker": (5.0, 0.1), "talker": (3.0, 0.07), "codec": (0.5, 0.03)}


def stages_json(path, profile="reference", sizes=(32, 64, 128)):
    doc = {"profile": profile, "commit": "abc1234", "sessions": list(sizes),
           "stage_ms": {str(n): {k: a + b * n for k, (a, b) in LINES.items()} for n in sizes}}
    path.write_text(json.dumps(doc))
    return str(path)


def test_stage_lines_are_fitted_per_beat_from_the_files():
    """Catches a stage read per frame as per beat (half the beat), or lines fitted wrong."""
    import tempfile
    from pathlib import Path
    got = stages.read([stages_json(Path(tempfile.mkdtemp()) / "s.json")], "reference")
    for name, (a, b) in LINES.items():
        fixed, per = got["stages"][name]
        assert fixed == pytest.approx(2 * a / 1e3, abs=1e-7)
        assert per == pytest.approx(2 * b / 1e3, rel=1e-4)
    assert got["_stages_from"][0]["sessions"] == [32, 64, 128]


def test_past_the_measured_batch_the_beat_grows_as_the_stages_do(tmp_path):
    """Catches a model that carries the roofline's slope past the measured batch though the
    stages were measured there (the roofline underestimated the H200's beats by 30-45 %)."""
    measured = [fit.read(bench_json(tmp_path / "g.json"))]
    doc = fit.build(measured, stages.read([stages_json(tmp_path / "s.json")], "reference"))
    model = fit.model_of(doc)
    total = lambda n: sum(a + b * n for a, b in LINES.values())
    assert model.beat_time(100, 1500) == pytest.approx(BEAT_S, rel=0.005)
    assert model.beat_time(200, 1500) / model.beat_time(100, 1500) == pytest.approx(
        total(200) / total(100), rel=1e-6)
    # below it, the ladder's buckets shrink as the stages do (a beat replays its bucket)
    assert model.beat_time(50, 1500) / model.beat_time(100, 1500) == pytest.approx(
        total(50) / total(100), rel=1e-6)
    assert model.beat_time(50, 1500, slots=100) == model.beat_time(64, 1500)


def test_a_stage_speedup_takes_its_share_off_every_beat(tmp_path, capsys):
    """Catches a what-if that speeds up the whole beat, or none of it, or accepts a stage the
    model has not."""
    gpu, st = bench_json(tmp_path / "g.json"), stages_json(tmp_path / "s.json")
    out = tmp_path / "fast-talker.json"
    assert fit.main([gpu, "--stages", st, "--stage-speedup", "talker=2", "-o", str(out)]) == 0
    model = fit.model_of(json.loads(out.read_text()))
    total = sum(a + b * 100 for a, b in LINES.values())
    talker = LINES["talker"][0] + LINES["talker"][1] * 100
    assert model.beat_time(100, 1500) == pytest.approx(BEAT_S * (total - talker / 2) / total,
                                                       rel=0.005)
    no = ["-o", str(tmp_path / "unwritten.json")]
    assert fit.main([gpu, "--stages", st, "--stage-speedup", "vocoder=2", *no]) == 2
    assert "a stage of" in capsys.readouterr().err
    assert fit.main([gpu, "--stage-speedup", "talker=2", *no]) == 2
    assert fit.main([gpu, "--stages", stages_json(tmp_path / "d.json", "dense"), *no]) == 2
    assert not (tmp_path / "unwritten.json").exists()
    assert "profile 'dense'" in capsys.readouterr().err
