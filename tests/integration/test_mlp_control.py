"""The MLP control of the templates finding 1 (models/mlp_control.py, study templates-mlp-control):
it sees the transformer's batches and embeddings, keeps the embeddings frozen, and can learn, so a
"does not generalise" result is not a broken trainer."""

import dataclasses
import json

import torch

from analyses.runners.study import run_study
from analyses.studies.templates import cell_config
from models.factory import build_model
from models.mlp_control import build_mlp_control, train_mlp_control
from models.train import Trainer
from tasks import make_task


def _small(n: int, steps: int, seed: int = 0, batch: int = 64):
    cfg = cell_config("tiny", "same_different", n, False, seed)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps, batch_size=batch,
                                                              eval_every=steps, eval_size=400))


def test_study_runs_at_tiny_scale_writes_its_report_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_THREADS", "1")
    results = run_study("templates-mlp-control", tmp_path, "tiny", progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["headline"] == json.loads(json.dumps(results["headline"], default=float))
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert sorted(saved["cells"]) == ["mlp-n4-s0", "mlp-n8-s0", "mlp-onehot-n4-s0", "mlp-onehot-n8-s0"]
    finals = saved["cells"]["mlp-n8-s0"]["final"]
    assert saved["headline"]["mlp_eval_loss_at_max_n"] == finals["eval_loss"]
    assert {"eval_loss", "error", "acc", "train_split_acc"} <= set(finals)
    # a rerun reads the finished cells back instead of training them again
    before = (tmp_path / "mlp" / "mlp-n4-s0.json").stat().st_mtime_ns
    assert run_study("templates-mlp-control", tmp_path, "tiny", progress=False)["headline"] == results["headline"]
    assert (tmp_path / "mlp" / "mlp-n4-s0.json").stat().st_mtime_ns == before


def test_control_sees_the_transformers_batches_and_embeddings_and_keeps_them_frozen(tmp_path, monkeypatch):
    import models.mlp_control as mlp_control

    cfg = _small(8, steps=5, seed=3)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, weight_decay=0.5))  # decay would show
    built = []  # the model train_mlp_control builds and trains, caught on its way in

    def build_and_keep(*args, **kwargs):
        built.append(build_mlp_control(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(mlp_control, "build_mlp_control", build_and_keep)
    batches = []
    train_mlp_control(cfg, record_batches=batches)
    trainer = Trainer(cfg, tmp_path / "run", progress=False)
    for mine in batches:
        theirs = trainer._next_batch()
        assert torch.equal(mine.tokens, theirs.tokens) and torch.equal(mine.labels, theirs.labels)
    task = make_task(cfg.task)
    untrained = build_mlp_control(cfg, task)
    initial = build_model(cfg.model, task, seed=3).embed.W_E
    assert torch.equal(untrained.W_E, initial) and torch.equal(trainer.model.embed.W_E, initial)
    # after train_mlp_control's own 5 steps (AdamW, weight decay 0.5): the embeddings are the
    # transformer's initial ones still, every layer has moved
    (trained,) = built
    assert torch.equal(trained.W_E.cpu(), initial)
    moved = {n: not torch.equal(p.detach().cpu(), dict(untrained.named_parameters())[n])
             for n, p in trained.named_parameters()}
    assert all(moved.values()), moved


def test_control_learns_the_training_symbols_and_one_hot_stays_at_chance_on_unseen_ones():
    """Same-different over 8 training symbols (64 strings) is a task an MLP can fit: accuracy on
    training-symbol strings rises from chance to >= 0.95 in 300 steps. With one-hot symbols an
    unseen symbol shares no input direction with a seen one, so test accuracy stays near 0.5."""
    for embeddings in ("transformer", "onehot"):
        out = train_mlp_control(_small(8, steps=300), embeddings=embeddings)
        assert out["final"]["train_split_acc"] >= 0.95, (embeddings, out["final"])
    assert abs(out["final"]["acc"] - 0.5) < 0.1, out["final"]
