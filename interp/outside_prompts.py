"""What you give `interp.outside.analyze_model`: clean/corrupted prompt pairs with their answers,
as token ids, and the metric read on them (docs/outside-models.md).

    pairs = PromptPairs.from_lists(clean, corrupted, answers, wrong_answers, model=model)
    pairs = PromptPairs.from_json("pairs.json", model=model)
    metric = scalar_metric(fn)  # a TransformerLens-style metric: one number for the batch

A pair is a clean prompt, its corrupted twin of the same length, the clean prompt's answer token
and the corrupted prompt's answer (`wrong_answer`); every prompt has the same number of tokens,
so that a position means the same thing in every pair (patching copies position by position).
The answer is read at the last position. Prompts are strings (tokenised by the model's tokenizer,
or split on whitespace into the names of `vocab`) or lists of token ids. Every malformed input is
refused here, with a ValueError that names the pair and the fix.

Metrics. The default is the project's `LogitDiff` (`interp.patching.logit_diff_metric`, built
from a `tasks.Batch` made of the pairs: labels = the answers, read at the last position). Any
metric of the project returns one value per pair; a TransformerLens-style metric that returns one
number for the whole batch (e.g. the mean logit difference) goes through `scalar_metric(fn)`.

Shape glossary: batch = prompt pairs, pos = token positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.patching import LogitDiff, Metric, logit_diff_metric
from tasks import Batch

Prompt = str | Sequence[int]
Answer = str | int

# ---------------------------------------------------------------------------------------------
# Prompt pairs


@dataclass(frozen=True)
class PromptPairs:
    """Clean prompts, their corrupted twins, and the answers, as token ids.

    clean, corrupted: [batch pos], one row per pair, every row the same length; answers: the
    clean prompt's answer token per pair; wrong_answers: the corrupted prompt's answer (the metric
    is logit(answer) - logit(wrong_answer) at the last position: positive on clean prompts,
    negative on corrupted ones for a model that does the task). `vocab`: names of the token ids
    for display (None: the model's tokenizer, or the ids themselves)."""

    clean: Int[Tensor, "batch pos"]
    corrupted: Int[Tensor, "batch pos"]
    answers: Int[Tensor, " batch"]
    wrong_answers: Int[Tensor, " batch"]
    vocab: list[str] | None = None

    def __post_init__(self) -> None:
        for name in ("clean", "corrupted", "answers", "wrong_answers"):
            value = getattr(self, name)
            if not isinstance(value, Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool:
                raise ValueError(f"PromptPairs.{name} must be an integer tensor of token ids, not {_kind(value)}")
        if self.clean.dim() != 2 or self.clean.shape[0] == 0 or self.clean.shape[1] == 0:
            raise ValueError(f"PromptPairs.clean has shape {tuple(self.clean.shape)}; it must be [pairs, positions] "
                             "with at least one pair and one token")
        if self.corrupted.shape != self.clean.shape:
            raise ValueError(f"clean prompts {tuple(self.clean.shape)} and corrupted prompts "
                             f"{tuple(self.corrupted.shape)} differ in shape; each pair needs two prompts of the "
                             "same length, and every pair the same length (patching copies position by position)")
        n = self.clean.shape[0]
        for name in ("answers", "wrong_answers"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"PromptPairs.{name} has shape {tuple(getattr(self, name).shape)}; it needs one "
                                 f"token id per pair, shape ({n},)")
        same = (self.answers == self.wrong_answers).nonzero().flatten().tolist()
        if same:
            raise ValueError(f"pair(s) {same[:5]} have the same answer and wrong answer; the metric compares the "
                             "two, so they must differ in every pair")
        negative = [name for name in ("clean", "corrupted", "answers", "wrong_answers")
                    if (getattr(self, name) < 0).any()]
        if negative:
            raise ValueError(f"PromptPairs.{negative[0]} holds a negative token id; token ids start at 0")

    def __len__(self) -> int:
        return self.clean.shape[0]

    @classmethod
    def from_lists(
        cls, clean: Sequence[Prompt], corrupted: Sequence[Prompt], answers: Sequence[Answer],
        wrong_answers: Sequence[Answer], *, model: HookedTransformer | None = None, vocab: Sequence[str] | None = None,
        prepend_bos: bool | None = None,
    ) -> PromptPairs:
        """Pairs from Python lists, one entry per pair. A prompt is a string or a list of token
        ids; an answer a string (one token) or a token id. Strings are split on whitespace into
        names of `vocab` when it is given, else tokenised by `model`'s tokenizer (`prepend_bos`:
        None follows the model's default). Give `model` to have ids checked against its
        vocabulary here rather than in `analyze_model`."""
        counts = {"clean": len(clean), "corrupted": len(corrupted), "answers": len(answers),
                  "wrong_answers": len(wrong_answers)}
        if len(set(counts.values())) != 1:
            raise ValueError(f"the lists differ in length ({', '.join(f'{k}: {v}' for k, v in counts.items())}); "
                             "give one clean prompt, one corrupted prompt, one answer and one wrong answer per pair")
        if not clean:
            raise ValueError("no prompt pairs: the lists are empty")
        encode = _Encoder(model, vocab, prepend_bos)
        rows = []
        for i, (c, k) in enumerate(zip(clean, corrupted)):
            c_ids, k_ids = encode.prompt(c, f"pair {i}, clean prompt"), encode.prompt(k, f"pair {i}, corrupted prompt")
            if len(c_ids) != len(k_ids):
                raise ValueError(f"pair {i}: the clean prompt has {len(c_ids)} tokens and the corrupted one "
                                 f"{len(k_ids)}; a pair's prompts must have the same length (patching copies "
                                 f"position by position): {encode.show(c_ids)} vs {encode.show(k_ids)}")
            if rows and len(c_ids) != len(rows[0][0]):
                raise ValueError(f"pair {i} has {len(c_ids)} tokens but pair 0 has {len(rows[0][0])}; every prompt "
                                 "must have the same number of tokens, so that a position means the same thing in "
                                 "every pair (use prompts of one template, or analyse each length separately)")
            rows.append((c_ids, k_ids))
        pairs = cls(torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]),
                    torch.tensor([encode.answer(a, f"pair {i}, answer") for i, a in enumerate(answers)]),
                    torch.tensor([encode.answer(a, f"pair {i}, wrong_answer") for i, a in enumerate(wrong_answers)]),
                    list(vocab) if vocab is not None else None)
        if model is not None:
            pairs.check(model)
        return pairs

    @classmethod
    def from_json(cls, path: str | Path, model: HookedTransformer | None = None) -> PromptPairs:
        """Pairs from a JSON file: {"pairs": [{"clean": ..., "corrupted": ..., "answer": ...,
        "wrong_answer": ...}, ...], "vocab": [...] (optional), "prepend_bos": true (optional)},
        or just the list of pairs. Prompts and answers as in `from_lists`. Read strictly
        (`models.safe_files.read_json`: a repeated key is refused), and so is a key not named
        here (a misspelt "prepend_bos" would otherwise be ignored); every message starts with
        the file's path."""
        from models.safe_files import RunFolderError, read_json

        path = Path(path)
        try:
            data = read_json(path)
        except FileNotFoundError:
            raise ValueError(f"{path} does not exist; give a JSON file of prompt pairs") from None
        except RunFolderError as err:
            raise ValueError(str(err)) from None
        if isinstance(data, list):
            data = {"pairs": data}
        if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
            raise ValueError(f"{path}: expected an object with a list \"pairs\" (or a list of pairs), "
                             f"got {type(data).__name__}")
        _refuse_other_keys(data, ("pairs", "vocab", "prepend_bos"), f"{path}: the top-level object")
        keys = ("clean", "corrupted", "answer", "wrong_answer")
        for i, pair in enumerate(data["pairs"]):
            missing = [key for key in keys if not isinstance(pair, dict) or key not in pair]
            if missing:
                raise ValueError(f"{path}: pair {i} lacks {missing}; each pair is an object with {list(keys)}")
            _refuse_other_keys(pair, keys, f"{path}: pair {i}")
        vocab = data.get("vocab")
        if vocab is not None and not (isinstance(vocab, list) and all(isinstance(v, str) for v in vocab)):
            raise ValueError(f"{path}: \"vocab\" must be a list of strings (the name of each token id)")
        if not isinstance(data.get("prepend_bos"), bool | None):
            raise ValueError(f"{path}: \"prepend_bos\" is {data['prepend_bos']!r}; use true, false or null "
                             "(null: the model's default)")
        try:
            return cls.from_lists(*[[pair[key] for pair in data["pairs"]] for key in keys], model=model, vocab=vocab,
                                  prepend_bos=data.get("prepend_bos"))
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def check(self, model: HookedTransformer) -> None:
        """ValueError unless every id is in the model's vocabulary and the prompts fit its context."""
        cfg = model.cfg
        for name, ids, size in (("clean", self.clean, cfg.d_vocab), ("corrupted", self.corrupted, cfg.d_vocab),
                                ("answers", self.answers, cfg.d_vocab_out),
                                ("wrong_answers", self.wrong_answers, cfg.d_vocab_out)):
            bad = (ids >= size).nonzero()
            if len(bad):
                where = bad[0].tolist()
                place = f"the {name} prompt of pair {where[0]}, position {where[1]}" if len(where) == 2 else \
                    f"the {name[:-1]} of pair {where[0]}"
                raise ValueError(f"PromptPairs.{name}{where} is token {int(ids[tuple(where)])}, outside the model's "
                                 f"vocabulary 0..{size - 1} ({'d_vocab' if size == cfg.d_vocab else 'd_vocab_out'}): "
                                 f"{place}")
        if self.clean.shape[1] > cfg.n_ctx:
            raise ValueError(f"the prompts have {self.clean.shape[1]} tokens but the model's context is "
                             f"n_ctx={cfg.n_ctx}")

    def batches(self) -> tuple[Batch, Batch]:
        """The pairs as the project's `Batch` twins: one label slot, read at the last position;
        the clean batch's label is the answer, the corrupted batch's the wrong answer."""
        n, n_pos = self.clean.shape
        pos = torch.full((n, 1), n_pos - 1, dtype=torch.long)
        ones = torch.ones(n, 1, dtype=torch.bool)

        def batch(tokens: Tensor, labels: Tensor) -> Batch:
            return Batch(tokens.long(), labels.long().view(n, 1), pos.clone(), ones.clone(), ones.clone())

        return batch(self.clean, self.answers), batch(self.corrupted, self.wrong_answers)

    def logit_diff(self) -> LogitDiff:
        """The project's metric on these pairs: logit(answer) - logit(wrong_answer) at the last
        position, per pair (`interp.patching.logit_diff_metric`)."""
        return logit_diff_metric(*self.batches())

    def token_strings(self, tokens: Tensor | Sequence[int], model: HookedTransformer | None = None) -> list[str]:
        """Names of the tokens: `vocab`, else the model's tokenizer, else the ids."""
        ids = [int(t) for t in tokens]
        if self.vocab is not None:
            return [self.vocab[t] if t < len(self.vocab) else str(t) for t in ids]
        if model is not None and getattr(model, "tokenizer", None) is not None:
            return list(model.to_str_tokens(torch.tensor(ids)))
        return [str(t) for t in ids]


