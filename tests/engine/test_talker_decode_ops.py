"""The talker's engine attention path (decode_ops.talker_qkv_attention: one qkv matmul, qk_norm_rope,
rows-form decode_attention; kernels interpreted on the CPU) against the reference layer on the
tiny talker: the same hidden states and caches over live frames, in both profiles, with the
sessions at different positions and the sliding window biting; then the whole talker as the
engine installs it (also the fused residual norms and gated MLPs, in warm-up, backbone, MoG head
and char encoder). Also the fused weights: views, no extra tensor in the state_dict, and rebuilt
after a load that assigns new weights."""
import dataclasses

import pytest
import torch

from gpu.engine.decode_ops import TritonDecodeOps, fused_gate_up_weight, fused_qkv_weight, install_talker
from gpu.model.talker.state import TalkerState
from gpu.model.talker.weights import load_talker
from tests.model.test_model_tts import CFG, inputs, make_talker, tiny_weights
from tests.tensorkit import counting, exact_fp32, rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"      # compiled kernels need device tensors


def on_dev(x):
    return type(x)(*(getattr(x, f.name).to(DEV) for f in dataclasses.fields(x)))


def use(talker, ops) -> None:
    """What decode_ops.install does for the talker's layers (no RMSNorm fusion: only the attention
    block differs between the two runs)."""
    for layer in talker.tts_model.backbone.layers:
        layer.decode_ops = ops


@torch.no_grad()
def run(talker, ops, profile: str):
    use(talker, ops)
    state = TalkerState.alloc(CFG, 4, 24, device=DEV, profile=profile)
    both = torch.tensor([3, 0], device=DEV)
    talker.warmup(state, both, CFG.n_warmup)                  # t > 1: the reference path either way
    outs = [talker.step(state, on_dev(inputs(1, seed=9)), torch.tensor([3], device=DEV))]  # ahead
    outs += [talker.step(state, on_dev(inputs(2, seed=10 + f)), both) for f in range(4)]
    use(talker, None)
    return outs, state


@pytest.fixture(autouse=True)
def plain_fp32_matmuls():
    """On the GPU an earlier test's executor may have switched TF32 on for the whole process; the
    engine's one fused qkv (and gate-up) matmul and the reference's separate ones then round
    differently (~2e-4), which the fp32 bound must not take for a kernel error."""
    with exact_fp32():
        yield


@pytest.fixture(scope="module")
def talker():
    return make_talker().to(DEV)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["reference", "dense"])
def test_engine_attention_equals_reference_layer(talker, profile):
    ref, st_ref = run(talker, None, profile)
    ops = counting(TritonDecodeOps(), "talker_qkv_attention")
    fast, st_fast = run(talker, ops, profile)
    assert ops.calls == 5 * CFG.n_layers                      # every live frame, every layer
    fp32 = profile == "reference"
    for a, b in zip(ref, fast):
        assert rel(b.hidden, a.hidden) < (1e-5 if fp32 else 1e-4), rel(b.hidden, a.hidden)
        assert torch.equal(a.codes, b.codes)
    assert torch.equal(st_fast.position, st_ref.position)
    for name in ("k", "v"):
        got, want = getattr(st_fast, name), getattr(st_ref, name)
        assert got.dtype == want.dtype
        assert rel(got, want) < (1e-5 if fp32 else 1e-2), (name, rel(got, want))
        assert torch.equal(got[[1, 2]], want[[1, 2]])        # other slots untouched (zeros)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["reference", "dense"])
def test_installed_talker_equals_reference(talker, profile):
    ref, st_ref = run(talker, None, profile)
    install_talker(talker, TritonDecodeOps())
    try:
        mlp = talker.tts_model.backbone.layers[0].mlp
        gate_up = mlp.gate_up_weight
        fast, st_fast = run(talker, TritonDecodeOps(), profile)
        assert mlp.gate_up_weight is gate_up                  # made once, at install
    finally:
        install_talker(talker, None)
    fp32 = profile == "reference"
    for a, b in zip(ref, fast):
        assert rel(b.hidden, a.hidden) < (1e-5 if fp32 else 1e-4), rel(b.hidden, a.hidden)
        assert torch.equal(a.codes, b.codes)
    for name in ("k", "v"):
        assert rel(getattr(st_fast, name), getattr(st_ref, name)) < (1e-5 if fp32 else 1e-2)


