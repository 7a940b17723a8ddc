"""mamba_step (Triton) against mamba_step_ref (PyTorch) at small odd sizes, state included.

On a CPU-only machine conftest sets TRITON_INTERPRET=1, so the kernels run in Triton's interpreter.
"""
import math

import pytest
import torch

import triton
import triton.language as tl

from gpu.kernels.mamba_step import _mix32, _round_bf16_sr, mamba_conv, mamba_step, mamba_step_ref
from gpu.model.formats import mix32, round_bf16_stochastic
from tests.tensorkit import edit_loop, rel

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
@pytest.mark.parametrize("slot_list,block_p,stream,tiles", edit_loop([
    ([4, 0, 2], 4, False, 1), ([5, 1, 3], 2, True, None),   # looped tiles, the last one partial
    ([5, 1, 3], 8, True, 1), ([4, 0, 2], 2, False, 2)], 2))
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
    bad = dict(state, ssm_state=state["ssm_state"].to(torch.float16))
    with pytest.raises(AssertionError, match="ssm_state"):
        run(mamba_step, inputs, bad, weights, torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV), ngroups)


def test_a_bf16_state_is_read_and_written_as_the_reference_rounds_it():
    """Bug it catches: a bf16-stored state computed in bf16 (its decay and input products
    rounded each step, not once), y read from the rounded state while the reference reads the
    unrounded one, or the store truncating where torch rounds to nearest."""
    weights, state, step, ngroups = make(torch.bfloat16, seed=7)
    state["ssm_state"] = state["ssm_state"].to(torch.bfloat16)
    slots = torch.tensor([5, 0, 3], dtype=torch.int32, device=DEV)
    st_k = {k: v.clone() for k, v in state.items()}
    st_r = {k: v.clone() for k, v in state.items()}
    for _ in range(3):
        inputs = {k: v.to(DEV) for k, v in step().items()}
        y = run(mamba_step, inputs, st_k, weights, slots, ngroups)
        y_ref = run(mamba_step_ref, inputs, st_r, weights, slots, ngroups)
        assert st_k["ssm_state"].dtype == torch.bfloat16
        assert rel(y, y_ref) < TOL[torch.bfloat16], rel(y, y_ref)
        # both round the same fp32 value once, to nearest: equal bits but where the two fp32
        # sums differ by an ulp across a rounding boundary
        differ = (st_k["ssm_state"] != st_r["ssm_state"]).float().mean().item()
        assert differ < 0.01, differ
        torch.testing.assert_close(st_k["ssm_state"], st_r["ssm_state"], rtol=8e-3, atol=1e-5)


@triton.jit
def _sr_probe(X, OUT, LENGTH, layer, n, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    e = tl.arange(0, BLOCK)
    m = e < n
    pos = (tl.load(LENGTH + b) & 0xFFFFFFFF).to(tl.uint32)
    key = _mix32(pos * 0x9E3779B1 + layer.to(tl.uint32))
    y = _round_bf16_sr(tl.load(X + b * n + e, mask=m, other=0.0), key, e)
    tl.store(OUT + b * n + e, y, mask=m)


def test_the_kernels_stochastic_rounding_draws_the_bits_its_torch_twin_draws():
    """Bug it catches: the kernel's hash or its carry into the exponent differing from the
    reference's (a uint32 multiply promoted and not wrapped, a sign bit touched), which would
    make the engine's state drift from the reference's a bit at a time."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 37, generator=g) * torch.logspace(-30, 30, 37)      # every exponent range
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), 0.0, -0.0
    length = torch.tensor([0, 1, 2 ** 31 + 5, 1499], dtype=torch.int64)
    out = torch.empty_like(x, device=DEV)
    _sr_probe[(4,)](x.to(DEV), out, length.to(DEV), 7, 37, BLOCK=64)
    want = round_bf16_stochastic(x, length, 7).float()
    got = out.cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert torch.equal(got.bfloat16().float().nan_to_num(), got.nan_to_num())   # bf16 values
    assert int(mix32(torch.tensor([1])).item()) != 1


def test_stochastic_rounding_is_unbiased_where_nearest_is_not():
    """Bug it catches: a rounding that is stochastic in name only (the bits too few, the add
    below the wrong bit, truncation): its mean over positions stays off the fp32 value."""
    x = torch.full((1, 1), 1.0 + 1 / 3)
    rounded = torch.stack([round_bf16_stochastic(x, torch.tensor([t]), 0).float()
                           for t in range(4000)])
    nearest = x.bfloat16().float()
    assert set(rounded.unique().tolist()) == {1.328125, 1.3359375}
    ulp = 2 ** -7
    assert abs(rounded.mean().item() - x.item()) < 0.05 * ulp < abs(nearest.item() - x.item())


@pytest.mark.slow        # the edit loop keeps the bit-for-bit probe above; make test runs this
def test_a_stochastically_rounded_state_follows_the_reference_and_its_positions():
    """Bug it catches: a step whose rounding ignores the row's position (the same bits every
    frame: a fixed dither, biased per element) or reads another row's."""
    weights, state, step, ngroups = make(torch.bfloat16, seed=11)
    state["ssm_state"] = state["ssm_state"].to(torch.bfloat16)
    slots = torch.tensor([5, 0, 3], dtype=torch.int32, device=DEV)
    length = torch.tensor([10, 20, 30, 40, 50, 60], dtype=torch.int64, device=DEV)
    st = {name: {k: v.clone() for k, v in state.items()} for name in ("k", "r", "near", "late")}
    inputs = {k: v.to(DEV) for k, v in step().items()}
    run(mamba_step, inputs, st["k"], weights, slots, ngroups, round_key=(length, 4))
    run(mamba_step_ref, inputs, st["r"], weights, slots, ngroups, round_key=(length, 4))
    run(mamba_step, inputs, st["near"], weights, slots, ngroups)
    run(mamba_step, inputs, st["late"], weights, slots, ngroups, round_key=(length + 1, 4))
    idx = slots.long()
    k, r = st["k"]["ssm_state"][idx], st["r"]["ssm_state"][idx]
    assert (k != r).float().mean().item() < 0.01          # an fp32 ulp apart at most, rarely
    for other in ("near", "late"):
        share = (k != st[other]["ssm_state"][idx]).float().mean().item()
        assert 0.1 < share < 0.5, (other, share)
    untouched = [s for s in range(6) if s not in slots.tolist()]
    assert torch.equal(st["k"]["ssm_state"][untouched], state["ssm_state"][untouched])
    fp32 = dict(state, ssm_state=state["ssm_state"].float())
    for fn in (mamba_step, mamba_step_ref):              # the twin refuses it too
        with pytest.raises(ValueError, match="bf16"):
            run(fn, inputs, fp32, weights, slots, ngroups, round_key=(length, 4))


