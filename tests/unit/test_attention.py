import pytest
import torch

from interp.attention import (
    DEFAULT_THRESHOLDS,
    HEAD_KINDS,
    MIN_ROLE_QUERIES,
    best_role_mass,
    calibrate_thresholds,
    classify_heads,
    label_heads,
    parent_targets,
    relative_mass,
    segment_roles,
)
from models.config import ModelConfig
from models.factory import build_model
from models.planted import PLANTED_KINDS, planted_pattern
from tasks import CompositeConfig, CompositeTask, ConfigError, LegoConfig, LegoTask, seeded_generator
from tasks.templates import TemplatesConfig, TemplatesTask

LEGO = LegoTask(LegoConfig(n_vars=6, n_supervised=3))
LEGO_S3 = LegoTask(LegoConfig(n_vars=8, group="s3", n_supervised=3))
LAYOUTS = [{"*.0": "association", "*.1": "manipulation"},
           {"0.2": "association", "1.0": "manipulation", "1.3": "broadcast", "0.1": "previous", "1.2": "self"},
           {"1.1": "association", "0.3": "manipulation", "0.0": "self", "1.0": "broadcast"}]


@pytest.mark.parametrize("task", [LEGO, LEGO_S3], ids=["z2", "s3"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_planted_head_gets_its_label(task, layout, seed):
    model = build_model(ModelConfig(n_layers=2, d_model=32, n_heads=4, planted=layout), task, seed=seed)
    tokens = task.sample(64, seeded_generator(seed), split="test").tokens
    labels = classify_heads(model, task, tokens).labels
    for layer, heads in model.planted_plan.items():
        for head, kind in heads.items():
            assert labels[layer][head] == kind, (layer, head, kind)


COMPOSITE = CompositeTask(CompositeConfig())


class OneSegment:
    """A task whose one segment is the whole sequence (as in a sum `a + b =`): the composite task
    with its segments merged."""

    def __init__(self, task):
        self.task = task

    def __getattr__(self, name):
        return getattr(self.task, name)

    def segment_ids(self, tokens):
        return torch.zeros_like(tokens)


SHORT_TASKS = [OneSegment(COMPOSITE), COMPOSITE, TemplatesTask(TemplatesConfig())]


@pytest.mark.parametrize("task", [LEGO, LEGO_S3, COMPOSITE], ids=["z2", "s3", "composite"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_heads_are_never_given_a_hop_kind(task, seed):
    model = build_model(ModelConfig(n_layers=4, d_model=64, n_heads=4), task, seed=seed)
    scores = classify_heads(model, task, task.sample(64, seeded_generator(seed), split="test").tokens)
    assert not any(scores.heads_labelled(kind) for kind in ("association", "parent", "manipulation"))


@pytest.mark.parametrize("task", SHORT_TASKS, ids=["one-segment", "composite", "templates"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_where_segments_are_no_repeated_clauses_roles_change_nothing(task, seed):
    """One segment over the whole sequence, composite's one 3-token segment among single tokens,
    templates' single tokens: scored by offset, a role would be one position (or hold one
    position per sequence), so they are scored over all queries, as without roles."""
    model = build_model(ModelConfig(n_layers=4, d_model=64, n_heads=4), task, seed=seed)
    tokens = task.sample(64, seeded_generator(seed), split="test").tokens
    by_role, plain = (classify_heads(model, task, tokens, by_role=flag) for flag in (True, False))
    assert torch.equal(by_role.scores, plain.scores) and by_role.labels == plain.labels
    assert not by_role.heads_labelled("parent")


def test_a_planted_previous_token_head_is_labelled_previous_on_a_one_segment_task():
    task = OneSegment(COMPOSITE)
    model = build_model(ModelConfig(n_layers=2, d_model=32, n_heads=4, planted={"1.0": "previous"}), task)
    labels = classify_heads(model, task, task.sample(64, seeded_generator(0), split="test").tokens).labels
    assert labels[1][0] == "previous"


def test_roles_are_clause_offsets_where_clauses_repeat_and_nothing_where_one_segment_is_everything(gen):
    tokens = LEGO.sample(8, gen, split="test").tokens
    roles = segment_roles(tokens, LEGO)
    assert roles[:, 1:6].tolist() == [[0, 1, 2, 3, 4]] * 8  # lhs = g rhs ;
    one = OneSegment(COMPOSITE)
    assert (segment_roles(one.sample(8, gen).tokens, one) == 0).all()


def test_parent_targets_lead_from_a_clause_to_the_clause_defining_its_right_hand_variable():
    batch = LEGO.sample(4, seeded_generator(0), split="test")
    parent, depth = parent_targets(batch.tokens, LEGO), batch.latents["depth"]  # depth: the chain depth per position
    in_clause = depth >= 0
    expected = (depth.unsqueeze(2) == depth.unsqueeze(1) + 1) & in_clause.unsqueeze(1) & in_clause.unsqueeze(2)
    assert torch.equal(parent, expected)  # every position of #k to all of #k-1; #0 reads the root value, no clause


def test_a_role_with_too_few_queries_falls_back_to_all_queries():
    patterns = torch.rand(1, 2, 1, 4, 4).softmax(-1)
    targets = torch.eye(4, dtype=torch.bool).roll(1, 1).expand(2, -1, -1)
    queries, n_keys = torch.ones(2, 4, dtype=torch.bool), torch.full((2, 4), 4)
    roles = torch.arange(4).expand(2, -1)  # 2 queries per role, fewer than MIN_ROLE_QUERIES
    assert MIN_ROLE_QUERIES > 2
    assert torch.equal(best_role_mass(patterns, targets, queries, n_keys, roles),
                       relative_mass(patterns, targets, queries, n_keys))


def test_the_label_is_the_first_kind_within_near_best_of_the_best_passing_score():
    scores = torch.zeros(len(HEAD_KINDS), 1, 3)
    scores[HEAD_KINDS.index("previous"), 0] = torch.tensor([0.98, 0.9, 0.3])
    scores[HEAD_KINDS.index("manipulation"), 0] = torch.tensor([1.0, 1.0, 0.3])
    assert label_heads(scores, DEFAULT_THRESHOLDS) == [["previous", "manipulation", "mixed"]]


def test_thresholds_separate_planted_from_random_heads():
    measured = calibrate_thresholds([LEGO], seeds=range(2), n_samples=48)
    for kind in HEAD_KINDS:
        assert measured[kind]["random_max"] < DEFAULT_THRESHOLDS[kind] < measured[kind]["planted_min"], kind


def test_planted_patterns_are_row_normalised_and_respect_causality(gen):
    composite = CompositeTask(CompositeConfig())
    for task in (LEGO, composite):
        tokens = task.sample(8, gen).tokens
        for kind in PLANTED_KINDS:
            pattern = planted_pattern(kind, tokens, task)
            assert torch.allclose(pattern.sum(-1), torch.ones(8, tokens.shape[1]))
            if task.causal:
                assert (pattern.triu(1) == 0).all()


def test_planted_heads_survive_training_steps_and_other_heads_learn(gen):
    model = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2, planted={"0.0": "association"}), LEGO)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    tokens = LEGO.sample(16, gen).tokens
    before = model.blocks[0].attn.W_Q.detach().clone()
    model(tokens).sum().backward()
    optimizer.step()
    assert model.blocks[0].attn.W_Q.grad[0].abs().sum() == 0  # the planted head's query is unused
    assert not torch.equal(before[1], model.blocks[0].attn.W_Q[1])
    _, cache = model.run_with_cache(tokens)
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"][:, 0], planted_pattern("association", tokens, LEGO))


@pytest.mark.parametrize(("spec", "message"),
                         [({"0.9": "association"}, "outside"), ({"0.0": "copy"}, "'copy' is unknown"),
                                               ({"x": "self"}, "not 'layer.head'")])
def test_bad_planted_specs(spec, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(n_layers=2, d_model=32, n_heads=4, planted=spec)


def test_planted_heads_read_the_tokens_of_run_with_hooks_too(gen):
    """TransformerLens's run_with_hooks calls model.forward directly (no nn.Module hooks): the
    planted pattern must still come from the tokens of that run, not of an earlier one."""
    model = build_model(ModelConfig(n_layers=2, d_model=32, n_heads=2, planted={"1.0": "association"}), LEGO)
    tokens, other = LEGO.sample(4, gen).tokens, LEGO.sample(4, gen).tokens
    expected = model(tokens)
    model(other)
    assert torch.equal(model.run_with_hooks(tokens, fwd_hooks=[]), expected)


def test_mass_on_keys_reads_each_sequences_own_query_row():
    from interp.attention import mass_on_keys

    patterns = torch.zeros(2, 2, 1, 3, 3)  # layer batch head query key
    patterns[0, 0, 0, 1] = torch.tensor([0.2, 0.8, 0.0])  # sequence 0 asks from position 1
    patterns[0, 1, 0, 2] = torch.tensor([1.0, 0.0, 0.0])  # sequence 1 asks from position 2
    patterns[1, :, 0] = 1 / 3
    mask = torch.tensor([[False, True, False], [False, True, True]])
    mass, baseline = mass_on_keys(patterns, torch.tensor([1, 2]), mask)
    assert mass[0, 0].item() == pytest.approx(0.4) and mass[1, 0].item() == pytest.approx(0.5)
    assert baseline == pytest.approx(0.5)