@pytest.mark.slow
def test_installed_talker_runs_the_fused_kernels(talker, monkeypatch):
    """The hooks really route: each residual step and gated MLP of a live frame is one call."""
    from gpu.engine import decode_ops
    calls = {"residual": 0, "gelu": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(decode_ops, "residual_rms_norm", counted("residual", decode_ops.residual_rms_norm))
    monkeypatch.setattr(decode_ops, "gelu_mul", counted("gelu", decode_ops.gelu_mul))
    install_talker(talker, TritonDecodeOps())
    try:
        state = TalkerState.alloc(CFG, 4, 24, device=DEV, profile="reference")
        slots = torch.tensor([1], device=DEV)
        talker.warmup(state, slots, CFG.n_warmup)
        calls.update(residual=0, gelu=0)
        with torch.no_grad():
            talker.step(state, on_dev(inputs(1, seed=4)), slots)
    finally:
        install_talker(talker, None)
    passes = sum(1 for w in CFG.schedule if w)
    mlps = CFG.n_layers + passes * CFG.mog_layers + 1                # + the char encoder layer
    assert calls["gelu"] == mlps
    assert calls["residual"] == 2 * CFG.n_layers + passes * CFG.mog_layers + 2


@torch.no_grad()
@pytest.mark.parametrize("fuse,module,second,rows", [
    (fused_qkv_weight, lambda t: t.tts_model.backbone.layers[1].self_attn, "k_proj", 3 * CFG.hidden),
    (fused_gate_up_weight, lambda t: t.tts_model.backbone.layers[2].mlp, "up_proj", 2 * CFG.mlp)],
    ids=["qkv", "gate_up"])
def test_fused_weight_is_views_and_follows_a_reload(fuse, module, second, rows):
    talker = make_talker()
    mod = module(talker)
    keys = set(talker.state_dict())
    w = fuse(mod)
    assert w.shape == (rows, CFG.hidden) and fuse(mod) is w
    linear = getattr(mod, second)
    start = w.shape[0] - linear.weight.shape[0] if second == "up_proj" else CFG.hidden
    assert linear.weight.data_ptr() == w[start].data_ptr()
    assert set(talker.state_dict()) == keys                  # non-persistent: no new name
    load_talker(talker, tiny_weights(seed=1))                 # assigns new tensors
    w2 = fuse(mod)
    assert w2 is not w
    assert torch.equal(w2[start:start + linear.weight.shape[0]], getattr(mod, second).weight)
    assert not torch.equal(w2, w)


@pytest.mark.slow
@torch.no_grad()
def test_engine_mog_choice_equals_the_reference_rule(talker):
    """The MoG head's mixture through the kernel (decode_ops.mog_choice) against top_p_filter +
    gumbel_choice, on uniforms sliced from a [B, steps, K] frame draw as the head passes them."""
    head = talker.tts_model.mog_head
    g = torch.Generator().manual_seed(3)
    rows = 16                   # a kernel program a row: more rows only cost interpreter time
    logits = (3 * torch.randn(rows, CFG.n_mixtures, generator=g)).to(DEV)
    frame_u = torch.rand(rows, CFG.n_steps, CFG.n_mixtures, generator=g).to(DEV)
    picks = []
    for ops in (None, TritonDecodeOps()):
        head.decode_ops = ops
        try:
            picks.append(torch.stack([head.choose(logits, frame_u[:, s]).long()
                                      for s in range(CFG.n_steps)]))
        finally:
            head.decode_ops = None
    assert torch.equal(picks[0], picks[1])
    assert len(picks[0].unique()) > 4                   # the draws differ: not one constant
