"""Composite anchor functions: `key, a1, a2 -> g(g(key; a1); a2)`, read at the last position.

A sequence has `seq_len` tokens: noise and key values from value_min..value_max, and exactly one
adjacent anchor pair (a1, a2) right after the key. Anchor k (token id k, 1-based) shifts its
input by `shifts[k-1]`. Pairs listed in `overrides` are trained on a non-inferential target
(default: (3,4) -> x-6 instead of x-10); `held_out` pairs never appear in training. On a held-out
pair an *inferential* model answers the true composition, a *symmetric* one copies the target
of the mirror pair.

Train/test split by key position p (0-based, p in 0..seq_len-3): a training key x satisfies
x mod m != p; a test key satisfies x mod m == p, with m = `key_modulus` (default seq_len-2, the
paper's text; its group's public code uses m = seq_len, so that keys with x mod 9 in {7, 8} are
never test keys).

Shape glossary: batch = sequences, pos = token positions, label = 1 (the last position).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from tasks.base import Batch, ConfigError, CounterfactualPairs, UnpaddedTask, uniform_choice
from tasks.registry import register_task

SPLITS = ("train", "test")


@dataclass
class CompositeConfig:
    name: str = "composite"
    shifts: list[int] = field(default_factory=lambda: [5, 1, -2, -8])
    seq_len: int = 9
    value_min: int = 20
    value_max: int = 99
    overrides: dict[str, int] = field(default_factory=lambda: {"3,4": -6})  # "a1,a2" -> total shift
    held_out: list[str] = field(default_factory=lambda: ["4,3"])
    key_modulus: int | None = None  # None: seq_len - 2
    vocab_size: int | None = None  # None: just the tokens used (0..the largest target); the group's code: 201

    @property
    def modulus(self) -> int:
        return self.key_modulus if self.key_modulus is not None else self.seq_len - 2

    def __post_init__(self) -> None:
        n = len(self.shifts)
        if n < 1:
            raise ConfigError("task.shifts is empty; give at least one anchor shift")
        if self.value_min <= n:
            raise ConfigError(f"task.value_min={self.value_min} collides with anchor ids 1..{n}; use value_min > {n}")
        if self.value_max - self.value_min < 2 * self.seq_len:
            raise ConfigError(f"task.value_max={self.value_max} leaves too few values; use value_max >= value_min + "
                              f"{2 * self.seq_len}")
        if self.seq_len < 3:
            raise ConfigError(f"task.seq_len={self.seq_len} has no room for key and pair; use seq_len >= 3")
        if self.value_min + min(self.shifts) * 2 < 0 or self.value_min + min(self.overrides.values(), default=0) < 0:
            raise ConfigError(f"task.value_min={self.value_min} lets targets go negative with shifts {self.shifts}")
        for pair in [*self.overrides, *self.held_out]:
            parse_pair(pair, n)
        if self.vocab_size is not None and self.vocab_size < self.value_max + 1:
            raise ConfigError(f"task.vocab_size={self.vocab_size} is smaller than the tokens used (0..{self.value_max} "
                              "and the targets); use a larger size, or null")
        if self.key_modulus is not None:
            values = range(self.value_min, self.value_max + 1)
            bare = [p for p in range(self.seq_len - 2)
                    if not any(x % self.key_modulus == p for x in values)
                    or all(x % self.key_modulus == p for x in values)]
            if self.key_modulus < 1 or bare:
                raise ConfigError(f"task.key_modulus={self.key_modulus} leaves key positions {bare or 'all'} without "
                                  f"test or training keys among values {self.value_min}..{self.value_max}; use a "
                                  f"modulus from {self.seq_len - 2} to about {self.value_max - self.value_min}, "
                                  "or null")


def parse_pair(pair: str, n_anchors: int) -> tuple[int, int]:
    """`"3,4"` -> (3, 4), checking that both anchors exist."""
    try:
        a1, a2 = (int(p) for p in pair.split(","))
    except ValueError:
        raise ConfigError(f"anchor pair {pair!r} is not of the form 'a1,a2'") from None
    if not (1 <= a1 <= n_anchors and 1 <= a2 <= n_anchors):
        raise ConfigError(f"anchor pair {pair!r} is not among the anchors 1..{n_anchors}")
    return a1, a2


class CompositeTask(UnpaddedTask):
    """Seeded, batched anchor-function sequences with per-pair targets and counterfactuals."""

    causal = True
    headline_metric = "acc_seen"

    def __init__(self, cfg: CompositeConfig):
        self.cfg = cfg
        n = len(cfg.shifts)
        self.pairs = [(a1, a2) for a1 in range(1, n + 1) for a2 in range(1, n + 1)]
        shifts = torch.tensor(cfg.shifts)
        self.inferential_shift = torch.tensor([shifts[a1 - 1] + shifts[a2 - 1] for a1, a2 in self.pairs])
        overrides = {parse_pair(p, n): s for p, s in cfg.overrides.items()}
        self.trained_shift = torch.tensor([overrides.get(p, int(s))
                                           for p, s in zip(self.pairs, self.inferential_shift)])
        held = {parse_pair(p, n) for p in cfg.held_out}
        self.is_held_out = torch.tensor([p in held for p in self.pairs])
        self.mirror = torch.tensor([self.pairs.index((a2, a1)) for a1, a2 in self.pairs])  # pair id -> (a2, a1)'s
        self.symmetric_shift = self.trained_shift[self.mirror]
        self.n_key_positions = cfg.seq_len - 2
        self._keys_by_split = {s: self._key_table(s) for s in SPLITS}
        max_target = cfg.value_max + max(int(self.trained_shift.max()), int(self.inferential_shift.max()), 0)
        if cfg.vocab_size is not None and cfg.vocab_size <= max_target:
            raise ConfigError(f"task.vocab_size={cfg.vocab_size} leaves out targets up to {max_target}; use at least "
                              f"{max_target + 1}, or null")
        self.vocab = [str(i) for i in range(max(max_target + 1, cfg.vocab_size or 0))]

    @property
    def d_vocab(self) -> int:
        return len(self.vocab)

    @property
    def d_vocab_out(self) -> int:
        return len(self.vocab)

    @property
    def n_ctx(self) -> int:
        return self.cfg.seq_len

    @property
    def label_names(self) -> list[str]:
        return ["target"]

    def pair_name(self, pair_id: int) -> str:
        return "{},{}".format(*self.pairs[pair_id])

    def _key_table(self, split: str) -> tuple[Tensor, Tensor]:
        """For each key position p, the allowed key values (padded) and how many there are."""
        values = torch.arange(self.cfg.value_min, self.cfg.value_max + 1)
        rows = []
        for p in range(self.n_key_positions):
            on_diagonal = values % self.cfg.modulus == p
            rows.append(values[on_diagonal if split == "test" else ~on_diagonal])
        counts = torch.tensor([len(r) for r in rows])
        table = torch.stack([torch.cat([r, r.new_zeros(int(counts.max()) - len(r))]) for r in rows])
        return table, counts

    def _draw_keys(self, key_pos: Int[Tensor, " batch"], split: str, gen: torch.Generator) -> Int[Tensor, " batch"]:
        table, counts = self._keys_by_split[split]
        index = (torch.rand(key_pos.shape, generator=gen) * counts[key_pos]).long()
        return table[key_pos, index]

    def sample(
        self, n: int, gen: torch.Generator, split: str = "train", pair_ids: Tensor | None = None,
        key_pos: int | None = None
    ) -> Batch:
        """`n` sequences. Training draws only trained pairs and training keys; "test" draws every
        pair (held-out ones included) with test keys. `pair_ids` forces the pairs; `key_pos`
        puts every key at that position (so positions line up across rows, for patching)."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown; use one of {SPLITS}")
        if pair_ids is None:
            allowed = ~self.is_held_out if split == "train" else torch.ones(len(self.pairs), dtype=torch.bool)
            pair_ids = uniform_choice(allowed.expand(n, -1), gen)
        if key_pos is None:
            key_positions = torch.randint(self.n_key_positions, (n,), generator=gen)
        elif 0 <= key_pos < self.n_key_positions:
            key_positions = torch.full((n,), key_pos)
        else:
            raise ValueError(f"key_pos={key_pos} is outside 0..{self.n_key_positions - 1}")
        latents = {
            "pair": pair_ids,
            "key_pos": key_positions,
            "key": self._draw_keys(key_positions, split, gen),
            "noise": torch.randint(self.cfg.value_min, self.cfg.value_max + 1, (n, self.cfg.seq_len), generator=gen),
            "split_is_test": torch.full((n,), split == "test"),
        }
        return self.build(latents)

    def build(self, latents: dict[str, Tensor]) -> Batch:
        pair, key_pos, key = latents["pair"], latents["key_pos"], latents["key"]
        n = len(pair)
        anchors = torch.tensor(self.pairs)[pair]  # [batch, 2]
        tokens = latents["noise"].clone()
        rows = torch.arange(n)
        tokens[rows, key_pos] = key
        tokens[rows, key_pos + 1] = anchors[:, 0]
        tokens[rows, key_pos + 2] = anchors[:, 1]
        held = self.is_held_out[pair]
        inferential = key + self.inferential_shift[pair]
        symmetric = key + self.symmetric_shift[pair]
        labels = torch.where(held, inferential, key + self.trained_shift[pair]).unsqueeze(1)
        label_pos = torch.full((n, 1), self.cfg.seq_len - 1)
        ones = torch.ones(n, 1, dtype=torch.bool)
        latents = {**latents, "held_out": held, "inferential": inferential, "symmetric": symmetric}
        return Batch(tokens, labels, label_pos, ones, ~held.unsqueeze(1), latents)

    def corrupt(self, batch: Batch, gen: torch.Generator,
                change: str = "key") -> tuple[Batch, Bool[Tensor, "batch label"]]:
        """A twin with the key changed (`change="key"`), or the first or second anchor changed
        (`"anchor1"`, `"anchor2"`) to another anchor whose pair is not held out. Returns the twin
        and which labels changed."""
        latents = dict(batch.latents)
        if change == "key":
            split = "test" if bool(latents["split_is_test"][0]) else "train"
            fresh = self._draw_keys(latents["key_pos"], split, gen)
            collide = fresh == latents["key"]  # redraw once more, then step to a neighbour
            fresh = torch.where(collide, self._draw_keys(latents["key_pos"], split, gen), fresh)
            m = self.cfg.modulus  # a neighbour with the same residue, so the key stays in its split
            neighbour = torch.where(fresh + m <= self.cfg.value_max, fresh + m, fresh - m)
            latents["key"] = torch.where(fresh == latents["key"], neighbour, fresh)
        elif change in ("anchor1", "anchor2"):
            latents["pair"] = self._other_pair(latents["pair"], slot=0 if change == "anchor1" else 1, gen=gen)
        else:
            raise ValueError(f"change={change!r} is unknown; use 'key', 'anchor1' or 'anchor2'")
        twin = self.build(latents)
        return twin, twin.labels != batch.labels

    def counterfactual_pairs(self, n: int, gen: torch.Generator, aligned: bool = True) -> CounterfactualPairs:
        """Change the key. Aligned pairs put every key at position 2 and keep only trained pairs
        (the held-out pair's answer is what the verdict asks about, not what patching reads)."""
        if not aligned:
            clean = self.sample(n, gen, split="test")
            return CounterfactualPairs(clean, self.corrupt(clean, gen, change="key")[0], "key changed")
        clean = self.sample(n, gen, split="test", key_pos=2)
        clean = clean.select(~clean.latents["held_out"])
        return CounterfactualPairs(clean, self.corrupt(clean, gen, change="key")[0], "key changed")

    def supervised_slots(self) -> list[bool]:
        return [True]

    def _other_pair(self, pair: Int[Tensor, " batch"], slot: int, gen: torch.Generator) -> Int[Tensor, " batch"]:
        anchors = torch.tensor(self.pairs)
        keep = 1 - slot
        same_kept = anchors[:, keep].unsqueeze(0) == anchors[pair][:, keep].unsqueeze(1)  # [batch, pair]
        differs = anchors[:, slot].unsqueeze(0) != anchors[pair][:, slot].unsqueeze(1)
        allowed = same_kept & differs & ~self.is_held_out.unsqueeze(0)
        return uniform_choice(allowed, gen)

    def segment_ids(self, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
        """The key and its anchor pair form one segment (id 0); every other position is its own."""
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        key_pos = self.anchor_mask(tokens).int().argmax(-1, keepdim=True) - 1
        in_triple = (positions >= key_pos) & (positions <= key_pos + 2)
        return torch.where(in_triple, 0, -1 - positions)

    def anchor_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        return (tokens >= 1) & (tokens <= len(self.cfg.shifts))

    def symbol_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        """Value positions (key and noise): the tokens whose repeats association heads find."""
        return ~self.anchor_mask(tokens)

    def token_strings(self, tokens: Int[Tensor, " pos"]) -> list[str]:
        """Values as numbers, anchors as `<a1>`.. so they stand out (`decode` joins these)."""
        n = len(self.cfg.shifts)
        return [f"<a{t}>" if 1 <= t <= n else str(t) for t in tokens.tolist()]

    def accuracy(self, batch: Batch, predictions: Int[Tensor, "batch label"]) -> dict[str, object]:
        """Accuracy per trained pair, over all trained pairs, and on held-out pairs the share of
        answers that are inferential, symmetric, or neither."""
        pred = predictions[:, 0]
        pair, held = batch.latents["pair"], batch.latents["held_out"]
        correct = pred == batch.labels[:, 0]
        per_pair = {}
        for pid in pair.unique().tolist():
            rows = pair == pid
            per_pair[self.pair_name(pid)] = round(correct[rows].float().mean().item(), 4)
        out: dict[str, object] = {"acc_per_pair": per_pair}
        out["acc_seen"] = round(correct[~held].float().mean().item(), 4) if (~held).any() else None
        if held.any():
            inf = (pred == batch.latents["inferential"])[held].float().mean().item()
            sym = (pred == batch.latents["symmetric"])[held].float().mean().item()
            out.update(held_out_inferential=round(inf, 4), held_out_symmetric=round(sym, 4),
                       held_out_other=round(1 - inf - sym, 4))
        return out


register_task("composite", CompositeConfig, CompositeTask)
