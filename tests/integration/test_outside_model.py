"""Issue 28, part 1: any HookedTransformer with the user's own prompt pairs (interp/outside.py).

On a model whose weights are set by hand (a previous-token head feeding an induction head, two
distractor heads nothing reads), exact head patching, path patching and the circuit find the
known heads and edges; a TransformerLens-style one-number metric through `scalar_metric` gives
the built-in metric's numbers; bad inputs fail with messages that say what to fix; the snippet
in docs/outside-models.md runs as written. The notebook analyses/notebooks/04_your_model.py is
run by tests/integration/test_notebooks.py, like every notebook (checked here that it is)."""

from __future__ import annotations

import json
import re
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from interp.outside import PromptPairs, analyze_model
from interp.outside_prompts import scalar_metric
from interp.patching import attribute_head_out, patch_head_out, patch_residual
from interp.paths import check_path_patchable, path_patch
from interp.toy_induction import hand_set_induction_model, induction_prompt_pairs

ROOT = Path(__file__).resolve().parents[2]
HEADS = {"previous": (0, 0), "self": (0, 1), "induction": (1, 0), "first": (1, 1)}


@pytest.fixture(scope="module")
def toy():
    model = hand_set_induction_model()
    pairs = induction_prompt_pairs(12, seed=3)
    return model, pairs, analyze_model(model, pairs)


def tl_mean_logit_diff(pairs: PromptPairs):
    """A metric as TransformerLens tutorials write it: one number, the mean over the batch,
    closing over the answer tokens [batch, 2]."""
    answer_tokens = torch.stack([pairs.answers, pairs.wrong_answers], dim=1)

    def mean_logit_diff(logits):
        last = logits[:, -1, :]
        return (last.gather(-1, answer_tokens[:, :1]) - last.gather(-1, answer_tokens[:, 1:])).mean()

    return mean_logit_diff


def random_model(**options) -> HookedTransformer:
    cfg = dict(n_layers=2, d_model=32, n_heads=2, d_head=8, d_vocab=13, n_ctx=12, act_fn="gelu",
               normalization_type="LN", seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return HookedTransformer(HookedTransformerConfig(**{**cfg, **options}))


TINY_PAIRS = PromptPairs.from_lists([[1, 2, 3, 4, 2]] * 2, [[1, 5, 3, 4, 5]] * 2, [3, 6], [7, 8])
WORDS = ["<bos>", "When", " Mary", " and", " John", " went", " to", " the", " store", ",", " gave", " a", " drink"]


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    """A random 2-layer model with LayerNorm and MLPs and a real (offline, word-level) HF tokenizer."""
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<bos>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(pattern=" ", behavior="merged_with_next")
    folder = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<bos>", pad_token="<bos>",
                            unk_token="<bos>").save_pretrained(folder)
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_heads=2, d_head=8, d_vocab=len(WORDS), n_ctx=16,
                                  act_fn="gelu", normalization_type="LN", seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return HookedTransformer(cfg, tokenizer=PreTrainedTokenizerFast.from_pretrained(folder))


IOI = (["When Mary and John went to the store, John gave a drink to",
        "When John and Mary went to the store, Mary gave a drink to"],
       ["When Mary and John went to the store, Mary gave a drink to",
        "When John and Mary went to the store, John gave a drink to"],
       [" Mary", " John"], [" John", " Mary"])


# ---------------------------------------------------------------------------------------------
# The known circuit


def test_exact_head_patching_finds_the_known_heads(toy):
    _, _, analysis = toy
    heads = analysis.patching.heads.values
    assert heads[HEADS["previous"]] == pytest.approx(1.0, abs=1e-3)  # the previous-token head carries it all
    assert heads[HEADS["induction"]] == pytest.approx(1.0, abs=1e-3)  # and so does the induction head it feeds
    assert heads[HEADS["self"]].abs() < 1e-4 and heads[HEADS["first"]].abs() < 1e-4  # distractors: nothing reads them
    # the residual stream: the swapped tokens (positions 1 and 4) going in, then where L0H0 moved them (2 and 5)
    residual = analysis.patching.residual.values
    assert set(residual[0].abs().gt(0.1).nonzero().flatten().tolist()) == {1, 4}
    assert set(residual[1].abs().gt(0.1).nonzero().flatten().tolist()) == {2, 5}


