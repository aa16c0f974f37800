"""Compiled ground truth (issue 28, part 2): small HookedTransformers whose weights are set by
hand, so that every node (head) and every edge of their circuit is known, written as fixtures
for the test suite (tests/integration/test_ground_truth.py).

    python -m analyses.make_fixtures            # (re)writes tests/data/circuits/<name>/
    python -m analyses.make_fixtures --check    # compares with the committed files; exit 1 on a difference

Each fixture is a folder with
  model.safetensors  every parameter of the model (float32, by its TransformerLens name)
  circuit.json       the HookedTransformerConfig fields that rebuild the model, the token names,
                     the prompt pairs (token ids), the answers and wrong answers, the known nodes
                     ("L1H0") and edges (["L0H0", "L1H0.k"]: sender -> receiver's q/k/v input, or
                     ["L1H0", "logits"]), each head's role, and the noise added (if any).
`load_fixture(folder)` rebuilds the model and the pairs. The script is deterministic: the same
torch gives the same bytes (the test checks the committed files against a fresh build).

The models are attention-only, causal, without norms (the one in `interp.toy_induction`,
`hand_set_induction_model`, is the pattern). The residual stream is a sum of named subspaces of
one-hot codes: the token, the position, and one per thing a head writes. A head's QK reads
codes and matches them with score SCORE (hard attention); its OV copies codes from one
subspace into another. Only the `out` subspace reaches the logits (W_U: out[t] -> logit of t,
times UNEMBED). Distractor heads write into `junk`, which nothing reads; each fixture has
distractors that read what the circuit's heads write, or the token the corruption changes, so
that they are active on the pairs and the edges into them exist in the weights, with no effect.

Fixtures (n_layers x n_heads; the circuit; the metric is logit(answer) - logit(wrong answer) at
the last position):
  q_composition   2x2  L0H0 moves a cue to the last position; L1H0's query reads it (Q-composition)
                       and picks the item at the position the cue names
  k_composition   2x2  induction: previous-token head L0H0 feeds the key of L1H0 (K-composition)
  v_composition   2x2  L0H0 copies each token one position on; L1H0 attends to a fixed position
                       and reads L0H0's output through its value (V-composition)
  two_hop_chain   3x2  L0H0 -> L1H0.v -> L2H0.q -> logits: a cue moved twice, then used as a query
  cancellation    3x3  two heads (L0H0, L1H0) whose signs multiply in L2H0's attention score, fed
                       by a two-hop path L0H1 -> L1H0.v -> L2H0.k: the clean and corrupted prompts
                       flip both signs, so resample-ablating every head but L2H0 keeps the whole
                       behaviour (the signs cancel), while mean ablation (sign 0) does not; the
                       finder's failure of issue 28, part 3
  <name>_noisy         the same weights plus N(0, NOISE_STD) on every parameter, the same pairs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformer_lens import HookedTransformer, HookedTransformerConfig

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "circuits"
SCORE = 8.0  # attention score (after the 1/sqrt(d_head) scale) of a matching key; others score 0
UNEMBED = 4.0  # logit of the answer per unit of attention on it
NOISE_STD = 0.05  # the noisy fixtures: N(0, NOISE_STD) on every parameter
N_PAIRS = 16
CONFIG_FIELDS = ("n_layers", "d_model", "n_heads", "d_head", "d_vocab", "d_vocab_out", "n_ctx", "attn_only",
                 "normalization_type", "attention_dir", "act_fn", "positional_embedding_type")
ITEMS = [chr(ord("a") + i) for i in range(10)]


@dataclass
class Fixture:
    name: str
    description: str
    model: HookedTransformer
    vocab: list[str]
    clean: list[list[int]]
    corrupted: list[list[int]]
    answers: list[int]
    wrong_answers: list[int]
    nodes: list[str]
    edges: list[tuple[str, str]]
    roles: dict[str, str]
    noise: dict[str, Any] | None = None
    distractors: list[str] = field(default_factory=list)

    def circuit_json(self) -> dict[str, Any]:
        cfg = self.model.cfg
        return {"name": self.name, "description": self.description,
                "generator": "python -m analyses.make_fixtures",
                "config": {key: getattr(cfg, key) for key in CONFIG_FIELDS},
                "score": SCORE, "unembed": UNEMBED, "noise": self.noise, "vocab": self.vocab,
                "pairs": {"clean": self.clean, "corrupted": self.corrupted, "answers": self.answers,
                          "wrong_answers": self.wrong_answers},
                "nodes": self.nodes, "edges": [list(e) for e in self.edges], "distractors": self.distractors,
                "roles": self.roles}

    def tensors(self) -> dict[str, Tensor]:
        return {name: p.detach().clone().contiguous() for name, p in self.model.named_parameters()}


def new_model(cfg: dict[str, Any]) -> HookedTransformer:
    """A HookedTransformer of these config fields on the CPU, every parameter zero."""
    with warnings.catch_warnings():  # TL 3.x announces 4.0 on every construction
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(HookedTransformerConfig(**cfg, seed=0, device="cpu"))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    return model


class _Net:
    """A model under construction: named residual subspaces and head-writing helpers."""

    def __init__(self, vocab: list[str], n_ctx: int, n_layers: int, n_heads: int, d_head: int,
                 spaces: dict[str, int]):
        self.vocab, self.n_ctx, self.d_head = vocab, n_ctx, d_head
        self.tokens = {name: i for i, name in enumerate(vocab)}
        self.at: dict[str, tuple[int, int]] = {}
        offset = 0
        for key, size in {"tok": len(vocab), "pos": n_ctx, **spaces}.items():
            self.at[key], offset = (offset, size), offset + size
        cfg = dict(n_layers=n_layers, d_model=offset, n_heads=n_heads, d_head=d_head, d_vocab=len(vocab),
                   d_vocab_out=len(vocab), n_ctx=n_ctx, attn_only=True, normalization_type=None,
                   attention_dir="causal", act_fn="relu", positional_embedding_type="standard")
        self.model = new_model(cfg)
        self.alpha = math.sqrt(SCORE * math.sqrt(d_head))  # q . k / sqrt(d_head) = SCORE for one matching code
        with torch.no_grad():
            for t in range(len(vocab)):
                self.model.embed.W_E[t, self.row("tok", t)] = 1.0
            for p in range(n_ctx):
                self.model.pos_embed.W_pos[p, self.row("pos", p)] = 1.0

    def row(self, space: str, index: int) -> int:
        start, size = self.at[space]
        if not 0 <= index < size:
            raise IndexError(f"{space}[{index}] is outside its {size} codes")
        return start + index

    def tok(self, names: Sequence[str]) -> list[int]:
        return [self.tokens[n] for n in names]

    @torch.no_grad()
    def qk(self, layer: int, head: int, query: Sequence[tuple[str, int, int]], key: Sequence[tuple[str, int, int]],
           query_bias: Sequence[int] = ()) -> None:
        """W_Q: code (space, index) -> head dim; W_K likewise; b_Q: a constant 1 in `query_bias` dims.
        A key scores SCORE per dim where its code and the query's meet."""
        attn = self.model.blocks[layer].attn
        for space, index, dim in query:
            attn.W_Q[head, self.row(space, index), dim] = self.alpha
        for dim in query_bias:
            attn.b_Q[head, dim] = self.alpha
        for space, index, dim in key:
            attn.W_K[head, self.row(space, index), dim] = self.alpha

    @torch.no_grad()
    def ov(self, layer: int, head: int, moves: Sequence[tuple[str, int, str, int, float]]) -> None:
        """Each (space, index, to_space, to_index, value): the code read is written, times value,
        into the code of to_space; one head dim per move."""
        attn = self.model.blocks[layer].attn
        if len(moves) > self.d_head:
            raise ValueError(f"{len(moves)} moves need more than d_head={self.d_head} dims")
        for dim, (space, index, to_space, to_index, value) in enumerate(moves):
            attn.W_V[head, self.row(space, index), dim] = value
            attn.W_O[head, dim, self.row(to_space, to_index)] = 1.0

    # attention patterns
    def previous(self, layer: int, head: int) -> None:
        """Position i attends to i - 1 (position 0 to itself, all keys scoring 0)."""
        self.qk(layer, head, [("pos", i, i) for i in range(self.n_ctx)], [("pos", j, j + 1) for j in range(self.n_ctx - 1)])

    def itself(self, layer: int, head: int) -> None:
        self.qk(layer, head, [("pos", i, i) for i in range(self.n_ctx)], [("pos", i, i) for i in range(self.n_ctx)])

    def fixed(self, layer: int, head: int, *positions: int) -> None:
        """Every position attends to `positions` (those before it: causal)."""
        self.qk(layer, head, [], [("pos", p, 0) for p in positions], query_bias=[0])

    # value patterns
    def copy(self, layer: int, head: int, space: str, indices: Sequence[int], to: str, to_indices: Sequence[int] | None = None,
             values: Sequence[float] | None = None) -> None:
        to_indices = list(indices) if to_indices is None else list(to_indices)
        values = [1.0] * len(indices) if values is None else list(values)
        self.ov(layer, head, [(space, i, to, j, v) for i, j, v in zip(indices, to_indices, values)])

    def junk(self, layer: int, head: int, space: str, indices: Sequence[int]) -> None:
        """Copy codes into `junk` (nothing reads it), folded onto its size."""
        size = self.at["junk"][1]
        self.copy(layer, head, space, list(indices)[: self.d_head], "junk", [k % size for k in range(min(len(indices), self.d_head))])

    @torch.no_grad()
    def unembed(self, items: Sequence[int]) -> None:
        for k, t in enumerate(items):
            self.model.unembed.W_U[self.row("out", k), t] = UNEMBED


