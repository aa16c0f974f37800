"""Linear probes of the residual stream: at which layer a quantity becomes linearly readable.

One probe per (layer, site, quantity): features are the residual stream at one layer, read at one
position of each sample (the site: a variable's token, an anchor ...), and the target is one
integer quantity (a variable's value, the key ...). All probes of a map are fitted together as
one batched solve; a probe is fitted on one set of samples and scored on fresh ones. Each task's
probe map, which sites and quantities it reads, is in its module of interp/tasks/.

Shape glossary: layer = residual streams (0 = embedding `blocks.0.hook_resid_pre`, l >= 1 = the
output of block l-1, `blocks.{l-1}.hook_resid_post`), batch = samples, pos = token positions,
d_model = residual width, site = positions read per sample, probe = probes fitted together,
class = target classes, quantity = what a probe predicts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

# ---------------------------------------------------------------------------------------------
# Residual streams


def layer_names(model: HookedTransformer) -> list[str]:
    """The hook behind each index of the layer axis: the embedding, then every block's output."""
    return ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]


@torch.no_grad()
def residual_streams(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], chunk_size: int = 512
) -> Float[Tensor, "layer batch pos d_model"]:
    """The residual stream before the first block and after every block (n_layers + 1 layers),
    cached `chunk_size` sequences at a time so that only the residual hooks are kept."""
    names = layer_names(model)
    wanted = set(names)
    chunks = []
    for start in range(0, tokens.shape[0], chunk_size):
        chunk = tokens[start : start + chunk_size].to(model.cfg.device)
        _, cache = model.run_with_cache(chunk, names_filter=lambda name: name in wanted)
        chunks.append(torch.stack([cache[name] for name in names]))
    return torch.cat(chunks, dim=1)


@torch.no_grad()
def residuals_at(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], positions: Int[Tensor, "batch site"],
    chunk_size: int = 512,
) -> Float[Tensor, "layer batch site d_model"]:
    """Every layer's residual stream at the given positions of each sequence (gathered chunk by
    chunk, so the full [layer, batch, pos, d_model] stream is never held at once)."""
    chunks = []
    for start in range(0, tokens.shape[0], chunk_size):
        streams = residual_streams(model, tokens[start : start + chunk_size], chunk_size)
        where = positions[start : start + chunk_size].to(streams.device)
        index = einops.repeat(where, "batch site -> layer batch site d_model",
                              layer=streams.shape[0], d_model=streams.shape[-1])
        chunks.append(streams.gather(2, index))
    return torch.cat(chunks, dim=1)


# ---------------------------------------------------------------------------------------------
# Batched linear probes