def test_path_patching_and_the_circuit_find_the_known_edges(toy):
    _, _, analysis = toy
    patching = analysis.patching
    assert patching.paths_refused is None
    strongest = patching.paths.strongest(3)
    assert {(s, r) for s, r, _ in strongest[:2]} == {("L0H0", "L1H0.k"), ("L1H0", "logits")}
    assert all(v == pytest.approx(1.0, abs=1e-3) for _, _, v in strongest[:2]) and abs(strongest[2][2]) < 1e-3
    circuit = patching.circuit
    assert sorted(circuit.nodes) == ["L0H0", "L1H0"] and circuit.faithfulness == pytest.approx(1.0, abs=1e-3)
    assert {(s, r) for s, r, _ in circuit.edges} == {("L0H0", "L1H0.k"), ("L1H0", "logits")}
    assert circuit.edge_faithfulness == pytest.approx(1.0, abs=1e-3)


def test_head_scores_label_the_hand_set_heads(toy):
    _, _, analysis = toy
    labels = analysis.heads.labels
    for kind, (layer, head) in HEADS.items():
        assert labels[layer][head] == kind
        assert analysis.heads.score(kind)[layer, head] > 0.95


def test_to_dict_is_json_and_the_report_is_offline(toy, tmp_path):
    _, pairs, analysis = toy
    written = json.loads(json.dumps(analysis.to_dict(), allow_nan=False))
    assert written["pairs"][0]["clean"] == pairs.token_strings(pairs.clean[0])
    assert written["patching"]["paths"]["circuit"]["nodes"] == analysis.patching.circuit.nodes
    page = analysis.write_report(tmp_path / "deep" / "report.html").read_text()
    for piece in ("CircuitsVis.AttentionHeads", "data:image/png;base64,", "<svg", "L1H0", "Head scores",
                  "Path patching"):
        assert piece in page
    assert not re.search(r"<script[^>]+src=", page) and "<link" not in page  # nothing fetched from elsewhere
    assert "Thresholds: previous: 0.50; self: 0.50;" in page  # as text, not as a JSON dict


# ---------------------------------------------------------------------------------------------
# Metrics


