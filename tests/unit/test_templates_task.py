import pytest
import torch

from models.config import RunConfig
from models.factory import build_model
from tasks import ConfigError, TemplatesConfig, TemplatesTask, make_task, seeded_generator

SMALL = {"n_train_symbols": 20, "n_val_symbols": 8, "n_test_symbols": 12}


def task(template: str, **kw) -> TemplatesTask:
    return TemplatesTask(TemplatesConfig(template=template, **{**SMALL, **kw}))


def reference_label(text: str) -> str:
    """Solve a decoded template string the obvious way."""
    words = text.split()
    if len(words) == 2:
        return "1" if words[0] == words[1] else "0"
    bindings = dict(clause.split()[::2] for clause in " ".join(words[:-2]).split(";") if clause.strip())
    return bindings[words[-1]]


@pytest.mark.parametrize("template", ["same_different", "binding", "copy"])
def test_labels_match_the_decoded_strings(template, gen):
    t = task(template, n_vars=3 if template != "same_different" else 2)
    batch = t.sample(64, gen, split="test")
    for text, label in zip(t.decode(batch.tokens), batch.labels[:, 0].tolist()):
        assert t.vocab[label] == reference_label(text)
    assert (batch.label_pos[:, 0] == t.n_ctx - 1).all() and batch.tokens.shape[1] == t.n_ctx


@pytest.mark.parametrize("template", ["same_different", "binding", "copy"])
def test_splits_draw_from_disjoint_alphabets_and_fill_wildcards_with_distinct_symbols(template, gen):
    t = task(template, n_vars=3 if template != "same_different" else 2)
    seen = {}
    for split in ("train", "val", "test"):
        batch = t.sample(200, gen, split=split)
        symbols = batch.latents["symbols"]
        assert all(len(set(row)) == len(row) for row in symbols.tolist())
        seen[split] = set(symbols.flatten().tolist())
        start, size = t.alphabet[split]
        assert all(start <= s < start + size for s in seen[split])
    assert not (seen["train"] & seen["test"]) and not (seen["train"] & seen["val"]) and not (seen["val"] & seen["test"])


def test_same_different_is_balanced_and_seeded():
    t = task("same_different")
    a, b = t.sample(2000, seeded_generator(3)), t.sample(2000, seeded_generator(3))
    assert torch.equal(a.tokens, b.tokens)
    assert 0.45 < a.latents["same"].float().mean().item() < 0.55


@pytest.mark.parametrize(("template", "change"), [("same_different", "label"), ("binding", "label"),
                                                  ("copy", "label"), ("copy", "query"), ("binding", "query")])
def test_corrupt_changes_the_labels_it_says_it_changes(template, change, gen):
    t = task(template, n_vars=3 if template != "same_different" else 2)
    clean = t.sample(200, gen, split="test")
    twin, changed = t.corrupt(clean, seeded_generator(5), change=change)
    assert torch.equal(changed, twin.labels != clean.labels)
    if (template, change) != ("binding", "query"):  # a binding query change keeps equal values
        assert changed.all()
    else:
        assert 0.2 < changed.float().mean() < 0.8
    for text, label in zip(t.decode(twin.tokens), twin.labels[:, 0].tolist()):
        assert t.vocab[label] == reference_label(text)
    assert torch.equal(twin.label_pos, clean.label_pos)
    start, size = t.alphabet["test"]
    symbols = twin.tokens[t.symbol_mask(twin.tokens)]
    assert ((symbols >= start) & (symbols < start + size)).all()  # the twin keeps to its alphabet
    if change == "label" and template == "copy":
        assert all(len(set(row)) == len(row) for row in twin.latents["symbols"].tolist())


def test_config_errors_name_the_value():
    with pytest.raises(ConfigError, match="n_test_symbols=3"):
        TemplatesConfig(template="copy", n_vars=2, n_test_symbols=3)
    with pytest.raises(ConfigError, match="template='nope'"):
        TemplatesConfig(template="nope")
    with pytest.raises(ValueError, match="change='query'"):
        task("same_different").corrupt(task("same_different").sample(4, seeded_generator(0)), seeded_generator(0),
                                       "query")


def test_registered_and_buildable_as_a_causal_model_with_fixed_embeddings(gen):
    cfg = RunConfig.from_dict({"task": {"name": "templates", "template": "copy", "n_vars": 1, **SMALL},
                               "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "fixed_embeddings": True}})
    t = make_task(cfg.task)
    model = build_model(cfg.model, t)
    assert model.cfg.attention_dir == "causal" and model.cfg.d_vocab_out == t.d_vocab == len(t.vocab)
    assert torch.equal(model.unembed.W_U, model.embed.W_E.T)
    logits = model(t.sample(8, gen).tokens)
    logits.sum().backward()
    assert model.embed.W_E.grad is None and model.unembed.W_U.grad is None  # fixed: never trained
    assert model.blocks[0].attn.W_Q.grad is not None
