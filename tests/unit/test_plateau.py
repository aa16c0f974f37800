import pytest
import torch

from interp.probes import residual_similarity
from interp.tasks.lego_plateau import hop_pull, parent_element_split
from models.config import ModelConfig
from models.factory import build_model
from tasks import LegoConfig, LegoTask

TASK = LegoTask(LegoConfig(n_vars=5, n_supervised=3))


def test_a_planted_association_head_puts_its_rhs_attention_on_the_parent_clause(gen):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, planted={"1.0": "association"})
    model = build_model(cfg, TASK)
    pull = hop_pull(model, TASK, TASK.sample(64, gen, split="test"), variable=2)
    # RHS of #2 is #1's letter, found at itself and at #1's left-hand token: half on each
    assert pull.attention[1, 1, 0] == pytest.approx(0.5)
    assert pull.attention[0, 1, 0] == 0  # from the LHS, the same letter is itself and the child's RHS
    assert pull.uniform == pytest.approx(1 / TASK.n_ctx)
    assert 0.3 * pull.uniform < pull.attention[:, 0].mean() < 3 * pull.uniform  # learned heads near uniform
    assert torch.isfinite(pull.pull).all() and pull.pull.shape == (2, 2, 2)
    assert all(p.grad is None for p in model.parameters())  # leaves the model as it found it


def test_a_variable_without_a_parent_or_a_short_sentence_is_refused(gen):
    model = build_model(ModelConfig(n_layers=1, d_model=16, n_heads=2), TASK)
    with pytest.raises(ValueError, match="variable=0"):
        hop_pull(model, TASK, TASK.sample(4, gen, split="test"), variable=0)
    short = LegoTask(LegoConfig(n_vars=5, min_vars=1)).sample(64, gen)
    with pytest.raises(ValueError, match="full-length"):
        hop_pull(model, TASK, short, variable=4)


def test_residual_similarity_is_one_when_every_position_holds_the_same_vector(gen):
    model = build_model(ModelConfig(n_layers=1, d_model=16, n_heads=2), TASK)
    tokens = TASK.sample(8, gen, split="test").tokens
    fresh = residual_similarity(model, tokens)
    assert fresh.shape == (2,) and (fresh.abs() < 0.5).all()  # random embeddings: far from parallel
    with torch.no_grad():
        model.embed.W_E[:] = 1.0
        model.pos_embed.W_pos[:] = 0.0
    assert residual_similarity(model, tokens)[0] == pytest.approx(1.0)


@pytest.mark.parametrize("shift, expected", [(0, "1.000"), (1, "0.000")])
def test_mention_accuracy_reads_the_mention_slots_of_the_supervised_variables(monkeypatch, shift, expected):
    from types import SimpleNamespace

    import analyses.research.plateau as plateau

    task = LegoTask(LegoConfig(n_vars=5, n_supervised=3, mention_labels="value"))
    # a model that answers every label slot right (shift 0) or wrong (shift 1, z2)
    monkeypatch.setattr(plateau, "predictions", lambda model, batch: (batch.labels + shift) % 2)
    line = plateau.mention_accuracy(SimpleNamespace(model=None, task=task), n=200, seed=0)[0]
    assert line.startswith("  mention labels (value)")
    assert line.endswith(", ".join(f"#{k} {expected}" for k in range(3)))  # #3 and #4 are not supervised


def test_the_parent_element_split_tells_the_zero_hop_rule_and_guessing_from_the_hop(gen):
    batch = TASK.sample(2000, gen, split="test")
    elements, values = batch.latents["elements"], batch.labels
    # the zero-hop rule, computed independently: #k = x0 + g0 + gk in Z2 (the parent's element left out)
    root = batch.latents["root"]
    zero_hop = (root.unsqueeze(1) + elements[:, :1] + elements) % 2
    zero_hop[:, :2] = values[:, :2]  # #0 and #1 need no hop
    assert (zero_hop[:, 2] == values[:, 2]).float().mean() < 0.6  # a wrong rule, right half the time
    rule = parent_element_split(batch, zero_hop, 2)
    assert rule.identity == 1.0 and rule.other == 0.0 and rule.signal == 0.0
    assert rule.share_identity == pytest.approx((elements[:, 1] == 0).float().mean().item())
    guess = parent_element_split(batch, torch.randint(2, values.shape, generator=gen), 2)
    assert abs(guess.signal) < 0.1 and 0.4 < guess.identity < 0.6
    assert parent_element_split(batch, values, 3).signal == 1.0  # the true answers: the hop
    with pytest.raises(ValueError, match="variable=0"):
        parent_element_split(batch, values, 0)
