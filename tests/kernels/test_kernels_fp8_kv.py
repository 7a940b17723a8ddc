"""fp8 e4m3 KV caches (uint8 bits, a scale per layer and kv head): the kernels' encoder and
decoder against torch's own float8_e4m3fn conversion, the talker's cache write (qk_norm_rope)
and every decode attention kernel against their PyTorch twins on fp8 caches.

On a CPU-only machine conftest sets TRITON_INTERPRET=1, so the kernels run in Triton's interpreter.
"""
import pytest
import torch
import triton
import triton.language as tl

from gpu.kernels.decode_attention import decode_attention, decode_attention_ref
from gpu.kernels.e4m3 import e4m3_decode, e4m3_encode
from gpu.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref
from gpu.model.formats import from_e4m3, to_e4m3
from tests.tensorkit import edit_loop, rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _round_trip(X, BITS, Y, n, N: tl.constexpr):
    i = tl.arange(0, N)
    m = i < n
    bits = e4m3_encode(tl.load(X + i, mask=m, other=0.0))
    tl.store(BITS + i, bits, mask=m)
    tl.store(Y + i, e4m3_decode(bits), mask=m)


def test_the_kernels_make_the_bits_torch_makes_and_read_them_back_exactly():
    """Bug it catches: a truncating encoder (the interpreter's casts truncate), a subnormal or a
    tie rounded the wrong way, -0.0 losing its sign, no saturation past 448 (torch's plain cast
    gives NaN there), or a decoder off by one in the exponent bias."""
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, 448.0, -448.0, 1000.0, -1e9, 2.0 ** -9, 3 * 2.0 ** -10,
                            5 * 2.0 ** -10, 2.0 ** -6, 1.0625, 1.1875, -2.0 ** -7, 240.0, 232.0])
    x = torch.cat([torch.randn(1024, generator=g) * 100, torch.randn(1024, generator=g) * 1e-2,
                   torch.randn(1024, generator=g) * 1e-3, special]).to(DEV)
    bits = torch.empty(len(x), dtype=torch.uint8, device=DEV)
    back = torch.empty(len(x), device=DEV)
    _round_trip[(1,)](x, bits, back, len(x), N=triton.next_power_of_2(len(x)))
    want = to_e4m3(x.cpu())
    assert torch.equal(bits.cpu(), want)
    assert torch.equal(back.cpu(), from_e4m3(want))
    every = torch.arange(256, dtype=torch.uint8)
    every = every[(every & 0x7F) != 0x7F]                    # all but the two NaNs
    assert torch.equal(to_e4m3(from_e4m3(every)), every)     # the twins are each other's inverse


def test_the_cache_write_stores_the_scaled_bits_of_the_reference():
    g = torch.Generator().manual_seed(1)
    b, r, hq, hkv, d, slots_n, p = 3, 1, 4, 4, 72, 5, 9
    q, k, v = (torch.randn(b, r, h * d, generator=g) for h in (hq, hkv, hkv))
    wq, wk = torch.randn(d, generator=g) * 0.1, torch.randn(d, generator=g) * 0.1
    ang = torch.rand(b, d // 2, generator=g) * 6
    slots, pos = torch.tensor([4, 0, 2]), torch.tensor([1, 5, 8])
    scale = torch.rand(2, hkv, generator=g) * 0.02 + 0.005
    caches = [torch.zeros(slots_n, r, hkv, p, d, dtype=torch.uint8, device=DEV) for _ in range(4)]
    args = [t.to(DEV) for t in (q, k, 3 * v, wq, wk, ang.cos(), ang.sin(), slots, pos)]
    q1 = qk_norm_rope(*args, caches[0], caches[1], eps=1e-6, kv_scale=scale.to(DEV))
    q2 = qk_norm_rope_ref(*args, caches[2], caches[3], eps=1e-6, kv_scale=scale.to(DEV))
    assert rel(q1, q2) < 1e-5
    written = (caches[2] != 0).sum().item()
    assert written > 0.9 * 2 * b * hkv * d / 2               # the rows were written
    # equal bits but where the fp32 values differ by an ulp across a rounding boundary
    for mine, ref in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert (mine != ref).float().sum().item() <= 0.01 * written
    with pytest.raises(AssertionError, match="kv_scale"):
        qk_norm_rope(*args, caches[0], caches[1], eps=1e-6)


@pytest.mark.parametrize("rows,hq,hkv,d,variant", edit_loop([
    (1, 4, 4, 72, {}), (2, 8, 2, 64, {}), (1, 4, 4, 72, {"lanes": False}),
    (1, 4, 4, 72, {"split_d": False}), (1, 4, 4, 72, {"mha_dot": True})], 2))
def test_every_attention_kernel_reads_fp8_caches_as_the_reference(rows, hq, hkv, d, variant):
    """Bug it catches: a kernel that reads the bits as numbers, applies a head's scale to the
    wrong head, or forgets the value scale in one of the kernel forms."""
    g = torch.Generator().manual_seed(hq + d)
    scale = torch.rand(2, hkv, generator=g) * 0.05 + 0.01
    shape = (4, rows, hkv, 40, d)
    k8 = to_e4m3(torch.randn(*shape, generator=g) / scale[0, None, None, :, None, None])
    v8 = to_e4m3(2 * torch.randn(*shape, generator=g) / scale[1, None, None, :, None, None])
    q = torch.randn(3, rows, hq, d, generator=g)
    slots, lens = torch.tensor([3, 0, 2]), torch.tensor([39, 5, 20])
    args = [t.to(DEV) for t in (q, k8, v8, slots, lens)]
    o = decode_attention(*args, scale=0.1, kv_scale=scale.to(DEV), **variant)
    want = decode_attention_ref(*args, scale=0.1, kv_scale=scale.to(DEV))
    assert rel(o, want) < 1e-5