def test_a_scalar_metric_is_refused_and_the_wrapper_gives_the_builtin_numbers(toy):
    model, pairs, analysis = toy
    scalar = tl_mean_logit_diff(pairs)
    with pytest.raises(ValueError, match="one value per pair"):  # the project's functions refuse it
        patch_head_out(model, pairs.clean, pairs.corrupted, scalar)
    with pytest.raises(ValueError, match=r"scalar_metric\(fn\)"):  # analyze_model says how to wrap it
        analyze_model(model, pairs, metric=scalar)
    wrapped = analyze_model(model, pairs, metric=scalar_metric(scalar, n_pairs=len(pairs)))
    for name in ("heads", "residual"):
        ours, builtin = getattr(wrapped.patching, name), getattr(analysis.patching, name)
        torch.testing.assert_close(ours.raw, builtin.raw, atol=1e-5, rtol=1e-5)
        assert ours.clean_metric == pytest.approx(builtin.clean_metric, abs=1e-5)
    torch.testing.assert_close(wrapped.patching.paths.edges_raw.nan_to_num(),
                               analysis.patching.paths.edges_raw.nan_to_num(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wrapped.patching.estimates["atp"].estimate.raw,
                               analysis.patching.estimates["atp"].estimate.raw, atol=1e-5, rtol=1e-5)
    assert wrapped.patching.circuit.nodes == analysis.patching.circuit.nodes


def test_the_wrapper_matches_on_a_model_with_norms_mlps_and_a_tokenizer(word_model):
    """LayerNorm and MLPs: the built-in metric takes the narrowed last-block path, the wrapped one the full run."""
    pairs = PromptPairs.from_lists(*IOI, model=word_model)
    assert pairs.clean.shape == (2, 14) and pairs.clean[0, 0] == 0  # prepended BOS, as the model defaults to
    assert pairs.answers.tolist() == [WORDS.index(" Mary"), WORDS.index(" John")]
    args = (word_model, pairs.clean, pairs.corrupted)
    builtin, wrapped = pairs.logit_diff(), scalar_metric(tl_mean_logit_diff(pairs))
    for sweep in (patch_head_out, patch_residual, attribute_head_out):
        torch.testing.assert_close(sweep(*args, wrapped).raw, sweep(*args, builtin).raw, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(path_patch(*args, wrapped).edges_raw.nan_to_num(),
                               path_patch(*args, builtin).edges_raw.nan_to_num(), atol=1e-5, rtol=1e-5)
    analysis = analyze_model(word_model, pairs)
    assert analysis.to_dict()["pairs"][0]["answer"] == " Mary"
    assert analysis.to_dict()["heads"]["scores"]["induction"] is not None  # " John" repeats: induction queries exist


# ---------------------------------------------------------------------------------------------
# Refused options and bad inputs


def test_a_refused_option_is_named_and_everything_else_still_runs():
    """A norm after attention as well as before: path patching would give wrong numbers
    (tests/unit/test_model_options.py), so it is refused by name; the report says why there are
    no edges, and every other analysis runs."""
    model = random_model(normalization_type="RMS", use_normalization_before_and_after=True)
    with pytest.raises(ValueError, match="use_normalization_before_and_after"):
        check_path_patchable(model)
    analysis = analyze_model(model, TINY_PAIRS)
    assert analysis.patching.paths is None and "use_normalization_before_and_after" in analysis.patching.paths_refused
    assert analysis.patching.circuit.edges == [] and analysis.patching.heads.values.shape == (2, 2)
    assert "Not computed: path patching refuses use_normalization_before_and_after=True" in analysis.report().to_html()


@pytest.mark.parametrize("options", [{"n_key_value_heads": 1}, {"positional_embedding_type": "shortformer"},
                                     {"parallel_attn_mlp": True}], ids=lambda options: next(iter(options)))
def test_options_that_path_patching_handles_get_edges(options):
    """Grouped key/value heads, shortformer positions and parallel attention and MLP: path
    patching and edge ablation equal their slow references there (tests/unit/test_model_options.py)."""
    analysis = analyze_model(random_model(**options), TINY_PAIRS)
    assert analysis.patching.paths_refused is None and analysis.patching.paths is not None
    assert analysis.patching.circuit.n_edges > 0


def test_hand_set_model_accepts_ids_and_vocab_strings_alike():
    model = hand_set_induction_model()
    by_ids = PromptPairs.from_lists([[7, 0, 1, 2, 3, 4, 5, 0]], [[7, 3, 1, 2, 0, 4, 5, 0]], [1], [4], model=model)
    by_names = PromptPairs.from_lists(["h a b c d e f a"], ["h d b c a e f a"], ["b"], ["e"], model=model,
                                      vocab=list("abcdefghij"))
    assert torch.equal(by_ids.clean, by_names.clean) and torch.equal(by_ids.corrupted, by_names.corrupted)
    assert by_names.token_strings(by_names.clean[0])[:3] == ["h", "a", "b"]


VOCAB = list("abcdefghij")


@pytest.mark.parametrize("lists, options, message", [
    ((["a b"], ["a c", "b c"], ["b"], ["c"]), {"vocab": VOCAB}, r"the lists differ in length \(clean: 1, corrupted: 2"),
    (([], [], [], []), {}, "no prompt pairs"),
    ((["a b c"], ["a b"], ["b"], ["c"]), {"vocab": VOCAB},
     "pair 0: the clean prompt has 3 tokens and the corrupted one 2"),
    ((["a b", "a b c"], ["a c", "a c d"], ["b", "c"], ["c", "d"]), {"vocab": VOCAB},
     "pair 1 has 3 tokens but pair 0 has 2; every prompt must have the same number of tokens"),
    ((["a b"], ["a c"], ["b"], ["b"]), {"vocab": VOCAB}, "same answer and wrong answer"),
    ((["a zz"], ["a c"], ["b"], ["c"]), {"vocab": VOCAB}, r"pair 0, clean prompt: \['zz'\] not in vocab"),
    ((["a b"], ["a c"], ["b"], ["c"]), {}, "no tokenizer .* and no vocab; give token ids"),
    (([[1, 2]], [[1, 3]], [2], [3.0]), {}, "pair 0, wrong_answer must be a string .* or a token id, not float"),
    (([[1, 2]], [[1, 2.5]], [2], [3]), {}, "pair 0, corrupted prompt must be a string or a list of token ids"),
    (([[1, 2]], [[1, 3]], [-2], [3]), {}, "negative token id"),
    (([[1, 2, 11]], [[1, 3, 2]], [2], [3]), {"model": "toy"},
     r"clean\[0, 2\] is token 11, outside the model's vocabulary 0..9"),
    (([[1, 2]], [[1, 3]], [2], [10]), {"model": "toy"}, r"wrong_answers\[0\] is token 10, outside .* 0..9"),
    (([[1] * 9], [[2] * 9], [2], [3]), {"model": "toy"},
     "the prompts have 9 tokens but the model's context is n_ctx=8"),
])
def test_bad_pairs_are_refused_with_clear_messages(lists, options, message):
    if options.get("model") == "toy":
        options = {**options, "model": hand_set_induction_model()}
    with pytest.raises(ValueError, match=message):
        PromptPairs.from_lists(*lists, **options)


def test_bad_tokenizer_answers_json_files_and_metrics(word_model, tmp_path, toy):
    with pytest.raises(ValueError, match=r"pair 0, answer: ' Mary and' is 2 tokens .*an answer must be one token"):
        PromptPairs.from_lists(IOI[0][:1], IOI[1][:1], [" Mary and"], [" John"], model=word_model)
    too_long = " ".join(["When Mary"] * 9)  # 19 tokens with BOS; the tokenizer must not cut it to n_ctx=16
    with pytest.raises(ValueError, match="the prompts have 19 tokens but the model's context is n_ctx=16"):
        PromptPairs.from_lists([too_long], [too_long.replace("Mary", "John")], [" Mary"], [" John"], model=word_model)
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps({"pairs": [{"clean": [1, 2], "corrupted": [1, 3], "answer": 2}]}))
    with pytest.raises(ValueError, match=r"pairs.json: pair 0 lacks \['wrong_answer'\]"):
        PromptPairs.from_json(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="pairs.json is not JSON"):
        PromptPairs.from_json(path)
    path.write_text(json.dumps([{"clean": [1, 2], "corrupted": [1, 3, 4], "answer": 2, "wrong_answer": 3}]))
    with pytest.raises(ValueError, match="pairs.json: pair 0: the clean prompt has 2 tokens and the corrupted one 3"):
        PromptPairs.from_json(path)
    model, pairs, _ = toy
    with pytest.raises(ValueError, match=r"returned shape \(12, 8\); it must return one value per pair, shape \(12,\)"):
        analyze_model(model, pairs, metric=lambda logits: logits[:, :, 0])
    with pytest.raises(ValueError, match="return a tensor"):
        analyze_model(model, pairs, metric=scalar_metric(lambda logits: logits.mean().item()))
    with pytest.raises(ValueError, match="wrapped for 3 pairs but got logits for 12"):
        analyze_model(model, pairs, metric=scalar_metric(tl_mean_logit_diff(pairs), n_pairs=3))
    with pytest.raises(ValueError, match="integer tensor of token ids, not a torch.float32 tensor"):
        PromptPairs(pairs.clean.float(), pairs.corrupted, pairs.answers, pairs.wrong_answers)


# ---------------------------------------------------------------------------------------------
# The docs and the notebook


def test_the_docs_snippet_runs_as_written(monkeypatch, tmp_path, capsys):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "outside-models.md").read_text(), re.S)
    assert len(blocks) == 1, "docs/outside-models.md should hold exactly one runnable ```python block"
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its temporary folder lands under pytest's
    exec(compile(blocks[0], "docs/outside-models.md", "exec"), {"__name__": "__docs__"})
    printed = capsys.readouterr().out
    assert "circuit: ['L0H0', 'L1H0']" in printed and "report:" in printed
    assert list(tmp_path.rglob("report.html")) and list(tmp_path.rglob("analysis.json"))


