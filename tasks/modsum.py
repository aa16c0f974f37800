"""Modular sum, a toy task: `a + b =` with a, b uniform in 0..p-1, label (a + b) mod p read at the
last position. Causal. With interp/tasks/modsum.py (its analysis and preset) this file is all
there is of the task: nothing else in the workbench names it.

Both splits draw every (a, b) alike: the task holds nothing out.

Shape glossary: batch = sums, pos = token positions (a, +, b, =), label = 1 (the last position).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from tasks.base import Batch, ConfigError, CounterfactualPairs, UnpaddedTask
from tasks.registry import register_task

SPLITS = ("train", "test")
MAX_MODULUS = 10_000


@dataclass
class ModsumConfig:
    """p: the modulus; operands and answers are 0..p-1."""

    name: str = "modsum"
    p: int = 7

    def __post_init__(self) -> None:
        if not 2 <= self.p <= MAX_MODULUS:
            raise ConfigError(f"task.p={self.p} must be within 2..{MAX_MODULUS}")


class ModsumTask(UnpaddedTask):
    """Seeded, batched sums `a + b =` with counterfactual twins (b changed, so the sum changes)."""

    causal = True
    headline_metric = "acc"

    def __init__(self, cfg: ModsumConfig):
        self.cfg = cfg
        self.plus, self.equals = cfg.p, cfg.p + 1  # the two fixed tokens follow the numbers
        self.vocab = [str(i) for i in range(cfg.p)] + ["+", "="]

    @property
    def d_vocab(self) -> int:
        return len(self.vocab)

    @property
    def d_vocab_out(self) -> int:
        return self.cfg.p

    @property
    def n_ctx(self) -> int:
        return 4

    @property
    def label_names(self) -> list[str]:
        return ["sum"]

    def sample(self, n: int, gen: torch.Generator, split: str = "train") -> Batch:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown; use one of {SPLITS}")
        return self.build({"a": torch.randint(self.cfg.p, (n,), generator=gen),
                           "b": torch.randint(self.cfg.p, (n,), generator=gen)})

    def build(self, latents: dict[str, Tensor]) -> Batch:
        a, b = latents["a"], latents["b"]
        n = len(a)
        tokens = torch.stack([a, torch.full((n,), self.plus), b, torch.full((n,), self.equals)], dim=1)
        ones = torch.ones(n, 1, dtype=torch.bool)
        return Batch(tokens, ((a + b) % self.cfg.p).unsqueeze(1), torch.full((n, 1), 3), ones, ones.clone(),
                     dict(latents))

    def corrupt(self, batch: Batch, gen: torch.Generator) -> tuple[Batch, Bool[Tensor, "batch label"]]:
        """A twin whose b is another number (so the sum always changes), and which labels changed."""
        b = batch.latents["b"]
        shift = torch.randint(1, self.cfg.p, b.shape, generator=gen)
        twin = self.build({**batch.latents, "b": (b + shift) % self.cfg.p})
        return twin, twin.labels != batch.labels

    def counterfactual_pairs(self, n: int, gen: torch.Generator, aligned: bool = True) -> CounterfactualPairs:
        """Test sums and twins with b changed. Every sum shares one layout: pairs are always aligned."""
        clean = self.sample(n, gen, split="test")
        return CounterfactualPairs(clean, self.corrupt(clean, gen)[0], "second operand b changed")

    def supervised_slots(self) -> list[bool]:
        return [True]

    def accuracy(self, batch: Batch, predictions: Int[Tensor, "batch label"]) -> dict[str, object]:
        correct = (predictions[:, 0] == batch.labels[:, 0]).float().mean().item()
        return {"acc": round(correct, 4), "error": round(1 - correct, 4)}

    def segment_ids(self, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
        """One clause: the whole sum."""
        return torch.zeros_like(tokens)

    def symbol_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        """The operands (a repeated number is what association heads find)."""
        return tokens < self.cfg.p

    def token_strings(self, tokens: Int[Tensor, " pos"]) -> list[str]:
        return [self.vocab[t] for t in tokens.tolist()]


register_task("modsum", ModsumConfig, ModsumTask)
