import json

import pytest

from models.config import ModelConfig, RunConfig, TrainConfig
from models.presets import all_presets, get_preset
from tasks import CompositeConfig, ConfigError, LegoConfig


@pytest.mark.parametrize("name", sorted(all_presets()))
def test_every_preset_round_trips_through_json(name):
    cfg = get_preset(name)
    assert RunConfig.from_dict(json.loads(cfg.to_json())) == cfg


def test_overrides_parse_values_and_keep_types():
    cfg = get_preset("lego-cpu").with_overrides(["model.tie_layers=true", "train.lr=3e-3", "task.n_vars=8",
                                                  "model.init_gamma=null", "train.steps=10"])
    assert cfg.model.tie_layers is True and cfg.train.lr == 3e-3 and cfg.task.n_vars == 8
    assert get_preset("composite-cpu").with_overrides(["task.held_out=[\"4,3\",\"3,4\"]"]).task.held_out == ["4,3",
                                                                                                             "3,4"]
    assert get_preset("lego-cpu").with_overrides(["train.lr=1"]).train.lr == 1.0


@pytest.mark.parametrize(
    ("assignment", "message"),
    [("task.n_vars=30", "n_vars=30"), ("model.init_gamma=0", "init_gamma=0"), ("model.init_gamma=-1", "init_gamma=-1"),
     ("model.n_layers=0", "n_layers=0"), ("train.lr=abc", "train.lr='abc'"), ("model.nope=1", "no field 'nope'"),
     ("nope.x=1", "section.key=value"), ("train.warmup_steps=-1", "warmup_steps=-1"),
     ("model.min_depth=9", "min_depth=9"), ("train.device=tpu", "device='tpu'"),
     ("model.init_gamma=Infinity", "init_gamma=inf is not a finite"), ("model.init_gamma=NaN", "init_gamma=nan"),
     ("train.lr=NaN", "train.lr=nan"), ("train.lr=Infinity", "train.lr=inf"),
     ("train.weight_decay=NaN", "weight_decay=nan"), ("train.grad_clip=NaN", "grad_clip=nan"),
     ("model.d_mlp=0", "d_mlp=0 must be >= 1"), ("model.d_head=-4", "d_head=-4 must be >= 1"),
     # numbers too long to parse, or too large for a double or for 64 bits (issue 43)
     (f"train.steps={'1' * 5000}", "--set train.steps=1111111111...1111111111 is a number of 5,000 characters"),
     (f"train.lr=1{'0' * 400}", "train.lr=1000000000...0000000000 is too large"),
     (f"train.steps={2**63}", "train.steps=9223372036854775808 is too large"),
     # sizes bounded before anything is allocated from them (issue 54: 1e9 snapshots took 3 GB)
     ("train.snapshots=1000000000", "snapshots=1000000000.*<= 10,000"),
     ("train.snapshots=10001", "snapshots=10001.*<= 10,000")],
)
def test_bad_values_are_rejected_naming_the_value(assignment, message):
    with pytest.raises(ConfigError, match=message):
        get_preset("lego-cpu").with_overrides([assignment])


def test_unknown_preset_and_task():
    with pytest.raises(ConfigError, match="preset 'nope' is unknown"):
        get_preset("nope")
    with pytest.raises(ConfigError, match="task.name='maze'"):
        RunConfig.from_dict({"task": {"name": "maze"}})


def test_held_out_pair_must_be_an_anchor_pair():
    with pytest.raises(ConfigError, match="'4,7'"):
        RunConfig.from_dict({"task": {"name": "composite", "held_out": ["4,7"]}})


def test_defaults_are_valid():
    RunConfig(task=LegoConfig(), model=ModelConfig(), train=TrainConfig())
    RunConfig(task=CompositeConfig())


def test_list_elements_are_checked_and_unknown_sections_refused():
    with pytest.raises(ConfigError, match=r"task.shifts\[0\]='a' has the wrong type"):
        get_preset("composite-cpu").with_overrides(['task.shifts=["a","b"]'])
    data = get_preset("lego-cpu").to_dict()
    with pytest.raises(ConfigError, match="unknown section"):
        RunConfig.from_dict({**data, "extra": {}})
