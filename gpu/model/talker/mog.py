"""EAR-TTS mixture-of-Gaussians head with iterative unmasking (docs/MODEL.md §2.5 step 5).

Algorithm, per frame and session, from the backbone output h_r of each CFG row r:
  q = 0 (the sum of the codebook vectors chosen so far, [latent]).
  For each of the n_steps steps s whose width w_s > 0 (w from the masking formula):
    m_r = MLP stack(embed_code(q) + h_r)          3 residual gated-MLP blocks + RMSNorm
    ĝ   = m_c + cfg_scale·(m_c − m_u)              (ĝ = m_c when CFG is off)
    k   = argmax(top_p(proj_logits(ĝ)) + Gumbel(U_s))   mixture, U_s = row s of the uniforms
    σ   = exp(max(proj_logs(ĝ), min_log_std))
    z   = low_mat[k]·(proj_mus[k]·ĝ)·σ + proj_else(ĝ) + noise_scale·ε_s·σ
    greedy L2 residual VQ of z over the next w_s codebooks; their vectors are added to q.
The static schedule (31 codebooks, 8 steps: [0,0,0,1,1,3,4,22]) fixes the work: always the same
passes, always a full K-way sort for top-p, whatever the values (docs/MODEL.md §8).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from gpu.model.talker.text import GatedMLP, RMSNorm, add_normed

if TYPE_CHECKING:
    from gpu.model.talker.config import TalkerConfig

FILTERED_LOGIT = -1e9       # what top-p writes over the dropped mixtures
GUMBEL_EPS = 1e-8


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Keep a mixture iff the probability mass sorted before it is < top_p; others → −1e9.

    logits [B, K] → [B, K] in the original order. Always a full descending K-way sort.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs               # exclusive prefix sum
    kept = sorted_logits.masked_fill(before >= top_p, FILTERED_LOGIT)
    return torch.empty_like(logits).scatter_(-1, order, kept)


def gumbel_choice(logits: Tensor, uniforms: Tensor) -> Tensor:
    """argmax(logit − log(−log(U + 1e-8) + 1e-8)): a sample given the uniforms U [B, K] → [B]."""
    gumbel = -torch.log(-torch.log(uniforms + GUMBEL_EPS) + GUMBEL_EPS)
    return (logits + gumbel).argmax(dim=-1)


def codebook_sqnorms(codebooks: Tensor) -> Tensor:
    """‖e_i‖² of every code vector: [..., V, D] → [..., V]."""
    return (codebooks * codebooks).sum(-1)


def rvq_search(z: Tensor, codebooks: Tensor, sqnorms: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Greedy L2 residual VQ of z [B, D] over codebooks [w, V, D] (their ‖e‖² [w, V] may be
    passed in: computed once per frame for all 31 books, not once per step).

    Returns the codes [B, w] (c_j = argmin_i ‖e_i‖² − 2·r·e_i, then r ← r − e_{c_j}) and the sum
    of the chosen vectors [B, D].
    """
    if sqnorms is None:
        sqnorms = codebook_sqnorms(codebooks)
    r, chosen_sum, codes = z, torch.zeros_like(z), []
    for book, norms in zip(codebooks, sqnorms):                 # w iterations, static
        dist = torch.addmm(norms[None, :], r, book.T, alpha=-2.0)          # ‖e‖² − 2·r·e [B, V]
        c = dist.argmin(dim=-1)
        e = book[c]                                                       # [B, D]
        r, chosen_sum = r - e, chosen_sum + e
        codes.append(c)
    return torch.stack(codes, dim=-1), chosen_sum


class MogBlock(nn.Module):
    """x + post_norm(gated MLP(pre_norm(x)))."""

    def __init__(self, cfg: "TalkerConfig"):
        super().__init__()
        self.pre_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = GatedMLP(cfg.hidden, cfg.mlp)
        self.post_norm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(self, x: Tensor) -> Tensor:
        return add_normed(x, self.mlp(self.pre_norm(x)), self.post_norm)[0]


