"""The Task contract is checked: every registered task keeps it; a task that lacks a member, or
whose member raises NotImplementedError, is refused when it is first looked up, with a message
naming the task, the member and the doc section; docs/tasks.md lists the contract as the code
holds it (tasks.contract.CONTRACT, the tasks.Task protocol, TaskAnalysis's fields)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import tasks
from tasks import ConfigError, Task, TaskContractError, make_task, registered_task, task_names
from tasks.base import Batch, CounterfactualPairs, UnpaddedTask
from tasks.contract import CONTRACT, DOC_SECTION, REQUIRED, contract_table

ROOT = Path(__file__).resolve().parents[2]
TASKS_DOC = ROOT / "docs" / "tasks.md"


@dataclass
class ParityConfig:
    """A test task: the parity of `n_bits` bits, read at the last position."""

    name: str = "parity"
    n_bits: int = 3


class _Parity(UnpaddedTask):
    """Every member of the contract but `symbol_mask` and `token_strings` (the test classes below
    add one, both or neither)."""

    causal = True
    headline_metric = "acc"
    d_vocab, d_vocab_out, label_names = 2, 2, ["parity"]

    def __init__(self, cfg: ParityConfig):
        self.cfg, self.n_ctx = cfg, cfg.n_bits

    def sample(self, n: int, gen: torch.Generator, split: str = "train") -> Batch:
        return self.build({"bits": torch.randint(2, (n, self.cfg.n_bits), generator=gen)})

    def build(self, latents: dict[str, torch.Tensor]) -> Batch:
        bits = latents["bits"]
        n, ones = len(bits), torch.ones(len(bits), 1, dtype=torch.bool)
        return Batch(bits, bits.sum(1, keepdim=True) % 2, torch.full((n, 1), self.cfg.n_bits - 1), ones, ones.clone(),
                     dict(latents))

    def corrupt(self, batch: Batch, gen: torch.Generator) -> tuple[Batch, torch.Tensor]:
        bits = batch.latents["bits"].clone()
        bits[:, -1] = 1 - bits[:, -1]
        twin = self.build({"bits": bits})
        return twin, twin.labels != batch.labels

    def counterfactual_pairs(self, n: int, gen: torch.Generator, aligned: bool = True) -> CounterfactualPairs:
        clean = self.sample(n, gen, "test")
        return CounterfactualPairs(clean, self.corrupt(clean, gen)[0], "last bit flipped")

    def supervised_slots(self) -> list[bool]:
        return [True]

    def accuracy(self, batch: Batch, predictions: torch.Tensor) -> dict[str, object]:
        return {"acc": (predictions == batch.labels).float().mean().item()}

    def segment_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(tokens)


class _SymbolMask:
    def symbol_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(tokens, dtype=torch.bool)


class _TokenStrings:
    def token_strings(self, tokens: torch.Tensor) -> list[str]:
        return [str(t) for t in tokens.tolist()]


class ParityTask(_SymbolMask, _TokenStrings, _Parity):
    """The whole contract."""


class NoSymbolMask(_TokenStrings, _Parity):
    """No `symbol_mask` at all."""


class NoTokenStrings(_SymbolMask, _Parity):
    """`token_strings` inherited from UnpaddedTask, which raises NotImplementedError."""


class WrongHeadline(ParityTask):
    headline_metric = "accuracy"  # accuracy() records "acc"


@pytest.fixture
def registry(monkeypatch):
    """The task registry, restored after the test: register_task(name, ...) there is undone."""
    monkeypatch.setattr(tasks.registry, "_TASKS", dict(tasks.registry._TASKS))
    monkeypatch.setattr(tasks.registry, "_CHECKED", dict(tasks.registry._CHECKED))
    return tasks.registry


@pytest.mark.parametrize("name", task_names())
def test_every_registered_task_keeps_the_contract(name):
    entry = registered_task(name)  # runs the check
    task = make_task(entry.config())
    assert isinstance(task, Task)  # the protocol's members are all there
    for member in REQUIRED:
        assert hasattr(task, member), member


def test_a_complete_task_registers_and_builds(registry):
    registry.register_task("parity", ParityConfig, ParityTask)
    assert isinstance(make_task(ParityConfig()), ParityTask)
    assert "parity" in task_names()


@pytest.mark.parametrize("task_cls, message", [
    (NoSymbolMask, "task 'parity': no `symbol_mask`"),
    (NoTokenStrings, "task 'parity': `token_strings` is not implemented (token_strings(tokens[0]) raised "
                     "NotImplementedError)"),
    (WrongHeadline, "task 'parity': `headline_metric` 'accuracy' is not a key of accuracy() on the test split"),
])
def test_a_broken_task_is_refused_naming_the_task_the_member_and_the_doc(registry, task_cls, message):
    registry.register_task("parity", ParityConfig, task_cls)  # registering alone does not fail: others keep working
    for lookup in (lambda: registered_task("parity"), lambda: make_task(ParityConfig())):
        with pytest.raises(TaskContractError) as err:
            lookup()
        assert str(err.value).startswith(message), str(err.value)
        assert str(err.value).endswith(f"(see {DOC_SECTION})")
        assert isinstance(err.value, ConfigError)  # the command line's configuration error, status 2
    assert registered_task(task_names()[0])  # the other tasks still work


def test_the_contracts_required_members_are_the_task_protocols():
    protocol = {name for name in vars(Task) if not name.startswith("_")} | set(Task.__annotations__)
    assert set(REQUIRED) == protocol
    assert len({m.name for m in CONTRACT}) == len(CONTRACT)


def _section(doc: Path, heading: str) -> str:
    text = doc.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_docs_list_the_task_contract_as_the_code_holds_it():
    section = _section(TASKS_DOC, "The Task contract")
    assert contract_table() in section, f"docs/tasks.md's table must read:\n{contract_table()}"
    assert DOC_SECTION == "docs/tasks.md, 'The Task contract'"


def test_the_docs_list_the_analysis_contract_as_the_code_holds_it():
    from interp.task_analysis import ANALYSIS_DOC_SECTION, analysis_contract

    rows = re.findall(r"^\| `(\w+)` \| (yes|no) \|", _section(TASKS_DOC, "The analysis contract"), re.MULTILINE)
    assert {name: flag == "yes" for name, flag in rows} == analysis_contract()
    assert len(rows) == len(analysis_contract())
    assert ANALYSIS_DOC_SECTION == "docs/tasks.md, 'The analysis contract'"


def test_contributing_points_to_the_contract_instead_of_repeating_it():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert "docs/tasks.md#the-task-contract" in text
    assert "broadcast_mask" not in text and "token_strings" not in text  # the list lives in docs/tasks.md only


@pytest.mark.parametrize("change, message", [
    ({"curves_caption": " "}, "`curves_caption` is ' '; it must be a non-empty string"),
    ({"findings": None}, "`findings` is None; it must be a method"),
    ({"summary": "acc"}, "`summary` is 'acc'; it must be a method"),
    ({"verdict_shape": {"acc": "a number"}},
     "`verdict_shape` is {'acc': 'a number'}; it must be a shape (models.shapes.shape_problem)"),
])
def test_a_broken_analysis_is_refused_naming_the_task_the_member_and_the_doc(change, message):
    import copy

    from interp.task_analysis import ANALYSIS_DOC_SECTION, check_analysis
    from interp.tasks import ANALYSES

    broken = copy.copy(next(iter(ANALYSES.values())))
    for member, value in change.items():
        setattr(broken, member, value)
    with pytest.raises(TaskContractError) as err:
        check_analysis("parity", broken)
    assert str(err.value) == f"the analysis of task 'parity': {message} (see {ANALYSIS_DOC_SECTION})"


def test_an_analysis_without_a_required_method_cannot_be_made_and_one_of_another_kind_is_refused():
    from interp.task_analysis import TaskAnalysis, check_analysis

    class NoCurves(TaskAnalysis):
        curves_caption = "accuracy"

        def findings(self, run, seed): ...
        def headline(self, verdict): ...
        def verdict_html(self, verdict): ...

    with pytest.raises(TypeError, match="curves"):
        NoCurves()
    with pytest.raises(TaskContractError, match="TaskAnalysis subclass, not dict"):
        check_analysis("parity", {"findings": print})


@pytest.mark.parametrize("task_cls, member", [(NoSymbolMask, "no `symbol_mask`"),
                                              (NoTokenStrings, "`token_strings` is not implemented")])
def test_workbench_train_refuses_a_broken_task_at_once_with_status_2(registry, task_cls, member, tmp_path, capsys):
    """`workbench train` stops before anything is written or trained, with the documented status of a
    configuration error and the message naming the task, the member and the doc section."""
    import json

    from analyses.cli import main

    registry.register_task("parity", ParityConfig, task_cls)
    config = tmp_path / "parity.json"
    config.write_text(json.dumps({"task": {"name": "parity"}, "train": {"steps": 5}}))
    out = tmp_path / "run"
    status = main(["train", "--config", str(config), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"task 'parity': {member}" in err and f"(see {DOC_SECTION})" in err
    assert "unexpected error" not in err
    assert not out.exists()  # refused before the run folder was made: nothing trained


def _finding(found):
    """The composite task's analysis, its findings replaced by `found`."""
    import copy

    from interp.tasks import task_analysis

    steps = copy.copy(task_analysis("composite"))
    steps.findings = lambda run, seed: found
    return steps


