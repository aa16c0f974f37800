"""The settings a loss-spike replay changes (StableMax, the loss's dtype) and the composite group's
protocol (`composite-code`): its warm-up from 1e-5 and its epochs over a fixed training set."""

import math

import pytest
import torch
import torch.nn.functional as F

from models.config import ConfigError, TrainConfig
from models.presets import get_preset
from models.step import label_losses
from models.train import Epochs, learning_rate
from tasks import make_task, seeded_generator


def test_stablemax_is_the_normalised_s_of_the_logits_and_keeps_the_argmax():
    logits = torch.randn(64, 11, generator=seeded_generator(0), dtype=torch.float64) * 4
    labels = torch.randint(11, (64,), generator=seeded_generator(1))
    s = torch.where(logits >= 0, logits + 1, 1 / (1 - logits))
    expected = -(s / s.sum(-1, keepdim=True)).gather(1, labels[:, None]).squeeze(1).log()
    assert torch.allclose(label_losses(logits, labels, "stablemax"), expected, rtol=1e-12, atol=0)
    assert torch.equal(label_losses(logits, labels), F.cross_entropy(logits, labels, reduction="none"))
    assert torch.equal(s.argmax(-1), logits.argmax(-1))  # s grows monotonically: the answers are the same


def test_a_confident_answer_keeps_a_loss_and_a_gradient_in_float32_only_with_stablemax():
    # the correct logit 30 above 200 others: 1 + 200 exp(-30) rounds to 1 in float32
    logits = torch.zeros(1, 201)
    logits[0, 7] = 30.0
    labels = torch.tensor([7])
    for softmax, floored in (("standard", True), ("stablemax", False)):
        x = logits.clone().requires_grad_(True)
        loss = label_losses(x, labels, softmax)
        loss.sum().backward()
        assert (loss.item() == 0.0) is floored, softmax
        assert (x.grad[0, 7].item() == 0.0) is floored, softmax  # the correct class's gradient
    assert label_losses(logits.double(), labels).item() > 0  # float64 keeps it too


def test_the_warm_up_starts_at_warmup_from_and_reaches_lr_then_decays():
    cfg = TrainConfig(steps=1000, lr=2e-4, min_lr=1e-5, warmup_steps=100, warmup_from=1e-5)
    assert learning_rate(0, cfg) == 1e-5
    assert math.isclose(learning_rate(50, cfg), 1e-5 + 0.5 * (2e-4 - 1e-5))
    assert learning_rate(100, cfg) == 2e-4 and math.isclose(learning_rate(1000, cfg), 1e-5)
    plain = TrainConfig(steps=1000, lr=2e-4, min_lr=1e-5, warmup_steps=100)
    assert learning_rate(0, plain) == 2e-4 / 100  # unset: from lr / warmup_steps, as before
    with pytest.raises(ConfigError, match="warmup_from"):
        TrainConfig(lr=1e-4, warmup_from=2e-4)


def test_epochs_visit_every_row_once_drop_the_last_partial_batch_and_need_no_state():
    task = make_task(get_preset("composite-cpu").task)
    rows = task.sample(100, seeded_generator(3))
    rows.tokens[:, 0] = torch.arange(100)  # a row's identity, to count visits
    epochs = Epochs(rows, 32, seed=5)
    assert epochs.per_epoch == 3
    first = torch.cat([epochs.batch(t).tokens[:, 0] for t in range(3)])
    assert len(first) == 96 and len(set(first.tolist())) == 96  # 96 distinct rows, 4 dropped
    second = torch.cat([epochs.batch(t).tokens[:, 0] for t in range(3, 6)])
    assert not torch.equal(first, second)  # reshuffled each epoch
    # a fresh object (a resumed run) draws step 4's batch without walking steps 0-3
    assert torch.equal(Epochs(rows, 32, seed=5).batch(4).tokens, epochs.batch(4).tokens)
    with pytest.raises(ConfigError, match="n_train"):
        TrainConfig(sampling="epochs")
    with pytest.raises(ConfigError, match="softmax"):
        TrainConfig(softmax="sparsemax")


def test_composite_code_is_the_groups_run_as_their_code_writes_it():
    cfg = get_preset("composite-code")
    train, model, task = cfg.train, cfg.model, make_task(cfg.task)
    # 210 epochs of 759,375 // 2048 = 370 batches; warm-up 10 epochs, cosine over the other 200
    assert (train.steps, train.batch_size, train.n_train, train.sampling) == (210 * 370, 2048, 759_375, "epochs")
    assert 759_375 // train.batch_size == 370 and train.warmup_steps == 10 * 370
    # GradualWarmupScheduler(multiplier 20, base lr 1e-5) stepped per batch, then CosineAnnealingLR to 1e-5
    for step in (0, 1000, 3699):
        assert math.isclose(learning_rate(step, train), 1e-5 * (19 * step / 3700 + 1), rel_tol=1e-12)
    assert learning_rate(3700, train) == 2e-4 and math.isclose(learning_rate(train.steps, train), 1e-5)
    assert (train.weight_decay, train.weight_decay_on, train.grad_clip, train.seed) == (0.01, "all", 1.0, 1)
    assert (train.adam_beta2, train.adam_eps, train.loss_dtype, train.softmax) == (0.999, 1e-8, "float32", "standard")
    assert (model.n_layers, model.d_model, model.n_heads, model.d_head, model.d_mlp) == (2, 400, 1, 200, 1200)
    assert (model.norm_position, model.act_fn, model.biases, model.init_gamma) == ("post", "relu", False, 0.8)
    assert (model.n_ctx, model.unembed_bias_init, task.d_vocab, cfg.task.key_modulus) == (20, "uniform", 201, 9)