class MogHead(nn.Module):
    """`mog_head`: MLP stack, mixture logits, low-rank means, shared log-std, residual mean."""

    def __init__(self, cfg: "TalkerConfig"):
        super().__init__()
        self.cfg = cfg
        blocks: list[nn.Module] = [MogBlock(cfg) for _ in range(cfg.mog_layers)]
        self.mlp_stack = nn.ModuleList(blocks + [RMSNorm(cfg.hidden, cfg.rms_eps)])
        self.proj_logits = nn.Linear(cfg.hidden, cfg.n_mixtures, bias=False)
        # [K·r, H] as in the checkpoint; used as the free view [K, r, H] (the loader's rule).
        self.proj_mus = nn.Linear(cfg.hidden, cfg.n_mixtures * cfg.low_rank, bias=False)
        self.proj_logs = nn.Linear(cfg.hidden, 1, bias=False)
        self.proj_else = nn.Linear(cfg.hidden, cfg.latent, bias=False)
        self.low_mat = nn.Parameter(torch.empty(cfg.n_mixtures, cfg.latent, cfg.low_rank))
        self.decode_ops = None      # gpu.engine.decode_ops.TritonDecodeOps on the fast path

    def guided(self, x: Tensor) -> Tensor:
        """MLP stack on every CFG row x [B, R, H], then ĝ [B, H] (CFG when R = 2)."""
        for block in self.mlp_stack:
            x = block(x)
        m_c = x[:, 0]
        if x.shape[1] == 1:
            return m_c
        return m_c + self.cfg.cfg_scale * (m_c - x[:, 1])

    def choose(self, logits: Tensor, uniforms: Tensor) -> Tensor:
        """The mixture k [B]: Gumbel-max over the top-p filtered logits [B, K] (one kernel
        launch on the engine's fast path instead of a sort and a dozen elementwise ops)."""
        if self.decode_ops is not None:
            return self.decode_ops.mog_choice(logits, uniforms, self.cfg.top_p)
        return gumbel_choice(top_p_filter(logits, self.cfg.top_p), uniforms)

    def latent(self, g: Tensor, k: Tensor, eps: Tensor) -> Tensor:
        """z [B, D] of mixture k [B] at ĝ [B, H] with normals ε [B, D]."""
        cfg = self.cfg
        sigma = self.proj_logs(g).clamp(min=cfg.min_log_std).exp()          # [B, 1]
        mus = self.proj_mus.weight.view(cfg.n_mixtures, cfg.low_rank, cfg.hidden)[k]  # [B, r, H]
        low = torch.einsum("brh,bh->br", mus, g)
        mean = torch.einsum("bdr,br->bd", self.low_mat[k], low) * sigma + self.proj_else(g)
        return mean + cfg.noise_scale * eps * sigma

    def sample(self, h: Tensor, embed_code: nn.Linear, rvq_embs: Tensor,
               uniforms: Tensor, normals: Tensor, sqnorms: Tensor | None = None) -> Tensor:
        """Codes [B, Q] from h [B, R, H], uniforms [B, S, K], normals [B, S, D]; `sqnorms`
        [Q, V] = codebook_sqnorms(rvq_embs) when the caller keeps them (EarTTS does)."""
        cfg = self.cfg
        q = h.new_zeros(h.shape[0], cfg.latent)
        if sqnorms is None:
            sqnorms = codebook_sqnorms(rvq_embs)
        codes, first = [], 0
        for s, width in enumerate(cfg.schedule):
            if width == 0:                                   # static: the schedule is config
                continue
            g = self.guided(h + embed_code(q)[:, None, :])
            k = self.choose(self.proj_logits(g), uniforms[:, s])
            z = self.latent(g, k, normals[:, s])
            c, chosen = rvq_search(z, rvq_embs[first:first + width], sqnorms[first:first + width])
            codes.append(c)
            q, first = q + chosen, first + width
        return torch.cat(codes, dim=-1)