@dataclass
class LinearProbes:
    """Many linear classifiers `argmax(standardise(x) @ weight + bias)`, one per probe."""

    mean: Float[Tensor, "probe d_model"]
    scale: Float[Tensor, "probe d_model"]
    weight: Float[Tensor, "probe d_model class"]
    bias: Float[Tensor, "probe class"]

    def logits(self, features: Float[Tensor, "probe batch d_model"]) -> Float[Tensor, "probe batch class"]:
        standard = (features - self.mean.unsqueeze(1)) / self.scale.unsqueeze(1)
        return torch.baddbmm(self.bias.unsqueeze(1), standard, self.weight)

    def accuracy(
        self, features: Float[Tensor, "probe batch d_model"], labels: Int[Tensor, "probe batch"],
        mask: Bool[Tensor, "probe batch"] | None = None,
    ) -> Float[Tensor, " probe"]:
        """Fraction of (unmasked) samples whose class each probe predicts correctly."""
        correct = (self.logits(features).argmax(-1) == labels).float()
        if mask is None:
            return correct.mean(-1)
        return (correct * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _standardise(features: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-probe, per-feature mean and scale over the weighted samples; constant features keep
    scale 1 so that they standardise to 0 rather than blow up."""
    total = weights.sum(1, keepdim=True).clamp(min=1)  # [probe, 1]
    mean = torch.einsum("pb,pbd->pd", weights, features) / total
    var = torch.einsum("pb,pbd->pd", weights, (features - mean.unsqueeze(1)) ** 2) / total
    scale = torch.where(var > 1e-12, var.sqrt(), torch.ones_like(var))
    return (features - mean.unsqueeze(1)) / scale.unsqueeze(1), mean, scale


def _fit_lda(x: Tensor, y: Tensor, w: Tensor, n_classes: int, reg: float) -> tuple[Tensor, Tensor]:
    """Linear discriminant analysis: class means and one pooled within-class covariance, shrunk
    towards the identity by `reg` (the features are standardised, so `reg` is in units of their
    variance). Closed form; unlike least squares on one-hot targets it does not mask classes
    that lie between others, which matters for ordinal targets with ~100 classes."""
    onehot = F.one_hot(y, n_classes).to(x.dtype) * w.unsqueeze(-1)  # [probe, batch, class]
    counts = onehot.sum(1)  # [probe, class]
    means = onehot.transpose(1, 2) @ x / counts.clamp(min=1).unsqueeze(-1)  # [probe, class, d_model]
    within = x - means.gather(1, y.unsqueeze(-1).expand_as(x))
    cov = (within * w.unsqueeze(-1)).transpose(1, 2) @ within / w.sum(1).clamp(min=1)[:, None, None]
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    weight = torch.linalg.solve(cov + reg * eye, means.transpose(1, 2))  # [probe, d_model, class]
    prior = counts / counts.sum(-1, keepdim=True).clamp(min=1)
    bias = -0.5 * (means * weight.transpose(1, 2)).sum(-1) + prior.clamp(min=1e-12).log()
    return weight, bias.masked_fill(counts == 0, -1e9)  # classes never seen are never predicted


def _fit_ridge(x: Tensor, y: Tensor, w: Tensor, n_classes: int, reg: float) -> tuple[Tensor, Tensor]:
    """Ridge regression onto one-hot targets (a least-squares classifier), with an unpenalised bias."""
    onehot = F.one_hot(y, n_classes).to(x.dtype)
    design = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1) * w.unsqueeze(-1).sqrt()
    penalty = torch.eye(design.shape[-1], dtype=x.dtype, device=x.device) * reg * w.sum(1)[:, None, None]
    penalty[:, -1, -1] = 0
    gram = design.transpose(1, 2) @ design + penalty
    solution = torch.linalg.solve(gram, design.transpose(1, 2) @ (onehot * w.unsqueeze(-1).sqrt()))
    return solution[:, :-1], solution[:, -1]


def _fit_logistic(x: Tensor, y: Tensor, w: Tensor, n_classes: int, reg: float,
                  steps: int = 300) -> tuple[Tensor, Tensor]:
    """Multinomial logistic regression, full-batch Adam on all probes at once, L2 penalty `reg`."""
    weight = torch.zeros(x.shape[0], x.shape[-1], n_classes, dtype=x.dtype, device=x.device, requires_grad=True)
    bias = torch.zeros(x.shape[0], 1, n_classes, dtype=x.dtype, device=x.device, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.05)
    share = w / w.sum(1, keepdim=True).clamp(min=1)
    with torch.enable_grad():
        for _ in range(steps):
            logits = torch.baddbmm(bias, x, weight)
            loss = (F.cross_entropy(logits.transpose(1, 2), y, reduction="none") * share).sum()
            loss = loss + reg * weight.pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return weight.detach(), bias.detach().squeeze(1)


PROBE_FITTERS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "lda": _fit_lda, "ridge": _fit_ridge, "logistic": _fit_logistic,
}
DEFAULT_REG = {"lda": 1e-3, "ridge": 1e-3, "logistic": 1e-4}


def fit_probes(
    features: Float[Tensor, "probe batch d_model"], labels: Int[Tensor, "probe batch"], n_classes: int,
    mask: Bool[Tensor, "probe batch"] | None = None, method: str = "lda", reg: float | None = None,
) -> LinearProbes:
    """One linear classifier per probe, fitted on standardised features of the unmasked samples.

    method: "lda" (default; closed form, fast, copes with ~100 classes), "ridge" (least squares on
    one-hot targets) or "logistic" (multinomial, 300 Adam steps; slower, for comparison).
    """
    if method not in PROBE_FITTERS:
        raise ValueError(f"method={method!r} is unknown; use one of {sorted(PROBE_FITTERS)}")
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError(f"labels span {int(labels.min())}..{int(labels.max())}; they must lie in "
                         f"0..n_classes-1={n_classes - 1}")
    features = features.float()
    weights = torch.ones_like(labels, dtype=features.dtype) if mask is None else mask.to(features.dtype)
    standard, mean, scale = _standardise(features, weights)
    reg = DEFAULT_REG[method] if reg is None else reg
    weight, bias = PROBE_FITTERS[method](standard, labels, weights, n_classes, reg)
    return LinearProbes(mean, scale, weight, bias)


# ---------------------------------------------------------------------------------------------
# Probe grids: one generic fit over (layer, site, quantity); each task's probe map (interp/tasks/) wraps it


@dataclass
class ProbeSet:
    """Samples to probe: where to read each sample, what to predict there, which reads count."""

    tokens: Int[Tensor, "batch pos"]
    positions: Int[Tensor, "batch site"]
    targets: Int[Tensor, "batch site quantity"]
    mask: Bool[Tensor, "batch site"]


def _probe_layout(model: HookedTransformer, data: ProbeSet) -> tuple[Tensor, Tensor, Tensor]:
    """Features, labels and masks with (layer, site, quantity) flattened into one probe axis."""
    resid = residuals_at(model, data.tokens, data.positions)
    n_quantities = data.targets.shape[-1]
    features = einops.repeat(resid, "layer batch site d_model -> (layer site quantity) batch d_model",
                             quantity=n_quantities)
    labels = einops.repeat(data.targets, "batch site quantity -> (layer site quantity) batch", layer=resid.shape[0])
    mask = einops.repeat(data.mask, "batch site -> (layer site quantity) batch", layer=resid.shape[0],
                         quantity=n_quantities)
    return features, labels.to(features.device), mask.to(features.device)


@dataclass
class ProbeGrid:
    """Accuracy of one probe per (layer, site, quantity) on fresh samples and on its own training
    samples, and the baseline of always answering the training set's most frequent class."""

    accuracy: Float[Tensor, "layer site quantity"]
    train_accuracy: Float[Tensor, "layer site quantity"]
    majority: Float[Tensor, "site quantity"]


def majority_baseline(train: ProbeSet, test: ProbeSet, n_classes: int) -> Float[Tensor, "site quantity"]:
    """Test accuracy of always predicting the most frequent training class of each (site, quantity):
    the honest chance level when the classes are not balanced."""
    votes = F.one_hot(train.targets, n_classes) * train.mask[..., None, None]
    majority = votes.sum(0).argmax(-1)  # [site, quantity]
    hits = (test.targets == majority) & test.mask.unsqueeze(-1)
    return (hits.sum(0) / test.mask.sum(0).clamp(min=1).unsqueeze(-1)).float()


def probe_grid(
    model: HookedTransformer, train: ProbeSet, test: ProbeSet, n_classes: int, method: str = "lda"
) -> ProbeGrid:
    """Fit one probe per (layer, site, quantity) on `train`, all at once, and score it on `test`."""
    shape = dict(layer=model.cfg.n_layers + 1, site=train.targets.shape[1], quantity=train.targets.shape[2])
    features, labels, mask = _probe_layout(model, train)
    probes = fit_probes(features, labels, n_classes, mask, method=method)
    train_accuracy = probes.accuracy(features, labels, mask)
    del features  # the test features take their place; both can be large
    test_accuracy = probes.accuracy(*_probe_layout(model, test))
    return ProbeGrid(_unflatten(test_accuracy, shape), _unflatten(train_accuracy, shape),
                     majority_baseline(train, test, n_classes))


def _unflatten(accuracy: Tensor, shape: dict[str, int]) -> Tensor:
    return einops.rearrange(accuracy.cpu(), "(layer site quantity) -> layer site quantity", **shape)


def rounded(values: Tensor, decimals: int = 4) -> list:
    """Nested lists for JSON; rounded in float64 so that 0.5185 prints as 0.5185."""
    return values.double().round(decimals=decimals).tolist()


@torch.no_grad()
def residual_similarity(model: HookedTransformer, tokens: Tensor) -> Float[Tensor, " layer"]:
    """Mean cosine similarity between the residual streams of two different positions of a
    sentence, after the embedding (index 0) and after each block: near 1 means the hidden states
    collapse toward one direction (a known plateau symptom)."""
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    n_pos = tokens.shape[1]
    off_diagonal = ~torch.eye(n_pos, dtype=torch.bool, device=tokens.device)
    similarity = []
    for name in names:
        unit = F.normalize(cache[name], dim=-1)  # [batch pos d_model]
        cosines = unit @ unit.transpose(1, 2)  # [batch pos pos]
        similarity.append(cosines[:, off_diagonal].mean())
    return torch.stack(similarity)
