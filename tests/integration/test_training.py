import json

import pytest
import torch
from safetensors.torch import load_file

from models.config import ModelConfig
from models.run_folder import RunFolder
from models.runs import load_run, read_metrics
from models.train import Trainer, TrainingDiverged, learning_rate
from tasks import CompositeConfig, CompositeTask
from tests.helpers import kill_then_resume, tiny_composite_run, tiny_lego_run


def without_time(records):
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records]


def test_same_seed_same_metrics_other_seed_other_metrics(tmp_path):
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        Trainer(tiny_lego_run(steps=15, seed=seed), tmp_path / name, progress=False).fit()
    a, b, c = (without_time(read_metrics(tmp_path / n)) for n in "abc")
    assert a == b and a != c
    assert [r["step"] for r in a] == [5, 10, 15]


def tiny_tied_stochastic_run(steps, n_train):
    return tiny_lego_run(steps=steps, n_train=64).with_overrides(
        ["model.tie_layers=true", "model.n_layers=3", "model.min_depth=1"])


@pytest.mark.parametrize("make_cfg", [tiny_lego_run, tiny_composite_run, tiny_tied_stochastic_run])
def test_resume_after_a_kill_ends_with_the_weights_of_an_uninterrupted_run(tmp_path, make_cfg, monkeypatch):
    cfg = make_cfg(steps=30, n_train=None)
    Trainer(cfg, tmp_path / "whole", progress=False).fit()

    # after the checkpoint at 10, an evaluation at 15
    kill_then_resume(cfg, tmp_path / "killed", monkeypatch, at_step=15)

    whole = load_file(str(tmp_path / "whole/model.safetensors"))
    resumed = load_file(str(tmp_path / "killed/model.safetensors"))
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert without_time(read_metrics(tmp_path / "whole")) == without_time(read_metrics(tmp_path / "killed"))


def test_a_nan_loss_stops_the_run_and_records_it(tmp_path):
    cfg = tiny_lego_run(steps=50, lr=1e30, grad_clip=None, warmup_steps=0, weight_decay=0.0)
    with pytest.raises(TrainingDiverged, match="(?i)lower train.lr"):
        Trainer(cfg, tmp_path / "run", progress=False).fit()
    last = read_metrics(tmp_path / "run")[-1]
    assert last["diverged"] is True and last["step"] < 50


def test_loaded_run_reproduces_its_recorded_accuracy(tmp_path):
    from models.factory import build_model

    Trainer(tiny_composite_run(steps=10), tmp_path / "run", progress=False).fit()
    run = load_run(tmp_path / "run")
    assert json.loads((tmp_path / "run/config.json").read_text())["versions"]["torch"].startswith("2.")
    stored, loaded = load_file(str(tmp_path / "run/model.safetensors")), dict(run.model.named_parameters())
    assert stored.keys() == loaded.keys() and all(torch.equal(stored[k], loaded[k]) for k in stored)
    fresh = dict(build_model(run.config.model, run.task, seed=run.config.train.seed).named_parameters())
    assert not all(torch.equal(fresh[k], loaded[k]) for k in fresh)  # the trained weights, not the init
    trainer = Trainer(run.config, tmp_path / "other", progress=False)
    trainer.model, trainer.folder = run.model, RunFolder(tmp_path / "run")
    assert trainer._evaluate()["acc_seen"] == run.metrics[-1]["acc_seen"]


def test_learning_rate_warms_up_then_decays_to_min_lr():
    cfg = tiny_lego_run(steps=100, lr=1e-3, min_lr=1e-5, warmup_steps=10).train
    rates = [learning_rate(s, cfg) for s in range(101)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:])) and rates[100] == pytest.approx(1e-5)


def test_mimic_steps_pretrain_attention_before_the_task(tmp_path):
    plain = Trainer(tiny_lego_run(steps=1), tmp_path / "plain", progress=False)
    plain.fit()
    mimicked = Trainer(tiny_lego_run(steps=1, mimic_steps=30), tmp_path / "mimic", progress=False)
    mimicked.fit()
    record = json.loads((tmp_path / "mimic" / "mimic.json").read_text())
    assert record["steps"] == 30 and record["final_loss"] < record["loss"][0]
    assert not (tmp_path / "plain" / "mimic.json").exists()
    weights = load_file(str(tmp_path / "mimic" / "model.safetensors"))
    assert any(not torch.equal(v, load_file(str(tmp_path / "plain" / "model.safetensors"))[k])
               for k, v in weights.items())