def _refuse_other_keys(obj: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    other = sorted(set(obj) - set(allowed))
    if other:
        raise ValueError(f"{where} has key(s) {other} that prompt pairs do not have; the keys are {list(allowed)}")


def _kind(value: Any) -> str:
    return f"a {value.dtype} tensor" if isinstance(value, Tensor) else type(value).__name__


class _Encoder:
    """Prompts and answers to token ids: ids as given, strings through `vocab` or the tokenizer."""

    def __init__(self, model: HookedTransformer | None, vocab: Sequence[str] | None, prepend_bos: bool | None):
        self.model, self.prepend_bos = model, prepend_bos
        self.index = None if vocab is None else {name: i for i, name in enumerate(vocab)}
        if vocab is not None and len(self.index) != len(vocab):
            raise ValueError("vocab names a token twice; each name must be unique")
        self.tokenizer = None if model is None else getattr(model, "tokenizer", None)

    def _strings_need(self, where: str) -> None:
        if self.index is None and self.tokenizer is None:
            raise ValueError(f"{where} is a string, but there is no tokenizer (the model has none, or no model was "
                             "given) and no vocab; give token ids, or vocab=[name of token 0, name of token 1, ...]")

    def prompt(self, prompt: Prompt, where: str) -> list[int]:
        if isinstance(prompt, str):
            self._strings_need(where)
            if self.index is not None:
                words = prompt.split()
                unknown = [w for w in words if w not in self.index]
                if unknown:
                    raise ValueError(f"{where}: {unknown[:5]} not in vocab (prompts are split on whitespace)")
                ids = [self.index[w] for w in words]
            else:
                ids = self.model.to_tokens(prompt, prepend_bos=self.prepend_bos, truncate=False)[0].tolist()
        elif isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise ValueError(f"{where} must be a string or a list of token ids (ints), not {_kind(prompt)}")
        if not ids:
            raise ValueError(f"{where} is empty")
        return ids

    def answer(self, answer: Answer, where: str) -> int:
        if isinstance(answer, int) and not isinstance(answer, bool):
            return answer
        if not isinstance(answer, str):
            raise ValueError(f"{where} must be a string (one token) or a token id, not {_kind(answer)}")
        self._strings_need(where)
        if self.index is not None:
            if answer.strip() not in self.index:
                raise ValueError(f"{where}: {answer!r} is not in vocab")
            return self.index[answer.strip()]
        ids = self.model.to_tokens(answer, prepend_bos=False)[0].tolist()
        if len(ids) != 1:
            raise ValueError(f"{where}: {answer!r} is {len(ids)} tokens "
                             f"{self.model.to_str_tokens(answer, prepend_bos=False)}; an answer must be one token "
                             "(mind the leading space: ' Mary', not 'Mary')")
        return ids[0]

    def show(self, ids: list[int]) -> str:
        if self.index is not None:
            names = {i: name for name, i in self.index.items()}
            return " ".join(names.get(i, str(i)) for i in ids)
        return str(ids)


# ---------------------------------------------------------------------------------------------
# Metrics


def scalar_metric(fn: Callable[[Tensor], Tensor], n_pairs: int | None = None) -> Metric:
    """A TransformerLens-style metric, `fn(logits [batch pos d_vocab]) -> one number for the
    batch` (e.g. the mean logit difference over the prompts), as the per-pair metric the
    workbench's patching takes.

    The workbench's functions call a metric on the logits of exactly the pairs, in their order
    (each patched copy of the batch, each baseline, each gradient step separately), and average
    what it returns per pair. The wrapper calls `fn` on those logits and repeats its one number
    once per pair, so that average is `fn`'s value: exact patching, attribution (gradients flow
    through `fn`), path patching and the circuit finder see exactly `fn`. A metric that closes
    over per-prompt tensors (answer tokens [batch, 2]) therefore works as it does in
    TransformerLens. The per-pair values themselves are not per-pair measurements; only their mean is.
    `n_pairs`: check that every call gets that many rows. A `fn` that already returns one value
    per pair is passed through unchanged."""
    if not callable(fn):
        raise ValueError(f"scalar_metric needs a function logits -> number, not {_kind(fn)}")

    def per_pair(logits: Tensor) -> Tensor:
        n = logits.shape[0]
        if n_pairs is not None and n != n_pairs:
            raise ValueError(f"the metric was wrapped for {n_pairs} pairs but got logits for {n}")
        value = fn(logits)
        if not isinstance(value, Tensor):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                raise ValueError(f"the metric returned a Python {type(value).__name__} ({value}); return a tensor "
                                 "(e.g. without .item()), so that patching's gradients can flow through it")
            raise ValueError(f"the metric returned {_kind(value)}; it must return a tensor")
        if value.dim() == 0 or value.shape == (1,):
            return value.reshape(()).expand(n)
        if value.shape == (n,):
            return value
        raise ValueError(f"the metric returned shape {tuple(value.shape)}; scalar_metric takes a function that returns "
                         f"one number for the batch (shape ()) or one per pair (shape ({n},))")

    per_pair.wrapped = fn  # type: ignore[attr-defined]
    per_pair.__name__ = f"scalar_metric({getattr(fn, '__name__', 'fn')})"
    per_pair.__doc__ = (f"{fn.__doc__ or ''}\n(wrapped by interp.outside_prompts.scalar_metric: one number repeated "
                        "per pair)")
    return per_pair


def check_metric(model: HookedTransformer, pairs: PromptPairs, metric: Metric) -> None:
    """Run `metric` once on the clean prompts' logits: ValueError, naming the fix, unless it
    returns one value per pair (a TransformerLens-style one-number metric needs `scalar_metric`)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        value = metric(model(pairs.clean.to(device)))
    n = len(pairs)
    if isinstance(value, Tensor) and value.shape == (n,):
        return
    shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
    if not isinstance(value, Tensor) or value.numel() == 1:
        raise ValueError(f"the metric returned one number ({shape}) for {n} pairs; the workbench averages one value "
                         "per pair. Wrap a TransformerLens-style metric: "
                         "metric=interp.outside_prompts.scalar_metric(fn)")
    raise ValueError(f"the metric returned shape {shape}; it must return one value per pair, shape ({n},)")
