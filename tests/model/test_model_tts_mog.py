"""MoG head sampling pieces (gpu/model/talker/mog.py): schedule, top-p, Gumbel choice, RVQ, z."""
import math

import pytest
import torch

from gpu.model.talker.config import TalkerConfig, unmasking_schedule
from gpu.model.talker.mog import gumbel_choice, rvq_search, top_p_filter
from gpu.model.talker.talker import Talker
from gpu.model.talker.weights import init_random, load_talker
from tests.model.test_model_tts import CFG, inputs, make_talker

RTOL, ATOL = 1e-5, 1e-5




@pytest.fixture(scope="module")
def talker(one_thread):
    return make_talker()


def test_unmasking_schedule_from_the_formula():
    assert unmasking_schedule(31, 8, 3.0) == (0, 0, 0, 1, 1, 3, 4, 22)
    assert TalkerConfig.full().schedule == (0, 0, 0, 1, 1, 3, 4, 22)
    assert sum(w > 0 for w in TalkerConfig.full().schedule) == 5               # 5 passes
    tiny = TalkerConfig.tiny().schedule                   # same formula, 8 codebooks
    assert sum(tiny) == 8 and 0 in tiny and max(tiny) > 1 and sum(w > 0 for w in tiny) > 1


def _expected_keep(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Float64 loop: walk the sorted mixtures, keep while the mass before is < top_p."""
    keep = torch.zeros_like(logits, dtype=torch.bool)
    for b in range(logits.shape[0]):
        probs = torch.softmax(logits[b].double(), 0)
        mass = 0.0
        for i in torch.argsort(logits[b], descending=True).tolist():
            assert abs(mass - top_p) > 1e-5, "test input too close to the boundary"
            keep[b, i] = mass < top_p
            mass += probs[i].item()
    return keep


def test_top_p_keeps_exactly_the_items_before_mass_095():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 1024, generator=g) * torch.tensor([0.5, 1, 2, 3, 4, 8])[:, None]
    keep = _expected_keep(logits, 0.95)
    out = top_p_filter(logits, 0.95)
    assert torch.equal(out[keep], logits[keep]) and (out[~keep] == -1e9).all()
    assert 1 <= keep.sum(1).min() and keep.sum(1).max() < 1024          # it does cut
    flat = top_p_filter(torch.zeros(1, 1024), 0.95)                      # uniform: i/1024 < 0.95
    assert (flat > -1).sum() == math.ceil(0.95 * 1024)
    peaked = torch.zeros(1, 1024)
    peaked[0, 17] = 20.0                                                 # one item holds > 0.95
    assert (top_p_filter(peaked, 0.95) > -1).nonzero()[:, 1].tolist() == [17]


def test_gumbel_choice_is_reproducible_and_samples_the_softmax():
    g = torch.Generator().manual_seed(1)
    logits = top_p_filter(torch.randn(1, 32, generator=g).expand(20000, -1), 0.95)
    u = torch.rand(20000, 32, generator=g)
    k = gumbel_choice(logits, u)
    assert torch.equal(k, gumbel_choice(logits.clone(), u.clone()))
    ref = (logits.double() - torch.log(-torch.log(u.double() + 1e-8) + 1e-8)).argmax(-1)
    assert torch.equal(k, ref)
    assert (logits[0, k] > -1).all()                                      # never a dropped item
    freq = torch.bincount(k, minlength=32).double() / k.numel()
    assert (freq - torch.softmax(logits[0].double(), 0)).abs().max() < 0.015
    assert not torch.equal(k, gumbel_choice(logits, torch.rand(20000, 32, generator=g)))


def test_rvq_search_picks_the_argmin():
    g = torch.Generator().manual_seed(2)
    books = torch.randn(5, 64, 16, generator=g)
    z = torch.randn(7, 16, generator=g) * 3
    codes, chosen = rvq_search(z, books)
    r = z.double()
    for j in range(5):
        want = torch.cdist(r, books[j].double()).argmin(-1)
        assert torch.equal(codes[:, j], want)
        r = r - books[j].double()[want]
    torch.testing.assert_close(chosen, (z.double() - r).float(), rtol=RTOL, atol=ATOL)


@torch.no_grad()
def test_mixture_latent_formula():
    cfg = TalkerConfig.tiny()
    with torch.device("meta"):
        talker = Talker(cfg)
    load_talker(talker, init_random(cfg, torch.Generator().manual_seed(3)))
    head = talker.tts_model.mog_head
    g = torch.Generator().manual_seed(4)
    x, k, eps = (torch.randn(3, cfg.hidden, generator=g), torch.tensor([0, 31, 7]),
                 torch.randn(3, cfg.latent, generator=g))
    z = head.latent(x, k, eps)
    mus, r = head.proj_mus.weight, cfg.low_rank
    for b in range(3):
        kb = k[b].item()
        sigma = math.exp(max((head.proj_logs.weight[0] @ x[b]).item(), -4.0))
        low = mus[r * kb:r * kb + r] @ x[b]                            # rows 64k..64k+63
        want = head.low_mat[kb] @ low * sigma + head.proj_else.weight @ x[b] + 1e-3 * eps[b] * sigma
        torch.testing.assert_close(z[b], want, rtol=RTOL, atol=ATOL)


@torch.no_grad()
def test_mog_sampling_loop_follows_the_schedule(talker):
    """Unmasking by hand, one session at a time: steps with w_s > 0 use row s of the random
    inputs, q accumulates the chosen vectors, codebooks are consumed in order."""
    m, head = talker.tts_model, talker.tts_model.mog_head
    g = torch.Generator().manual_seed(13)
    h = torch.randn(3, 2, CFG.hidden, generator=g)
    inp = inputs(3, seed=14)
    codes = head.sample(h, m.embed_code, m.rvq_embs, inp.uniforms, inp.normals)
    schedule = [0, 0, 0, 0, 0, 1, 1, 6]                  # the formula's schedule for 8 codebooks
    for b in range(3):
        q, book, want = torch.zeros(CFG.latent), 0, []
        for s, width in enumerate(schedule):
            if width == 0:
                continue
            gd = head.guided((h[b] + m.embed_code(q))[None])
            k = gumbel_choice(top_p_filter(head.proj_logits(gd), CFG.top_p), inp.uniforms[b, s][None])
            r = head.latent(gd, k, inp.normals[b, s][None])[0]
            for _ in range(width):
                c = int(torch.cdist(r[None], m.rvq_embs[book]).argmin())
                r, q, book = r - m.rvq_embs[book, c], q + m.rvq_embs[book, c], book + 1
                want.append(c)
        assert codes[b].tolist() == want
