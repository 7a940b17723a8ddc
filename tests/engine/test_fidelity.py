"""The teacher-forced fidelity harness (bench/harness/fidelity.py) on the tiny config.

On the CPU without the Triton kernels (interpreted they take ~25 s a frame here); the kernel-
installed variant runs where a GPU is. Bounds for `dense` against `fp32-dense` (CFG off on both),
stage inputs from the reference, measured on this machine (seeds 0-4, 2 sessions x 12 frames and
8 x 32): rel_l2 perception <= 0.013, thinker <= 0.0092, talker (bf16 KV) <= 0.0033; rel_max
perception <= 0.019, thinker <= 0.027 (single frames spike there), talker <= 0.005; mel, RNNT and
codec compute in fp32 on the reference's inputs: exactly 0. The bounds below leave 2-3x.
"""
import sys
from pathlib import Path

import pytest
import torch

from bench.harness import fidelity, fidelity_forcing
from gpu.model.config import Profile, VoiceChatConfig

CFG = VoiceChatConfig.tiny()
SESSIONS, FRAMES, SEED = 2, 8, 0

BOUNDS = {      # quantity → (rel_l2, rel_max) for dense against fp32-dense on the CPU
    "mel.window": (0.0, 0.0), "rnnt.logits": (0.0, 0.0), "codec.pcm": (0.0, 0.0),
    "perception.enc": (0.03, 0.05), "perception.audio": (0.03, 0.05),
    "thinker.hidden": (0.02, 0.06), "thinker.text_logits": (0.02, 0.06),
    "thinker.func_logits": (0.02, 0.06), "thinker.ssm": (0.03, 0.06),
    "talker.hidden": (0.008, 0.015), "talker.mog_logits": (0.008, 0.015),
    "talker.latent": (0.008, 0.015), "talker.rvq_scores": (0.008, 0.015),
}
THINKER = {"thinker.hidden", "thinker.text_logits", "thinker.func_logits", "thinker.ssm"}


def violations(res: dict) -> set[str]:
    """Quantities outside BOUNDS, or whose determined top-1 choices disagree."""
    bad = set()
    for name, q in res["quantities"].items():
        l2, mx = BOUNDS[name]
        if q["rel_l2"] > l2 or q["rel_max"] > mx:
            bad.add(name)
        if "top1" in q and q["top1"]["agree"] < 1.0:
            bad.add(name)
    return bad


def dense(seed=SEED, perturb=None, chain=False) -> dict:
    ref, test = fidelity.build_pair(CFG, Profile.named("dense"), "cpu", seed=seed, kernels=False)
    if perturb is not None:
        perturb(test)
    return fidelity.measure(ref, test, SESSIONS, FRAMES, seed, chain=chain)


@pytest.fixture(scope="module")
def dense_result(one_thread):
    return dense()


def test_reference_against_itself_is_exact():
    ref, test = fidelity.build_pair(CFG, Profile.named("fp32"), "cpu", seed=1, kernels=False)
    assert ref.profile.name == test.profile.name == "fp32" and ref is not test
    res = fidelity.measure(ref, test, SESSIONS, FRAMES, seed=1)
    assert set(res["quantities"]) == set(fidelity.QUANTITIES)
    for name, q in res["quantities"].items():
        assert q["rel_max"] == q["rel_l2"] == 0.0, (name, q)
        assert q["max_abs_ref"] > 0, name                   # something was compared
        if "top1" in q:
            a = q["top1"]
            assert a["agree"] == a["agree_all"] == 1.0 and a["counted"] > 0.9, (name, a)
            assert a["tol"] == 1e-5 and a["rows"] > 0


def test_the_harness_reference_side_is_the_model_step():
    """The restated RNNT, thinker bookkeeping and talker (MoG, RVQ) of the harness give exactly
    what `VoiceChat.step` gives, free running on the same prompts, audio and noise."""
    ref, _ = fidelity.build_pair(CFG, Profile.named("fp32"), "cpu", seed=2, kernels=False)
    frames = 6
    forced = [f["ref"] for f in fidelity_forcing.forced_frames(ref, ref, SESSIONS, frames, seed=2)]
    prompts, audio = fidelity_forcing.inputs(CFG, SESSIONS, frames, seed=2)
    state = ref.alloc_state(SESSIONS, frames, prompts.shape[1])
    slots = torch.arange(SESSIONS)
    state.reset(slots)
    ref.prefill_chunk(state, slots, prompts, torch.full((SESSIONS,), prompts.shape[1]))
    ref.warmup_chunk(state, slots, CFG.talker.n_warmup)
    for t, r in enumerate(forced):
        o = ref.step(state, audio[:, t], slots, ref.noise(2, slots, torch.full((SESSIONS,), t)),
                     torch.full((SESSIONS,), -1))
        assert torch.equal(o.text, r["thinker"]["text"]) and torch.equal(o.func, r["thinker"]["func"])
        assert torch.equal(o.user, r["rnnt"]["tokens"])
        assert torch.equal(o.codes, r["talker"]["codes"])
        assert torch.equal(o.pcm, r["pcm"]), t


