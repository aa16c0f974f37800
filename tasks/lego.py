"""LEGO: chains of group operations, `a = +1 ; b = -a ; ...`, clauses in random order.

A sentence is [BOS] followed by n clauses of five tokens `lhs = g rhs ;` and [EOS]. The clauses
form one chain x0 -> v0 -> v1 -> ... -> v(n-1): v0's right-hand side is a value x0 of the set X,
every later variable's right-hand side is the previous variable. Labels are the variables'
values in chain order (#0 next to the root) and are read at each clause's left-hand token.

Shape glossary: batch = sentences, pos = token positions, var = variables in chain order.
"""

from __future__ import annotations

import itertools
import string
import warnings
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from tasks.base import Batch, ConfigError, CounterfactualPairs, uniform_choice
from tasks.registry import register_task

CLAUSE_LEN = 5  # lhs = g rhs ;
SPECIALS = ["[PAD]", "[BOS]", "[EOS]", "=", ";"]
PAD, BOS, EOS, EQUALS, SEMI = range(len(SPECIALS))
VARIABLES = list(string.ascii_lowercase)
SUPERVISION_MODES = ("all", "first", "first+last")
MENTION_LABELS = ("none", "value", "element")


DEFAULT_N_SUPERVISED = 3  # LegoConfig.n_supervised


@dataclass(frozen=True)
class Group:
    """A finite group acting on a finite set: `action[g, x]` is the index of g applied to x."""

    name: str
    elements: tuple[str, ...]
    values: tuple[str, ...]
    action: tuple[tuple[int, ...], ...]


def _z2() -> Group:
    return Group("z2", ("+", "-"), ("1", "-1"), ((0, 1), (1, 0)))


def _s3() -> Group:
    perms = list(itertools.permutations(range(3)))  # perms[g][x] = g(x), 0-based
    names = {(0, 1, 2): "id", (1, 0, 2): "(12)", (2, 1, 0): "(13)", (0, 2, 1): "(23)",
             (1, 2, 0): "(123)", (2, 0, 1): "(132)"}
    return Group("s3", tuple(names[p] for p in perms), ("1", "2", "3"), tuple(perms))


GROUPS = {"z2": _z2, "s3": _s3}


