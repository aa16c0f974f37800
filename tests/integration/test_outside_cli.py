"""`workbench analyze-model` (issue 28, part 1): interp/outside.py's analysis from the command
line, on a model that a user's function returns and prompt pairs in a JSON file.

The command docs/outside-models.md shows runs as written on the shipped example and finds the
hand-set circuit (L0H0 -> L1H0's key, L1H0 -> logits); every bad input (spec, factory, return
value, pairs file, --out) exits 2 with a message naming the problem and writes nothing."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import torch

from analyses.cli import main
from analyses.examples.induction import PAIRS_FILE, pairs_json, pairs_spec
from models.runs import CONFIG
from tests.helpers import no_hang

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "outside-models.md"
EXAMPLE = "analyses/examples/induction.py:build"
EXAMPLE_PAIRS = "analyses/examples/induction_pairs.json"


def docs_command() -> list[str]:
    """The analyze-model command of docs/outside-models.md, as argv after `workbench`."""
    [line] = [line for line in DOC.read_text().splitlines() if line.startswith(".venv/bin/workbench analyze-model")]
    return shlex.split(line)[1:]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with no_hang(120):  # a FIFO read that blocks fails the test instead of hanging the suite
        code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_docs_command_finds_the_known_circuit(monkeypatch, tmp_path, capsys):
    argv = docs_command()
    assert argv == ["analyze-model", "--model", EXAMPLE, "--prompts", EXAMPLE_PAIRS, "--out", "runs/induction"]
    monkeypatch.chdir(ROOT)  # the paths are relative to the repository root, as from a fresh clone
    out = tmp_path / "induction"
    code, printed, err = run([*argv[:-1], str(out)], capsys)
    assert code == 0, err
    assert "circuit: L0H0, L1H0 (faithfulness 1.0); edges: L0H0 -> L1H0.k, L1H0 -> logits" in printed
    assert sorted(p.name for p in out.iterdir()) == ["analysis.json", "report.html"]
    written = json.loads((out / "analysis.json").read_text())
    circuit = written["patching"]["paths"]["circuit"]
    assert sorted(circuit["nodes"]) == ["L0H0", "L1H0"] and circuit["faithfulness"] == pytest.approx(1.0, abs=1e-3)
    assert {(s, r) for s, r, _ in circuit["edges"]} == {("L0H0", "L1H0.k"), ("L1H0", "logits")}
    assert written["heads"]["labels"] == [["previous", "self"], ["induction", "first"]]
    assert len(written["pairs"]) == 16 and written["pairs"][0]["answer"] == pairs_spec()["pairs"][0]["answer"]
    page = (out / "report.html").read_text()
    assert "CircuitsVis.AttentionHeads" in page and "Path patching" in page and EXAMPLE in page


def test_a_module_spec_works_and_a_second_run_replaces_the_first(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "again"
    argv = ["analyze-model", "--model", "analyses.examples.induction:build", "--prompts", EXAMPLE_PAIRS,
            "--out", str(out)]
    assert run(argv, capsys)[0] == 0
    (out / "analysis.json").write_text("{}")
    code, printed, _ = run(argv, capsys)
    assert code == 0 and "circuit: L0H0, L1H0" in printed
    assert json.loads((out / "analysis.json").read_text())["pairs"]


def test_the_example_pairs_file_is_what_its_module_writes():
    assert PAIRS_FILE == ROOT / EXAMPLE_PAIRS
    assert PAIRS_FILE.read_text() == pairs_json(pairs_spec())  # rewrite: python analyses/examples/induction.py


# ---------------------------------------------------------------------------------------------
# Bad inputs: exit 2, a message naming the problem, nothing written

FACTORIES = """
from interp.toy_induction import hand_set_induction_model
not_a_function = 3
def build():
    return hand_set_induction_model()
def broken():
    raise RuntimeError("the checkpoint is missing")
def a_dict():
    return {"weights": 1}
def exits():
    import sys
    sys.exit(0)
