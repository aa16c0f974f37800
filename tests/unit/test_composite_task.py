import pytest
import torch

from tasks import CompositeConfig, CompositeTask, ConfigError

SHIFT = {1: 5, 2: 1, 3: -2, 4: -8}


def reference_target(tokens: list[int]) -> tuple[int, tuple[int, int], int]:
    """Find the one adjacent anchor pair and the key before it; compose the shifts."""
    starts = [p for p in range(1, len(tokens) - 1) if tokens[p] in SHIFT and tokens[p + 1] in SHIFT]
    assert len(starts) == 1 and sum(t in SHIFT for t in tokens) == 2
    p = starts[0]
    return tokens[p - 1], (tokens[p], tokens[p + 1]), p - 1


def test_targets_compose_the_shifts_with_the_34_override(gen):
    task = CompositeTask(CompositeConfig())
    batch = task.sample(500, gen)
    for row, label in zip(batch.tokens.tolist(), batch.labels[:, 0].tolist()):
        key, pair, _ = reference_target(row)
        assert label == (key - 6 if pair == (3, 4) else key + SHIFT[pair[0]] + SHIFT[pair[1]])


@pytest.mark.parametrize("split", ["train", "test"])
def test_key_position_split(split, gen):
    batch = CompositeTask(CompositeConfig()).sample(500, gen, split=split)
    for row in batch.tokens.tolist():
        key, _, pos = reference_target(row)
        assert (key % 7 == pos) == (split == "test")
        assert all(20 <= t <= 99 for t in row if t not in SHIFT)


def test_held_out_pair_only_at_test_with_both_candidate_targets(gen):
    task = CompositeTask(CompositeConfig())
    held = task.pairs.index((4, 3))
    assert not (task.sample(2000, gen, "train").latents["pair"] == held).any()
    batch = task.sample(2000, gen, "test")
    rows = batch.latents["pair"] == held
    assert rows.any() and torch.equal(batch.latents["held_out"], rows)
    key = batch.latents["key"][rows]
    assert torch.equal(batch.latents["inferential"][rows], key - 10)
    assert torch.equal(batch.latents["symmetric"][rows], key - 6)
    assert not batch.loss_mask[rows].any()


@pytest.mark.parametrize("change", ["key", "anchor1", "anchor2"])
def test_corrupt_changes_what_it_says(change, gen):
    task = CompositeTask(CompositeConfig())
    batch = task.sample(300, gen)
    twin, changed = task.corrupt(batch, gen, change=change)
    assert torch.equal(changed, twin.labels != batch.labels)
    assert changed.float().mean() > 0.9
    if change == "key":
        assert torch.equal(twin.latents["pair"], batch.latents["pair"])
    assert not twin.latents["held_out"].any()


def test_accuracy_reports_held_out_rates(gen):
    task = CompositeTask(CompositeConfig())
    batch = task.sample(1000, gen, "test")
    symmetric_model = torch.where(batch.latents["held_out"], batch.latents["symmetric"], batch.labels[:, 0])
    report = task.accuracy(batch, symmetric_model.unsqueeze(1))
    assert report["acc_seen"] == 1.0 and report["held_out_symmetric"] == 1.0 and report["held_out_inferential"] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"held_out": ["5,1"]}, "'5,1' is not among the anchors"), ({"overrides": {"34": -6}}, "not of the form"),
     ({"value_min": 3}, "value_min=3")],
)
def test_bad_configs_name_the_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CompositeConfig(**kwargs)


def test_fixed_key_position(gen):
    task = CompositeTask(CompositeConfig())
    batch = task.sample(100, gen, split="test", key_pos=3)
    assert (batch.latents["key_pos"] == 3).all() and (batch.tokens[:, 4] <= 4).all()
    assert (batch.latents["key"] % 7 == 3).all()
    with pytest.raises(ValueError, match="key_pos=7"):
        task.sample(4, gen, key_pos=7)


