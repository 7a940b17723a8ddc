"""RNNT: the always-10-step masked batched decoder == NeMo's per-session greedy loop with early
exit; turn-taking counters == a plain per-frame reference; batch invariance and reset."""
import torch

from gpu.model import rnnt as R
from tests.tensorkit import _no_grad  # noqa: F401 (the fixture registers by import)




def model(seed=0):
    """Tiny RNNT whose random weights give frames of 0, some and 10 tokens (checked by the tests):
    biases nonzero, the predictor's say in the joint ×4, blank favoured by +1."""
    cfg = R.RNNTConfig.tiny()
    g = torch.Generator().manual_seed(seed)
    sd = R.init_random(cfg, g)
    for k, v in sd.items():
        if "bias" in k:
            sd[k] = 0.5 * torch.randn(v.shape, generator=g)
    sd[R.PREFIX + "rnnt_joint.pred.weight"] *= 4
    sd[R.PREFIX + "rnnt_joint.joint_net.2.bias"][cfg.blank] = 1.0
    m = R.RNNT(cfg)
    m.load_named(sd)
    return m


def encoder_frames(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.25, 3.0, B)[:, None, None]
    return scale * torch.randn(B, T, cfg.enc_dim, generator=g)


def nemo_greedy(m, enc):
    """One session, NeMo's loop: the predictor is re-run from (last label, hidden) each symbol, the
    first from (blank, zeros); a blank ends the frame and the hidden state is kept only on emit."""
    cfg = m.cfg
    zeros = torch.zeros(1, cfg.lstm_layers, cfg.pred_dim)
    label, hidden, out = None, None, []
    for e in enc:
        f, frame = m.rnnt_joint["enc"](e[None]), []
        for _ in range(cfg.max_symbols):
            if label is None:
                g, h, c = m._predict(torch.tensor([cfg.blank]), zeros, zeros)
            else:
                g, h, c = m._predict(torch.tensor([label]), *hidden)
            k = int(m.joint(f, g).argmax(-1))
            if k == cfg.blank:
                break
            frame.append(k)
            label, hidden = k, (h, c)
        out.append(frame)
    return out


def run(m, state, enc, slots):
    outs = [m.step(state, enc[:, t], slots) for t in range(enc.shape[1])]
    return outs, torch.stack([o.tokens for o in outs], 1)          # [B, T, 10]


def test_masked_decode_equals_nemo_greedy_loop():
    m = model()
    cfg, B, T = m.cfg, 5, 16
    enc = encoder_frames(cfg, B, T, seed=1)
    state = R.RNNTState.alloc(m, 7)
    outs, tokens = run(m, state, enc, torch.tensor([6, 0, 3, 1, 4]))
    counts = torch.stack([o.n_tokens for o in outs], 1)
    assert (counts == 0).any() and (counts == cfg.max_symbols).any() and ((counts > 0) & (counts < 10)).any()
    for b in range(B):
        ref = nemo_greedy(m, enc[b])
        for t in range(T):
            got = tokens[b, t]
            assert got[:len(ref[t])].tolist() == ref[t] and (got[len(ref[t]):] == -1).all()
            assert counts[b, t] == len(ref[t])


def test_start_state_is_predictor_primed_with_blank():
    m = model(seed=2)
    state = R.RNNTState.alloc(m, 3)
    zeros = torch.zeros(1, m.cfg.lstm_layers, m.cfg.pred_dim)
    g, h, c = m._predict(torch.tensor([m.cfg.blank]), zeros, zeros)
    torch.testing.assert_close(state.g, g.expand(3, -1), rtol=0, atol=0)
    torch.testing.assert_close(state.h, h.expand(3, -1, -1), rtol=0, atol=0)
    assert state.g.abs().sum() > 0                                # LSTM biases make it nonzero


def turn_reference(cfg, speech):
    """Plain per-frame reference of the counters for one session's speech flags."""
    run = blank = turns = 0
    inside, out = False, []
    for s in speech:
        run, blank = (run + 1, 0) if s else (0, blank + 1)
        bou = not inside and run >= (cfg.bou_frames_first if turns == 0 else cfg.bou_frames)
        eou = inside and blank >= cfg.eou_frames
        turns += bou
        inside = (inside or bou) and not eou
        out.append((bou, eou, inside, run))
    return out


def test_turn_taking_counters():
    m = model()
    cfg = m.cfg
    g = torch.Generator().manual_seed(3)
    pattern = [1, 1, 0, 1] + [0] * 16 + [1, 1, 0, 1, 1, 1] + [0] * 15 + [1]
    speech = torch.tensor([pattern, (torch.rand(len(pattern), generator=g) < 0.5).long().tolist()]).bool()
    state = R.RNNTState.alloc(m, 3)
    slots = torch.tensor([2, 0])
    got = [m._turns(state, speech[:, t], slots) + (state.in_utterance[slots].clone(), state.speech_run[slots].clone())
           for t in range(speech.shape[1])]
    for b in range(2):
        ref = turn_reference(cfg, speech[b].tolist())
        assert [tuple(bool(x[b]) if i < 3 else int(x[b]) for i, x in enumerate(row)) for row in got] == \
               [(bool(r[0]), bool(r[1]), bool(r[2]), r[3]) for r in ref]
    bous = [t for t, row in enumerate(got) if row[0][0]]
    eous = [t for t, row in enumerate(got) if row[1][0]]
    assert bous == [1, 25] and eous == [18, 40]                   # 2 frames first turn, 3 after; 15 blanks


def test_rnnt_batch_invariance_and_reset():
    m = model(seed=4)
    cfg, T = m.cfg, 10
    enc = encoder_frames(cfg, 4, T + 3, seed=5)
    alone = R.RNNTState.alloc(m, 4)
    _, ref = run(m, alone, enc[1:2, :T], torch.tensor([2]))
    state = R.RNNTState.alloc(m, 4)
    m.step(state, enc[[0, 3], 0], torch.tensor([0, 3]))            # others one frame ahead
    got = []
    for t in range(T):
        if t == 5:
            state.reset(torch.tensor([0]))
        out = m.step(state, torch.stack([enc[0, t + 1], enc[1, t], enc[3, t + 1]]), torch.tensor([3, 2, 0]))
        got.append(out.tokens[1])
    assert torch.equal(torch.stack(got), ref[0])
    state.reset(torch.tensor([2]))
    _, again = run(m, state, enc[1:2, :T], torch.tensor([2]))
    assert torch.equal(again, ref)


def test_rnnt_outputs_well_formed():
    m = model(seed=6)
    state = R.RNNTState.alloc(m, 4)
    outs, tokens = run(m, state, encoder_frames(m.cfg, 4, 8, seed=7), torch.arange(4))
    valid = tokens >= 0
    assert ((tokens < m.cfg.vocab) | ~valid).all()                 # never emits blank
    assert (valid[..., 1:] <= valid[..., :-1]).all()               # tokens first, then −1 padding
    assert all(torch.isfinite(t).all() for t in (state.g, state.h, state.c))
