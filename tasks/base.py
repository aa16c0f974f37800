"""What every task hands to models and analyses: one batch type and a few shared helpers.

Shape glossary: batch = samples, pos = token positions, label = label slots of a sample
(LEGO: one per variable in chain order; composite: one), d_vocab_out = classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the value and what is allowed."""


@dataclass
class Batch:
    """Token sequences with their labels and where the labels are read.

    `latents` hold the generative variables a sample was built from (variable letters, group
    elements, keys ...), so that `corrupt()` can change one of them and rebuild the sample.
    """

    tokens: Int[Tensor, "batch pos"]
    labels: Int[Tensor, "batch label"]
    label_pos: Int[Tensor, "batch label"]
    label_mask: Bool[Tensor, "batch label"]  # the label exists (False for padding)
    loss_mask: Bool[Tensor, "batch label"]  # the label is supervised in training
    latents: dict[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def map(self, fn: Callable[[Tensor], Tensor]) -> Batch:
        """The batch with `fn` applied to every tensor, latents included."""
        tensors = {f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "latents"}
        return Batch(**tensors, latents={k: fn(v) for k, v in self.latents.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The batch on `device`. With `non_blocking`, a copy from pinned memory (`pin_memory`)
        to a GPU returns at once and overlaps with the work already queued there."""
        return self.map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory, which a GPU copies from asynchronously (CUDA only)."""
        return self.map(Tensor.pin_memory)

    def select(self, index: Tensor | slice) -> Batch:
        """The sub-batch of the given sample indices (a slice or index tensor)."""
        return self.map(lambda t: t[index])


class CounterfactualPairs(NamedTuple):
    """Clean inputs, their corrupted twins (one latent changed so the answer changes), and a
    sentence saying what was changed. With `aligned`, every row shares one layout, so that a
    position means the same thing in every row, as per-position patching needs."""

    clean: Batch
    corrupted: Batch
    description: str


@runtime_checkable
class Task(Protocol):
    """What every task offers to models, training and analysis. Adding a task means one file in
    `tasks/` implementing this and registering it (`tasks.registry.register_task`), and one in
    `interp/tasks/` defining its analysis (`interp.task_analysis.TaskAnalysis`). Each member,
    what reads it and which are optional: `tasks.contract.CONTRACT`, shown in docs/tasks.md ("The
    Task contract"); a registered task is held to it the first time it is looked up.

    Labels: each sample has `len(label_names)` label slots. Slot i is read at position
    `batch.label_pos[:, i]` (the model's logits there, restricted to `d_vocab_out` classes);
    `batch.label_mask` says the slot exists, `batch.loss_mask` that it is trained on.
    """

    cfg: Any
    causal: bool  # a left-to-right (causal) model, or one that sees the whole sequence
    headline_metric: str  # the `accuracy` key a run is judged by: the stop rule and progress bars read it

    @property
    def d_vocab(self) -> int: ...
    @property
    def d_vocab_out(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def label_names(self) -> list[str]: ...
    @property
    def bos_token(self) -> int | None: ...

    def sample(self, n: int, gen: torch.Generator, split: str = "train") -> Batch:
        """`n` fresh samples of a split ("train" or "test"; a task may have more)."""

    def build(self, latents: dict[str, Tensor]) -> Batch:
        """The samples these latents describe (what `corrupt` rebuilds from)."""

    def corrupt(self, batch: Batch, gen: torch.Generator) -> tuple[Batch, Bool[Tensor, "batch label"]]:
        """A twin of each sample with one latent changed, and which labels changed."""

    def counterfactual_pairs(self, n: int, gen: torch.Generator, aligned: bool = True) -> CounterfactualPairs:
        """Test-split pairs for patching: the task's standard change of one latent."""

    def supervised_slots(self) -> list[bool]:
        """Which label slots training supervises, for full-length test samples."""

    def accuracy(self, batch: Batch, predictions: Int[Tensor, "batch label"]) -> dict[str, object]:
        """The evaluation metrics written to metrics.jsonl."""

    def segment_ids(self, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
        """Each position's local window (a clause); manipulation heads attend inside it."""

    def symbol_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        """Positions whose other occurrences association heads find."""

    def broadcast_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]: ...
    def padding_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]: ...
    def decode(self, tokens: Int[Tensor, "batch pos"] | Int[Tensor, " pos"]) -> list[str] | str: ...
    def token_strings(self, tokens: Int[Tensor, " pos"]) -> list[str]: ...


def logits_at_labels(
    logits: Float[Tensor, "batch pos d_vocab_out"], label_pos: Int[Tensor, "batch label"]
) -> Float[Tensor, "batch label d_vocab_out"]:
    """The model's logits at each label position."""
    index = label_pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return logits.gather(1, index)


def seeded_generator(seed: int) -> torch.Generator:
    """A local CPU generator: tasks never touch the global RNG."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def uniform_choice(weights: Bool[Tensor, "batch n"], gen: torch.Generator) -> Int[Tensor, " batch"]:
    """One index per row, uniform among the True entries of `weights` (each row needs one)."""
    scores = torch.rand(weights.shape, generator=gen).masked_fill(~weights, -1.0)
    return scores.argmax(dim=-1)


class UnpaddedTask:
    """Shared by tasks whose sequences have no BOS and no padding (composite, templates):
    broadcast heads attend to position 0, and text is the tokens' strings joined by spaces."""

    @property
    def bos_token(self) -> int | None:
        return None

    def broadcast_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        mask = torch.zeros_like(tokens, dtype=torch.bool)
        mask[:, 0] = True
        return mask

    def padding_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        return torch.zeros_like(tokens, dtype=torch.bool)

    def decode(self, tokens: Int[Tensor, "batch pos"] | Int[Tensor, " pos"]) -> list[str] | str:
        if tokens.dim() == 2:
            return [self.decode(row) for row in tokens]
        return " ".join(self.token_strings(tokens))

    def token_strings(self, tokens: Int[Tensor, " pos"]) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} must define token_strings(tokens), each token's string "
                                  f"(docs/tasks.md, 'The Task contract')")