def test_dense_profile_errors_within_bf16_bounds(dense_result):
    res = dense_result
    assert (res["profile"], res["reference_profile"]) == ("dense", "fp32-dense")
    assert res["stage_precision"] == {"mel": "fp32", "perception": "bf16", "rnnt": "fp32",
                                      "thinker": "bf16", "talker": "bf16", "codec": "fp32"}
    assert violations(res) == set(), {k: (q["rel_l2"], q["rel_max"], q.get("top1"))
                                      for k, q in res["quantities"].items()}
    q = res["quantities"]
    for name in THINKER | {"perception.audio", "talker.hidden"}:
        assert q[name]["rel_l2"] > 1e-4, name               # bf16 really ran
    for name in ("thinker.text_logits", "talker.mog_logits", "talker.rvq_scores"):
        assert q[name]["top1"]["counted"] > 0.5, name       # the agreement is not vacuous
        assert q[name]["top1"]["tol"] == 1e-2
    assert len(q["codec.pcm"]["rel_max_by_frame"]) == FRAMES


def test_planted_thinker_weight_error_is_caught_in_its_stage_only(dense_result):
    """One thinker weight 1.5x (a mis-scaled kernel, say) in the tested model: the thinker's
    errors jump past the bounds; every other stage reads the reference's inputs, so its numbers
    do not move at all."""
    def perturb(model):
        w = model.thinker.llm.layers[0].mixer.out_proj.weight
        with torch.no_grad():
            w.copy_(w * 1.5)
    res, clean = dense(perturb=perturb)["quantities"], dense_result["quantities"]
    for name in THINKER:
        assert res[name]["rel_l2"] > max(3 * clean[name]["rel_l2"], BOUNDS[name][0]), name
    assert violations({"quantities": res}) & THINKER
    for name in set(fidelity.QUANTITIES) - THINKER:
        assert res[name] == clean[name], name


def test_chained_inputs_carry_perception_error_downstream(dense_result):
    res = dense(chain=True)
    q, iso = res["quantities"], dense_result["quantities"]
    assert res["stage_precision"]["rnnt"] == "bf16"         # its input is bf16 perception's
    assert 0 < q["rnnt.logits"]["rel_l2"] < 0.03
    assert q["thinker.text_logits"]["rel_l2"] < 0.03
    for name in ("mel.window", "perception.enc", "talker.hidden", "talker.rvq_scores", "codec.pcm"):
        assert q[name] == iso[name], name                   # upstream of the change, or forced


def test_mismatched_cfg_rows_are_refused():
    ref = fidelity.build_pair(CFG, Profile.named("fp32"), "cpu", kernels=False)[0]
    _, test = fidelity.build_pair(CFG, Profile.named("dense"), "cpu", kernels=False)
    with pytest.raises(ValueError, match="CFG rows"):
        fidelity.measure(ref, test, 1, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("profile", ["reference", "dense"])
def test_serving_profile_with_kernels_on_the_gpu(profile):
    """The engine's Triton decode path in a serving profile against fp32 on the GPU."""
    ref, test = fidelity.build_pair(CFG, Profile.named(profile), "cuda", seed=0, kernels=True)
    res = fidelity.measure(ref, test, 4, 16, seed=0)
    assert res["kernels"] and res["device"].startswith("cuda")
    bound = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 3e-2}
    for name, q in res["quantities"].items():
        prec = res["stage_precision"][q["stage"]]
        assert q["rel_l2"] <= bound[prec], (name, prec, q["rel_l2"])
        if "top1" in q:
            assert q["top1"]["agree"] >= 0.99, (name, q["top1"])