def test_the_notebook_is_among_those_the_notebook_suite_runs():
    from tests.integration.test_notebooks import NOTEBOOKS

    assert ROOT / "analyses" / "notebooks" / "04_your_model.py" in NOTEBOOKS


def test_the_induction_threshold_is_the_measured_midpoint_between_random_heads_and_a_hand_set_one():
    from interp.outside import OUTSIDE_THRESHOLDS
    from interp.toy_induction import calibrate_induction

    measured = calibrate_induction()
    assert measured["random_max"] < OUTSIDE_THRESHOLDS["induction"] < measured["hand_set"]
    assert measured["threshold"] == OUTSIDE_THRESHOLDS["induction"]


def test_a_model_with_nan_weights_is_analysed_and_said_to_be_undefined(tmp_path, capsys):
    """analyze-model on a model whose weights hold NaN writes its analysis and report (exit 0, not
    an unexpected error), and says in both and on stdout which weights, and that every number is undefined."""
    from analyses.cli import main

    factory = tmp_path / "nan_model.py"
    factory.write_text("import runpy, torch\n"
                       f"build_induction = runpy.run_path({str(ROOT / 'analyses' / 'examples' / 'induction.py')!r})"
                       "['build']\n"
                       "def build():\n    model = build_induction()\n"
                       "    with torch.no_grad():\n        model.embed.W_E.fill_(float('nan'))\n    return model\n")
    out = tmp_path / "out"
    assert main(["analyze-model", "--model", f"{factory}:build", "--prompts",
                 str(ROOT / "analyses" / "examples" / "induction_pairs.json"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("warning: the model's weights hold NaN or infinity (1 tensors: embed.W_E)")
    assert json.loads((out / "analysis.json").read_text())["model"]["non_finite_weights"] == ["embed.W_E"]
    assert "every number measured on it is undefined" in (out / "report.html").read_text()