def _pairs(n: int, seed: int, make) -> tuple[list[list[int]], list[list[int]], list[int], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    rows = [make(gen) for _ in range(n)]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]


def _perm(gen: torch.Generator, n: int, k: int) -> list[int]:
    return torch.randperm(n, generator=gen)[:k].tolist()


def q_composition() -> Fixture:
    """items at positions 0..3, a cue "@i" at 4, "?" at 5: the answer is the item at position i."""
    items, cues = ITEMS[:8], [f"@{i}" for i in range(4)]
    net = _Net([*items, *cues, "?"], n_ctx=6, n_layers=2, n_heads=2, d_head=8,
               spaces={"sel": 4, "out": 8, "junk": 8})
    cue_ids, item_ids = net.tok(cues), net.tok(items)
    net.previous(0, 0)  # L0H0: the cue, moved from position 4 to 5, into `sel`
    net.copy(0, 0, "tok", cue_ids, "sel", range(4))
    net.itself(0, 1)  # L0H1 distractor: its own token (the cue changes) into junk
    net.junk(0, 1, "tok", [*cue_ids, *item_ids[:4]])
    net.qk(1, 0, [("sel", i, i) for i in range(4)], [("pos", i, i) for i in range(4)])  # L1H0: query = the cue
    net.copy(1, 0, "tok", item_ids, "out", range(8))
    net.qk(1, 1, [("sel", i, i) for i in range(4)], [("pos", (i + 1) % 4, i) for i in range(4)])  # L1H1: the next item
    net.junk(1, 1, "tok", item_ids)
    net.unembed(item_ids)

    def make(gen):
        chosen = _perm(gen, 8, 4)
        i, j = _perm(gen, 4, 2)
        clean = [item_ids[c] for c in chosen] + [cue_ids[i], net.tokens["?"]]
        corrupted = [item_ids[c] for c in chosen] + [cue_ids[j], net.tokens["?"]]
        return clean, corrupted, item_ids[chosen[i]], item_ids[chosen[j]]

    return Fixture("q_composition", "Q-composition: a cue moved by L0H0 is L1H0's query; L1H0 copies the item at "
                   "the position the cue names. Clean and corrupted differ in the cue.", net.model, net.vocab,
                   *_pairs(N_PAIRS, 1, make), nodes=["L0H0", "L1H0"], edges=[("L0H0", "L1H0.q"), ("L1H0", "logits")],
                   roles={"L0H0": "previous-token head: the cue at the last position (into sel)",
                          "L0H1": "distractor: its own token into junk",
                          "L1H0": "selector: query sel, key position; copies the item (into out)",
                          "L1H1": "distractor: query sel (reads L0H0), attends to the next item, writes junk"},
                   distractors=["L0H1", "L1H1"])


