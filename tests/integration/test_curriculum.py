"""A curriculum trains its stages in order, each from the last one's weights, resumes where it
stopped, and refuses a folder that holds another run."""

import json

import pytest

from analyses.cli import main
from analyses.studies.lego_pool import TINY_CURRICULUM
from interp.tasks.lego_presets import LEGO_THREE_HOPS
from models.curriculum import train_curriculum
from models.runs import RunFolderError, read_config, read_metrics, read_tensors, weights_digest
from tasks import ConfigError

TINY = TINY_CURRICULUM  # two stages: #0-#1 of n = 4, then #0-#2 of n = 5, 8 steps each


def test_each_stage_starts_from_the_weights_the_stage_before_it_ended_with(tmp_path):
    results = train_curriculum(TINY, tmp_path, ["train.seed=3"], progress=False)
    assert [r.name for r in results] == ["1", "2"] and [r.state for r in results] == ["trained", "trained"]
    first, second = read_config(tmp_path / "1"), read_config(tmp_path / "2")
    assert first.train.init_from is None and second.train.init_from == str(tmp_path / "1")
    assert (first.task.n_vars, second.task.n_vars, first.train.seed, second.train.seed) == (4, 5, 3, 3)
    init = json.loads((tmp_path / "2" / "init.json").read_text())  # b started from a's final weights
    assert init["from"] == str(tmp_path / "1") and init["step"] == 8
    assert init["weights_digest"] == weights_digest(read_tensors(tmp_path / "1" / "model.safetensors")[0])
    assert results[1].final == read_metrics(tmp_path / "2")[-1] and results[1].final["step"] == 8
    again = train_curriculum(TINY, tmp_path, ["train.seed=3"], progress=False)  # finished stages are kept
    assert [r.state for r in again] == ["found", "found"]


def test_a_stage_folder_of_another_config_is_refused_before_anything_trains(tmp_path):
    train_curriculum(TINY, tmp_path, ["train.seed=1"], progress=False)
    mtime = (tmp_path / "1" / "metrics.jsonl").stat().st_mtime_ns
    with pytest.raises(RunFolderError, match="another config"):
        train_curriculum(TINY, tmp_path, ["train.seed=2"], progress=False)
    assert (tmp_path / "1" / "metrics.jsonl").stat().st_mtime_ns == mtime


def test_the_three_hop_curriculum_is_plain_and_ends_on_n8_with_five_supervised():
    configs = LEGO_THREE_HOPS.configs(LEGO_THREE_HOPS.folders("x"), ["model.tie_layers=true"])
    assert [c.task.n_vars for c in configs] == [6, 6, 8] and [c.task.n_supervised for c in configs] == [3, 5, 5]
    assert all(c.model.planted == {} and not c.train.mimic_steps and c.model.tie_layers for c in configs)
    assert configs[0].heads_origin == "learned" and configs[2].train.init_from == "x/2-three-hops-n6"


def test_the_n12_curricula_add_the_papers_task_after_the_three_hop_stages():
    from interp.tasks.lego_presets import LEGO_N12, LEGO_N12_ALBERT, LEGO_THREE_HOPS_ALBERT

    for curriculum, before, tied in ((LEGO_N12, LEGO_THREE_HOPS, False),
                                     (LEGO_N12_ALBERT, LEGO_THREE_HOPS_ALBERT, True)):
        assert curriculum.stages[:-1] == before.stages and curriculum.common == before.common
        configs = curriculum.configs(["a", "b", "c", "d"], ["model.n_layers=12"])
        assert all((c.model.n_layers, c.model.tie_layers, c.model.planted) == (12, tied, {}) for c in configs)
        last = configs[-1]
        assert (last.task.n_vars, last.task.n_letters, last.task.n_supervised) == (12, 12, 6)
        assert last.train.init_from == "c"


def test_cli_lists_curricula_and_refuses_bad_requests(tmp_path, capsys):
    assert main(["curriculum", "--list"]) == 0
    assert "lego-three-hops" in capsys.readouterr().out
    assert main(["curriculum", "lego-three-hops"]) == 2  # no --out
    assert main(["curriculum", "nonsense", "--out", str(tmp_path / "x")]) == 2
    assert main(["curriculum", "lego-three-hops", "--out", str(tmp_path / "x"), "--set", "train.init_from=y"]) == 2
    assert main(["curriculum", "lego-three-hops", "--out", str(tmp_path / "x"), "--set", "model.nope=1"]) == 2
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="sets train.init_from itself"):
        TINY.configs(TINY.folders(tmp_path), last=["train.init_from=z"])


def test_a_zoo_entry_trained_by_a_curriculum_keeps_its_last_stage_and_reads_as_built(tmp_path, monkeypatch):
    import analyses.zoo as zoo

    entry = zoo.ZooEntry("tiny-course", "lego-cpu", ("train.seed=2",), "test", curriculum="tiny")
    monkeypatch.setitem(zoo.ZOO, entry.name, entry)
    monkeypatch.setattr(zoo, "get_curriculum", lambda name: TINY)
    monkeypatch.setattr(zoo, "STAGES_DIR", tmp_path / "stages")
    target = zoo.build(entry.name, zoo_dir=tmp_path / "zoo", progress=False)
    assert {p.name for p in target.iterdir()} <= set(zoo.KEPT_FILES) and (target / "model.safetensors").exists()
    kept = read_config(target)
    assert kept.task.n_vars == 5 and kept.train.seed == 2  # the last stage, with the entry's overrides
    assert kept.train.init_from == str(tmp_path / "stages" / entry.name / "1")
    assert zoo.status(entry.name, tmp_path / "zoo") == "built"
    moved = kept.with_overrides(["train.init_from=\"elsewhere/1\""])  # trained elsewhere: the same recipe
    (target / "config.json").write_text(json.dumps({**json.loads((target / "config.json").read_text()),
                                                    **{k: v for k, v in moved.to_dict().items() if k == "train"}}))
    assert zoo.status(entry.name, tmp_path / "zoo") == "built"
    other = kept.with_overrides(["train.seed=3"])
    (target / "config.json").write_text(json.dumps({**json.loads((target / "config.json").read_text()),
                                                    "train": other.to_dict()["train"]}))
    assert zoo.status(entry.name, tmp_path / "zoo") == "stale"
