"""The per-step instruments of a replay (analyses/research/step_probe.py) read the run's own steps."""

import json

from analyses.research.step_probe import main, probe_steps
from models.train import Trainer
from tests.helpers import tiny_composite_run


def test_the_probe_replays_the_runs_own_steps_and_records_each(tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(tiny_composite_run(steps=12, eval_every=4, checkpoint_every=4, keep_state=[4]), run, progress=False).fit()
    records = probe_steps(run, 4, 8)
    assert [r["step"] for r in records] == list(range(5, 13))
    # the replayed losses are the run's own: their mean over steps 5-8 is its recorded train_loss at step 8
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    at_8 = next(r for r in logged if r["step"] == 8)["train_loss"]
    assert abs(sum(r["train_loss"] for r in records[:4]) / 4 - at_8) < 1e-6
    for r in records:
        assert 0 <= r["zero_loss_share"] <= 1 and r["grad_norm"] > 0 and r["update_rms"] > 0
        assert r["update_max"] >= r["update_rms"] and set(r["grad_norms"]) >= {"embed.W_E", "unembed.W_U"}
    assert main([f"{run}@4", "--steps", "2", "--set", "train.loss_dtype=float64"]) == 0
    assert [json.loads(line)["step"] for line in capsys.readouterr().out.splitlines()] == [5, 6]