def test_train_or_load_trains_once_then_loads_and_refuses_another_config(tmp_path):
    from models.train import train_or_load
    from tasks import ConfigError

    cfg = tiny_lego_run(steps=20)
    run = train_or_load(cfg, tmp_path / "r", progress=False)
    assert run.metrics[-1]["step"] == 20
    before = (tmp_path / "r" / "metrics.jsonl").stat().st_mtime_ns
    assert train_or_load(cfg, tmp_path / "r", progress=False).metrics == run.metrics  # loaded, not retrained
    assert (tmp_path / "r" / "metrics.jsonl").stat().st_mtime_ns == before
    longer = tiny_lego_run(steps=30)
    with pytest.raises(ConfigError, match="another config"):
        train_or_load(longer, tmp_path / "r", progress=False)


def test_training_kernels_are_deterministic_on_cpu_threads():
    """The embedding's backward on two threads adds gradient rows in a varying order unless
    deterministic kernels are on; `fit` turns them on, so one seed gives one set of weights."""
    from models.device import deterministic_kernels
    from models.factory import build_model
    from models.step import masked_cross_entropy
    from tasks import make_task, seeded_generator

    cfg = tiny_lego_run()
    task = make_task(cfg.task)
    model = build_model(cfg.model, task, seed=0)
    batch = task.sample(96, seeded_generator(0), split="train")  # > 1,000 token rows: the backward runs in parallel

    def embedding_grad():
        model.zero_grad(set_to_none=True)
        masked_cross_entropy(model(batch.tokens), batch.label_pos, batch.labels, batch.loss_mask.float()).backward()
        return model.embed.W_E.grad.clone()

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with deterministic_kernels(torch.device("cpu")):
            first = embedding_grad()
            assert all(torch.equal(first, embedding_grad()) for _ in range(5))
    finally:
        torch.set_num_threads(threads)
    assert not torch.are_deterministic_algorithms_enabled()  # restored for the caller


@pytest.mark.slow  # two threads beside the suite's other process: a minute (the context manager's test is quick)
def test_two_fits_on_two_threads_give_bit_identical_weights(tmp_path):
    """Through fit(), not the context manager alone: the lego-cpu shape for 10 steps on 2
    threads. Without deterministic kernels the two runs' weights differed by 4e-5 here (the
    embedding's backward adds rows in a varying order)."""
    from models.presets import get_preset

    cfg = get_preset("lego-cpu").with_overrides(["model.planted={}", "train.steps=10", "train.eval_every=10",
                                                  "train.eval_size=64", "train.checkpoint_every=10"])
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for name in ("a", "b"):
            Trainer(cfg, tmp_path / name, progress=False).fit()
    finally:
        torch.set_num_threads(threads)
    a, b = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_plateau_rule_stops_a_run_where_its_accuracy_stopped_rising_and_resume_keeps_it_stopped(tmp_path):
    from models.runs import run_state

    cfg = tiny_composite_run(steps=400, plateau_evals=3, eval_every=10, checkpoint_every=50)
    result = Trainer(cfg, tmp_path / "r", progress=False).fit()
    records = read_metrics(tmp_path / "r")
    assert records[-1]["stopped"] == "plateau" and result.steps == records[-1]["step"] < 400
    seen = [r["acc_seen"] for r in records]
    # the rule, read off the curve: it holds at the stop and at no evaluation before it
    holds = [len(seen[: i + 1]) > 3 and max(seen[i - 2: i + 1]) <= max(seen[: i - 2]) + 0.002 for i in range(len(seen))]
    assert holds[-1] and not any(holds[:-1])
    assert run_state(tmp_path / "r", cfg) == "done"
    weights = load_file(tmp_path / "r" / "model.safetensors")
    assert Trainer(cfg, tmp_path / "r", resume=True, progress=False).fit().steps == result.steps
    assert read_metrics(tmp_path / "r") == records  # resumed, nothing trained
    assert all(torch.equal(weights[k], v) for k, v in load_file(tmp_path / "r" / "model.safetensors").items())