def k_composition() -> Fixture:
    """Induction: clean `p A B q D C r A` (answer B), corrupted `p D B q A C r A` (answer C)."""
    net = _Net(list(ITEMS), n_ctx=8, n_layers=2, n_heads=2, d_head=10, spaces={"prev": 10, "out": 10, "junk": 10})
    ids = list(range(10))
    net.previous(0, 0)  # L0H0: previous token into `prev`
    net.copy(0, 0, "tok", ids, "prev")
    net.itself(0, 1)  # L0H1 distractor: its own token (A and D move) into junk
    net.junk(0, 1, "tok", ids)
    net.qk(1, 0, [("tok", t, t) for t in ids], [("prev", t, t) for t in ids])  # L1H0: induction
    net.copy(1, 0, "tok", ids, "out")
    net.qk(1, 1, [("tok", t, t) for t in ids], [("prev", t, t) for t in ids])  # L1H1: an induction head into junk
    net.junk(1, 1, "tok", ids)
    net.unembed(ids)

    def make(gen):
        p, a, b, q, d, c, r = _perm(gen, 10, 7)
        return [p, a, b, q, d, c, r, a], [p, d, b, q, a, c, r, a], b, c

    return Fixture("k_composition", "K-composition (induction): previous-token head L0H0 writes the key that "
                   "induction head L1H0 matches. The corruption swaps which earlier token precedes the answer.",
                   net.model, net.vocab, *_pairs(N_PAIRS, 2, make), nodes=["L0H0", "L1H0"],
                   edges=[("L0H0", "L1H0.k"), ("L1H0", "logits")],
                   roles={"L0H0": "previous-token head (into prev)", "L0H1": "distractor: its own token into junk",
                          "L1H0": "induction head: query token, key prev; copies the token (into out)",
                          "L1H1": "distractor: the same induction pattern (reads L0H0 through its key), writes junk"},
                   distractors=["L0H1", "L1H1"])


