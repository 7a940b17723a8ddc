"""A prompt chunk through a Mamba2 layer in the dual (SSD) form from a carried state, against
the plain recurrence run position by position."""
import pytest
import torch
import torch.nn.functional as F

from gpu.model.config import VoiceChatConfig
from gpu.model.thinker import Mamba2


def recurrence(m: Mamba2, u, conv, ssm, valid):
    """h_t = exp(Δ_t A)·h_{t−1} + Δ_t x_t ⊗ B_t, y_t = h_t·C_t, one position at a time; an
    invalid position leaves the state as it was."""
    z, xbc, dt = m._split(u)
    seq = torch.cat([conv, xbc.transpose(1, 2)], dim=2)
    xbc = F.silu(m.conv1d(seq)).transpose(1, 2)
    x, Bh, Ch, delta, A = m._ssm_inputs(xbc, dt)
    ys = []
    for t in range(u.shape[1]):
        upd = torch.exp(delta[:, t] * A)[..., None, None] * ssm \
            + (delta[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        ssm = torch.where(valid[:, t, None, None, None], upd, ssm)
        ys.append(torch.einsum("bhpn,bhn->bhp", ssm, Ch[:, t]))
    return m._out(torch.stack(ys, 1), x, z), ssm


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_the_chunk_in_dual_form_equals_the_recurrence(chunk):
    """Bugs caught: the carried state's decay applied from the wrong position, an invalid
    position that decays or feeds the state, a decay that crosses the causal diagonal."""
    torch.manual_seed(chunk)
    cfg = VoiceChatConfig.tiny().thinker
    m = Mamba2(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    u = torch.randn(4, chunk, cfg.hidden)
    conv = torch.randn(4, cfg.conv_dim, cfg.conv_kernel - 1)
    ssm = torch.randn(4, cfg.mamba_heads, cfg.mamba_head_dim, cfg.d_state)
    valid = torch.arange(chunk) < torch.tensor([chunk, chunk // 2, 1, 0])[:, None]
    with torch.no_grad():
        want_y, want_ssm = recurrence(m, u, conv, ssm, valid)
        y, _, got_ssm = m.forward_chunk(u, conv, ssm, valid)
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
    assert rel(y[valid], want_y[valid]) < 1e-5
    assert rel(got_ssm, want_ssm) < 1e-5
    assert torch.equal(got_ssm[3], ssm[3])                  # nothing valid: state untouched
