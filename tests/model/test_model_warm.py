"""The talker's warm-up copied in at a slot's reset (VoiceChat.warm) instead of run per session:
its inputs are fixed, so the copy must leave exactly the state that running it leaves."""
import pytest
import torch

from gpu.model.config import Profile
from gpu.model.voicechat import VoiceChat
from tests.model.test_model_voicechat_kit import CFG


@pytest.mark.parametrize("profile, tol", [("fp32", 1e-6), ("dense", 1e-2)])
def test_a_copied_warm_up_equals_the_warm_up_run_in_chunks(profile, tol):
    """Bugs caught: a template of the wrong positions, layers or CFG rows; a copy that touches
    another slot; a position counter left at 0 (the first frame would overwrite the warm-up)."""
    model = VoiceChat.random(CFG, Profile.named(profile), seed=3)
    ran, copied = model.alloc_state(3, 32), model.alloc_state(3, 32)
    slots = torch.tensor([0, 2])
    for state in (ran, copied):
        state.talker.k[1] = state.talker.v[1] = 7.0           # another session's rows
    n = CFG.talker.n_warmup
    for at in range(0, n, 8):                                 # as an eager start runs it
        model.warmup_chunk(ran, slots, min(8, n - at))
    model.warm(copied, slots)
    assert torch.equal(copied.talker.position, ran.talker.position)
    assert copied.talker.position.tolist() == [n, 0, n]
    for name in ("k", "v"):
        a, b = getattr(ran.talker, name).float(), getattr(copied.talker, name).float()
        assert torch.equal(b[1], a[1]) and (b[1] == 7.0).all()
        scale = a.abs().max()
        assert (a - b).abs().max() <= tol * scale, name
        assert a[:, :, :, :, :n].abs().sum() > 0