def test_init_from_starts_at_another_runs_weights_on_a_harder_task_and_records_where_they_came_from(tmp_path):
    import dataclasses

    from models.runs import read_tensors, weights_digest
    from models.train import starting_weights

    first = tiny_lego_run(steps=10)
    Trainer(first, tmp_path / "easy", progress=False).fit()
    source, _ = read_tensors(tmp_path / "easy" / "model.safetensors")
    # a curriculum step: the same model on a task with more letters, from the easy run's weights
    harder = dataclasses.replace(tiny_lego_run(steps=10, init_from=str(tmp_path / "easy")),
                                 task=dataclasses.replace(first.task, n_letters=26))
    trainer = Trainer(harder, tmp_path / "hard", progress=False)
    trainer._start()  # step 0: the starting weights are loaded, nothing trained yet
    assert all(torch.equal(p, source[n]) for n, p in trainer.model.named_parameters())
    record = json.loads((tmp_path / "hard" / "init.json").read_text())
    assert record == {"from": str(tmp_path / "easy"), "step": 10, "weights_digest": weights_digest(source)}
    Trainer(harder, tmp_path / "hard2", progress=False).fit()
    plain = Trainer(dataclasses.replace(harder, train=dataclasses.replace(harder.train, init_from=None)),
                    tmp_path / "plain", progress=False)
    plain.fit()
    assert read_metrics(tmp_path / "hard2") != read_metrics(tmp_path / "plain")  # the start mattered
    assert not (tmp_path / "plain" / "init.json").exists()
    with pytest.raises(Exception, match="model differs from this run's in \\['n_layers'\\]"):
        starting_weights(tiny_lego_run().with_overrides(["model.n_layers=3"]), trainer.model, tmp_path / "easy")


def test_the_plateau_rule_waits_for_its_minimum_step_and_for_watched_metrics_to_settle(tmp_path):
    base = dict(steps=400, plateau_evals=3, eval_every=10, checkpoint_every=50)
    plain = Trainer(tiny_composite_run(**base), tmp_path / "plain", progress=False).fit().steps
    assert plain < 400
    later = Trainer(tiny_composite_run(**base, plateau_min_steps=plain + 50), tmp_path / "min", progress=False).fit()
    assert later.steps >= plain + 50
    # watched with a tolerance of 0, held-out rates that move at all keep the run going
    watched = tiny_composite_run(**base, eval_size=512, plateau_watch=["held_out_symmetric", "held_out_inferential"],
                                 plateau_watch_tol=0.0)
    Trainer(watched, tmp_path / "watch", progress=False).fit()
    records = read_metrics(tmp_path / "watch")
    last = records[-1]
    if last.get("stopped"):
        window = records[-3:]
        assert all(len({r[k] for r in window}) == 1 for k in ("held_out_symmetric", "held_out_inferential"))
    moved = [i for i in range(3, len(records) + 1)
             if len({r["held_out_symmetric"] for r in records[i - 3:i]}) > 1]
    assert moved, "the tiny run's held-out rates never moved, so this test shows nothing"
    assert all(not records[i - 1].get("stopped") for i in moved)


def test_watching_a_metric_the_task_does_not_record_is_a_config_error(tmp_path):
    from tasks import ConfigError

    cfg = tiny_composite_run(steps=40, plateau_evals=2, eval_every=10, eval_size=512, plateau_watch=["held_out_typo"])
    with pytest.raises(ConfigError, match="held_out_typo.*held_out_symmetric"):
        Trainer(cfg, tmp_path / "r", progress=False)  # refused before anything is written
    assert not (tmp_path / "r").exists()


def test_refinements_of_the_stop_rule_need_the_rule():
    from tasks import ConfigError

    with pytest.raises(ConfigError, match="set train.plateau_evals too"):
        tiny_composite_run(plateau_min_steps=100)


