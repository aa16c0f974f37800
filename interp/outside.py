"""Your own model, your own prompts: the workbench's patching, path patching, circuit graph, head
scores and HTML report on any TransformerLens `HookedTransformer`, with clean/corrupted prompt
pairs you write yourself and no project Task (docs/outside-models.md walks through it).

    pairs = PromptPairs.from_lists(clean, corrupted, answers, wrong_answers, model=model)  # or .from_json(path)
    analysis = analyze_model(model, pairs)           # metric: logit(answer) - logit(wrong_answer) at the last token
    analysis.write_report("runs/mine/report.html")   # and analysis.to_dict() for JSON

From the command line (analyses/outside.py): `workbench analyze-model --model FILE.py:FUNCTION
--prompts PAIRS.json --out DIR`, FUNCTION() returning the model, the pairs file `from_json`'s.

A pair is a clean prompt, its corrupted twin of the same length, the clean prompt's answer token
and the corrupted prompt's answer (`wrong_answer`); every prompt has the same number of tokens,
so that a position means the same thing in every pair (patching copies position by position).
The answer is read at the last position. Prompts are strings (tokenised by the model's tokenizer,
or split on whitespace into the names of `vocab`) or lists of token ids.

Metrics. The default is the project's `LogitDiff` (`interp.patching.logit_diff_metric`, built
from a `tasks.Batch` made of the pairs: labels = the answers, read at the last position). Any
metric of the project returns one value per pair; a TransformerLens-style metric that returns one
number for the whole batch (e.g. the mean logit difference) goes through `scalar_metric(fn)`.

Nothing here reimplements patching: it calls `interp.patching`, `interp.atp`, `interp.paths`,
`interp.circuit`, `interp.attention` and `interp.analysis_html`'s report sections, as `workbench
analyze` does on a project run. Path patching is refused, with the option named, for model
options it does not handle (`interp.paths.check_path_patchable`, the same check for every model;
the table of options is in docs/limits.md); the circuit then has no edges.

Head scores need no task: per head, the attention mass on each kind's targets relative to
uniform attention (`interp.attention.relative_mass`), as the project's classifier measures:
  previous   the position just before the query
  self       the query's own position
  first      position 0 (the BOS token where the model prepends one)
  duplicate  earlier (causal) or other positions holding the query's own token
  induction  causal models only: the token after an earlier occurrence of the query's token
A kind that no query of the prompts can show (no repeated token: no duplicate or induction
query) is NaN and None in `to_dict`. Thresholds: previous, self and first reuse the project's
calibrated ones (previous, self, broadcast); duplicate reuses association's (calibrated on LEGO's
planted heads); induction's is calibrated on the hand-set induction head
(`interp.toy_induction.calibrate_induction`).

Shape glossary: batch = prompt pairs, pos = token positions, layer, head_index, kind.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp import plots
from interp.analysis import PatchingAnalysis
from interp.analysis_html import _circuit_html, _patching_html, _paths_html
from interp.atp import judge_estimates
from interp.attention import DEFAULT_THRESHOLDS, HeadScores, attention_patterns, relative_mass
from interp.circuit import find_circuit
from interp.patching import LogitDiff, Metric, logit_diff_metric, patch_head_out, patch_residual
from interp.paths import check_path_patchable, path_patch
from interp.report import Report, figure_html, table_html
from interp.report_format import evidence_text
from tasks import Batch

OUTSIDE_KINDS = ("previous", "self", "first", "duplicate", "induction")
OUTSIDE_THRESHOLDS = {"previous": DEFAULT_THRESHOLDS["previous"], "self": DEFAULT_THRESHOLDS["self"],
                      "first": DEFAULT_THRESHOLDS["broadcast"], "duplicate": DEFAULT_THRESHOLDS["association"],
                      "induction": 0.36}
# induction: measured by `interp.toy_induction.calibrate_induction()`, the midpoint between the
# highest score of a randomly initialised copy of hand_set_induction_model's architecture (0.002,
# 3 seeds) and its hand-set induction head (0.72); analyses/lab/workbench-circuits.md, "The classifier against patching"

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
        negative = [name for name in ("clean", "corrupted", "answers", "wrong_answers") if (getattr(self, name) < 0).any()]
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
                                ("answers", self.answers, cfg.d_vocab_out), ("wrong_answers", self.wrong_answers, cfg.d_vocab_out)):
            bad = (ids >= size).nonzero()
            if len(bad):
                where = bad[0].tolist()
                place = f"the {name} prompt of pair {where[0]}, position {where[1]}" if len(where) == 2 else \
                    f"the {name[:-1]} of pair {where[0]}"
                raise ValueError(f"PromptPairs.{name}{where} is token {int(ids[tuple(where)])}, outside the model's "
                                 f"vocabulary 0..{size - 1} ({'d_vocab' if size == cfg.d_vocab else 'd_vocab_out'}): "
                                 f"{place}")
        if self.clean.shape[1] > cfg.n_ctx:
            raise ValueError(f"the prompts have {self.clean.shape[1]} tokens but the model's context is n_ctx={cfg.n_ctx}")

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
            raise ValueError(f"{where}: {answer!r} is {len(ids)} tokens {self.model.to_str_tokens(answer, prepend_bos=False)}; "
                             "an answer must be one token (mind the leading space: ' Mary', not 'Mary')")
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
    per_pair.__doc__ = f"{fn.__doc__ or ''}\n(wrapped by interp.outside.scalar_metric: one number repeated per pair)"
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
                         "per pair. Wrap a TransformerLens-style metric: metric=interp.outside.scalar_metric(fn)")
    raise ValueError(f"the metric returned shape {shape}; it must return one value per pair, shape ({n},)")


# ---------------------------------------------------------------------------------------------
# Head scores without a task


def outside_target_masks(
    tokens: Int[Tensor, "batch pos"], causal: bool
) -> dict[str, tuple[Bool[Tensor, "batch pos pos"], Bool[Tensor, "batch pos"], Int[Tensor, "batch pos"]]]:
    """Per kind of OUTSIDE_KINDS: (targets [batch query key], the queries that count, how many
    keys each query can attend to). A query counts when some allowed key is a target and some is
    not. Induction needs a causal model (left out otherwise)."""
    n, n_pos = tokens.shape
    allowed = torch.ones(n_pos, n_pos, dtype=torch.bool, device=tokens.device)
    if causal:
        allowed = allowed.tril()
    allowed = allowed.unsqueeze(0).expand(n, -1, -1)
    eye = torch.eye(n_pos, dtype=torch.bool, device=tokens.device).unsqueeze(0)
    same = tokens.unsqueeze(2) == tokens.unsqueeze(1)  # [batch query key]
    previous = torch.diag_embed(torch.ones(n_pos - 1, dtype=torch.bool, device=tokens.device), offset=-1).unsqueeze(0)
    first = torch.zeros(1, n_pos, n_pos, dtype=torch.bool, device=tokens.device)
    first[:, 1:, 0] = True
    targets = {"previous": previous & allowed, "self": eye & allowed, "first": first & allowed,
               "duplicate": same & ~eye & allowed}
    if causal:  # key k follows an earlier occurrence of the query's token: tokens[k - 1] == tokens[q], k < q
        after = torch.zeros_like(same)
        after[:, :, 1:] = same[:, :, :-1]
        targets["induction"] = after & ~eye & allowed
    n_keys = allowed.sum(-1)
    return {kind: (t.expand(n, -1, -1), t.any(-1) & (t.sum(-1) < n_keys), n_keys) for kind, t in targets.items()}


def outside_head_scores(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"], tokens: Int[Tensor, "batch pos"], causal: bool,
    thresholds: dict[str, float] | None = None,
) -> HeadScores:
    """Scores of OUTSIDE_KINDS for every head (NaN where no query of `tokens` can show the kind),
    and labels: the best-scoring kind that reaches its threshold, else "mixed"."""
    thresholds = {**OUTSIDE_THRESHOLDS, **(thresholds or {})}
    masks = outside_target_masks(tokens, causal)
    n_layers, _, n_heads = patterns.shape[:3]
    scores = torch.full((len(OUTSIDE_KINDS), n_layers, n_heads), float("nan"))
    for i, kind in enumerate(OUTSIDE_KINDS):
        if kind in masks and masks[kind][1].any():
            targets, queries, n_keys = masks[kind]
            scores[i] = relative_mass(patterns.float(), targets, queries, n_keys).cpu()
    labels = []
    for layer in range(n_layers):
        row = []
        for head in range(n_heads):
            found = [(scores[i, layer, head].item(), kind) for i, kind in enumerate(OUTSIDE_KINDS)
                     if math.isfinite(scores[i, layer, head].item())
                     and scores[i, layer, head].item() >= thresholds[kind]]
            row.append(max(found)[1] if found else "mixed")
        labels.append(row)
    return HeadScores(scores, labels, thresholds, OUTSIDE_KINDS)


def _scores_dict(heads: HeadScores) -> dict[str, Any]:
    """`HeadScores.to_dict` with NaN (a kind these prompts cannot show) as None, valid JSON."""
    clean = lambda t: [[None if v != v else round(v, 4) for v in row] for row in t.tolist()]  # noqa: E731
    return {"kinds": list(heads.kinds), "scores": {k: clean(heads.score(k)) for k in heads.kinds},
            "labels": heads.labels, "thresholds": heads.thresholds}


# ---------------------------------------------------------------------------------------------
# The analysis


@dataclass
class OutsideAnalysis:
    """`analyze_model`'s findings: head scores, and patching in the form `workbench analyze`
    writes (`interp.analysis.PatchingAnalysis`: exact residual and head sweeps, attribution
    estimates judged against exact, path patching or why it was refused, the circuit)."""

    model: dict[str, Any]  # the configuration options that matter here (`model_summary`)
    pairs: PromptPairs
    prompts: list[dict[str, Any]]  # per pair: clean and corrupted token names, answer and wrong answer names
    metric: str
    heads: HeadScores
    patching: PatchingAnalysis
    patterns: Float[Tensor, "layer head_index query_pos key_pos"]  # on the first clean prompt, for the report
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Plain values for `json.dumps` (NaN as None)."""
        pairs = [{**named, "clean_ids": clean, "corrupted_ids": corrupted, "answer_id": int(a), "wrong_answer_id": int(w)}
                 for named, clean, corrupted, a, w in zip(self.prompts, self.pairs.clean.tolist(),
                                                          self.pairs.corrupted.tolist(), self.pairs.answers,
                                                          self.pairs.wrong_answers)]
        return {"model": self.model, "pairs": pairs, "metric": self.metric, "heads": _scores_dict(self.heads),
                "patching": _nan_to_none(self.patching.to_dict()), "seconds": self.seconds}

    def write_json(self, path: str | Path) -> Path:
        """`to_dict()` as a JSON file (the analysis.json of this analysis)."""
        from models.runs import atomic_write_bytes, non_finite_note
        from models.safe_files import finite_json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data, places = finite_json(self.to_dict())  # strict JSON: NaN and infinity as null, and said so
        if places:
            data["non_finite"] = non_finite_note(places, [])
        atomic_write_bytes(path, json.dumps(data, indent=1, allow_nan=False).encode())
        return path

    def report(self, title: str = "Your model, your prompts") -> Report:
        """The HTML report: prompts, every head's attention (circuitsvis, offline), head scores,
        exact and attribution patching, path patching, the circuit graph."""
        report = Report(title)
        written = self.to_dict()
        join = "" if self.model.get("tokenizer") else " "
        rows = [[i, join.join(p["clean"]), join.join(p["corrupted"]), p["answer"], p["wrong_answer"]]
                for i, p in enumerate(self.prompts[:20])]
        report.add("Model and prompts", f"<p>{html.escape(_model_line(self.model))}. Metric: {html.escape(self.metric)}. "
                   f"{len(self.pairs)} pairs (the first {len(rows)} below); analysed in {self.seconds:.1f} s.</p>"
                   + table_html(rows, ["pair", "clean", "corrupted", "answer", "wrong answer"]))
        n_layers, n_heads = self.patterns.shape[:2]
        names = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
        report.add("Attention", "<p>Every head on the first clean prompt (hover a head to zoom in).</p>"
                   + report.attention_widget(self.prompts[0]["clean"], self.patterns.flatten(0, 1), names,
                                             self.model["causal"]))
        heads = written["heads"]
        unseen = [kind for kind, rows_ in heads["scores"].items() if all(v is None for row in rows_ for v in row)]
        note = f" Not measurable on these prompts (no query can show it): {', '.join(unseen)}." if unseen else ""
        report.add("Head scores", f"<p>Attention mass on each kind's targets relative to uniform attention (0 = "
                   f"uniform, 1 = all of it), on the clean and corrupted prompts.{html.escape(note)} Thresholds: "
                   f"{html.escape(evidence_text(heads['thresholds'], 2))} (induction's calibrated on a hand-set induction head).</p>"
                   + figure_html(self.head_score_figure(), "Score per kind; * marks each head's label.")
                   + table_html([[f"L{i}", *row] for i, row in enumerate(heads["labels"])],
                                ["layer", *[f"H{h}" for h in range(n_heads)]]))
        patching = written["patching"]
        report.add("Activation patching", _patching_html(patching))
        report.add("Path patching", _paths_html(patching["paths"], heads["labels"]))
        report.add("Circuit", _circuit_html(patching["paths"]["circuit"], heads["labels"]))
        return report

    def head_score_figure(self) -> Any:
        """One heatmap per kind (layer x head), * on each head's label; blank where a kind is NaN."""
        return plots.head_score_heatmaps({k: self.heads.score(k).tolist() for k in self.heads.kinds}, self.heads.labels)

    def write_report(self, path: str | Path, title: str = "Your model, your prompts") -> Path:
        """Write the report (one self-contained HTML file: no CDN, no server) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return self.report(title).write(path)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


def _model_line(cfg: dict[str, Any]) -> str:
    parts = [f"{cfg['n_layers']} layers x {cfg['n_heads']} heads, d_model {cfg['d_model']}",
             "causal" if cfg["causal"] else "bidirectional", "attention only" if cfg["attn_only"] else "with MLPs",
             f"normalization {cfg['normalization_type']}"]
    return ", ".join(parts)


def model_summary(model: HookedTransformer) -> dict[str, Any]:
    cfg = model.cfg
    return {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "d_model": cfg.d_model, "d_head": cfg.d_head,
            "d_vocab": cfg.d_vocab, "d_vocab_out": cfg.d_vocab_out, "n_ctx": cfg.n_ctx,
            "causal": cfg.attention_dir == "causal", "attn_only": bool(cfg.attn_only),
            "normalization_type": cfg.normalization_type, "positional_embedding_type": cfg.positional_embedding_type,
            "model_name": getattr(cfg, "model_name", None), "tokenizer": getattr(model, "tokenizer", None) is not None}


def analyze_model(
    model: HookedTransformer, pairs: PromptPairs, metric: Metric | None = None, *, ig_steps: int = 4,
    circuit_target: float = 0.9, score_tokens: Int[Tensor, "batch pos"] | None = None,
) -> OutsideAnalysis:
    """Everything `workbench analyze` does for a project run that needs no task, on any
    HookedTransformer and your prompt pairs:

    - exact patching of the residual stream (layer x position) and of each head's output,
      clean -> corrupted (`patch_residual`, `patch_head_out`);
    - attribution estimates per head (plain, GradDrop, `ig_steps`-step integrated gradients)
      judged against exact (`interp.atp.judge_estimates`);
    - path patching (`interp.paths.path_patch`) unless the model's options are refused
      (`interp.paths.check_path_patchable`; the reason is kept);
    - the circuit graph (`interp.circuit.find_circuit`, target `circuit_target`);
    - head scores (`outside_head_scores`) on the clean and corrupted prompts, or `score_tokens`.

    `metric`: per pair, logits [batch pos d_vocab_out] -> [batch]; None: logit(answer) -
    logit(wrong_answer) at the last position. A TransformerLens-style metric returning one number
    goes through `scalar_metric(fn)`. The model runs where its parameters are."""
    started = time.perf_counter()
    if not isinstance(model, HookedTransformer):
        raise ValueError(f"analyze_model needs a transformer_lens HookedTransformer, not {type(model).__name__}")
    if not isinstance(pairs, PromptPairs):
        raise ValueError(f"analyze_model needs PromptPairs (PromptPairs.from_lists or .from_json), not {_kind(pairs)}")
    pairs.check(model)
    if metric is None:
        metric, metric_name = pairs.logit_diff(), "logit(answer) - logit(wrong answer) at the last position"
    else:
        check_metric(model, pairs, metric)
        metric_name = getattr(metric, "__name__", type(metric).__name__)
    device = next(model.parameters()).device
    clean, corrupted = pairs.clean.to(device), pairs.corrupted.to(device)
    args = (model, clean, corrupted, metric)
    heads = patch_head_out(*args)
    residual = patch_residual(*args)
    estimates = judge_estimates(*args, "head", heads, ig_steps=ig_steps)
    try:
        check_path_patchable(model)
        refused = None
    except ValueError as err:
        refused = str(err)
    paths = None if refused else path_patch(*args)
    circuit = find_circuit(*args, heads.values, paths, target=circuit_target)
    causal = model.cfg.attention_dir == "causal"
    scored = torch.cat([clean, corrupted]) if score_tokens is None else score_tokens.to(device)
    head_scores = outside_head_scores(attention_patterns(model, scored).cpu(), scored.cpu(), causal)
    names = model if getattr(model, "tokenizer", None) is not None else None
    prompts = [{"clean": pairs.token_strings(c, names), "corrupted": pairs.token_strings(k, names),
                "answer": pairs.token_strings([a], names)[0], "wrong_answer": pairs.token_strings([w], names)[0]}
               for c, k, a, w in zip(pairs.clean, pairs.corrupted, pairs.answers.tolist(), pairs.wrong_answers.tolist())]
    description = f"{len(pairs)} pairs of your prompts; metric: {metric_name}"
    patching = PatchingAnalysis(description, len(pairs), prompts[0]["clean"], residual, heads, estimates, paths,
                                refused, circuit)
    return OutsideAnalysis(model_summary(model), pairs, prompts, metric_name, head_scores, patching,
                           attention_patterns(model, clean[:1])[:, 0].cpu(), round(time.perf_counter() - started, 2))