class _Written:
    def to_dict(self) -> dict:
        return {"verdict": "learned"}


@pytest.mark.parametrize("found, what", [((None, {"verdict": "learned"}), "a verdict without to_dict() (a dict"),
                                         ((["map"], None), "a verdict without to_dict() (a NoneType"),
                                         (([0.5], _Written()), "a probe map without to_dict() (a list")])
def test_findings_that_cannot_be_written_are_the_tasks_error_naming_it(found, what):
    """An analysis whose verdict (or probe map) has no to_dict() fails `workbench analyze` as a
    configuration error naming the task and the doc section, not as the workbench's unexpected error."""
    from interp.analysis import task_findings
    from models.runs import load_run

    run = load_run(ROOT / "zoo" / "composite-inferential")
    steps = _finding(found)
    with pytest.raises(TaskContractError, match="docs/tasks.md, 'The analysis contract'") as err:
        task_findings(steps, run, 0)
    assert str(err.value).startswith(f"task 'composite': its analysis's findings gave {what}")


def test_findings_that_write_themselves_pass_unchanged():
    from interp.analysis import task_findings
    from models.runs import load_run

    run = load_run(ROOT / "zoo" / "composite-inferential")
    verdict = _Written()
    assert task_findings(_finding((None, verdict)), run, 0) == (None, verdict)