def test_a_bias_free_model_keeps_its_attention_and_mlp_biases_at_zero_through_training(tmp_path):
    cfg = tiny_composite_run(steps=20).with_overrides(["model.biases=false"])
    Trainer(cfg, tmp_path / "r", progress=False).fit()
    run = load_run(tmp_path / "r")
    biases = {n: p for n, p in run.model.named_parameters() if n.rsplit(".", 1)[-1] in
              ("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out")}
    assert len(biases) == 6 * cfg.model.n_layers
    assert all(torch.count_nonzero(p) == 0 for p in biases.values())
    assert torch.count_nonzero(run.model.unembed.b_U) > 0  # the unembedding's bias, kept, trains from its zeros
    assert run.config.model.biases is False


def test_weight_decay_on_all_decays_every_trained_parameter_and_keeps_frozen_biases_at_zero(tmp_path):
    """The composite paper's code decays every parameter (AdamW over model.parameters()); ours by
    default only the weight matrices. Frozen (bias-free) biases get no gradient, so they stay zero."""
    def decayed(trainer) -> set[str]:
        return {name for name, (_, weight_decay) in trainer.groups.items() if weight_decay > 0}

    cfg = tiny_composite_run(steps=10).with_overrides(["model.biases=false", "train.weight_decay=0.5"])
    default = Trainer(cfg, tmp_path / "m", progress=False)
    names = {n for n, _ in default.model.named_parameters()}
    assert decayed(default) == {n for n in names if n.rsplit(".", 1)[-1].startswith("W_")}
    trainer = Trainer(cfg.with_overrides(["train.weight_decay_on=all"]), tmp_path / "a", progress=False)
    assert decayed(trainer) == names
    trainer.fit()
    frozen = [p for n, p in trainer.model.named_parameters() if n.rsplit(".", 1)[-1] in ("b_Q", "b_V", "b_in", "b_out")]
    assert frozen and all(torch.count_nonzero(p) == 0 for p in frozen)


def test_decay_on_all_shrinks_the_norms_and_leaves_the_matrices_as_the_default_does(tmp_path):
    """One AdamW step from the same weights and batch: decoupled decay multiplies a decayed
    parameter by (1 - lr * wd) before the Adam update, so under "all" each LayerNorm weight (1 at
    init) ends lr * wd below the default run's, and the matrices (decayed in both) are identical."""
    cfg = tiny_composite_run(steps=1, warmup_steps=0, weight_decay=0.5, lr=1e-2)
    runs = {}
    for on in ("matrices", "all"):
        trainer = Trainer(cfg.with_overrides([f"train.weight_decay_on={on}"]), tmp_path / on, progress=False)
        lr = trainer.learning_rate()  # step 0's: lr itself, without warm-up
        trainer.fit()
        runs[on] = dict(trainer.model.named_parameters())
    norms = [n for n in runs["all"] if n.endswith("ln1.w")]
    assert norms
    for n in norms:
        assert torch.allclose(runs["matrices"][n] - runs["all"][n], torch.full_like(runs["all"][n], lr * 0.5),
                              atol=1e-6)
    assert all(torch.equal(runs["matrices"][n], runs["all"][n]) for n in runs["all"]
               if n.rsplit(".", 1)[-1].startswith("W_"))


def test_a_uniform_unembedding_bias_is_drawn_at_pytorchs_scale_whatever_the_gamma():
    """`model.unembed_bias_init=uniform`: b_U ~ U(+-1/sqrt(d_model)) as nn.Linear's default, not
    rescaled with init_gamma (the paper's code), and every other parameter as without it."""
    from models.factory import build_model

    task = CompositeTask(CompositeConfig())
    models = {(gamma, init): build_model(ModelConfig(n_layers=2, d_model=64, n_heads=1, init_gamma=gamma,
                                                     unembed_bias_init=init), task, seed=3, device="cpu")
              for gamma in (0.5, 1.0) for init in ("zero", "uniform")}
    bias = models[(0.5, "uniform")].unembed.b_U
    assert torch.equal(bias, models[(1.0, "uniform")].unembed.b_U)  # not rescaled with gamma
    assert 0.5 * 64 ** -0.5 < bias.abs().max() <= 64 ** -0.5
    assert torch.count_nonzero(models[(0.5, "zero")].unembed.b_U) == 0
    zero, uniform = (dict(models[(0.5, init)].named_parameters()) for init in ("zero", "uniform"))
    assert all(torch.equal(zero[n], uniform[n]) for n in zero if n != "unembed.b_U")
