"""A generated table of bad inputs (issue 16): each bad value, given through `--set`, a
hand-edited config.json, a sweep grid or a study option, exits 2, names the value, and writes
nothing."""

from __future__ import annotations

import json
import math

import pytest

from analyses.cli import main
from models.presets import get_preset
from tests.helpers import folder_bytes

# (preset, key, bad value as typed on the command line, what the message must name)
BAD_VALUES = [
    ("lego-cpu", "task.n_vars", "0", "n_vars=0"), ("lego-cpu", "task.n_vars", "30", "n_vars=30"),
    ("lego-cpu", "task.group", "z3", "group='z3'"), ("lego-cpu", "task.supervision", "some", "supervision='some'"),
    ("lego-cpu", "task.n_supervised", "9", "n_supervised=9"), ("lego-cpu", "task.min_vars", "0", "min_vars=0"),
    ("lego-cpu", "task.biased_fraction", "1.5", "biased_fraction=1.5"),
    ("lego-cpu", "task.identity_prob", "-0.1", "identity_prob=-0.1"),
    ("lego-cpu", "task.ordered_fraction", "NaN", "ordered_fraction=nan"),
    ("lego-cpu", "task.forest_fraction", "2", "forest_fraction=2"), ("lego-cpu", "task.cut_prob", "-1", "cut_prob=-1"),
    ("lego-cpu", "task.mention_labels", "both", "mention_labels='both'"),
    ("lego-cpu", "task.n_letters", "3", "n_letters=3"),
    ("lego-cpu", "model.n_layers", "0", "n_layers=0"), ("lego-cpu", "model.d_model", "0", "d_model=0"),
    ("lego-cpu", "model.n_heads", "0", "n_heads=0"), ("lego-cpu", "model.d_head", "-4", "d_head=-4"),
    ("lego-cpu", "model.d_mlp", "0", "d_mlp=0"), ("lego-cpu", "model.act_fn", "tanhh", "act_fn='tanhh'"),
    ("lego-cpu", "model.normalization", "BN", "normalization='BN'"),
    ("lego-cpu", "model.norm_position", "middle", "norm_position='middle'"),
    ("lego-cpu", "model.positional", "alibi", "positional='alibi'"),
    ("lego-cpu", "model.init_gamma", "-1", "init_gamma=-1"),
    ("lego-cpu", "model.init_gamma", "Infinity", "init_gamma=inf"), ("lego-cpu", "model.min_depth", "9", "min_depth=9"),
    ("lego-cpu", "model.planted", '{"9.0":"association"}', "'9.0'"),
    ("lego-cpu", "model.planted", '{"1.0":"mystery"}', "'mystery'"),
    ("lego-cpu", "model.identity_off_diagonal", "true", "identity_off_diagonal"),
    ("lego-cpu", "model.nope", "1", "'nope'"),
    ("lego-cpu", "train.steps", "0", "steps=0"), ("lego-cpu", "train.batch_size", "0", "batch_size=0"),
    ("lego-cpu", "train.lr", "NaN", "lr=nan"), ("lego-cpu", "train.lr", "-0.001", "lr=-0.001"),
    ("lego-cpu", "train.min_lr", "1", "min_lr=1"), ("lego-cpu", "train.warmup_steps", "-1", "warmup_steps=-1"),
    ("lego-cpu", "train.weight_decay", "-1", "weight_decay=-1"), ("lego-cpu", "train.grad_clip", "0", "grad_clip=0"),
    ("lego-cpu", "train.eval_every", "0", "eval_every=0"), ("lego-cpu", "train.eval_size", "0", "eval_size=0"),
    ("lego-cpu", "train.checkpoint_every", "0", "checkpoint_every=0"), ("lego-cpu", "train.n_train", "3", "n_train=3"),
    ("lego-cpu", "train.device", "tpu", "device='tpu'"), ("lego-cpu", "train.precision", "fp8", "precision='fp8'"),
    ("lego-cpu", "train.mimic_steps", "-5", "mimic_steps=-5"),
    ("lego-cpu", "train.identity_lr_scale", "0", "identity_lr_scale=0"),
    ("lego-cpu", "train.weight_decay_on", "biases", "weight_decay_on='biases'"),
    ("composite-cpu", "model.unembed_bias_init", "normal", "unembed_bias_init='normal'"),
    ("lego-cpu", "train.plateau_evals", "0", "plateau_evals=0"),
    ("lego-cpu", "train.plateau_tol", "1", "plateau_tol=1"),
    ("composite-cpu", "task.shifts", '["a","b"]', "shifts[0]='a'"),
    ("composite-cpu", "task.shifts", "[]", "shifts is empty"),
    ("composite-cpu", "task.seq_len", "2", "seq_len=2"), ("composite-cpu", "task.value_min", "2", "value_min=2"),
    ("composite-cpu", "task.held_out", '["4,7"]', "'4,7'"),
    ("composite-cpu", "model.init_gamma", "NaN", "init_gamma=nan"),
    ("templates-cpu", "task.template", "maze", "template='maze'"), ("templates-cpu", "task.n_vars", "0", "n_vars=0"),
    ("templates-cpu", "task.n_train_symbols", "1", "n_train_symbols=1"),
    ("lego-cpu", "train.init_from", '""', "init_from=''"),
    ("lego-cpu", "train.init_from", "no/such/run", "no/such/run"),
    ("lego-cpu", "task.name", '["lego"]', "task.name=['lego']"),
    ("lego-cpu", "task.name", "chess", "task.name='chess'"),
]
IDS = [f"{preset}:{key}={value}" for preset, key, value, _ in BAD_VALUES]