def v_composition() -> Fixture:
    """items at 0..4, "?" at 5: the answer is the item at position 2, read by L1H0 at position 3
    from what L0H0 copied there."""
    net = _Net([*ITEMS, "?"], n_ctx=6, n_layers=2, n_heads=2, d_head=10, spaces={"prev": 10, "out": 10, "junk": 10})
    ids = list(range(10))
    net.previous(0, 0)  # L0H0: previous token into `prev`
    net.copy(0, 0, "tok", ids, "prev")
    net.fixed(0, 1, 2)  # L0H1 distractor: reads the corrupted token itself, writes junk
    net.junk(0, 1, "tok", ids)
    net.fixed(1, 0, 3)  # L1H0: position 3, value = prev there (V-composition)
    net.copy(1, 0, "prev", ids, "out")
    net.fixed(1, 1, 3)  # L1H1 distractor: the same, into junk
    net.junk(1, 1, "prev", ids)
    net.unembed(ids)

    def make(gen):
        chosen = _perm(gen, 10, 6)
        clean = [*chosen[:5], 10]
        corrupted = [*chosen[:2], chosen[5], *chosen[3:5], 10]
        return clean, corrupted, chosen[2], chosen[5]

    return Fixture("v_composition", "V-composition: L0H0 copies each token one position on; L1H0 attends to "
                   "position 3 and reads that copy (the item at position 2) through its value. The corruption "
                   "changes the item at position 2.", net.model, net.vocab, *_pairs(N_PAIRS, 3, make),
                   nodes=["L0H0", "L1H0"], edges=[("L0H0", "L1H0.v"), ("L1H0", "logits")],
                   roles={"L0H0": "previous-token head (into prev)",
                          "L0H1": "distractor: attends to position 2 (the changed item), writes junk",
                          "L1H0": "mover: attends to position 3, copies prev (into out)",
                          "L1H1": "distractor: attends to position 3, copies prev (reads L0H0) into junk"},
                   distractors=["L0H1", "L1H1"])


