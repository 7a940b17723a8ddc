"""decode_attention (Triton) against decode_attention_ref at small odd sizes: GQA and MHA, fp32
and bf16 KV, per-slot lengths, sliding window, several split counts, a strided cache view; the
per-lane MHA kernel (lanes) against an fp64 twin, and which MHA kernel the default picks."""
import pytest
import torch

import gpu.kernels.decode_attention as attn
from gpu.kernels.decode_attention import decode_attention, decode_attention_ref
from tests.tensorkit import edit_loop, rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}




def make(q_dtype, kv_dtype, hq, hkv, head_dim, cap, *, max_slots=6, seed=0, seq_major=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, hq, head_dim, generator=g).to(q_dtype)
    if seq_major:   # a [S, L, H, D] buffer seen as [S, H, L, D]: exercises the stride arguments
        k = torch.randn(max_slots, cap, hkv, head_dim, generator=g).to(kv_dtype).transpose(1, 2)
        v = torch.randn(max_slots, cap, hkv, head_dim, generator=g).to(kv_dtype).transpose(1, 2)
    else:
        k = torch.randn(max_slots, hkv, cap, head_dim, generator=g).to(kv_dtype)
        v = torch.randn(max_slots, hkv, cap, head_dim, generator=g).to(kv_dtype)
    return q.to(DEV), k.to(DEV), v.to(DEV)


CASES = [  # (q dtype, kv dtype, HQ, HKV, head_dim, cap, lengths, window, splits, seq_major)
    (torch.bfloat16, torch.bfloat16, 6, 2, 24, 50, [37, 1, 50], 0, 1, False),     # thinker-like GQA
    (torch.bfloat16, torch.bfloat16, 10, 2, 20, 70, [70, 33, 5], 0, 3, True),
    (torch.float32, torch.float32, 6, 3, 12, 40, [40, 17, 2], 9, 2, False),       # GQA fp32 (ieee dot)
    (torch.float32, torch.float32, 3, 3, 9, 45, [45, 7, 30], 0, 1, False),        # talker-like MHA fp32
    (torch.float32, torch.float32, 3, 3, 9, 45, [45, 7, 30], 10, 4, True),        # + sliding window
    (torch.float32, torch.bfloat16, 2, 2, 18, 65, [64, 65, 3], 20, 3, False),     # dense profile: bf16 KV
    (torch.float32, torch.float32, 2, 2, 24, 40, [40, 1, 33], 0, 1, False),       # MHA 24 = 16 + 8 tiles
    (torch.float32, torch.float32, 2, 2, 16, 40, [40, 9, 33], 5, 2, False),       # MHA pow2: padded kernel
]
PADDED = [(torch.float32, torch.float32, 3, 3, 9, 45, [45, 7, 30], 10, 2, True),   # head_dim in one
          (torch.float32, torch.bfloat16, 2, 2, 18, 65, [64, 65, 3], 0, 3, False)]  # padded tile
MHA_DOT = [(torch.float32, torch.float32, 3, 3, 9, 45, [45, 7, 30], 10, 2, False),  # MHA through tl.dot
           (torch.float32, torch.bfloat16, 2, 2, 18, 65, [64, 65, 3], 0, 1, True)]


@pytest.mark.parametrize("q_dtype,kv_dtype,hq,hkv,head_dim,cap,lengths,window,splits,seq_major,variant",
                         edit_loop([c + ({},) for c in CASES] + [c + (dict(mha_dot=True),) for c in MHA_DOT]
                                   + [c + (dict(split_d=False),) for c in PADDED], 4))
def test_decode_attention_matches_ref(q_dtype, kv_dtype, hq, hkv, head_dim, cap, lengths, window,
                                      splits, seq_major, variant):
    q, k, v = make(q_dtype, kv_dtype, hq, hkv, head_dim, cap, seed=hq + cap, seq_major=seq_major)
    o, slots, lens = run_checked(q, k, v, lengths, scale=head_dim ** -0.5, window=window,
                                 num_splits=splits, **variant)
    o_ref = decode_attention_ref(q, k, v, slots, lens, scale=head_dim ** -0.5, window=window)
    tol = TOL[torch.bfloat16 if torch.bfloat16 in (q_dtype, kv_dtype) else torch.float32]
    assert rel(o, o_ref) < tol, rel(o, o_ref)


def run_checked(q, k, v, lengths, **kw):
    """decode_attention of rows at slots [4, 0, 2] with these lengths into a NaN-filled `out`:
    (o, slots, lengths) once it returned `out`, all finite, and left the cache as it was."""
    slots = torch.tensor([4, 0, 2], dtype=torch.int32, device=DEV)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    k0, v0 = k.clone(), v.clone()
    out = torch.full_like(q, float("nan"))
    o = decode_attention(q, k, v, slots, lens, out=out, **kw)
    assert o is out and torch.isfinite(o).all()
    assert torch.equal(k, k0) and torch.equal(v, v0), "attention must not write the cache"
    return o, slots, lens