def assert_refused(code: int, err: str, named: str) -> None:
    assert code == 2, err
    assert named in err, f"the message does not name {named!r}: {err}"


@pytest.mark.parametrize(("preset", "key", "value", "named"), BAD_VALUES, ids=IDS)
def test_set_on_the_command_line(tmp_path, capsys, preset, key, value, named):
    out = tmp_path / "run"
    code = main(["train", "--preset", preset, "--out", str(out), "--set", f"{key}={value}", "--no-progress"])
    assert_refused(code, capsys.readouterr().err, named)
    assert not out.exists()


def _edited(preset: str, key: str, value: str) -> dict:
    """The preset's config.json as a user would hand-edit it: the value as JSON (NaN and
    Infinity as Python's json writes them), or as a string where it is not JSON."""
    data = get_preset(preset).to_dict()
    section, field = key.split(".")
    try:
        data[section][field] = json.loads(value)
    except json.JSONDecodeError:
        data[section][field] = value
    return data


@pytest.mark.parametrize(("preset", "key", "value", "named"), BAD_VALUES, ids=IDS)
def test_hand_edited_config_json(tmp_path, capsys, preset, key, value, named):
    out = tmp_path / "run"
    out.mkdir()
    text = json.dumps(_edited(preset, key, value))
    (out / "config.json").write_text(text)
    for command in (["train", "--out", str(out), "--resume", "--no-progress"], ["report", str(out)]):
        code = main(command)
        assert_refused(code, capsys.readouterr().err, named if command[0] == "train" else str(out))
        assert [p.name for p in out.iterdir()] == ["config.json"] and (out / "config.json").read_text() == text


# whole sections of a hand-edited config.json: (preset, section, its value as JSON or None for
# deleted, what the message must name)
BAD_SECTIONS = [
    ("lego-cpu", "task", None, "no task section"), ("lego-cpu", "task", '["lego"]', "the task section is ['lego']"),
    ("composite-cpu", "model", "[1]", "the model section is [1]"),
    ("composite-cpu", "train", '"x"', "the train section is 'x'"),
    ("templates-cpu", "model", "null", "the model section is None"),
]


@pytest.mark.parametrize(("preset", "section", "value", "named"), BAD_SECTIONS,
                         ids=[f"{p}:{s}={v}" for p, s, v, _ in BAD_SECTIONS])
def test_hand_edited_config_json_section(tmp_path, capsys, preset, section, value, named):
    """A section missing or not an object: exit 2 naming the section and what it must be."""
    data = get_preset(preset).to_dict()
    if value is None:
        del data[section]
    else:
        data[section] = json.loads(value)
    out = tmp_path / "run"
    out.mkdir()
    text = json.dumps(data)
    (out / "config.json").write_text(text)
    code = main(["train", "--out", str(out), "--resume", "--no-progress"])
    err = capsys.readouterr().err
    assert_refused(code, err, named)
    assert "must be a JSON object" in err and str(out / "config.json") in err
    assert [p.name for p in out.iterdir()] == ["config.json"] and (out / "config.json").read_text() == text


