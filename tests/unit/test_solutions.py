import pytest
import torch

from interp.tasks.composite import classify_composite, composite_verdict
from interp.tasks.lego_verdict import last_learned_before_middle, learned_steps
from models.config import ModelConfig
from models.factory import build_model
from tasks import CompositeConfig, CompositeTask


@pytest.mark.parametrize(
    ("seen", "inferential", "symmetric", "verdict"),
    [(0.85, 0.9, 0.0, "unlearned"), (0.95, 0.8, 0.1, "inferential"), (0.99, 0.05, 0.93, "symmetric"),
     (0.99, 0.4, 0.4, "mixed")],
)
def test_composite_verdict_rules(seen, inferential, symmetric, verdict):
    assert classify_composite(seen, inferential, symmetric) == verdict


def test_learned_steps_and_the_shortcut_signature():
    metrics = [{"step": 100, "acc_per_var": [0.99, 0.5, 0.5, 0.96]},
               {"step": 200, "acc_per_var": [0.99, 0.97, 0.5, 0.99]},
               {"step": 300, "acc_per_var": [0.99, 0.98, 0.97, 0.99]}]
    steps = learned_steps(metrics, 4)
    assert steps == [100, 200, 300, 100]
    assert last_learned_before_middle(steps) is True
    assert last_learned_before_middle([100, 200, 300, 400]) is False
    assert last_learned_before_middle([100, None, None, None]) is None


def test_composite_verdict_of_a_symmetric_oracle_model():
    """A model that answers what a symmetric solution would, except where the anchor pair ends the
    sequence (there it composes, as our small-init pre-LN models do): verdict symmetric, the
    evidence fields filled, and the rates per key position show where it composes."""
    task = CompositeTask(CompositeConfig())
    model = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=1), task)
    symmetric_shift = task.symmetric_shift
    trained_shift = task.trained_shift

    def oracle(tokens, hook):  # read key and pair off the tokens, answer like the mirror pair
        anchors = task.anchor_mask(tokens)
        first = anchors.int().argmax(-1)
        rows = torch.arange(len(tokens))
        a1, a2, key = tokens[rows, first], tokens[rows, first + 1], tokens[rows, first - 1]
        pair = (a1 - 1) * 4 + (a2 - 1)
        held_shift = torch.where(first + 1 == tokens.shape[1] - 1, task.inferential_shift[pair], symmetric_shift[pair])
        answer = key + torch.where(task.is_held_out[pair], held_shift, trained_shift[pair])
        logits = torch.full((len(tokens), tokens.shape[1], task.d_vocab_out), -10.0)
        logits[rows, -1, answer] = 10.0
        return logits

    state = {}
    model.register_forward_pre_hook(lambda m, args: state.update(tokens=args[0]))
    model.unembed.register_forward_hook(lambda m, args, out: oracle(state["tokens"], None))
    verdict = composite_verdict(model, task, n=200)
    assert verdict.verdict == "symmetric" and verdict.seen_accuracy == 1.0
    assert verdict.held_out_symmetric + verdict.held_out_inferential == pytest.approx(1.0)
    assert verdict.held_out_symmetric > 0.8
    assert len(verdict.attention_flow["last->key"]) == 1 and verdict.cosine_same_target is not None
    last = task.n_key_positions - 1  # the key there puts the pair at the sequence's end
    by_position = verdict.held_out_by_key_position
    assert by_position["symmetric"] == [1.0] * last + [0.0] and by_position["inferential"] == [0.0] * last + [1.0]


def test_parity_rules_name_the_rule_a_scripted_lego_model_follows():
    """A model scripted to answer #0-#2 correctly, then 'root, #0's element, my parent's element
    and mine' (one hop, then stop) and a negated rule for the last: each rule is recovered."""
    from interp.tasks.lego_verdict import lego_parity_rules
    from tasks import LegoConfig, LegoTask, seeded_generator

    task = LegoTask(LegoConfig(n_vars=6, n_supervised=3))
    model = build_model(ModelConfig(n_layers=1, d_model=16, n_heads=1), task)
    batch = task.sample(300, seeded_generator(4), split="test")  # what lego_parity_rules(seed=4) draws
    root, elements = batch.latents["root"], batch.latents["elements"]
    answers = batch.labels.clone()
    for k in (3, 4, 5):
        answers[:, k] = (root + elements[:, 0] + elements[:, k - 1] + elements[:, k]) % 2
    answers[:, 5] = 1 - answers[:, 5]

    def scripted(module, args, out):
        assert torch.equal(state["tokens"], batch.tokens)
        logits = torch.full((*batch.tokens.shape, out.shape[-1]), -10.0)
        rows = torch.arange(len(batch)).unsqueeze(1)
        logits[rows, batch.label_pos, answers] = 10.0
        return logits

    state = {}
    model.register_forward_pre_hook(lambda m, args: state.update(tokens=args[0]))
    model.unembed.register_forward_hook(scripted)
    rules = lego_parity_rules(model, task, n=300, seed=4)
    assert [r.is_true_rule for r in rules] == [True, True, True, False, False, False]
    assert rules[3].terms == ["x0", "g0", "g2", "g3"] and rules[3].agreement == 1.0 and not rules[3].negated
    assert rules[5].negated and rules[5].terms == ["x0", "g0", "g4", "g5"] and rules[5].describe().startswith("not ")
    assert 0.3 < rules[3].accuracy < 0.7  # the one-hop rule is right about half the time on #3
    with pytest.raises(ValueError, match="s3"):
        lego_parity_rules(model, LegoTask(LegoConfig(n_vars=6, group="s3")), n=10)