def test_decode_attention_default_splits_and_max_len():
    q, k, v = make(torch.float32, torch.float32, 4, 2, 16, 300, seed=3)
    slots = torch.tensor([5, 1, 3], dtype=torch.int32, device=DEV)
    lens = torch.tensor([257, 128, 190], dtype=torch.int32, device=DEV)
    o = decode_attention(q, k, v, slots, lens, scale=0.25, max_len=260)
    assert rel(o, decode_attention_ref(q, k, v, slots, lens, scale=0.25)) < 1e-5


def test_decode_attention_rejects_bad_args():
    q, k, v = make(torch.float32, torch.float32, 4, 2, 16, 30)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    if DEV == "cpu":    # values are checked only where that costs no device sync
        with pytest.raises(AssertionError, match="lengths"):
            decode_attention(q, k, v, slots, torch.tensor([31, 1, 1], dtype=torch.int32, device=DEV), scale=1.0)
    with pytest.raises(AssertionError, match="v_cache"):
        decode_attention(q, k, v.to(torch.bfloat16), slots, torch.ones(3, dtype=torch.int32, device=DEV), scale=1.0)
    with pytest.raises(AssertionError, match="lanes: MHA only"):     # GROUP 2
        decode_attention(q, k, v, slots, torch.ones(3, dtype=torch.int32, device=DEV), scale=1.0, lanes=True)


LANES = [  # (kv dtype, H, head_dim, cap, lengths, window, splits, block_l); fp32 q, lanes=True
    (torch.bfloat16, 2, 72, 200, [200, 1, 97], 0, 1, 64),     # 200 = 3·64 + 8; length 1
    (torch.float32, 2, 72, 130, [130, 65, 1], 0, 2, 32),
    (torch.bfloat16, 3, 72, 150, [150, 40, 9], 30, 3, 16),    # sliding window
    (torch.bfloat16, 2, 72, 60, [5, 1, 17], 0, 8, 32),        # splits 1..7 of every row empty
    (torch.float32, 2, 72, 80, [80, 3, 0], 9, 8, 16),         # window, empty splits, an empty row
    (torch.float16, 2, 72, 70, [70, 64, 2], 0, 3, 64),
    (torch.bfloat16, 2, 16, 40, [40, 9, 33], 5, 2, 32),       # power-of-two head_dim: two halves
]


@pytest.mark.parametrize("kv_dtype,h,head_dim,cap,lengths,window,splits,block_l",
                         edit_loop(LANES, 3))
def test_lanes_kernel_matches_fp64(kv_dtype, h, head_dim, cap, lengths, window, splits, block_l):
    # fp32 math over the 16-bit cache values, whose fp32 (and fp64) images are exact.
    q, k, v = make(torch.float32, kv_dtype, h, h, head_dim, cap, seed=cap + splits)
    o, slots, lens = run_checked(q, k, v, lengths, scale=head_dim ** -0.5, window=window,
                                 num_splits=splits, block_l=block_l, lanes=True)
    o64 = decode_attention_ref(q.double(), k.double(), v.double(), slots, lens,
                               scale=head_dim ** -0.5, window=window)
    assert rel(o, o64) < 1e-5, rel(o, o64)
    assert (o[lens == 0] == 0).all(), "an empty row attends to nothing: 0"


class _Spy:
    """Stands in for a kernel: records its name at launch, then launches it."""
    def __init__(self, name, kernel, log):
        self.name, self.kernel, self.log = name, kernel, log

    def __getitem__(self, grid):
        self.log.append(self.name)
        return self.kernel[grid]


@pytest.mark.parametrize("kv_dtype,head_dim,lanes,expect", edit_loop([
    (torch.bfloat16, 18, None, "lanes"),        # a split-d shape: lanes by default, any KV dtype
    (torch.bfloat16, 18, False, "split"),
    (torch.bfloat16, 16, None, "padded"),       # power of two: not a split-d shape
    (torch.float16, 18, None, "lanes"),
    (torch.float32, 18, None, "lanes"),
    (torch.float32, 18, False, "split"),
    (torch.bfloat16, 16, True, "lanes"),
], 3))
def test_lanes_default_on_split_d_shapes(monkeypatch, kv_dtype, head_dim, lanes, expect):
    names = dict(lanes="attn_mha_lanes_kernel", split="attn_mha_split_kernel",
                 padded="attn_mha_kernel", dot="_attn_gqa_kernel")
    log = []
    for short, name in names.items():
        monkeypatch.setattr(attn, name, _Spy(short, getattr(attn, name), log))
    q, k, v = make(torch.float32, kv_dtype, 2, 2, head_dim, 20, seed=7)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32, device=DEV)
    lens = torch.tensor([20, 3, 11], dtype=torch.int32, device=DEV)
    o = decode_attention(q, k, v, slots, lens, scale=0.3, num_splits=2, lanes=lanes)
    assert log == [expect], log
    assert rel(o, decode_attention_ref(q.double(), k.double(), v.double(), slots, lens,
                                       scale=0.3)) < 1e-5
    if lanes is None:   # the default is the forced call, bit for bit
        forced = decode_attention(q, k, v, slots, lens, scale=0.3, num_splits=2,
                                  lanes=expect == "lanes")
        assert torch.equal(o, forced)