"""
GOOD_PAIR = {"clean": "h a b c d e f a", "corrupted": "h d b c a e f a", "answer": "b", "wrong_answer": "e"}
VOCAB = list("abcdefghij")


def pairs_text(*pairs: dict, **top) -> str:
    return json.dumps({"vocab": VOCAB, "pairs": list(pairs), **top})


# (--model, the pairs file's text, what stderr must say); {dir} is the test's folder
BAD = {
    "no colon": ("factories.py", None, r"--model '.*factories.py' is not FILE.py:FUNCTION or package.module:FUNCTION"),
    "empty function": ("factories.py:", None, "is not FILE.py:FUNCTION"),
    "no such file": ("missing.py:build", None, r"missing.py does not exist"),
    "a folder": ("{dir}/:build", None, "is a folder, not a file"),
    "no such module": ("no_such_package.models:build", None, "no module named 'no_such_package'"),
    "no such function": ("factories.py:bulid", None,
                         r"has no 'bulid'; it defines \['a_dict', 'broken', 'build', 'exits'\]"),
    "not a function": ("factories.py:not_a_function", None, r"not_a_function is not a function \(it is int\)"),
    "factory raises": ("factories.py:broken", None,
                       r"calling broken\(\) failed \(RuntimeError: the checkpoint is missing\)"),
    "not a HookedTransformer": ("factories.py:a_dict", None,
                                r"a_dict\(\) returned builtins.dict, not a transformer_lens "
                                "HookedTransformer"),
    "syntax error": ("syntax.py:build", None, r"importing .*syntax.py failed \(SyntaxError"),
    # issue 43: user code that exits would end the workbench with its own status (0 included)
    "factory exits": ("factories.py:exits", None,
                      r"calling exits\(\) called sys.exit\(0\); a model factory must return"),
    "module exits": ("exits.py:build", None, r"importing .*exits.py called sys.exit\(5\)"),
    "prompts a FIFO": (None, "FIFO", r"--prompts .*pairs.json is a FIFO \(named pipe\), not a regular file"),
    "no pairs file": (None, "MISSING", r"--prompts .*pairs.json does not exist"),
    "bad JSON": (None, "{not json", r"--prompts .*pairs.json is not JSON"),
    "repeated key": (None, '{"pairs": [], "pairs": []}', r"pairs.json repeats the key 'pairs'"),
    "not an object": (None, '"pairs"', r"pairs.json: expected an object with a list \"pairs\""),
    "missing field": (None, pairs_text({k: v for k, v in GOOD_PAIR.items() if k != "wrong_answer"}),
                      r"pairs.json: pair 0 lacks \['wrong_answer'\]"),
    "unknown key": (None, pairs_text(GOOD_PAIR, prepend_BOS=True),
                    r"the top-level object has key\(s\) \['prepend_BOS'\]"),
    "unknown pair key": (None, pairs_text(GOOD_PAIR, {**GOOD_PAIR, "wrong": "c"}), r"pair 1 has key\(s\) \['wrong'\]"),
    "bad prepend_bos": (None, pairs_text(GOOD_PAIR, prepend_bos="yes"),
                        r"\"prepend_bos\" is 'yes'; use true, false or null"),
    "no pairs": (None, pairs_text(), "no prompt pairs"),
    "token id out of vocab": (None, json.dumps([{"clean": [7, 0, 1, 12], "corrupted": [7, 3, 1, 0], "answer": 1,
                                                 "wrong_answer": 4}]),
                              r"pairs.json: PromptPairs.clean\[0, 3\] is token 12, outside the model's vocabulary 0..9 "
                              r"\(d_vocab\): the clean prompt of pair 0, position 3"),
    "answer id out of vocab": (None, json.dumps([{"clean": [7, 0, 1, 0], "corrupted": [7, 3, 1, 0], "answer": 1,
                                                  "wrong_answer": 10}]),
                               r"wrong_answers\[0\] is token 10, .*: the wrong_answer of pair 0"),
    "name not in vocab": (None, pairs_text({**GOOD_PAIR, "clean": "h a b c d e f z"}),
                          r"pair 0, clean prompt: \['z'\] not in vocab"),
    "strings without a tokenizer": (None, json.dumps([GOOD_PAIR]), "no tokenizer .* and no vocab; give token ids"),
    "too long": (None, pairs_text({**GOOD_PAIR, "clean": "h a b c d e f a b", "corrupted": "h d b c a e f a b"}),
                 "the prompts have 9 tokens but the model's context is n_ctx=8"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_inputs_exit_2_naming_the_problem_and_write_nothing(case, tmp_path, capsys, monkeypatch):
    spec, text, message = BAD[case]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "factories.py").write_text(FACTORIES)
    (tmp_path / "syntax.py").write_text("def build(:\n")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(5)\n")
    (tmp_path / "pairs.json").write_text(pairs_text(GOOD_PAIR) if text is None else text)
    if text in ("MISSING", "FIFO"):
        (tmp_path / "pairs.json").unlink()
    if text == "FIFO":
        os.mkfifo(tmp_path / "pairs.json")
    spec = (spec or "factories.py:build").replace("{dir}", str(tmp_path))
    out = tmp_path / "out"
    code, _, err = run(["analyze-model", "--model", spec, "--prompts", "pairs.json", "--out", str(out)], capsys)
    assert code == 2, err
    assert re.search(message, err), err
    assert err.count("\n") == 1 and "Traceback" not in err  # one line, no traceback
    assert not out.exists()


def test_debug_prints_the_traceback_of_the_users_code(tmp_path, capsys):
    (tmp_path / "factories.py").write_text(FACTORIES)
    (tmp_path / "pairs.json").write_text(pairs_text(GOOD_PAIR))
    code, _, err = run(["--debug", "analyze-model", "--model", f"{tmp_path}/factories.py:broken", "--prompts",
                        str(tmp_path / "pairs.json"), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "Traceback" in err and 'raise RuntimeError("the checkpoint is missing")' in err


@pytest.mark.parametrize("case", ["a training run", "other files", "a file"])
def test_an_out_folder_that_is_not_its_own_is_refused_untouched(case, tmp_path, capsys):
    out = tmp_path / "out"
    if case == "a file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / (CONFIG if case == "a training run" else "notes.txt")).write_text("mine")
        (out / "analysis.json").write_text("mine")
    before = {p: p.read_bytes() for p in [out, *out.rglob("*")] if p.is_file()}
    code, _, err = run(["analyze-model", "--model", str(ROOT / EXAMPLE), "--prompts", str(ROOT / EXAMPLE_PAIRS),
                        "--out", str(out)], capsys)
    assert code == 2 and f"--out {out}" in err
    assert {p: p.read_bytes() for p in [out, *out.rglob("*")] if p.is_file()} == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_without_a_gpu_is_refused_before_anything_runs(tmp_path, capsys):
    code, _, err = run(["analyze-model", "--model", str(ROOT / EXAMPLE), "--prompts", str(ROOT / EXAMPLE_PAIRS),
                        "--out", str(tmp_path / "out"), "--device", "cuda"], capsys)
    assert code == 2 and "analyze-model --device='cuda' but no CUDA device" in err and not (tmp_path / "out").exists()
