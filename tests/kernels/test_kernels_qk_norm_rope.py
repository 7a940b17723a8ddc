"""qk_norm_rope (Triton) against qk_norm_rope_ref on fresh random inputs: head_dim 72 (the talker's,
halves of 36 in 64-lane tiles) and small ones, CFG rows 1 and 2, fp32 and bf16 caches, q/k/v as
slices of one fused qkv row or as separate tensors, a layer view of the talker's 6-D state and a
position-major cache, int32 and int64 slots. The rows not written must stay untouched."""
import pytest
import torch

from gpu.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref
from gpu.model.talker.text import rope_cos_sin
from tests.tensorkit import rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def make(batch, rows, hq, hkv, d, max_slots, max_pos, dtype, *, fused, layout, theta, seed):
    g = torch.Generator().manual_seed(seed)
    width = (hq + 2 * hkv) * d
    if fused:       # column slices of one qkv matmul output: row stride (Hq + 2·Hkv)·D
        qkv = (2.0 * torch.randn(batch, rows, width, generator=g)).to(DEV)
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
    else:
        q, k, v = ((2.0 * torch.randn(batch, rows, h * d, generator=g)).to(DEV) for h in (hq, hkv, hkv))
    wq = (0.5 * torch.randn(d, generator=g)).to(DEV)
    wk = (0.5 * torch.randn(d, generator=g)).to(DEV)
    pos = torch.randperm(max_pos, generator=g)[:batch].to(DEV)
    cos, sin = rope_cos_sin(pos, d, theta)                        # [B, D/2]
    if layout == "state":       # layer 1 of a [S, L, R, Hkv, P, D] state, as the talker passes it
        buf = torch.randn(max_slots, 3, rows, hkv, max_pos, d, generator=g).to(dtype)
        k_layer, v_layer = buf[:, 1], buf.clone()[:, 1]
    elif layout == "pos_major":  # [S, R, P, Hkv, D] seen as [S, R, Hkv, P, D]
        k_layer = torch.randn(max_slots, rows, max_pos, hkv, d, generator=g).to(dtype).transpose(2, 3)
        v_layer = torch.randn(max_slots, rows, max_pos, hkv, d, generator=g).to(dtype).transpose(2, 3)
    else:
        k_layer = torch.randn(max_slots, rows, hkv, max_pos, d, generator=g).to(dtype)
        v_layer = torch.randn(max_slots, rows, hkv, max_pos, d, generator=g).to(dtype)
    return q, k, v, wq, wk, cos, sin, pos, k_layer.to(DEV), v_layer.to(DEV)


CASES = [  # (B, R, Hq, Hkv, D, cache dtype, fused, layout, slots dtype, theta)
    (3, 2, 4, 4, 72, torch.float32, True, "state", torch.int64, 1e4),       # talker reference profile
    (3, 1, 4, 4, 72, torch.bfloat16, True, "state", torch.int64, 1e6),      # talker dense profile
    (2, 2, 4, 4, 16, torch.float32, False, "plain", torch.int32, 1e4),      # tiny config
    (4, 1, 6, 2, 24, torch.bfloat16, False, "pos_major", torch.int32, 1e6),  # GQA, halves of 12
    (1, 2, 2, 2, 10, torch.float32, True, "pos_major", torch.int64, 1e4),   # odd halves (5 of 8)
]


@pytest.mark.parametrize("batch,rows,hq,hkv,d,dtype,fused,layout,slot_dtype,theta", CASES)
def test_qk_norm_rope_matches_ref(batch, rows, hq, hkv, d, dtype, fused, layout, slot_dtype, theta):
    max_slots, max_pos = 5, 11
    q, k, v, wq, wk, cos, sin, pos, k_layer, v_layer = make(
        batch, rows, hq, hkv, d, max_slots, max_pos, dtype, fused=fused, layout=layout,
        theta=theta, seed=batch * d + rows)
    slots = torch.tensor([4, 0, 2, 1][:batch], dtype=slot_dtype, device=DEV)
    k_ref, v_ref = k_layer.clone(), v_layer.clone()
    k0, v0 = k_layer.clone(), v_layer.clone()
    q_out = qk_norm_rope(q, k, v, wq, wk, cos, sin, slots, pos, k_layer, v_layer, eps=EPS)
    q_ref = qk_norm_rope_ref(q, k, v, wq, wk, cos, sin, slots, pos, k_ref, v_ref, eps=EPS)
    assert q_out.shape == (batch, rows, hq, d) and q_out.dtype == torch.float32
    assert q_out.is_contiguous()
    assert rel(q_out, q_ref) < 1e-5, rel(q_out, q_ref)
    # the written rows: k normed and rotated, v as it is (so bit-equal: one RNE rounding at most)
    at = (slots.long()[:, None], torch.arange(rows, device=DEV)[None, :], slice(None), pos.long()[:, None])
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel(k_layer[at], k_ref[at]) < tol, rel(k_layer[at], k_ref[at])
    assert torch.equal(v_layer[at], v_ref[at])
    # everything else untouched
    written = torch.zeros(k_layer.shape[:4], dtype=torch.bool, device=DEV)
    written[at] = True
    assert torch.equal(k_layer[~written], k0[~written]) and torch.equal(v_layer[~written], v0[~written])


def test_qk_norm_rope_bf16_rounds_to_nearest_even():
    # Values a hair above a bf16 midpoint round up, exact midpoints to the even neighbour: the
    # interpreter's truncating cast would get both wrong; v is stored without any math.
    q, k, v, wq, wk, cos, sin, pos, k_layer, v_layer = make(
        2, 1, 2, 2, 8, 3, 5, torch.bfloat16, fused=False, layout="plain", theta=1e4, seed=7)
    base = torch.tensor([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20,
                         -1.0 - 2 ** -8, 2.0 + 2 ** -7, 3.0, 1.0 + 2 ** -9], device=DEV)
    v = base.repeat(2, 1, 2).contiguous()                          # [2, 1, 2·8]
    slots = torch.tensor([2, 0], dtype=torch.int32, device=DEV)
    qk_norm_rope(q, k, v, wq, wk, cos, sin, slots, pos, k_layer, v_layer, eps=EPS)
    got = v_layer[slots.long(), 0, :, pos.long()]                  # [2, Hkv, 8]
    assert torch.equal(got, base.to(torch.bfloat16).expand_as(got))


def test_qk_norm_rope_rejects_bad_args():
    q, k, v, wq, wk, cos, sin, pos, k_layer, v_layer = make(
        2, 2, 2, 2, 8, 3, 5, torch.float32, fused=True, layout="plain", theta=1e4, seed=1)
    args = (q, k, v, wq, wk, cos, sin)
    if DEV == "cpu":    # values are checked only where that costs no device sync
        with pytest.raises(AssertionError, match="repeat"):
            qk_norm_rope(*args, torch.tensor([1, 1], device=DEV), pos, k_layer, v_layer, eps=EPS)
        with pytest.raises(AssertionError, match="pos"):
            qk_norm_rope(*args, torch.tensor([0, 1], device=DEV), torch.tensor([0, 5], device=DEV),
                         k_layer, v_layer, eps=EPS)
    with pytest.raises(AssertionError, match="v_layer"):
        qk_norm_rope(*args, torch.tensor([0, 1], device=DEV), pos, k_layer,
                     v_layer.to(torch.bfloat16), eps=EPS)
    with pytest.raises(AssertionError, match="k:"):
        qk_norm_rope(q, k[..., :-8], v, wq, wk, cos, sin, torch.tensor([0, 1], device=DEV), pos,
                     k_layer, v_layer, eps=EPS)