@pytest.mark.slow
def test_an_option_is_measured_against_the_profile_it_changes(tmp_path):
    """dense-ssm16 against dense (`against`): teacher-forced, every stage but the thinker gets
    the same inputs and runs the same arithmetic, so only the thinker's numbers move, by about
    bf16's rounding of the state; the KL of its token distributions is reported per frame, in
    windows. Bug it catches: a comparison that mixes in the base profile's own precision (the
    reference run in fp32), or a bf16 state that is not rounded at all (zero error)."""
    ref, test = fidelity.build_pair(CFG, Profile.named("dense-ssm16"), "cpu", seed=3,
                                    kernels=False, against=Profile.named("dense"))
    res = fidelity.measure(ref, test, SESSIONS, FRAMES, seed=3, window=3)
    assert (res["profile"], res["reference_profile"]) == ("dense-ssm16", "dense")
    q = res["quantities"]
    assert 0 < q["thinker.ssm"]["rel_l2"] < 4e-3 and q["thinker.ssm"]["rel_max"] < 1e-2
    for name in set(fidelity.QUANTITIES) - THINKER:
        assert q[name]["rel_max"] == 0.0, name
    kl = res["kl"]["thinker.text"]
    assert 0 < kl["mean"] < 1e-3 and len(kl["mean_by_frame"]) == len(kl["max_by_frame"]) == 3
    assert res["kl"]["talker.mixture"]["max"] == 0.0        # the talker got the same inputs
    assert len(q["thinker.ssm"]["rel_max_by_frame"]) == 3    # 8 frames in windows of 3
    # a long call's run stops after the thinker: the same thinker numbers, no talker or codec
    short = fidelity.measure(ref, test, SESSIONS, FRAMES, seed=3, window=3, thinker_only=True)
    assert set(short["quantities"]) == {n for n, st in fidelity.QUANTITIES.items()
                                        if st not in ("talker", "codec")}
    assert all(short["quantities"][n] == q[n] for n in short["quantities"])
    assert set(short["kl"]) == {"thinker.text", "thinker.func"}
    # a long run's result so far, at each window: what a run cut short still leaves
    seen = []
    fidelity.measure(ref, test, SESSIONS, FRAMES, seed=3, window=3, thinker_only=True,
                     progress=lambda done, s, partial: seen.append(partial()))
    assert [p["frames"] for p in seen] == [3, 6] and seen[0]["frames_asked"] == FRAMES
    assert len(seen[1]["quantities"]["thinker.ssm"]["rel_max_by_frame"]) == 2
    # its plot has the thinker's panels only, not empty talker and codec ones
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import fidelity_plot
    png = tmp_path / "short.png"
    assert fidelity_plot.plot([short], str(png)) == [p[0] for p in fidelity_plot.PANELS[:2]]
    assert png.stat().st_size > 0
    assert len(fidelity_plot.plot([res], str(png))) == len(fidelity_plot.PANELS)


def test_the_users_can_say_real_speech_with_pauses():
    """`speech`: each session hears the recording from its own point, the recording again after
    a pause, and the stages' errors are measured on it as on noise."""
    import soundfile
    from pathlib import Path
    wav, rate = soundfile.read(Path(__file__).resolve().parents[2] / "assets" / "demo_user.wav",
                               dtype="float32")
    speech = torch.from_numpy(wav)
    assert rate == 16000
    frames = int(len(speech) / CFG.mel.frame_samples) + 30        # past the pause, into a repeat
    _, audio = fidelity_forcing.inputs(CFG, 2, frames, speech=speech)
    flat = audio.flatten(1)
    n = len(speech)
    assert torch.equal(flat[0, :n], speech)
    gap = int(fidelity_forcing.SPEECH_GAP_S * 16000)
    assert flat[0, n:n + gap].abs().max() == 0 and torch.equal(flat[0, n + gap:n + gap + 100],
                                                               speech[:100])
    assert not torch.equal(flat[1, :n], speech)                    # another point of it
    ref, test = fidelity.build_pair(CFG, Profile.named("dense-ssm16"), "cpu", seed=4,
                                    kernels=False, against=Profile.named("dense"))
    res = fidelity.measure(ref, test, 2, 4, seed=4, speech=speech, thinker_only=True)
    assert res["audio"].startswith("speech") and res["quantities"]["thinker.ssm"]["rel_l2"] > 0


def test_fp8_talker_kv_is_measured_against_the_profile_without_it():
    """dense-compact against dense-ssm16-sr: only the talker's numbers move, judged at fp8's
    bound, and the KL of its mixture choice is reported."""
    ref, test = fidelity.build_pair(CFG, Profile.named("dense-compact"), "cpu", seed=5,
                                    kernels=False, against=Profile.named("dense-ssm16-sr"))
    res = fidelity.measure(ref, test, SESSIONS, FRAMES, seed=5)
    q = res["quantities"]
    assert res["stage_precision"]["talker"] == "fp8"
    assert q["talker.mog_logits"]["top1"]["tol"] == fidelity.TOL["fp8"]
    for name, quantity in q.items():
        moved = quantity["rel_max"] > 0
        assert moved == (fidelity.QUANTITIES[name] == "talker"), name
    assert 0 < q["talker.hidden"]["rel_l2"] < 0.05
    assert 0 < res["kl"]["talker.mixture"]["mean"] < 1e-2
    assert res["kl"]["thinker.text"]["max"] == 0.0
