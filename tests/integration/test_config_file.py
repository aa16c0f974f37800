"""`workbench train --config FILE`: a run without a preset, from a JSON file (e.g. another run's
config.json), with --set on top; and the task's own headline metric drives the stop rule."""

import pytest

from analyses.cli import main
from models.runs import read_config
from tests.helpers import tiny_composite_run

SMALL = ["--set", "train.steps=8", "--set", "train.eval_every=4", "--set", "train.eval_size=64", "--no-progress"]


def test_a_run_trains_from_a_config_file_and_its_config_json_trains_the_same_run_again(tmp_path):
    cfg = tiny_composite_run(steps=8, eval_every=4)
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    assert main(["train", "--config", str(tmp_path / "cfg.json"), "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert read_config(tmp_path / "a") == cfg
    # a run folder's config.json (package versions included) is a config file too; --set applies on top
    assert main(["train", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b"),
                 "--set", "train.seed=1", "--no-progress"]) == 0
    again = read_config(tmp_path / "b")
    assert again.train.seed == 1 and again.model == cfg.model and again.task == cfg.task


@pytest.mark.parametrize(("content", "extra", "message"), [
    (None, [], "does not exist"),
    ('{"task": {"name": "composite"}, "train": {"steps": 8, "steps": 9}}', [], "repeats the key 'steps'"),
    ('[1, 2]', [], "is not a JSON object"),
    ('{"task": {"name": "chess"}}', [], "task.name='chess' is unknown"),
    ('{"task": {"name": "composite"}}', ["--preset", "composite-cpu"], "use one"),
    ('{"task": {"name": "composite"}}', ["--task", "lego"], "is a composite configuration but --task is lego"),
])
def test_a_bad_config_file_is_exit_2_naming_it(tmp_path, capsys, content, extra, message):
    path = tmp_path / "cfg.json"
    if content is not None:
        path.write_text(content)
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "r"), *extra, *SMALL]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_the_stop_rule_reads_the_tasks_own_headline_metric(tmp_path, monkeypatch):
    from models.train import Trainer
    from tasks import CompositeTask, ConfigError

    monkeypatch.setattr(CompositeTask, "headline_metric", "acc_renamed")  # a task that names its metric otherwise
    cfg = tiny_composite_run(steps=40, eval_every=10, plateau_evals=2)
    with pytest.raises(ConfigError, match="the stop rule reads \\['acc_renamed'\\]"):
        Trainer(cfg, tmp_path / "r", progress=False)  # never silently without its stop rule
    assert not (tmp_path / "r").exists()
