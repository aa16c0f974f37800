"""Builders shared by the tests: tiny configurations that train in seconds."""

from __future__ import annotations

import contextlib
import signal

from models.config import ModelConfig, RunConfig, TrainConfig
from tasks import CompositeConfig, LegoConfig

TINY_MODEL = ModelConfig(n_layers=2, d_model=32, n_heads=2, d_mlp=64)


def tiny_lego_run(steps: int = 20, **train) -> RunConfig:
    return RunConfig(
        task=LegoConfig(n_vars=4, n_supervised=2),
        model=TINY_MODEL,
        train=TrainConfig(**{"steps": steps, "batch_size": 16, "warmup_steps": 2, "eval_every": 5,
                             "eval_size": 64, "checkpoint_every": 10, **train}),
    )


def tiny_composite_run(steps: int = 20, **train) -> RunConfig:
    return RunConfig(
        task=CompositeConfig(),
        model=ModelConfig(n_layers=2, d_model=32, n_heads=1, d_mlp=64, init_gamma=0.5),
        train=TrainConfig(**{"steps": steps, "batch_size": 16, "warmup_steps": 2, "eval_every": 5,
                             "eval_size": 64, "checkpoint_every": 10, **train}),
    )


def analysed_zoo_copy(built_once, name: str):
    """A copy of the zoo's model `name` analysed by `workbench analyze --samples 128`
    (analysis.json and report.html beside its weights), built once per test session (the
    `built_once` fixture): read it only, copy it to change it."""
    import shutil

    from analyses.cli import main
    from analyses.zoo import zoo_path

    def build(folder):
        out = folder / name
        shutil.copytree(zoo_path(name), out)
        assert main(["analyze", str(out), "--samples", "128"]) == 0
        return out

    return built_once(f"analysed-{name}", build)


def lego_timeline_run(built_once):
    """A tiny LEGO run (`tiny_lego_run(steps=20, snapshots=4)`) with its timeline and report
    (`workbench analyze --timeline`), built once per test session (`built_once`): read it only."""
    from analyses.cli import main
    from models.train import Trainer

    def build(folder):
        Trainer(tiny_lego_run(steps=20, snapshots=4), folder / "run", progress=False).fit()
        assert main(["analyze", str(folder / "run"), "--timeline", "--no-progress"]) == 0
        return folder / "run"

    return built_once("lego-timeline", build)


def folder_bytes(folder) -> dict[str, bytes]:
    """Every file under `folder` (snapshots/ included), by its path inside it, with its bytes:
    what a test compares to say that a command changed nothing."""
    from pathlib import Path

    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


class Killed(Exception):
    """Stands for a kill in the middle of training."""


def kill_at(cfg: RunConfig, run_dir, at_step: int = 15) -> None:
    """Train `cfg` into `run_dir` and die before step `at_step + 1` (a run cut short: its last
    checkpoint, and metrics up to `at_step`)."""
    import pytest

    from models.train import Trainer

    killed = Trainer(cfg, run_dir, progress=False)
    original = killed._next_batch

    def dying_step():
        if killed.step == at_step:
            raise Killed
        return original()

    killed._next_batch = dying_step
    with pytest.raises(Killed):
        killed.fit()


def kill_then_resume(cfg: RunConfig, run_dir, monkeypatch, at_step: int = 15) -> None:
    """Train `cfg` into `run_dir`, die before step `at_step + 1`, then resume to the end. Checks
    that the resumed run starts at the last checkpoint, not at step 0 (which, with the same
    seed, would end with the same weights too)."""
    from models.train import Trainer

    kill_at(cfg, run_dir, at_step)
    resumed = Trainer(cfg, run_dir, resume=True, progress=False)
    steps_run = []
    resumed_step = resumed._next_batch
    monkeypatch.setattr(resumed, "_next_batch", lambda: steps_run.append(resumed.step) or resumed_step())
    resumed.fit()
    checkpoint = at_step // cfg.train.checkpoint_every * cfg.train.checkpoint_every
    assert steps_run == list(range(checkpoint, cfg.train.steps)), "resume did not start at the last checkpoint"


def lego_reference_values(text: str) -> dict[str, str]:
    """Solve a decoded LEGO sentence the slow, obvious way: substitute until every variable is known."""
    clauses = [c.split() for c in text.replace("[BOS]", "").replace("[EOS]", "").split(";") if c.strip()]
    known: dict[str, str] = {}
    while len(known) < len(clauses):
        for lhs, _, g, rhs in clauses:
            value = rhs if rhs[-1].isdigit() else known.get(rhs)
            if lhs not in known and value is not None:
                known[lhs] = apply_element(g, value)
    return known


def apply_element(g: str, value: str) -> str:
    if g in "+-":
        return value if g == "+" else str(-int(value))
    cycles = {"id": {}, "(12)": {1: 2, 2: 1}, "(13)": {1: 3, 3: 1}, "(23)": {2: 3, 3: 2},
              "(123)": {1: 2, 2: 3, 3: 1}, "(132)": {1: 3, 3: 2, 2: 1}}[g]
    return str(cycles.get(int(value), int(value)))


def held_out_rates_by_hand(run, n: int, seed: int = 0) -> tuple[float, float]:
    """A composite run's held-out (4,3) answer rates (inferential, symmetric), computed without
    the task's latents or the verdict code: key and anchors read back from the tokens, targets
    from the paper's definition (inferential x - 8 - 2 = x - 10 with the default shifts;
    symmetric: the trained (3,4) answer, x - 6), on the batch `composite_verdict(n, seed)` draws
    (trained pairs first, then held-out ones)."""
    import torch

    from interp.tasks.composite import _trained_pairs, held_out_pairs
    from tasks import seeded_generator

    task = run.task
    assert task.cfg.shifts == [5, 1, -2, -8] and task.cfg.held_out == ["4,3"] and task.cfg.overrides == {"3,4": -6}
    gen = seeded_generator(seed)
    task.sample(n, gen, split="test", pair_ids=_trained_pairs(task, n, gen))
    tokens = task.sample(n, gen, split="test", pair_ids=held_out_pairs(task, n, gen)).tokens
    first_anchor = ((tokens >= 1) & (tokens <= 4)).int().argmax(1)
    rows = torch.arange(len(tokens))
    key, a1, a2 = tokens[rows, first_anchor - 1], tokens[rows, first_anchor], tokens[rows, first_anchor + 1]
    assert (a1 == 4).all() and (a2 == 3).all()
    with torch.no_grad():
        answer = run.model(tokens)[:, -1].argmax(-1)
    return (answer == key - 10).float().mean().item(), (answer == key - 6).float().mean().item()


class Hung(BaseException):
    """Raised by `no_hang` when its block outlives the time given: a BaseException, so that no
    `except Exception` of the product (the command line's top level) swallows it."""


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """Fail, rather than hang the suite, when the block blocks for longer than `seconds` (a FIFO
    opened for reading waits for a writer for ever). SIGALRM interrupts a blocking system call
    in the main thread; POSIX only."""
    def alarm(signum, frame):
        raise Hung(f"blocked for more than {seconds} s (a read of a special file that never returns?)")

    before = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