def conv_ref(xBC, conv_state, slots, conv_w, conv_b):
    """The conv launch in torch, fp32 (as mamba_step_ref): SiLU(window · w + b); state <- window[1:]."""
    idx, f = slots.long(), torch.float32
    window = torch.cat([conv_state[idx].to(f), xBC.to(f)[:, :, None]], dim=-1)
    conv_state[idx] = window[:, :, 1:].to(conv_state.dtype)
    return torch.nn.functional.silu((window * conv_w.to(f)).sum(-1) + conv_b.to(f))


@pytest.mark.parametrize("act,state_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                             (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("conv_dim,block_c,slot_list", [
    (54, 16, [4, 0, 2]), (54, None, [5, 1, 3]), (37, 8, [2, 5, 0, 1]), (8, 8, [3])])
@pytest.mark.slow
def test_conv_tiles_equal_cols_and_ref(act, state_dtype, conv_dim, block_c, slot_list):
    """The [block_c, 4]-tile conv kernel against the first (column) kernel and torch, over three
    steps: the same state bits, out within an ulp-level tolerance; other slots untouched."""
    g = torch.Generator().manual_seed(conv_dim + len(slot_list))
    rn = lambda *s: torch.randn(*s, generator=g)
    w, b = rn(conv_dim, 4).to(act).to(DEV), (0.1 * rn(conv_dim)).to(act).to(DEV)
    state0 = rn(7, conv_dim, 3).to(state_dtype).to(DEV)
    st_new, st_old, st_ref = state0.clone(), state0.clone(), state0.clone()
    slots = torch.tensor(slot_list, dtype=torch.int32, device=DEV)
    tol = 1e-6 if act == torch.float32 and state_dtype == torch.float32 else 1e-5
    # Triton's interpreter casts fp32 -> bf16 by truncation (the GPU rounds to nearest, as torch):
    # there the x column written to a bf16 state may sit one bf16 ulp from torch's.
    trunc = DEV == "cpu" and act == torch.float32 and state_dtype == torch.bfloat16
    for _ in range(3):
        x = rn(len(slot_list), conv_dim).to(act).to(DEV)
        out = torch.full((len(slot_list), conv_dim), float("nan"), device=DEV)
        y_new = mamba_conv(x, st_new, slots, w, b, out=out, block_c=block_c)
        y_old = mamba_conv(x, st_old, slots, w, b, tiles=False, block_c=block_c)
        y_ref = conv_ref(x, st_ref, slots, w, b)
        assert y_new is out and torch.isfinite(y_new).all()
        assert torch.equal(st_new, st_old)
        if trunc:
            torch.testing.assert_close(st_new.float(), st_ref.float(), rtol=2 ** -7, atol=0)
            st_ref.copy_(st_new)
        assert torch.equal(st_new, st_ref)
        assert rel(y_new, y_old) < tol and rel(y_new, y_ref) < tol, (rel(y_new, y_old), rel(y_new, y_ref))
        torch.testing.assert_close(y_new, y_ref, rtol=1e-5, atol=1e-5)
    untouched = [s for s in range(7) if s not in slot_list]
    assert torch.equal(st_new[untouched], state0[untouched])
    assert not torch.equal(st_new[slot_list], state0[slot_list])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mamba_step_conv_paths_agree(dtype):
    """mamba_step with the tile conv (default) and the column conv: same states, y within TOL of
    each other and of the reference."""
    weights, state, step, ngroups = make(dtype, batch=4, seed=11)
    slots = torch.tensor([3, 5, 0, 2], dtype=torch.int32, device=DEV)
    st = [{k: v.clone() for k, v in state.items()} for _ in range(3)]
    for _ in range(2):
        inputs = {k: v.to(DEV) for k, v in step().items()}
        y_new = run(mamba_step, inputs, st[0], weights, slots, ngroups)
        y_old = run(mamba_step, inputs, st[1], weights, slots, ngroups, conv_tiles=False)
        y_ref = run(mamba_step_ref, inputs, st[2], weights, slots, ngroups)
        assert rel(y_new, y_old) < TOL[dtype] and rel(y_new, y_ref) < TOL[dtype]
        assert torch.equal(st[0]["conv_state"], st[1]["conv_state"])
        assert torch.equal(st[0]["conv_state"], st[2]["conv_state"])
        torch.testing.assert_close(st[0]["ssm_state"], st[1]["ssm_state"], rtol=1e-5, atol=1e-5)
