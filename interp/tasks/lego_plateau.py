"""Why a LEGO model sits on the #2 plateau (analyses/research/plateau.py): for every head, its attention on
the hop (the parent clause) and the pull of the loss toward it; and what a model's answers alone
say of the hop (`parent_element_split`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from tasks import Batch, LegoTask, logits_at_labels
from tasks.lego import PAD

# ---------------------------------------------------------------------------------------------
# The #2 plateau (analyses/research/plateau.py): does the loss pull any head toward the hop?
#
# Variable #k (k >= 2) needs one association hop per step back along the chain: from the clause of
# #k, attend to the clause of its parent #k-1, whose left-hand token is the same letter as #k's
# right-hand token. For every head we read, at #k's left-hand (LHS) and right-hand (RHS) tokens,
#
# - `attention`: the mass on the parent's LHS token, and what uniform attention would give there;
# - `pull`: minus the gradient of #k's loss with respect to that attention score, minus the same
#   for the query's average other key. Positive means gradient descent raises the hop's attention.
#
# On uniform training data a Z2 model's #k is parent XOR own element, so copying the parent's value
# alone gains nothing at first order and the pull averages to ~0: the plateau. The measurement is
# per batch, so the same model can be read on uniform and on biased (mixed-input) sentences.
#
# `parent_element_split` reads what a model knows of the hop from its answers alone: #k's
# accuracy apart for sentences whose parent clause applies the identity and for the others. The
# zero-hop rule (x0 + g0 + gk, what plateau models answer) is right exactly when the parent's
# element is the identity (1 and 0); guessing gives chance on both; the hop gives 1 and 1. In Z2,
# `signal` = the two accuracies' sum minus 1 is how well the answers track the parent's element:
# 0 for the zero-hop rule and for guessing alike, 1 for the hop.
# Shapes: batch, layer, head_index, query_pos, key_pos, and site (LHS or RHS of #k).

SITES = ("lhs", "rhs")
RHS_OFFSET = 3  # `lhs = g rhs ;`: the right-hand token is three after the left-hand one


@dataclass
class HopPull:
    """Per (site, layer, head): attention on the parent's LHS, its uniform baseline, and the pull."""

    variable: int
    attention: Float[Tensor, "site layer head_index"]
    uniform: float
    pull: Float[Tensor, "site layer head_index"]
    loss: float

    def strongest(self) -> tuple[str, int, int, float]:
        """The (site, layer, head, pull) with the largest pull."""
        return _largest(self.pull)

    def most_attentive(self) -> tuple[str, int, int, float]:
        """The (site, layer, head, attention) that puts the most attention on the parent."""
        return _largest(self.attention)


def _largest(values: Float[Tensor, "site layer head_index"]) -> tuple[str, int, int, float]:
    flat = int(values.argmax())
    site, rest = divmod(flat, values.shape[1] * values.shape[2])
    layer, head = divmod(rest, values.shape[2])
    return SITES[site], layer, head, float(values.flatten()[flat])


def hop_pull(model: HookedTransformer, task: LegoTask, batch: Batch, variable: int) -> HopPull:
    """Attention on, and gradient pull toward, the parent clause of `variable` for every head,
    from `variable`'s loss alone, averaged over the batch (full-length sentences)."""
    if not 1 <= variable < task.cfg.n_vars:
        raise ValueError(f"variable={variable} has no parent clause; use 1..{task.cfg.n_vars - 1}")
    if not batch.label_mask[:, variable].all():
        raise ValueError("hop_pull needs full-length sentences (split='test', or no task.min_vars)")
    scores: dict[int, Tensor] = {}
    patterns: dict[int, Tensor] = {}

    def keep_scores(value: Tensor, hook) -> Tensor:
        value.retain_grad()
        scores[hook.layer()] = value
        return value

    def keep_pattern(value: Tensor, hook) -> Tensor:  # the pattern used (planted heads replace it)
        patterns[hook.layer()] = value.detach()
        return value

    hooks = [hook for layer in range(model.cfg.n_layers) for hook in
             [(f"blocks.{layer}.attn.hook_attn_scores", keep_scores),
              (f"blocks.{layer}.attn.hook_pattern", keep_pattern)]]
    with torch.enable_grad():
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)
        picked = logits_at_labels(logits, batch.label_pos)[:, variable]
        loss = F.cross_entropy(picked, batch.labels[:, variable])
        loss.backward()
    rows = torch.arange(len(batch))
    lhs = batch.label_pos[:, variable]
    queries = torch.stack([lhs, lhs + RHS_OFFSET])  # [site batch]
    parent = batch.label_pos[:, variable - 1]
    attention, pull = [], []
    for layer in range(model.cfg.n_layers):
        pattern, g = patterns[layer], -scores[layer].grad  # [batch head q k]; g: descent direction
        att = torch.stack([pattern[rows, :, q, parent] for q in queries])  # [site batch head]
        toward = torch.stack([g[rows, :, q, parent] for q in queries])
        others = torch.stack([g[rows, :, q, :].mean(-1) for q in queries])
        attention.append(att.mean(1))
        pull.append((toward - others).mean(1) * len(batch))  # undo the loss's mean over the batch
    model.zero_grad(set_to_none=True)
    n_keys = int((batch.tokens[0] != PAD).sum())
    return HopPull(variable, torch.stack(attention, 1), 1.0 / n_keys, torch.stack(pull, 1), loss.item())


@dataclass
class ParentSplit:
    """#`variable`'s accuracy where its parent clause's element is the identity, and elsewhere."""

    variable: int
    identity: float
    other: float
    share_identity: float  # of the sentences

    @property
    def signal(self) -> float:
        """identity + other - 1: 0 for the zero-hop rule and for guessing, 1 for the hop (Z2)."""
        return self.identity + self.other - 1


def parent_element_split(batch: Batch, predicted: Tensor, variable: int) -> ParentSplit:
    """Split #`variable`'s accuracy (`predicted`: [batch label] answers) by whether its parent
    #variable-1 applies the identity (element 0). Needs every sentence to hold the variable."""
    if variable < 1 or variable >= batch.labels.shape[1]:
        raise ValueError(f"variable={variable} has no parent clause; use 1..{batch.labels.shape[1] - 1}")
    held = batch.label_mask[:, variable]
    if not held.all():
        raise ValueError("parent_element_split needs full-length sentences (split='test', or no task.min_vars)")
    right = (predicted[:, variable] == batch.labels[:, variable]).float()
    identity = batch.latents["elements"][:, variable - 1] == 0
    if identity.all() or not identity.any():
        raise ValueError("the batch needs sentences with and without the identity at the parent; sample more")
    return ParentSplit(variable, right[identity].mean().item(), right[~identity].mean().item(),
                       identity.float().mean().item())