def two_hop_chain() -> Fixture:
    """A cue "@i" at 0, items at 1..5, "?" at 6: the answer is the item at position i (2..5).
    L0H0 moves the cue to position 1, L1H0 from there to every later position, L2H0 uses it."""
    items, cues = ITEMS[:8], [f"@{i}" for i in range(2, 6)]
    net = _Net([*items, *cues, "?"], n_ctx=7, n_layers=3, n_heads=2, d_head=8,
               spaces={"sel0": 4, "sel1": 4, "out": 8, "junk": 8})
    cue_ids, item_ids = net.tok(cues), net.tok(items)
    net.previous(0, 0)  # L0H0: the cue into sel0 at position 1
    net.copy(0, 0, "tok", cue_ids, "sel0", range(4))
    net.fixed(0, 1, 0)  # L0H1 distractor: reads the cue itself, writes junk
    net.junk(0, 1, "tok", cue_ids)
    net.fixed(1, 0, 1)  # L1H0: attends to position 1, sel0 -> sel1 (V-composition)
    net.copy(1, 0, "sel0", range(4), "sel1")
    net.previous(1, 1)  # L1H1 distractor: previous position's sel0 (reads L0H0) into junk
    net.junk(1, 1, "sel0", range(4))
    net.qk(2, 0, [("sel1", k, k) for k in range(4)], [("pos", k + 2, k) for k in range(4)])  # L2H0: Q-composition
    net.copy(2, 0, "tok", item_ids, "out", range(8))
    net.qk(2, 1, [("sel1", k, k) for k in range(4)], [("pos", k + 2, k) for k in range(4)])  # L2H1: same, junk
    net.junk(2, 1, "tok", item_ids)
    net.unembed(item_ids)

    def make(gen):
        chosen = _perm(gen, 8, 5)
        i, j = _perm(gen, 4, 2)
        body = [item_ids[c] for c in chosen]
        return ([cue_ids[i], *body, net.tokens["?"]], [cue_ids[j], *body, net.tokens["?"]],
                body[i + 1], body[j + 1])

    return Fixture("two_hop_chain", "A three-layer, two-hop chain: L0H0 moves the cue to position 1 (sel0), L1H0 "
                   "reads it there through its value and writes it at every later position (sel1), L2H0's query "
                   "reads it and copies the item at the position it names. Clean and corrupted differ in the cue.",
                   net.model, net.vocab, *_pairs(N_PAIRS, 4, make), nodes=["L0H0", "L1H0", "L2H0"],
                   edges=[("L0H0", "L1H0.v"), ("L1H0", "L2H0.q"), ("L2H0", "logits")],
                   roles={"L0H0": "previous-token head: the cue into sel0 at position 1",
                          "L0H1": "distractor: attends to the cue, writes junk",
                          "L1H0": "mover: attends to position 1, sel0 -> sel1",
                          "L1H1": "distractor: previous position's sel0 (reads L0H0) into junk",
                          "L2H0": "selector: query sel1, key position; copies the item (into out)",
                          "L2H1": "distractor: the same pattern (reads L1H0 through its query), writes junk"},
                   distractors=["L0H1", "L1H1", "L2H1"])