def _uniform_reader(n_layers: int = 1, positions: bool = False):
    """A random composite model whose attention is uniform over the past (W_Q = W_K = 0) and,
    unless `positions`, blind to position (W_pos = 0): its first layer cannot tell the anchors' order."""
    from models.config import ModelConfig
    from models.factory import build_model

    task = CompositeTask(CompositeConfig())
    model = build_model(ModelConfig(n_layers=n_layers, d_model=32, n_heads=1, d_mlp=64), task, seed=0)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.zero_()
            block.attn.W_K.zero_()
        if not positions:
            model.W_pos.zero_()
    return model, task


def test_anchor_order_is_lost_where_the_last_token_pools_the_anchors_blind_to_position():
    from interp.tasks.composite import anchor_order_sensitivity

    model, task = _uniform_reader()
    blind = anchor_order_sensitivity(model, task, key_pos=2, n=64)
    assert blind["last"][0] < 1e-5  # a uniform, position-blind read of the past is the same for either order
    assert blind["anchor2"][0] > 0.1  # anchor 2's own token is the other anchor after the swap
    at_end = anchor_order_sensitivity(model, task, key_pos=task.n_key_positions - 1, n=64)
    assert at_end["last"] == at_end["anchor2"]  # the pair ends the sequence: the same token
    model, task = _uniform_reader(positions=True)
    assert anchor_order_sensitivity(model, task, key_pos=2, n=64)["last"][0] > 0.01  # positions keep the order


def test_last_attention_patch_takes_the_donor_rows_at_the_last_position_of_the_named_layer():
    """With every MLP and layer 1's attention silenced, the last token's final residual is its own
    embedding plus layer 0's attention output there. Patching that output from a donor that
    differs only at the anchors gives exactly the donor's answers; patching the silent layer 1
    leaves the clean ones."""
    from interp.task_analysis import predictions
    from interp.tasks.composite import _trained_pairs, last_attention_patched

    model, task = _uniform_reader(n_layers=2, positions=True)
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.W_out.zero_()
            block.mlp.b_out.zero_()
        model.blocks[1].attn.W_O.zero_()
        weights = torch.Generator().manual_seed(0)  # not the global generator: the tests before move it
        model.blocks[0].attn.W_Q.normal_(generator=weights)  # attention that depends on the tokens, not uniform
        model.blocks[0].attn.W_K.normal_(generator=weights)
    gen = torch.Generator().manual_seed(0)
    batch = task.sample(64, gen, split="test", pair_ids=_trained_pairs(task, 64, gen), key_pos=2)
    donor = task.build({**batch.latents, "pair": _trained_pairs(task, 64, gen)})
    clean, theirs = predictions(model, batch)[:, 0], predictions(model, donor)[:, 0]
    assert not torch.equal(clean, theirs)  # the anchors matter to this model, so the check can fail
    assert torch.equal(last_attention_patched(model, batch, donor, layer=0), theirs)
    assert torch.equal(last_attention_patched(model, batch, donor, layer=1), clean)


def test_order_and_route_refuse_what_they_cannot_measure():
    from interp.tasks.composite import anchor_order_sensitivity

    model, _ = _uniform_reader()
    task = CompositeTask(CompositeConfig(held_out=["2,2"]))  # its own mirror
    with pytest.raises(ValueError, match="own mirror"):
        anchor_order_sensitivity(model, task, key_pos=2, n=16)


def test_other_answers_are_the_held_out_answers_that_are_neither_solution_with_the_pairs_they_belong_to(gen):
    """Half the held-out rows answered x-10 (left out), a quarter x-16 ((4,4)'s target: one
    anchor read twice), a quarter x-13 (no pair's target): shares of all rows, commonest first."""
    from interp.tasks.composite import other_answers

    task = CompositeTask(CompositeConfig())
    held = task.sample(400, gen, split="test", pair_ids=task.is_held_out.nonzero()[:, 0].repeat(400))
    key = held.latents["key"]
    pred = torch.cat([held.latents["inferential"][:200], key[200:300] - 16, key[300:] - 13])
    pred[300:301] = held.latents["symmetric"][300:301]  # one x-6 row: a solution, left out too
    rows = other_answers(pred, held, task)
    assert rows == [{"offset": -16, "share": 0.25, "target_of": ["4,4"]},
                    {"offset": -13, "share": 0.2475, "target_of": []}]
    assert other_answers(held.latents["inferential"], held, task) == []
