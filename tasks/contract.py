"""The Task contract as data: every member of a task that the workbench reads, whether it is
required, and what reads it (`CONTRACT`), and the check that holds a registered task to it
(`check_task`). docs/tasks.md, section "The Task contract", shows the same table, and a test keeps
the two equal.

The check builds the task from its config's defaults and calls every member once on two samples
of each split, so a task that lacks a member, or whose member raises `NotImplementedError`, is
refused with a message naming the task, the member and the doc section before any training step,
not at `workbench analyze` or `report`. It costs about a millisecond a task and runs the first time
the task is looked up (`tasks.registry.registered_task`), not at import."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tasks.base import Batch, ConfigError, CounterfactualPairs, seeded_generator

DOC_SECTION = "docs/tasks.md, 'The Task contract'"
N_CHECK = 2  # samples per split the check draws


class TaskContractError(ConfigError):
    """A registered task lacks a member of the Task contract, or a member misbehaves; the message
    names the task, the member and the doc section. A configuration error: the command line's
    status 2."""


@dataclass(frozen=True)
class Member:
    name: str
    kind: str  # "attribute", "property" or "method(arguments)"
    required: bool
    read_by: str  # what in the workbench reads it


CONTRACT: tuple[Member, ...] = (
    Member("cfg", "attribute", True, "the task's own config, as the run's config.json holds it"),
    Member("causal", "attribute", True, "models/factory.py (causal or bidirectional attention), interp/attention.py, "
           "models/planted.py, the report's attention widgets"),
    Member("headline_metric", "attribute", True, "models/train.py (the stop rule, progress bar, snapshots), the sweep "
           "page; it must be a key of `accuracy` on the test split"),
    Member("d_vocab", "property", True, "models/factory.py (the embedding), models/memory.py"),
    Member("d_vocab_out", "property", True, "models/factory.py (the unembedding: classes), interp/analysis.py"),
    Member("n_ctx", "property", True, "models/factory.py (positions), models/memory.py"),
    Member("label_names", "property", True, "interp/analysis.py (the patched slot), models/mlp_control.py, "
           "interp/head_evidence.py"),
    Member("bos_token", "property", True, "models/planted.py (planted broadcast heads); None where there is none"),
    Member("sample", "method(n, gen, split)", True, "models/train.py (training batches; evaluation on "
           "`split=\"test\"` only), every analysis"),
    Member("build", "method(latents)", True, "the task's own `corrupt`: rebuilds samples from changed latents"),
    Member("corrupt", "method(batch, gen)", True, "the task's own `counterfactual_pairs`, the plateau analysis"),
    Member("counterfactual_pairs", "method(n, gen, aligned)", True, "interp/analysis.py (patching, circuit, "
           "timeline)"),
    Member("supervised_slots", "method()", True, "interp/analysis.py (which slot patching reads)"),
    Member("accuracy", "method(batch, predictions)", True, "models/train.py (every evaluation, written to "
           "metrics.jsonl)"),
    Member("segment_ids", "method(tokens)", True, "interp/attention.py (manipulation and gathering scores), "
           "models/planted.py"),
    Member("symbol_mask", "method(tokens)", True, "interp/attention.py (association scores)"),
    Member("broadcast_mask", "method(tokens)", True, "interp/attention.py (broadcast scores)"),
    Member("padding_mask", "method(tokens)", True, "interp/attention.py (which positions are real)"),
    Member("decode", "method(tokens)", True, "the notebooks; the text of a sample"),
    Member("token_strings", "method(tokens)", True, "interp/run_report.py and interp/analysis.py (attention "
           "widgets, the patching section)"),
    Member("segment_depth", "method(tokens)", False, "interp/attention.py (depth heads); without it every depth "
           "score is 0"),
    Member("role_names", "attribute", False, "interp/head_evidence.py (names what a gathering head reads); "
           "without it \"offset k\""),
)
REQUIRED = tuple(m.name for m in CONTRACT if m.required)


def contract_table() -> str:
    """The contract as the markdown table docs/tasks.md shows."""
    rows = ["| member | kind | required | read by |", "|---|---|---|---|"]
    rows += [f"| `{m.name}` | {m.kind} | {'yes' if m.required else 'no'} | {m.read_by} |" for m in CONTRACT]
    return "\n".join(rows)


def check_task(name: str, config_cls: type, task_cls: type) -> None:
    """Build the task `name` from its config's defaults and call every member of the contract once;
    TaskContractError naming the task, the member and the doc section at the first that is missing,
    unimplemented or wrong."""
    def fail(what: str) -> TaskContractError:
        return TaskContractError(f"task {name!r}: {what} (see {DOC_SECTION})")

    try:
        cfg = config_cls()
    except Exception as err:  # noqa: BLE001 (a plugin's code: every failure is reported as the task's)
        raise fail(f"its config {config_cls.__name__}() with its defaults is refused: "
                   f"{type(err).__name__}: {err}") from err
    try:
        task = task_cls(cfg)
    except Exception as err:  # noqa: BLE001
        raise fail(f"{task_cls.__name__}(config) with the config's defaults raised {type(err).__name__}: {err}") \
            from err
    for member in REQUIRED:
        if not _has(task, member, fail):
            raise fail(f"no `{member}`")

    def call(member: str, shown: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(task, member)(*args, **kwargs)
        except NotImplementedError as err:
            raise fail(f"`{member}` is not implemented ({shown} raised NotImplementedError)") from err
        except Exception as err:  # noqa: BLE001
            raise fail(f"`{member}`: {shown} raised {type(err).__name__}: {err}") from err

    def expect(ok: bool, member: str, what: str) -> None:
        if not ok:
            raise fail(f"`{member}` {what}")

    sizes = {m: getattr(task, m) for m in ("d_vocab", "d_vocab_out", "n_ctx")}
    for member, value in sizes.items():
        expect(isinstance(value, int) and value > 0, member, f"is {value!r}; it must be a positive int")
    expect(isinstance(task.causal, bool), "causal", f"is {task.causal!r}; it must be True or False")
    expect(task.bos_token is None or isinstance(task.bos_token, int), "bos_token",
           f"is {task.bos_token!r}; it must be a token id or None")
    names = task.label_names
    expect(isinstance(names, list) and bool(names) and all(isinstance(n, str) for n in names), "label_names",
           f"is {names!r}; it must be a non-empty list of strings")
    slots = call("supervised_slots", "supervised_slots()")
    expect(isinstance(slots, list) and len(slots) == len(names), "supervised_slots",
           f"returned {slots!r}; it must be a list of {len(names)} bools, one per label")
    batches = {split: call("sample", f"sample({N_CHECK}, gen, split={split!r})", N_CHECK, seeded_generator(0),
                           split=split) for split in ("train", "test")}
    for split, batch in batches.items():
        _check_batch(batch, task, f"sample({N_CHECK}, gen, split={split!r})", expect)
    test = batches["test"]
    rebuilt = call("build", "build(batch.latents)", test.latents)
    expect(isinstance(rebuilt, Batch) and torch.equal(rebuilt.tokens, test.tokens), "build",
           "did not rebuild the test batch from its latents")
    twin = call("corrupt", "corrupt(batch, gen)", test, seeded_generator(1))
    expect(isinstance(twin, tuple) and len(twin) == 2 and isinstance(twin[0], Batch), "corrupt",
           "must return (the twin Batch, which labels changed)")
    pairs = call("counterfactual_pairs", f"counterfactual_pairs({N_CHECK}, gen, aligned=True)", N_CHECK,
                 seeded_generator(2), aligned=True)
    expect(isinstance(pairs, CounterfactualPairs), "counterfactual_pairs", "must return a CounterfactualPairs")
    metrics = call("accuracy", "accuracy(test batch, its labels)", test, test.labels)
    expect(isinstance(metrics, dict) and task.headline_metric in metrics, "headline_metric",
           f"{task.headline_metric!r} is not a key of accuracy() on the test split "
           f"({sorted(metrics) if isinstance(metrics, dict) else metrics!r}); the trainer reads it there")
    tokens = test.tokens
    masks = ["segment_ids", "symbol_mask", "broadcast_mask", "padding_mask"]
    masks += ["segment_depth"] if _has(task, "segment_depth", fail) else []
    for member in masks:
        value = call(member, f"{member}(tokens)", tokens)
        expect(isinstance(value, Tensor) and value.shape == tokens.shape, member,
               f"must return a tensor of the tokens' shape {tuple(tokens.shape)}")
        if member.endswith("_mask"):
            expect(value.dtype == torch.bool, member, f"must return a bool tensor, not {value.dtype}")
    strings = call("token_strings", "token_strings(tokens[0])", tokens[0])
    expect(isinstance(strings, list) and len(strings) == tokens.shape[1], "token_strings",
           f"must return one string per position ({tokens.shape[1]})")
    text = call("decode", "decode(tokens)", tokens)
    expect(isinstance(text, list) and len(text) == len(tokens), "decode", "of a batch must return one str a sample")
    expect(isinstance(call("decode", "decode(tokens[0])", tokens[0]), str), "decode", "of one sample must return a str")


def _has(task: object, member: str, fail: Callable[[str], TaskContractError]) -> bool:
    """Whether `task` has `member`; a property that raises NotImplementedError is not implemented."""
    try:
        return hasattr(task, member)
    except NotImplementedError as err:
        raise fail(f"`{member}` is not implemented (reading it raised NotImplementedError)") from err
    except Exception as err:  # noqa: BLE001
        raise fail(f"`{member}`: reading it raised {type(err).__name__}: {err}") from err


def _check_batch(batch: object, task: Any, shown: str, expect: Callable[[bool, str, str], None]) -> None:
    """A sampled batch has the shapes and ranges the model and the trainer rely on."""
    expect(isinstance(batch, Batch), "sample", f"{shown} returned {type(batch).__name__}, not a tasks.Batch")
    assert isinstance(batch, Batch)
    n_labels = len(task.label_names)
    tokens, labels = batch.tokens, batch.labels
    expect(tokens.dim() == 2 and len(tokens) == N_CHECK, "sample", f"{shown}: tokens must be [{N_CHECK}, pos]")
    expect(tokens.shape[1] <= task.n_ctx, "sample", f"{shown}: {tokens.shape[1]} positions, more than n_ctx="
           f"{task.n_ctx}")
    expect(bool((tokens >= 0).all() and (tokens < task.d_vocab).all()), "sample",
           f"{shown}: a token outside 0..d_vocab-1={task.d_vocab - 1}")
    for field in ("labels", "label_pos", "label_mask", "loss_mask"):
        value = getattr(batch, field)
        expect(tuple(value.shape) == (N_CHECK, n_labels), "sample",
               f"{shown}: {field} has shape {tuple(value.shape)}, not [{N_CHECK}, len(label_names)={n_labels}]")
    real = batch.label_mask
    expect(bool((labels[real] >= 0).all() and (labels[real] < task.d_vocab_out).all()), "sample",
           f"{shown}: a label outside 0..d_vocab_out-1={task.d_vocab_out - 1}")
    expect(bool((batch.label_pos[real] >= 0).all() and (batch.label_pos[real] < tokens.shape[1]).all()), "sample",
           f"{shown}: a label position outside the sequence")
