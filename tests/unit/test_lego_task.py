import pytest
import torch

from tasks import ConfigError, LegoConfig, LegoTask, seeded_generator
from tasks.lego import EOS, PAD
from tests.helpers import lego_reference_values


def assert_labels_follow_the_text(task, batch, n):
    """The first n sentences' labels are the values a reference solver reads off their text."""
    for i in range(n):
        solved = lego_reference_values(task.decode(batch.tokens[i]))
        for depth in range(task.cfg.n_vars):
            variable = task.vocab[batch.tokens[i, batch.label_pos[i, depth]]]
            assert solved[variable] == task.group.values[batch.labels[i, depth]]


@pytest.mark.parametrize("group", ["z2", "s3"])
def test_labels_are_the_values_a_reference_solver_reads_off_the_text(group, gen):
    task = LegoTask(LegoConfig(group=group, n_vars=8))
    assert_labels_follow_the_text(task, task.sample(200, gen), 200)


def test_chain_order_labels_follow_the_chain(gen):
    task = LegoTask(LegoConfig(n_vars=6))
    batch = task.sample(50, gen)
    for i in range(50):
        pos = batch.label_pos[i]
        for depth in range(1, 6):  # the rhs of variable #depth is variable #depth-1
            assert batch.tokens[i, pos[depth] + 3] == batch.tokens[i, pos[depth - 1]]


def test_same_seed_same_sentences_other_seed_other_sentences():
    task = LegoTask(LegoConfig(n_vars=12))
    a, b = task.sample(64, seeded_generator(7)), task.sample(64, seeded_generator(7))
    c = task.sample(64, seeded_generator(8))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.tokens, c.tokens)


def test_sampling_leaves_the_global_rng_alone(gen):
    state = torch.get_rng_state()
    LegoTask(LegoConfig()).sample(10, gen)
    assert torch.equal(state, torch.get_rng_state())


def test_depth_of_every_position(gen):
    task = LegoTask(LegoConfig(n_vars=5))
    batch = task.sample(20, gen)
    depth = batch.latents["depth"]
    assert (depth[:, 0] == -1).all() and (depth[:, -1] == -1).all()
    rows = torch.arange(20).unsqueeze(1)
    assert torch.equal(depth[rows, batch.label_pos], torch.arange(5).expand(20, -1))


@pytest.mark.parametrize(
    ("mode", "k", "expected"),
    [("all", 3, [1, 1, 1, 1, 1, 1]), ("first", 3, [1, 1, 1, 0, 0, 0]), ("first+last", 2, [1, 1, 0, 0, 0, 1])],
)
def test_supervision_masks(mode, k, expected, gen):
    batch = LegoTask(LegoConfig(n_vars=6, supervision=mode, n_supervised=k)).sample(4, gen)
    assert batch.loss_mask.tolist() == [[bool(e) for e in expected]] * 4


def test_mixed_chain_lengths_pad_and_mask(gen):
    task = LegoTask(LegoConfig(n_vars=6, min_vars=2, supervision="first+last", n_supervised=1))
    batch = task.sample(300, gen)
    length = batch.latents["length"]
    assert set(length.tolist()) == {2, 3, 4, 5, 6}
    assert torch.equal(batch.label_mask.sum(1), length)
    assert (batch.tokens[torch.arange(300), 1 + 5 * length] == EOS).all()
    assert ((batch.tokens == PAD).sum(1) == 5 * (6 - length)).all()
    last = batch.loss_mask[torch.arange(300), length - 1]
    assert last.all() and (batch.loss_mask & ~batch.label_mask).sum() == 0
    for i in range(20):  # padded sentences still solve correctly
        solved = lego_reference_values(task.decode(batch.tokens[i]))
        assert len(solved) == int(length[i])
    assert (task.sample(50, gen, split="test").latents["length"] == 6).all()  # tests are full length


@pytest.mark.parametrize("group", ["z2", "s3"])
@pytest.mark.parametrize("depth", [0, 2, 5])
def test_corrupt_flips_one_element_and_exactly_the_downstream_labels(group, depth, gen):
    task = LegoTask(LegoConfig(group=group, n_vars=6))
    batch = task.sample(100, gen)
    twin, changed = task.corrupt(batch, gen, depth=depth)
    assert ((twin.tokens != batch.tokens).sum(1) == 1).all()
    assert torch.equal(changed, torch.arange(6).expand(100, -1) >= depth)
    assert torch.equal(twin.labels != batch.labels, changed)
    assert torch.equal(twin.label_pos, batch.label_pos)


def test_decode_is_readable():
    task = LegoTask(LegoConfig(n_vars=2, n_supervised=1))
    text = task.decode(task.sample(1, seeded_generator(0)).tokens[0])
    assert text.startswith("[BOS] ") and text.endswith(" [EOS]") and text.count(";") == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n_vars": 30}, "n_vars=30"), ({"group": "s4"}, "group='s4'"), ({"n_supervised": 7}, "n_supervised=7"),
     ({"supervision": "last"}, "supervision='last'"), ({"min_vars": 9}, "min_vars=9")],
)
def test_bad_configs_name_the_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LegoConfig(**kwargs)


def test_aligned_sentences_share_one_layout(gen):
    task = LegoTask(LegoConfig(n_vars=6, min_vars=2))
    batch = task.sample(30, gen, aligned=True)
    assert (batch.label_pos == batch.label_pos[0]).all()
    assert (batch.latents["length"] == 6).all()
    assert len({tuple(row) for row in batch.tokens.tolist()}) > 1  # contents still differ


