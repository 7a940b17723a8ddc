"""mamba_step (Triton) against mamba_step_ref (PyTorch) at small odd sizes, state included.

On a CPU-only machine conftest sets TRITON_INTERPRET=1, so the kernels run in Triton's interpreter.
"""
import math

import pytest
import torch

from gpu.kernels.mamba_step import mamba_step, mamba_step_ref
from tests.tensorkit import rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}   # relative-norm tolerance of the output y




def make(dtype, *, batch=3, max_slots=6, nheads=6, ngroups=2, head_dim=5, d_state=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    d_inner = nheads * head_dim
    conv_dim = d_inner + 2 * ngroups * d_state
    rn = lambda *s: torch.randn(*s, generator=g)
    dt_bias = torch.log(torch.expm1(torch.exp(torch.empty(nheads).uniform_(math.log(1e-3), math.log(1e-1), generator=g))))
    dt_bias[0] = 33.5                      # the checkpoint has heads this large
    weights = dict(
        conv_w=rn(conv_dim, 4).to(dtype), conv_b=(0.1 * rn(conv_dim)).to(dtype),
        dt_bias=dt_bias, A_log=torch.log(torch.empty(nheads).uniform_(1, 16, generator=g)),
        D=1.0 + 0.5 * rn(nheads), norm_w=(1.0 + 0.2 * rn(d_inner)).to(dtype))
    state = dict(conv_state=rn(max_slots, conv_dim, 3).to(dtype),
                 ssm_state=rn(max_slots, nheads, head_dim, d_state))
    step = lambda: dict(xBC=rn(batch, conv_dim).to(dtype), z=rn(batch, d_inner).to(dtype),
                        dt=rn(batch, nheads).to(dtype))
    to = lambda d: {k: v.to(DEV) for k, v in d.items()}
    return to(weights), to(state), step, ngroups


def run(fn, inputs, state, weights, slots, ngroups, **kw):
    return fn(inputs["xBC"], inputs["z"], inputs["dt"], state["conv_state"], state["ssm_state"], slots,
              weights["conv_w"], weights["conv_b"], weights["dt_bias"], weights["A_log"], weights["D"],
              weights["norm_w"], ngroups=ngroups, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slot_list,block_p,stream,tiles", [
    ([4, 0, 2], 4, False, 1), ([5, 1, 3], 8, True, 1),
    ([4, 0, 2], 2, False, 2), ([5, 1, 3], 2, True, None)])  # looped tiles, the last one partial
def test_mamba_step_matches_ref(dtype, slot_list, block_p, stream, tiles):
    weights, state, step, ngroups = make(dtype, seed=len(slot_list) + block_p)
    slots = torch.tensor(slot_list, dtype=torch.int32, device=DEV)
    st_k = {k: v.clone() for k, v in state.items()}
    st_r = {k: v.clone() for k, v in state.items()}
    for _ in range(2):                      # two steps: the conv window and the SSM state chain
        inputs = {k: v.to(DEV) for k, v in step().items()}
        out = torch.full_like(inputs["z"], float("nan"))
        y = run(mamba_step, inputs, st_k, weights, slots, ngroups, out=out, block_p=block_p, stream=stream,
                tiles=tiles)
        y_ref = run(mamba_step_ref, inputs, st_r, weights, slots, ngroups)
        assert y is out and torch.isfinite(y).all()
        assert rel(y, y_ref) < TOL[dtype], rel(y, y_ref)
        assert rel(st_k["ssm_state"], st_r["ssm_state"]) < 1e-5
        torch.testing.assert_close(st_k["ssm_state"], st_r["ssm_state"], rtol=1e-5, atol=1e-5)
        assert torch.equal(st_k["conv_state"], st_r["conv_state"])
    untouched = [s for s in range(state["ssm_state"].shape[0]) if s not in slot_list]
    for k in state:
        assert torch.equal(st_k[k][untouched], state[k][untouched]), f"{k}: untouched slot changed"
        assert not torch.equal(st_k[k][slot_list], state[k][slot_list]), f"{k}: state not updated"


def test_mamba_step_rejects_bad_args():
    weights, state, step, ngroups = make(torch.float32)
    inputs = {k: v.to(DEV) for k, v in step().items()}
    if DEV == "cpu":    # slot values are checked only where that costs no device sync
        with pytest.raises(AssertionError, match="slot"):
            run(mamba_step, inputs, state, weights, torch.tensor([0, 6, 1], dtype=torch.int32, device=DEV), ngroups)
    with pytest.raises(AssertionError, match="int32"):
        run(mamba_step, inputs, state, weights, torch.tensor([0, 1, 2], device=DEV), ngroups)
    bad = dict(state, ssm_state=state["ssm_state"].to(torch.bfloat16))
    with pytest.raises(AssertionError, match="ssm_state"):
        run(mamba_step, inputs, bad, weights, torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV), ngroups)
