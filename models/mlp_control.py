"""An MLP control for a transformer run: the same config's task, training batches, schedule and
held-out batch, with the sequence read by a plain MLP instead of attention.

`EmbeddingMLP` concatenates the token embeddings of the whole sequence, passes them through
hidden layers with ReLU to a d_model vector per label slot, and reads logits from that vector
with the embeddings' transpose plus a trained bias. Its embeddings are the transformer's own
initial W_E for that config and seed (built by `build_model` and copied), frozen, as
`model.fixed_embeddings` keeps them, so an MLP and a transformer of one config see symbols through
the same fixed random vectors on the way in and out. With `embeddings="onehot"` the table is
the identity instead: the paper's one-hot symbols, orthogonal to each other.

`train_mlp_control(cfg)` trains it on exactly the batches `Trainer` draws for `cfg`
(`models.train.next_training_batch` from a generator seeded with train.seed), with AdamW, the
same lr schedule (`learning_rate`), weight decay on weight matrices only and the same gradient
clip, and evaluates it at the same steps on the same held-out batch (`evaluation_batch`, the test
split), on train.device. It also scores fresh strings of the training split, to tell "learned nothing" from
"learned the training symbols only". No run folder, checkpoint or resume: a control trains in
seconds at cpu scale; the caller keeps the numbers it returns.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from models.config import RunConfig
from models.device import check_precision, resolve_device, to_device, training_precision
from models.factory import build_model
from models.train import Epochs, evaluation_batch, learning_rate, next_training_batch, training_set
from tasks import Batch, ConfigError, Task, make_task, seeded_generator
from tasks.base import UnpaddedTask

TRAIN_SPLIT_SEED_OFFSET = 4_000_003  # the fresh training-split strings the control is also scored on


class EmbeddingMLP(nn.Module):
    """Frozen token embeddings of every position, concatenated -> `n_hidden` Linear+ReLU layers of
    width `hidden` -> Linear to d_model per label slot -> logits = that @ W_E^T + b_U."""

    def __init__(self, embeddings: Float[Tensor, "d_vocab d_model"], n_ctx: int, n_labels: int, hidden: int,
                 n_hidden: int = 2):
        super().__init__()
        d_vocab, d_model = embeddings.shape
        self.register_buffer("W_E", embeddings.detach().clone())  # a buffer: never trained, never decayed
        self.n_labels, self.d_model = n_labels, d_model
        widths = [n_ctx * d_model] + [hidden] * n_hidden
        layers: list[nn.Module] = []
        for d_in, d_out in zip(widths, widths[1:]):
            layers += [nn.Linear(d_in, d_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], n_labels * d_model))
        self.net = nn.Sequential(*layers)
        self.b_U = nn.Parameter(torch.zeros(d_vocab))  # the unembedding's bias, trained as in the transformer
        # one-hot symbols: W_E^T is the identity, so the product is skipped (d_vocab^2 per string)
        self.identity = d_vocab == d_model and bool(torch.equal(embeddings, torch.eye(d_vocab)))

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch label d_vocab"]:
        x = self.W_E[tokens].flatten(1)
        out = self.net(x).view(len(tokens), self.n_labels, self.d_model)
        return (out if self.identity else out @ self.W_E.T) + self.b_U


EMBEDDINGS = ("transformer", "onehot")


def build_mlp_control(cfg: RunConfig, task: Task, hidden: int | None = None, n_hidden: int = 2,
                      embeddings: str = "transformer") -> EmbeddingMLP:
    """The control for `cfg`, its MLP weights seeded with train.seed, without touching the global
    RNG. `embeddings`: "transformer", that config's transformer's initial token embeddings (same
    seed, same model config; d_model wide); "onehot", the identity (d_vocab wide: every symbol
    orthogonal to every other, so an unseen symbol shares no input direction with a seen one).
    `hidden`: the hidden width (default 4 * model.d_model either way)."""
    if embeddings not in EMBEDDINGS:
        raise ConfigError(f"embeddings={embeddings!r} is unknown; use one of {EMBEDDINGS}")
    if not isinstance(task, UnpaddedTask):
        raise ConfigError(f"an MLP control reads fixed-length sequences; task {cfg.task.name!r} pads them")
    if task.d_vocab != task.d_vocab_out:
        raise ConfigError(f"an MLP control reads logits with its input embeddings; task {cfg.task.name!r} has "
                          f"d_vocab={task.d_vocab}, d_vocab_out={task.d_vocab_out}")
    if not cfg.model.fixed_embeddings:
        raise ConfigError("an MLP control keeps the transformer's embeddings frozen; its config needs "
                          "model.fixed_embeddings=true so the transformer it is compared with does too")
    seed = cfg.train.seed
    if embeddings == "transformer":
        table = build_model(cfg.model, task, seed=seed).embed.W_E.detach()
    else:
        table = torch.eye(task.d_vocab)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return EmbeddingMLP(table, task.n_ctx, len(task.label_names), hidden or 4 * cfg.model.d_model, n_hidden)


def label_loss(logits: Float[Tensor, "batch label d_vocab"], batch: Batch, mask: Tensor | None = None) -> Tensor:
    """Cross-entropy over the whole output vocabulary at the supervised labels (as the trainer's)."""
    mask = batch.loss_mask if mask is None else mask
    return F.cross_entropy(logits[mask], batch.labels[mask])


@torch.no_grad()
def score(model: EmbeddingMLP, task: Task, batch: Batch) -> dict[str, Any]:
    """Loss and the task's accuracies on `batch` (a CPU batch; the model on any device), in fp32."""
    model.eval()
    device = model.W_E.device
    logits = model(batch.tokens.to(device)).float().cpu()
    scored = batch.label_mask & batch.loss_mask if batch.loss_mask.any() else batch.label_mask
    return {"loss": label_loss(logits, batch, scored).item(), **task.accuracy(batch, logits.argmax(-1))}


def train_mlp_control(cfg: RunConfig, hidden: int | None = None, n_hidden: int = 2, embeddings: str = "transformer",
                      record_batches: list[Batch] | None = None) -> dict[str, Any]:
    """Train the MLP control of `cfg` for train.steps steps (on train.device, with train.precision's
    autocast; evaluations in fp32; CUDA untested) and return its
    evaluations: `history` (one record per evaluation, at the trainer's steps: train_loss, the
    mean over the steps since the last one; eval_loss and the task's accuracies on the held-out
    test batch; train_split_loss / train_split_acc on fresh training-split strings) and `final`
    (the last record), plus `seconds` and `parameters`. `record_batches`: a list the training
    batches are appended to (tests compare them with the transformer's)."""
    train = cfg.train
    if train.plateau_evals is not None or train.init_from is not None or train.mimic_steps:
        raise ConfigError("an MLP control trains the plain schedule: no plateau_evals, init_from or mimic_steps")
    task = make_task(cfg.task)
    device = resolve_device(train.device)
    check_precision(device, train.precision)
    model = build_mlp_control(cfg, task, hidden, n_hidden, embeddings).to(device)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": train.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=train.lr)
    data_gen, train_set = seeded_generator(train.seed), training_set(task, train)
    epochs = Epochs(train_set, train.batch_size, train.seed) if train.sampling == "epochs" else None
    eval_batch = evaluation_batch(task, train)
    train_split = task.sample(train.eval_size, seeded_generator(train.seed + TRAIN_SPLIT_SEED_OFFSET), split="train")
    history: list[dict[str, Any]] = []
    loss_sum, loss_count, started = 0.0, 0, time.perf_counter()
    for step in range(train.steps):
        batch = epochs.batch(step) if epochs else next_training_batch(task, train_set, train.batch_size, data_gen)
        if record_batches is not None:
            record_batches.append(batch)
        batch = to_device(batch, device)
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, train)
        with training_precision(device, train.precision):
            logits = model(batch.tokens)
        loss = label_loss(logits.float(), batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"the MLP control's training loss became {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if train.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        loss_sum, loss_count = loss_sum + loss.item(), loss_count + 1  # a sync per step; controls are small
        done = step + 1
        if done % train.eval_every == 0 or done == train.steps:
            test, seen = score(model, task, eval_batch), score(model, task, train_split)
            history.append({"step": done, "train_loss": loss_sum / loss_count, "eval_loss": test.pop("loss"), **test,
                            "train_split_loss": seen["loss"], "train_split_acc": seen["acc"]})
            loss_sum, loss_count = 0.0, 0
    return {"final": history[-1], "history": history, "seconds": round(time.perf_counter() - started, 2),
            "parameters": sum(p.numel() for p in model.parameters())}