def test_biased_sentences_draw_the_identity_often_and_only_in_training(gen):
    task = LegoTask(LegoConfig(n_vars=6, biased_fraction=1.0, identity_prob=0.9))
    train, test = task.sample(4000, gen), task.sample(4000, gen, split="test")
    assert abs((train.latents["elements"] == 0).float().mean().item() - 0.9) < 0.02
    assert abs((test.latents["elements"] == 0).float().mean().item() - 0.5) < 0.02
    assert_labels_follow_the_text(task, train, 50)  # labels still follow the chain


def test_a_biased_fraction_mixes_biased_and_uniform_rows(gen):
    task = LegoTask(LegoConfig(n_vars=6, biased_fraction=0.5, identity_prob=1.0))
    all_identity = (task.sample(4000, gen).latents["elements"] == 0).all(1).float().mean().item()
    assert abs(all_identity - (0.5 + 0.5 / 2**6)) < 0.03


def test_ordered_sentences_list_the_chain_in_order_only_in_training(gen):
    task = LegoTask(LegoConfig(n_vars=6, ordered_fraction=1.0))
    train, test = task.sample(200, gen), task.sample(200, gen, split="test")
    assert (train.label_pos.diff(dim=1) > 0).all()
    assert (test.label_pos.diff(dim=1) > 0).all(1).float().mean() < 0.05
    mixed = LegoTask(LegoConfig(n_vars=6, ordered_fraction=0.5)).sample(2000, gen)
    assert abs((mixed.label_pos.diff(dim=1) > 0).all(1).float().mean().item() - 0.5) < 0.05


def test_forest_sentences_hold_several_values_and_labels_follow_the_text(gen):
    task = LegoTask(LegoConfig(n_vars=6, forest_fraction=1.0, cut_prob=0.5))
    train, test = task.sample(300, gen), task.sample(300, gen, split="test")
    is_value = lambda tokens: (tokens >= task.first_value).sum(1)  # noqa: E731
    assert (is_value(test.tokens) == 1).all()  # test sentences stay single chains
    assert abs(is_value(train.tokens).float().mean().item() - (1 + 5 * 0.5)) < 0.2
    assert_labels_follow_the_text(task, train, 100)


def test_a_forest_fraction_cuts_only_that_share_of_training_rows(gen):
    task = LegoTask(LegoConfig(n_vars=6, forest_fraction=0.5, cut_prob=1.0))
    n_values = (task.sample(4000, gen).tokens >= task.first_value).sum(1)
    assert set(n_values.unique().tolist()) == {1, 6}
    assert abs((n_values == 6).float().mean().item() - 0.5) < 0.03


@pytest.mark.parametrize("field", ["biased_fraction", "identity_prob", "ordered_fraction", "forest_fraction",
                                   "cut_prob"])
def test_curriculum_fractions_outside_0_1_are_refused(field):
    with pytest.raises(ConfigError, match=f"task.{field}=1.5"):
        LegoConfig(**{field: 1.5})


@pytest.mark.parametrize("forest", [0.0, 1.0])
def test_mention_labels_give_the_value_of_the_variable_each_right_hand_side_names(forest, gen):
    task = LegoTask(LegoConfig(n_vars=6, n_supervised=3, mention_labels="value", forest_fraction=forest))
    train, n = task.sample(100, gen), 6
    assert train.labels.shape == (100, 2 * n)
    for i in range(100):
        solved = lego_reference_values(task.decode(train.tokens[i]))
        for slot in range(2 * n):
            if not train.label_mask[i, slot]:
                continue
            token = task.vocab[train.tokens[i, train.label_pos[i, slot]]]
            assert token in solved  # a variable, never a value
            assert solved[token] == task.group.values[train.labels[i, slot]]
            if slot >= n:  # a mention: the right-hand token of a clause
                assert task.vocab[train.tokens[i, train.label_pos[i, slot] - 3]] in solved
    # mentions of the supervised #0, #1, #2 are trained, of the others not; the last variable has none
    mentions = train.loss_mask[:, n:]
    assert mentions[:, 3:].sum() == 0
    if forest == 0.0:
        assert mentions[:, :3].all()
    else:  # a cut clause reads a fresh value, which is no mention
        assert 0 < mentions[:, :3].float().mean() < 1


def test_mention_labels_are_for_training_only(gen):
    task = LegoTask(LegoConfig(n_vars=6, mention_labels="value"))
    assert task.sample(10, gen, split="test").labels.shape == (10, 6)
    assert task.counterfactual_pairs(10, gen).clean.labels.shape == (10, 6)


def test_element_mention_labels_give_the_sign_of_the_clause_defining_the_mentioned_variable(gen):
    task = LegoTask(LegoConfig(n_vars=6, n_supervised=3, mention_labels="element"))
    train = task.sample(50, gen)
    for i in range(50):
        text = task.token_strings(train.tokens[i])
        for slot in range(6, 12):
            if train.label_mask[i, slot]:
                letter = text[train.label_pos[i, slot]]
                defining = next(j for j, token in enumerate(text) if token == letter and text[j + 1] == "=")
                sign = text[defining + 2]
                assert task.group.values[train.labels[i, slot]] == ("1" if sign == "+" else "-1")
    with pytest.raises(ConfigError, match="task.mention_labels='x'"):
        LegoConfig(mention_labels="x")


def test_n_letters_names_variables_from_the_first_letters_only(gen):
    task = LegoTask(LegoConfig(n_vars=6, n_letters=6))
    for split in ("train", "test"):
        batch = task.sample(200, gen, split=split)
        letters = {token for row in batch.tokens.tolist() for token in row
                   if task.vocab[token] in "abcdefghijklmnopqrstuvwxyz"}
        assert {task.vocab[t] for t in letters} == set("abcdef")
    assert_labels_follow_the_text(task, task.sample(50, gen), 50)
    with pytest.raises(ConfigError, match="task.n_letters=5"):
        LegoConfig(n_vars=6, n_letters=5)