def cancellation() -> Fixture:
    """`A± B± x T1 T2 ?`: L2H0 attends to T1 when sign(A) * sign(B) = +1, to T2 when -1 (half
    and half at 0) and copies it. Clean and corrupted flip both signs (the product stays +1) and
    change T1, so the answer is T1 and the wrong answer T1'. sign(A) reaches L2H0's query through
    L0H0; sign(B) its key at T1's position through L0H1 -> L1H0 (two hops)."""
    items = ITEMS[:8]
    net = _Net([*items, "A+", "A-", "B+", "B-", "?"], n_ctx=6, n_layers=3, n_heads=3, d_head=8,
               spaces={"sa": 1, "sb": 1, "sk": 1, "out": 8, "junk": 8})
    item_ids = net.tok(items)
    a_plus, a_minus, b_plus, b_minus = net.tok(["A+", "A-", "B+", "B-"])
    net.fixed(0, 0, 0)  # L0H0: sign(A) (position 0) into sa at every position
    net.copy(0, 0, "tok", [a_plus, a_minus], "sa", [0, 0], [1.0, -1.0])
    net.previous(0, 1)  # L0H1: sign(B) (position 1) into sb at position 2
    net.copy(0, 1, "tok", [b_plus, b_minus], "sb", [0, 0], [1.0, -1.0])
    net.itself(0, 2)  # L0H2 distractor: its own token into junk
    net.junk(0, 2, "tok", [a_plus, a_minus, b_plus, b_minus, *item_ids[:4]])
    net.previous(1, 0)  # L1H0: sb of position 2 into sk at position 3 (T1's)
    net.copy(1, 0, "sb", [0], "sk", [0])
    net.fixed(1, 1, 0)  # L1H1 distractor: sa (reads L0H0) into junk
    net.junk(1, 1, "sa", [0])
    net.previous(1, 2)  # L1H2 distractor: sb (reads L0H1) into junk
    net.junk(1, 2, "sb", [0])
    # L2H0: score SCORE * (1 + sa * sk) at position 3, SCORE at position 4
    net.qk(2, 0, [("sa", 0, 1)], [("pos", 3, 0), ("pos", 4, 0), ("sk", 0, 1)], query_bias=[0])
    net.copy(2, 0, "tok", item_ids, "out", range(8))
    net.qk(2, 1, [("sa", 0, 1)], [("pos", 3, 0), ("pos", 4, 0), ("sk", 0, 1)], query_bias=[0])  # L2H1: same, junk
    net.junk(2, 1, "tok", item_ids)
    net.itself(2, 2)  # L2H2 distractor
    net.junk(2, 2, "tok", item_ids)
    net.unembed(item_ids)

    def make(gen):
        x, t1, t2, t1_other = _perm(gen, 8, 4)
        plus = bool(torch.randint(2, (1,), generator=gen).item())
        a, b = (a_plus, b_plus) if plus else (a_minus, b_minus)
        na, nb = (a_minus, b_minus) if plus else (a_plus, b_plus)
        clean = [a, b, item_ids[x], item_ids[t1], item_ids[t2], net.tokens["?"]]
        corrupted = [na, nb, item_ids[x], item_ids[t1_other], item_ids[t2], net.tokens["?"]]
        return clean, corrupted, item_ids[t1], item_ids[t1_other]

    return Fixture("cancellation", "Two signs multiply in L2H0's attention: sign(A) through L0H0 into its query, "
                   "sign(B) through L0H1 -> L1H0 into its key at T1. The corruption flips both signs (and changes "
                   "T1): resample-ablating L0H0, L0H1 and L1H0 together flips both again and cancels, so L2H0 alone "
                   "keeps the behaviour under resample ablation; under mean ablation (signs 0) it does not.",
                   net.model, net.vocab, *_pairs(N_PAIRS, 5, make), nodes=["L0H0", "L0H1", "L1H0", "L2H0"],
                   edges=[("L0H0", "L2H0.q"), ("L0H1", "L1H0.v"), ("L1H0", "L2H0.k"), ("L2H0", "logits")],
                   roles={"L0H0": "sign(A) into sa everywhere", "L0H1": "previous-token head: sign(B) into sb",
                          "L0H2": "distractor: its own token into junk",
                          "L1H0": "previous-token head: sb into sk at T1's position",
                          "L1H1": "distractor: sa (reads L0H0) into junk",
                          "L1H2": "distractor: sb (reads L0H1) into junk",
                          "L2H0": "selector: T1 if sa * sk > 0, else T2; copies it (into out)",
                          "L2H1": "distractor: the same pattern (reads L0H0 and L1H0), writes junk",
                          "L2H2": "distractor: its own token into junk"},
                   distractors=["L0H2", "L1H1", "L1H2", "L2H1", "L2H2"])


BUILDERS = (q_composition, k_composition, v_composition, two_hop_chain, cancellation)