SWEEP_VALUES = [row for row in BAD_VALUES if row[0] == "composite-cpu" or row[1].startswith("train.")][:12]


@pytest.mark.parametrize(("preset", "key", "value", "named"), SWEEP_VALUES,
                         ids=[f"{r[0]}:{r[1]}={r[2]}" for r in SWEEP_VALUES])
def test_bad_value_in_a_sweep_grid(tmp_path, capsys, preset, key, value, named):
    out = tmp_path / "sweep"
    grid = f"{key}={value}" if "," in value or value.startswith("[") else f"{key}={_good(preset, key)},{value}"
    code = main(["sweep", "--preset", preset, "--grid", grid, "--out", str(out), "--no-progress"])
    assert_refused(code, capsys.readouterr().err, named)
    assert not out.exists()


def _good(preset: str, key: str) -> str:
    section, field = key.split(".")
    value = get_preset(preset).to_dict()[section][field]
    return json.dumps(value) if not (isinstance(value, float) and math.isfinite(value)) else repr(value)


STUDY_OPTIONS = [
    (["composite-phase", "--scale", "huge"], "'huge'"),
    (["composite-phase", "--scale", "tiny", "--workers", "0"], "--workers 0"),
    (["composite-phase", "--scale", "tiny", "--seeds", "1,1"], "(1, 1)"),
    (["composite-phase", "--scale", "tiny", "--set", "model.init_gamma=-1"], "init_gamma=-1"),
    (["composite-phase", "--scale", "tiny", "--set", "model.norm_position=middle"], "norm_position='middle'"),
    (["composite-mechanism", "--scale", "tiny", "--set", "train.lr=NaN"], "lr=nan"),
    (["lego-extrapolation", "--scale", "tiny", "--set", "model.n_layers=2"], "does not take --set"),
    (["no-such-study", "--scale", "tiny"], "'no-such-study'"),
]


@pytest.mark.parametrize(("options", "named"), STUDY_OPTIONS, ids=[" ".join(o) for o, _ in STUDY_OPTIONS])
def test_bad_study_option(tmp_path, capsys, options, named):
    out = tmp_path / "study"
    code = main(["study", *options, "--out", str(out), "--no-progress"])
    assert_refused(code, capsys.readouterr().err, named)
    assert not out.exists()


def test_the_table_holds_at_least_sixty_bad_inputs():
    assert 2 * len(BAD_VALUES) + len(BAD_SECTIONS) + len(SWEEP_VALUES) + len(STUDY_OPTIONS) >= 60
    assert len({(p, k, v) for p, k, v, _ in BAD_VALUES}) == len(BAD_VALUES)  # no case counted twice


def test_a_size_too_large_for_memory_exits_2_naming_the_sizes_and_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--preset", "composite-cpu", "--out", str(out), "--set", "train.batch_size=1000000000000",
                 "--set", "train.steps=2", "--no-progress"])
    assert_refused(code, capsys.readouterr().err, "train.batch_size=1000000000000")
    assert not out.exists()  # the same --out works again with a smaller size


def test_an_out_folder_that_cannot_be_created_exits_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code = main(["train", "--preset", "composite-cpu", "--out", str(tmp_path / "file" / "run"), "--no-progress"])
    assert_refused(code, capsys.readouterr().err, "cannot be created")


def test_a_model_too_large_for_memory_in_config_json_exits_2_naming_the_sizes(tmp_path, capsys):
    """A hand-edited huge d_model: report and analyze refuse it (exit 2, the sizes named) instead
    of failing on allocation with a traceback; the folder is unchanged."""
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), "--set", "model.d_model=32",
                 "--set", "model.d_mlp=64", "--set", "train.steps=4", "--set", "train.eval_every=2",
                 "--set", "train.eval_size=50", "--no-progress"]) == 0
    data = json.loads((out / "config.json").read_text())
    data["model"]["d_model"] = 10**12
    (out / "config.json").write_text(json.dumps(data))
    before = folder_bytes(out)
    capsys.readouterr()
    for command in (["report", str(out)], ["analyze", str(out), "--samples", "8"]):
        code = main(command)
        err = capsys.readouterr().err
        assert_refused(code, err, "model.d_model=1000000000000")
        assert "memory" in err and str(out / "config.json") in err
    assert folder_bytes(out) == before