@dataclass
class LegoConfig:
    """LEGO sentences: `n_vars` clauses over `group`, supervision on some variables.

    supervision: "all"; "first" (#0..#n_supervised-1, the length-extrapolation setting);
    "first+last" (#0..#n_supervised-1 and the last variable, the shortcut study).
    min_vars: when below n_vars, each sentence's chain length is drawn from min_vars..n_vars
    and shorter sentences are padded (padding is never supervised nor scored).
    biased_fraction, identity_prob: a training curriculum of mixed inputs (Abbe, Cornacchia &
    Lotfi 2023, parities learned from biased plus uniform inputs). This fraction of training
    sentences draw each clause's group element as the identity with probability identity_prob
    (else uniformly among the others); the rest, and every test sentence, draw uniformly. The
    intent: in a biased sentence a variable mostly equals its parent, so copying the parent's
    value pays off at first order, where under uniform elements the gain is an XOR. At cpu scale
    it did not get a model past #2 (analyses/RESULTS.md).
    ordered_fraction: a curriculum of clause order. This fraction of training sentences list
    their clauses in chain order (#0 first), where the parent clause is also the previous one;
    the rest, and every test sentence, are shuffled.
    forest_fraction, cut_prob: a curriculum that takes the zero-hop shortcut away. This
    fraction of training sentences cut their chain into a forest: each clause after #0 reads a
    fresh value of X instead of its parent with probability cut_prob. With several values in
    a sentence, "the value anywhere, times my own element" no longer answers #1, so a variable
    must find the clause its right-hand side names, and one hop pays off at once. Labels follow
    the forest; the rest, and every test sentence, are single chains.
    mention_labels: denser supervision of training sentences, in extra label slots after the
    named ones, at each right-hand mention of a supervised variable (the `a` of `b = -a`).
    "value": the mention is trained to give that variable's value. Reading it is a copy from
    the clause that defines the variable, with no group element on the way: the association
    hop pays off at first order, where through the left-hand labels alone it pays only together
    with the XOR that follows. "element": the mention is trained to give what the defining
    clause's group element makes of the first value (z2: that clause's sign), a copy of an input
    token found by its letter (associative recall), learnable before any value is computed.
    "none" (default): no extra labels. Test sentences and every reported accuracy use the named
    labels only.
    n_letters: variables are named from the first n_letters letters (default all 26), in train
    and test alike. With n_letters = n_vars every sentence uses the same letters in new roles,
    so each letter pair a same-letter (association) head must match occurs in every sentence.
    """

    name: str = "lego"
    group: str = "z2"
    n_vars: int = 6
    supervision: str = "first"
    n_supervised: int = DEFAULT_N_SUPERVISED
    min_vars: int | None = None
    biased_fraction: float = 0.0
    identity_prob: float = 0.9
    ordered_fraction: float = 0.0
    forest_fraction: float = 0.0
    cut_prob: float = 0.5
    mention_labels: str = "none"
    n_letters: int = len(VARIABLES)

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ConfigError(f"task.group={self.group!r} is unknown; use one of {sorted(GROUPS)}")
        if not 1 <= self.n_vars <= len(VARIABLES):
            raise ConfigError(
                f"task.n_vars={self.n_vars} is outside 1..{len(VARIABLES)} (one letter per variable)"
            )
        if not self.n_vars <= self.n_letters <= len(VARIABLES):
            raise ConfigError(f"task.n_letters={self.n_letters} is outside n_vars={self.n_vars}..{len(VARIABLES)}")
        if self.supervision not in SUPERVISION_MODES:
            raise ConfigError(f"task.supervision={self.supervision!r} is unknown; use one of {SUPERVISION_MODES}")
        if self.supervision == "all" and self.n_supervised != DEFAULT_N_SUPERVISED:
            warnings.warn(f"task.n_supervised={self.n_supervised} is ignored: task.supervision='all' supervises "
                          f"every variable", stacklevel=2)
        elif self.supervision != "all" and not 1 <= self.n_supervised <= self.n_vars:
            raise ConfigError(f"task.n_supervised={self.n_supervised} is outside 1..n_vars={self.n_vars}")
        if self.min_vars is not None and not 1 <= self.min_vars <= self.n_vars:
            raise ConfigError(f"task.min_vars={self.min_vars} is outside 1..n_vars={self.n_vars}")
        if not 0.0 <= self.biased_fraction <= 1.0:
            raise ConfigError(f"task.biased_fraction={self.biased_fraction} is outside 0..1")
        if not 0.0 <= self.ordered_fraction <= 1.0:
            raise ConfigError(f"task.ordered_fraction={self.ordered_fraction} is outside 0..1")
        if self.mention_labels not in MENTION_LABELS:
            raise ConfigError(f"task.mention_labels={self.mention_labels!r} is unknown; use one of {MENTION_LABELS}")
        for name in ("identity_prob", "forest_fraction", "cut_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"task.{name}={getattr(self, name)} is outside 0..1")


class LegoTask:
    """Seeded, batched LEGO sentences with labels, chain depths and counterfactual twins."""

    causal = False
    headline_metric = "acc_supervised"

    def __init__(self, cfg: LegoConfig):
        self.cfg = cfg
        self.group = GROUPS[cfg.group]()
        self.action = torch.tensor(self.group.action)  # [element, value] -> value
        self.first_element = len(SPECIALS) + len(VARIABLES)
        self.first_value = self.first_element + len(self.group.elements)
        self.vocab = SPECIALS + VARIABLES + list(self.group.elements) + list(self.group.values)

    @property
    def d_vocab(self) -> int:
        return len(self.vocab)

    @property
    def d_vocab_out(self) -> int:
        return len(self.group.values)

    @property
    def n_ctx(self) -> int:
        return CLAUSE_LEN * self.cfg.n_vars + 2

    @property
    def label_names(self) -> list[str]:
        return [f"#{i}" for i in range(self.cfg.n_vars)]

    def sample(self, n: int, gen: torch.Generator, split: str = "train", aligned: bool = False) -> Batch:
        """`n` fresh sentences. Train and test differ by seed; with `min_vars` set, training
        draws a mixture of chain lengths while the test split is always full length.
        `aligned=True` gives every sentence the same clause order (and full length), so that a
        position means the same thing in every row, as per-position patching needs."""
        cfg, n_values = self.cfg, len(self.group.values)
        latents = {
            "variables": torch.rand(n, cfg.n_letters, generator=gen).argsort(-1)[:, : cfg.n_vars],
            "elements": self._draw_elements(n, gen, biased=split == "train" and not aligned),
            "root": torch.randint(n_values, (n,), generator=gen),
            "order_keys": self._draw_order(n, gen, aligned, curriculum=split == "train" and not aligned),
            "length": self._draw_lengths(n, gen, full=split == "test" or aligned),
        }
        if split == "train" and not aligned and cfg.forest_fraction > 0.0:
            latents |= self._draw_forest(n, gen)
        batch = self.build(latents)
        if split == "train" and not aligned and cfg.mention_labels != "none":
            batch = self._with_mention_labels(batch)
        return batch

    def _with_mention_labels(self, batch: Batch) -> Batch:
        """`batch` with n_vars extra label slots: slot n_vars + k is read at the right-hand token
        of clause #k+1, which names variable #k, and holds #k's value ("value") or what #k's
        group element makes of value 0 ("element"). It is trained where #k is and the mention
        is a variable (not a forest cut's fresh value)."""
        reads_parent = batch.label_mask[:, 1:].clone()
        if "cuts" in batch.latents:
            reads_parent &= ~batch.latents["cuts"][:, 1:]
        rhs_of_child = batch.label_pos[:, 1:] + 3  # lhs = g rhs: the rhs is three tokens on
        mention_pos = torch.cat([rhs_of_child, torch.zeros_like(rhs_of_child[:, :1])], dim=1)
        mentioned = torch.cat([reads_parent, torch.zeros_like(reads_parent[:, :1])], dim=1)
        trained = mentioned & batch.loss_mask
        mention = batch.labels if self.cfg.mention_labels == "value" else self.action[batch.latents["elements"], 0]
        return Batch(
            batch.tokens, torch.cat([batch.labels, mention], dim=1),
            torch.cat([batch.label_pos, torch.where(mentioned, mention_pos, 0)], dim=1),
            torch.cat([batch.label_mask, mentioned], dim=1), torch.cat([batch.loss_mask, trained], dim=1),
            batch.latents,
        )

    def _draw_forest(self, n: int, gen: torch.Generator) -> dict[str, Tensor]:
        """`cuts[b, i]`: clause #i reads its own value `roots[b, i]` instead of #i-1. Only a
        `forest_fraction` of rows are cut; #0 reads `root`, as in every sentence."""
        n_vars, n_values = self.cfg.n_vars, len(self.group.values)
        forest = torch.rand(n, 1, generator=gen) < self.cfg.forest_fraction
        cuts = forest & (torch.rand(n, n_vars, generator=gen) < self.cfg.cut_prob)
        cuts[:, 0] = False
        return {"cuts": cuts, "roots": torch.randint(n_values, (n, n_vars), generator=gen)}

    def _draw_order(self, n: int, gen: torch.Generator, aligned: bool, curriculum: bool) -> Tensor:
        """Sort keys of the clauses (slot order = ascending key): random, one shared order when
        `aligned`, and chain order in an `ordered_fraction` of training rows."""
        keys = torch.rand(1 if aligned else n, self.cfg.n_vars, generator=gen).expand(n, -1)
        if not curriculum or self.cfg.ordered_fraction == 0.0:
            return keys
        ordered = torch.rand(n, 1, generator=gen) < self.cfg.ordered_fraction
        chain = torch.linspace(0.0, 1.0, self.cfg.n_vars).expand(n, -1)
        return torch.where(ordered, chain, keys)

    def _draw_elements(self, n: int, gen: torch.Generator, biased: bool) -> Int[Tensor, "batch var"]:
        """Group elements per clause: uniform, or in a `biased_fraction` of training rows the
        identity (element 0) with probability `identity_prob`, else uniform among the others."""
        n_elements, n_vars = len(self.group.elements), self.cfg.n_vars
        uniform = torch.randint(n_elements, (n, n_vars), generator=gen)
        if not biased or self.cfg.biased_fraction == 0.0:
            return uniform
        rows = torch.rand(n, 1, generator=gen) < self.cfg.biased_fraction
        identity = torch.rand(n, n_vars, generator=gen) < self.cfg.identity_prob
        other = 1 + torch.randint(n_elements - 1, (n, n_vars), generator=gen)
        return torch.where(rows, torch.where(identity, 0, other), uniform)

    def _draw_lengths(self, n: int, gen: torch.Generator, full: bool) -> Int[Tensor, " batch"]:
        low = self.cfg.n_vars if full else self.cfg.min_vars or self.cfg.n_vars
        return torch.randint(low, self.cfg.n_vars + 1, (n,), generator=gen)

    def chain_values(
        self, elements: Int[Tensor, "batch var"], root: Int[Tensor, " batch"],
        cuts: Bool[Tensor, "batch var"] | None = None, roots: Int[Tensor, "batch var"] | None = None,
    ) -> Int[Tensor, "batch var"]:
        """Each variable's value: apply the chain's group elements one after another. Where
        `cuts` is set (the forest curriculum), a variable starts again from its own value in
        `roots`."""
        values, current = [], root
        for i in range(elements.shape[1]):  # a loop over chain depth, vectorised over the batch
            if cuts is not None and i > 0:
                current = torch.where(cuts[:, i], roots[:, i], current)
            current = self.action[elements[:, i], current]
            values.append(current)
        return torch.stack(values, dim=1)

    def build(self, latents: dict[str, Tensor]) -> Batch:
        """Tokens, labels and label positions of the sentences these latents describe."""
        n, n_vars = latents["elements"].shape
        length = latents["length"]
        present = torch.arange(n_vars).unsqueeze(0) < length.unsqueeze(1)  # [batch, var]
        # absent clauses get key 2 > any rand key, so they sort into the slots after the real ones
        clause_of_slot = latents["order_keys"].masked_fill(~present, 2.0).argsort(-1)
        slot_of_clause = clause_of_slot.argsort(-1)
        clauses = self._clause_tokens(latents).masked_fill(~present.unsqueeze(-1), PAD)
        slots = clauses.gather(1, clause_of_slot.unsqueeze(-1).expand(-1, -1, CLAUSE_LEN))
        tokens = torch.cat([torch.full((n, 1), BOS), slots.flatten(1), torch.full((n, 1), PAD)], dim=1)
        tokens.scatter_(1, (1 + CLAUSE_LEN * length).unsqueeze(1), EOS)
        labels = self.chain_values(latents["elements"], latents["root"], latents.get("cuts"), latents.get("roots"))
        label_pos = torch.where(present, 1 + CLAUSE_LEN * slot_of_clause, 0)
        depth = torch.where(present.gather(1, clause_of_slot), clause_of_slot, -1)
        latents = {**latents, "depth": self._depth_per_position(depth)}
        return Batch(tokens, labels, label_pos, present, self._loss_mask(present, length), latents)

    def _clause_tokens(self, latents: dict[str, Tensor]) -> Int[Tensor, "batch var 5"]:
        variables = latents["variables"] + len(SPECIALS)
        root = (latents["root"] + self.first_value).unsqueeze(1)
        rhs = torch.cat([root, variables[:, :-1]], dim=1)  # #0 reads the root, #i reads #i-1
        if "cuts" in latents:  # the forest curriculum: cut clauses read a value of their own
            rhs = torch.where(latents["cuts"], latents["roots"] + self.first_value, rhs)
        n, n_vars = variables.shape
        return torch.stack(
            [variables, torch.full((n, n_vars), EQUALS), latents["elements"] + self.first_element, rhs,
             torch.full((n, n_vars), SEMI)],
            dim=-1,
        )

    @staticmethod
    def _depth_per_position(depth_of_slot: Int[Tensor, "batch var"]) -> Int[Tensor, "batch pos"]:
        """Chain depth of the clause each token belongs to; -1 for BOS, EOS and padding."""
        edge = torch.full((depth_of_slot.shape[0], 1), -1)
        return torch.cat([edge, depth_of_slot.repeat_interleave(CLAUSE_LEN, dim=1), edge], dim=1)

    def _loss_mask(self, present: Bool[Tensor, "batch var"],
                   length: Int[Tensor, " batch"]) -> Bool[Tensor, "batch var"]:
        index = torch.arange(present.shape[1]).unsqueeze(0)
        if self.cfg.supervision == "all":
            return present
        first = index < self.cfg.n_supervised
        if self.cfg.supervision == "first":
            return present & first
        return present & (first | (index == (length - 1).unsqueeze(1)))

    def corrupt(self, batch: Batch, gen: torch.Generator, depth: int = 0) -> tuple[Batch, Bool[Tensor, "batch var"]]:
        """Change the group element of the clause at chain depth `depth` so that its variable's
        value changes; every variable from that depth on changes too (group actions are
        bijections). Returns the twin and which labels changed."""
        if not 0 <= depth < self.cfg.n_vars:
            raise ValueError(f"depth={depth} is outside 0..n_vars-1={self.cfg.n_vars - 1}")
        latents = dict(batch.latents)
        elements = latents["elements"].clone()
        incoming = latents["root"] if depth == 0 else batch.labels[:, depth - 1]
        outgoing = batch.labels[:, depth]
        differs = outgoing.unsqueeze(1) != self.action[:, incoming].T  # [batch, element]
        elements[:, depth] = uniform_choice(differs, gen)
        latents["elements"] = elements
        twin = self.build(latents)
        return twin, (twin.labels != batch.labels) & batch.label_mask

    def counterfactual_pairs(self, n: int, gen: torch.Generator, aligned: bool = True) -> CounterfactualPairs:
        """Flip the root clause's group element, so that every variable changes."""
        clean = self.sample(n, gen, split="test", aligned=aligned)
        corrupted, _ = self.corrupt(clean, gen, depth=0)
        return CounterfactualPairs(clean, corrupted, "group element at depth 0 flipped")

    def supervised_slots(self) -> list[bool]:
        full = torch.full((1,), self.cfg.n_vars)
        return self._loss_mask(torch.ones(1, self.cfg.n_vars, dtype=torch.bool), full)[0].tolist()

    def segment_ids(self, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
        """Clause index of each position (its 'local window'); BOS, EOS and padding each get a
        segment of their own (negative ids)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        special = (tokens == BOS) | (tokens == EOS) | (tokens == PAD)
        return torch.where(special, -1 - positions, (positions - 1).div(CLAUSE_LEN, rounding_mode="floor"))

    role_names = ("left-hand variable", "=", "group element", "right-hand variable", ";")  # a clause's offsets

    def segment_depth(self, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
        """Chain depth of each position's clause, read from the tokens alone (the root clause,
        whose right-hand side is a value, is depth 0; a clause reading the variable of depth k is
        k + 1); -1 for BOS, EOS, padding and clauses no chain from a root reaches. An optional
        member of the Task protocol: the head classifier's `depth` kind reads it."""
        lhs, rhs = tokens[:, 1::CLAUSE_LEN], tokens[:, 4::CLAUSE_LEN]
        n_clauses = min(lhs.shape[1], rhs.shape[1])
        lhs, rhs = lhs[:, :n_clauses], rhs[:, :n_clauses]
        variable = (lhs >= len(SPECIALS)) & (lhs < self.first_element)
        depth = torch.where(variable & (rhs >= self.first_value), 0, -1)
        # clause -> parent
        reads = (rhs.unsqueeze(2) == lhs.unsqueeze(1)) & variable.unsqueeze(1) & variable.unsqueeze(2)
        for _ in range(n_clauses):
            parent = torch.where(reads, depth.unsqueeze(1), -1).amax(-1)
            depth = torch.where((depth < 0) & (parent >= 0), parent + 1, depth)
        segments = self.segment_ids(tokens)
        inside = (segments >= 0) & (segments < n_clauses)
        return torch.where(inside, depth.gather(1, segments.clamp(0, max(n_clauses - 1, 0))), -1)

    def symbol_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        """Positions holding a variable: the tokens whose other occurrences association heads find."""
        return (tokens >= len(SPECIALS)) & (tokens < self.first_element)

    @property
    def bos_token(self) -> int:
        return BOS

    def broadcast_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        """The BOS/EOS positions that broadcast heads attend to."""
        return (tokens == BOS) | (tokens == EOS)

    def padding_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        return tokens == PAD

    def decode(self, tokens: Int[Tensor, "batch pos"] | Int[Tensor, " pos"]) -> list[str] | str:
        """Readable text: `[BOS] a = + 1 ; b = - a ; [EOS]` (padding dropped)."""
        if tokens.dim() == 2:
            return [self.decode(row) for row in tokens]
        return " ".join(self.vocab[t] for t in tokens.tolist() if t != PAD)

    def token_strings(self, tokens: Int[Tensor, " pos"]) -> list[str]:
        """One string per position (padding included), for attention views."""
        return [self.vocab[t] for t in tokens.tolist()]

    def accuracy(self, batch: Batch, predictions: Int[Tensor, "batch var"]) -> dict[str, object]:
        """Per-variable test accuracy in chain order, and the means over (un)supervised ones."""
        correct = (predictions == batch.labels) & batch.label_mask
        counts = batch.label_mask.sum(0).clamp(min=1)
        per_var = (correct.sum(0) / counts).tolist()
        supervised = self.supervised_slots()
        sup = [a for a, s in zip(per_var, supervised) if s]
        unsup = [a for a, s in zip(per_var, supervised) if not s]
        return {
            "acc_per_var": [round(a, 4) for a in per_var],
            "acc_supervised": round(sum(sup) / len(sup), 4) if sup else None,
            "acc_unsupervised": round(sum(unsup) / len(unsup), 4) if unsup else None,
        }


register_task("lego", LegoConfig, LegoTask)
