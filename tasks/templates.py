"""Template tasks with unseen symbols (Boix-Adsera et al., ICLR 2024): strings of wildcards and
fixed tokens with a label, wildcards filled with distinct symbols.

Templates (one per task config), label read at the last position:
  same_different  `a a -> 1`, `a b -> 0` (half of each)
  binding         `a = +1 ; b = -1 ; print a -> +1`: n_vars variables, each bound to +1 or -1,
                  one printed; the label is its value (a real label)
  copy            `a = x ; b = y ; print a -> x`: variables bound to symbols; the label is the
                  printed variable's symbol (a symbolic label: the answer is copied from the input)

Train, validation and test symbols come from disjoint alphabets (token blocks `x*`, `y*`, `z*`),
so the test split measures generalisation to symbols never seen in training. The output
vocabulary is the whole input vocabulary, so a symbolic label is just that symbol's token id.

Shape glossary: batch = strings, pos = token positions, label = 1 (the last position),
slot = the wildcards of a string.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from tasks.base import Batch, ConfigError, CounterfactualPairs, UnpaddedTask
from tasks.registry import register_task

TEMPLATES = ("same_different", "binding", "copy")
SPLITS = ("train", "val", "test")
FIXED = ["=", ";", "print", "0", "1", "+1", "-1"]
EQUALS, SEMI, PRINT, ZERO, ONE, PLUS, MINUS = range(len(FIXED))
CLAUSE_LEN = 4  # a = v ;
ALPHABET_PREFIX = {"train": "x", "val": "y", "test": "z"}


@dataclass
class TemplatesConfig:
    """One template over three disjoint alphabets of sizes n_train_symbols, n_val_symbols,
    n_test_symbols. n_vars: variables of the binding and copy templates."""

    name: str = "templates"
    template: str = "same_different"
    n_train_symbols: int = 64
    n_val_symbols: int = 64
    n_test_symbols: int = 256
    n_vars: int = 2

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise ConfigError(f"task.template={self.template!r} is unknown; use one of {TEMPLATES}")
        if self.n_vars < 1:
            raise ConfigError(f"task.n_vars={self.n_vars} must be >= 1")
        need = self.symbols_per_string
        for split in SPLITS:
            size = getattr(self, f"n_{split}_symbols")
            if size < need:
                raise ConfigError(f"task.n_{split}_symbols={size} is too small: a {self.template} string fills "
                                  f"{need} wildcards with distinct symbols; use n_{split}_symbols >= {need}")

    @property
    def symbols_per_string(self) -> int:
        """Distinct symbols one string needs: 2 for same-different (the `a b` case), one per
        variable for binding, a name and a value per variable for copy."""
        return {"same_different": 2, "binding": self.n_vars, "copy": 2 * self.n_vars}[self.template]


class TemplatesTask(UnpaddedTask):
    """Seeded, batched template strings over disjoint symbol alphabets, with counterfactual twins."""

    causal = True
    headline_metric = "acc"

    def __init__(self, cfg: TemplatesConfig):
        self.cfg = cfg
        sizes = [cfg.n_train_symbols, cfg.n_val_symbols, cfg.n_test_symbols]
        starts = torch.tensor([0, *sizes]).cumsum(0)[:-1] + len(FIXED)
        self.alphabet = {split: (int(start), size) for split, start, size in zip(SPLITS, starts, sizes)}
        self.vocab = FIXED + [f"{ALPHABET_PREFIX[s]}{i}" for s, size in zip(SPLITS, sizes) for i in range(size)]

    @property
    def d_vocab(self) -> int:
        return len(self.vocab)

    @property
    def d_vocab_out(self) -> int:
        return len(self.vocab)  # symbolic labels are symbols: every token is a possible answer

    @property
    def n_ctx(self) -> int:
        return 2 if self.cfg.template == "same_different" else CLAUSE_LEN * self.cfg.n_vars + 2

    @property
    def label_names(self) -> list[str]:
        return ["label"]

    def chance_accuracy(self) -> float:
        """A guess that knows the template but not the binding: a coin for same-different and
        binding, one of the string's n_vars values for copy."""
        return 1.0 / self.cfg.n_vars if self.cfg.template == "copy" else 0.5

    def draw_symbols(self, n: int, k: int, split: str, gen: torch.Generator) -> Int[Tensor, "batch slot"]:
        """`k` distinct symbols per row, uniform from the split's alphabet (as token ids)."""
        start, size = self.alphabet[split]
        return torch.rand(n, size, generator=gen).topk(k, dim=-1).indices + start

    def sample(self, n: int, gen: torch.Generator, split: str = "train") -> Batch:
        """`n` strings whose wildcards are filled from the split's alphabet. Every string of a
        template has the same layout (only which variable is printed varies), so positions line
        up across rows, as per-position patching needs."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown; use one of {SPLITS}")
        cfg = self.cfg
        latents = {
            "symbols": self.draw_symbols(n, cfg.symbols_per_string, split, gen),
            "split": torch.full((n,), SPLITS.index(split)),
        }
        if cfg.template == "same_different":
            latents["same"] = torch.rand(n, generator=gen) < 0.5
        else:
            latents["query"] = torch.randint(cfg.n_vars, (n,), generator=gen)
        if cfg.template == "binding":
            latents["values"] = torch.randint(2, (n, cfg.n_vars), generator=gen)  # 0: +1, 1: -1
        return self.build(latents)

    def build(self, latents: dict[str, Tensor]) -> Batch:
        """Tokens and labels of the strings these latents describe."""
        tokens, labels = {"same_different": self._same_different, "binding": self._binding,
                          "copy": self._copy}[self.cfg.template](latents)
        n = tokens.shape[0]
        label_pos = torch.full((n, 1), tokens.shape[1] - 1)
        ones = torch.ones(n, 1, dtype=torch.bool)
        return Batch(tokens, labels.unsqueeze(1), label_pos, ones, ones.clone(), latents)

    def _same_different(self, latents: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        symbols, same = latents["symbols"], latents["same"]
        second = torch.where(same, symbols[:, 0], symbols[:, 1])
        return torch.stack([symbols[:, 0], second], dim=1), torch.where(same, ONE, ZERO)

    def _binding(self, latents: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        values = torch.where(latents["values"] == 0, PLUS, MINUS)
        tokens = self._clauses(latents["symbols"], values, latents["query"])
        return tokens, values.gather(1, latents["query"].unsqueeze(1)).squeeze(1)

    def _copy(self, latents: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        names, values = latents["symbols"].chunk(2, dim=1)
        tokens = self._clauses(names, values, latents["query"])
        return tokens, values.gather(1, latents["query"].unsqueeze(1)).squeeze(1)

    @staticmethod
    def _clauses(names: Int[Tensor, "batch var"], values: Int[Tensor, "batch var"],
                 query: Int[Tensor, " batch"]) -> Int[Tensor, "batch pos"]:
        """`a = v ; b = w ; ... print q` with q the queried variable's name."""
        n, n_vars = names.shape
        clauses = torch.stack([names, torch.full((n, n_vars), EQUALS), values, torch.full((n, n_vars), SEMI)], dim=-1)
        printed = names.gather(1, query.unsqueeze(1))
        return torch.cat([clauses.flatten(1), torch.full((n, 1), PRINT), printed], dim=1)

    def corrupt(self, batch: Batch, gen: torch.Generator,
                change: str = "label") -> tuple[Batch, Bool[Tensor, "batch label"]]:
        """A twin whose label differs, changed in one named way:
          same_different  "label": the second symbol is swapped (`a a` <-> `a b`)
          binding         "label": the printed variable's value is flipped;
                          "query": another variable is printed (label changes where values differ)
          copy            "label": the printed variable's value becomes a fresh symbol of the
                          same alphabet; "query": another variable is printed (always changes)
        Returns the twin and which labels changed."""
        allowed = {"same_different": ("label",), "binding": ("label", "query"), "copy": ("label", "query")}
        if change not in allowed[self.cfg.template]:
            raise ValueError(f"change={change!r} is unknown for template {self.cfg.template!r}; "
                             f"use one of {allowed[self.cfg.template]}")
        latents = dict(batch.latents)
        if change == "query":
            if self.cfg.n_vars < 2:
                raise ValueError("change='query' needs n_vars >= 2 (another variable to print)")
            shift = torch.randint(1, self.cfg.n_vars, latents["query"].shape, generator=gen)
            latents["query"] = (latents["query"] + shift) % self.cfg.n_vars
        elif self.cfg.template == "same_different":
            latents["same"] = ~latents["same"]
        elif self.cfg.template == "binding":
            latents["values"] = self._flip_queried(latents["values"], latents["query"])
        else:
            latents["symbols"] = self._fresh_queried_value(latents["symbols"], latents["query"], latents["split"], gen)
        twin = self.build(latents)
        return twin, twin.labels != batch.labels

    def counterfactual_pairs(self, n: int, gen: torch.Generator, aligned: bool = True) -> CounterfactualPairs:
        """Test strings (unseen symbols) and twins with the label changed (see `corrupt`). Every
        string of a template shares one layout, so pairs are always aligned."""
        clean = self.sample(n, gen, split="test")
        what = {"same_different": "second symbol swapped", "binding": "printed variable's value flipped",
                "copy": "printed variable's value replaced by a fresh symbol"}[self.cfg.template]
        return CounterfactualPairs(clean, self.corrupt(clean, gen, change="label")[0], what)

    def supervised_slots(self) -> list[bool]:
        return [True]

    @staticmethod
    def _flip_queried(values: Int[Tensor, "batch var"], query: Int[Tensor, " batch"]) -> Int[Tensor, "batch var"]:
        flipped = values.clone()
        rows = torch.arange(len(query))
        flipped[rows, query] = 1 - values[rows, query]
        return flipped

    def _fresh_queried_value(self, symbols: Int[Tensor, "batch slot"], query: Int[Tensor, " batch"],
                             split: Int[Tensor, " batch"], gen: torch.Generator) -> Int[Tensor, "batch slot"]:
        """Replace the queried value with a symbol of the row's alphabet that the row lacks."""
        n_vars = self.cfg.n_vars
        starts = torch.tensor([self.alphabet[s][0] for s in SPLITS])[split]
        sizes = torch.tensor([self.alphabet[s][1] for s in SPLITS])[split]
        offsets = torch.arange(int(sizes.max()))
        candidates = starts.unsqueeze(1) + offsets  # [batch, max alphabet]
        free = (offsets < sizes.unsqueeze(1)) & ~(candidates.unsqueeze(-1) == symbols.unsqueeze(1)).any(-1)
        pick = torch.rand(free.shape, generator=gen).masked_fill(~free, -1.0).argmax(-1)
        fresh = symbols.clone()
        fresh[torch.arange(len(query)), n_vars + query] = candidates.gather(1, pick.unsqueeze(1)).squeeze(1)
        return fresh

    def symbol_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        """Positions holding a symbol (of any alphabet): the tokens whose repeats association
        heads find, and on which the identity term `a_h X X^T` acts."""
        return tokens >= len(FIXED)

    def segment_ids(self, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
        """Clause index of each position (`a = v ;`, and `print a` as the last clause); each
        same-different position is a segment of its own."""
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        if self.cfg.template == "same_different":
            return positions.clone()
        return positions.div(CLAUSE_LEN, rounding_mode="floor")

    def token_strings(self, tokens: Int[Tensor, " pos"]) -> list[str]:
        """`decode` joins these: `x3 = +1 ; x7 = -1 ; print x3` (train symbols x*, val y*, test z*)."""
        return [self.vocab[t] for t in tokens.tolist()]

    def accuracy(self, batch: Batch, predictions: Int[Tensor, "batch label"]) -> dict[str, object]:
        """Accuracy and error on the label; for same-different also per class (same / different)."""
        correct = (predictions[:, 0] == batch.labels[:, 0]).float()
        out: dict[str, object] = {"acc": round(correct.mean().item(), 4), "error": round(1 - correct.mean().item(), 4)}
        if self.cfg.template == "same_different":
            same = batch.latents["same"]
            for name, rows in (("acc_same", same), ("acc_different", ~same)):
                out[name] = round(correct[rows].mean().item(), 4) if rows.any() else None
        return out


register_task("templates", TemplatesConfig, TemplatesTask)