def noisy(base: Fixture, seed: int, std: float = NOISE_STD) -> Fixture:
    """`base` with N(0, std) added to every parameter (in `named_parameters` order, one generator)."""
    cfg = {key: getattr(base.model.cfg, key) for key in CONFIG_FIELDS}
    model = new_model(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (_, parameter), (_, source) in zip(model.named_parameters(), base.model.named_parameters()):
            parameter.copy_(source + std * torch.randn(source.shape, generator=gen))
    return Fixture(f"{base.name}_noisy", f"{base.description} With N(0, {std}) added to every parameter.", model,
                   base.vocab, base.clean, base.corrupted, base.answers, base.wrong_answers, base.nodes, base.edges,
                   base.roles, {"std": std, "seed": seed, "base": base.name}, base.distractors)


def build_all() -> dict[str, Fixture]:
    """Every fixture, built from scratch (deterministic)."""
    fixtures = {}
    for i, builder in enumerate(BUILDERS):
        base = builder()
        fixtures[base.name] = base
        fixtures[f"{base.name}_noisy"] = noisy(base, seed=1000 + i)
    return fixtures


def write(fixture: Fixture, out: Path) -> Path:
    from safetensors.torch import save_file

    folder = out / fixture.name
    folder.mkdir(parents=True, exist_ok=True)
    save_file(fixture.tensors(), str(folder / "model.safetensors"), metadata={"fixture": fixture.name})
    (folder / "model.safetensors").chmod(0o644)  # safetensors creates 0600
    (folder / "circuit.json").write_text(json.dumps(fixture.circuit_json(), indent=1) + "\n", encoding="utf-8")
    return folder


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass
class GroundTruth:
    """A fixture read back: the model, its prompt pairs, and the known circuit."""

    name: str
    model: HookedTransformer
    pairs: Any  # interp.outside.PromptPairs
    nodes: list[str]
    edges: list[tuple[str, str]]
    meta: dict[str, Any]


def read(folder: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors")), json.loads((folder / "circuit.json").read_text(encoding="utf-8"))


def load_fixture(folder: str | Path) -> GroundTruth:
    from interp.outside import PromptPairs

    folder = Path(folder)
    tensors, meta = read(folder)
    model = new_model(meta["config"])
    names = {name for name, _ in model.named_parameters()}
    if names != set(tensors):
        raise ValueError(f"{folder}: the weights file's tensors {sorted(set(tensors) ^ names)} do not match the config")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(tensors[name])
    pairs = meta["pairs"]
    prompt_pairs = PromptPairs(torch.tensor(pairs["clean"]), torch.tensor(pairs["corrupted"]),
                               torch.tensor(pairs["answers"]), torch.tensor(pairs["wrong_answers"]), meta["vocab"])
    return GroundTruth(meta["name"], model, prompt_pairs, list(meta["nodes"]), [tuple(e) for e in meta["edges"]], meta)


def differences(out: Path = OUT) -> list[str]:
    """What differs between a fresh build and the files in `out` (empty: they are the same)."""
    found = []
    for name, fixture in build_all().items():
        folder = out / name
        if not folder.is_dir():
            found.append(f"{name}: missing")
            continue
        tensors, meta = read(folder)
        if meta != json.loads(json.dumps(fixture.circuit_json())):
            found.append(f"{name}: circuit.json differs")
        fresh = fixture.tensors()
        if set(tensors) != set(fresh):
            found.append(f"{name}: other tensors")
            continue
        worst = max(((tensors[k] - fresh[k]).abs() / fresh[k].abs().clamp(min=1.0)).max().item() for k in fresh)
        if worst > 1e-7:  # 0 here; a float32 ulp of a weight of 4.76 is 4.8e-7, hence relative above 1
            found.append(f"{name}: weights differ by up to {worst:.3g} (relative, above 1)")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the fixtures (default: tests/data/circuits)")
    parser.add_argument("--check", action="store_true", help="compare with the files there instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        found = differences(args.out)
        print("\n".join(found) if found else f"the fixtures in {args.out} are what this script builds")
        return 1 if found else 0
    for fixture in build_all().values():
        folder = write(fixture, args.out)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{folder}: {len(fixture.nodes)} nodes, {len(fixture.edges)} edges, {size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
