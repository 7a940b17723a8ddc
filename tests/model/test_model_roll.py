"""Rolling a session's caches at the end of its context (TalkerState.roll, ThinkerState.roll):
rows after the sinks move down by the dropped count, and a talker key moved back `drop` rows is
the key of its position minus `drop`, at each layer's RoPE θ."""
import pytest
import torch

from gpu.model import slots as roll
from gpu.model.talker.state import TalkerState, roll_turn
from gpu.model.talker.config import TalkerConfig
from gpu.model.talker.text import apply_rope_tables, rope_cos_sin, rope_tables
from gpu.model.thinker import ThinkerState
from tests.model.test_model_voicechat_kit import CFG


def rotated(raw: torch.Tensor, positions: torch.Tensor, cfg: TalkerConfig) -> torch.Tensor:
    """raw keys [L, R, kv, n, D] rotated at `positions` [n] with each layer's θ."""
    out = torch.empty_like(raw)
    for layer, full in enumerate(cfg.full_layers):
        theta = cfg.rope_theta_full if full else cfg.rope_theta_local
        cos, sin = rope_cos_sin(positions, cfg.head_dim, theta)           # [n, D/2]
        # apply_rope_tables takes [..., T, heads, D]: put positions before the kv heads
        x = raw[layer].transpose(-3, -2)                                  # [R, n, kv, D]
        out[layer] = apply_rope_tables(x, rope_tables(cos, sin)).transpose(-3, -2)
    return out


@pytest.mark.parametrize("block_positions", [None, 1, 4])
@pytest.mark.parametrize("profile, tol", [("reference", 1e-5), ("dense", 1e-2)])
@pytest.mark.parametrize("cfg", [CFG.talker, TalkerConfig.full()], ids=["tiny", "full"])
def test_a_rolled_talker_key_is_the_key_of_its_new_position(cfg, profile, tol, block_positions,
                                                            monkeypatch):
    """Bug it catches: moving rows without turning their keys back (or turning them at the
    wrong layer's θ) leaves every query of the window at the wrong distance from them; moved
    in blocks smaller than the drop or larger, no row is read after it was overwritten."""
    torch.manual_seed(0)
    if block_positions:
        per_position = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 4
        monkeypatch.setattr(roll, "ROLL_BLOCK_BYTES", block_positions * per_position)
    end, sink, drop = 40, 8, 6
    state = TalkerState.alloc(cfg, 2, end, profile=profile)
    state.k.zero_()
    raw = torch.randn(cfg.n_layers, state.rows, cfg.n_kv_heads, end, cfg.head_dim)
    if profile == "dense":       # as stored: the reference below starts from the same rounding
        raw = raw.bfloat16().float()
    values = torch.randn_like(raw)
    state.k[1, ..., :end, :] = rotated(raw, torch.arange(end), cfg)
    state.v[1, ..., :end, :] = values
    state.position[1] = end
    before0 = state.k[0].clone()
    state.roll(1, sink, drop, roll_turn(cfg, drop, "cpu"))
    assert int(state.position[1]) == end - drop
    kept = torch.cat([torch.arange(sink), torch.arange(sink + drop, end)])   # original rows
    want = rotated(raw[..., kept, :], torch.arange(end - drop), cfg)
    got = state.k[1, ..., :end - drop, :].float()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert torch.equal(state.v[1, ..., :end - drop, :], values[..., kept, :].to(state.v.dtype))
    assert torch.equal(state.k[0], before0)                              # other slots untouched


@pytest.mark.parametrize("block_positions", [None, 1, 3])
def test_a_rolled_thinker_keeps_its_prompt_and_its_latest_rows(block_positions, monkeypatch):
    cfg = CFG.thinker
    state = ThinkerState.alloc(cfg, 2, 30)
    if block_positions:          # blocks shorter than the drop of 4, and not dividing the rows
        per_position = state.k[:, 1, 0].numel() * 2 * 4
        monkeypatch.setattr(roll, "ROLL_BLOCK_BYTES", block_positions * per_position)
    rows = torch.randn_like(state.k)
    state.k.copy_(rows)
    state.v.copy_(-rows)
    state.length[:] = torch.tensor([25, 28])
    state.roll(1, 5, 4)
    assert state.length.tolist() == [25, 24]
    kept = torch.cat([torch.arange(5), torch.arange(9, 28)])
    assert torch.equal(state.k[:, 1, :24], rows[:, 1, kept])
    assert torch.equal(state.v[:, 1, :24], -rows[:, 1, kept])
    assert torch.equal(state.k[:, 0], rows[:, 0])
    with pytest.raises(ValueError, match="cannot drop"):
        state.roll(0, 25, 8)


def test_a_rolled_fp8_talker_key_is_the_key_of_its_new_position():
    """fp8 caches hold scaled e4m3 bits: the keys are decoded, turned back and encoded again
    (turning the bits themselves would be garbage), the values move as they are."""
    from gpu.model.formats import from_e4m3, to_e4m3
    cfg = CFG.talker
    torch.manual_seed(1)
    end, sink, drop = 40, 8, 6
    scale = torch.rand(cfg.n_layers, 2, cfg.n_kv_heads) * 0.02 + 0.01
    state = TalkerState.alloc(cfg, 2, end, profile="dense", kv_dtype=torch.float8_e4m3fn,
                              kv_scale=scale)
    assert state.kv8 and state.k.dtype == torch.uint8
    per_head = scale[:, 0, None, :, None, None]                        # [L, 1, kv, 1, 1]
    raw = torch.randn(cfg.n_layers, state.rows, cfg.n_kv_heads, end, cfg.head_dim)
    keys = rotated(raw, torch.arange(end), cfg)
    state.k[1, ..., :end, :] = to_e4m3(keys / per_head)
    stored = from_e4m3(state.k[1, ..., :end, :]) * per_head             # what the cache holds
    values = state.v[1, ..., :end, :] = to_e4m3(torch.randn_like(raw))
    state.position[1] = end
    state.roll(1, sink, drop, roll_turn(cfg, drop, "cpu"))
    kept = torch.cat([torch.arange(sink), torch.arange(sink + drop, end)])
    want = rotated(raw[..., kept, :], torch.arange(end - drop), cfg)
    got = from_e4m3(state.k[1, ..., :end - drop, :]) * per_head
    assert (got - want).abs().max() <= 0.13 * want.abs().max()           # two fp8 roundings
    assert torch.equal(got[..., :sink, :], stored[..., :sink, :])        # sinks stay as stored
    assert torch.equal(state.v[1, ..., :end - drop, :], values[..., kept, :])
