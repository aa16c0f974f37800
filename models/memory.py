"""Memory is checked before it is spent: `check_memory` estimates a run's peak memory (model,
gradients, AdamW state, the activations of a training batch and of an evaluation chunk, the
task's sampled sets) and compares it with what this machine or container allows, so that a size
too large for memory is exit 2 naming the setting to lower, before anything is written, rather
than a process the kernel kills without a word.

The estimate is meant to be within a factor of 2 of the measured peak (tests/integration/
test_memory.py; `python -m analyses.research.memory_table` prints estimate against measured). It is a
guard against sizes that cannot fit, not a prediction to plan by. `WORKBENCH_SKIP_MEMORY_CHECK=1`
turns the check off (docs/training.md).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.config import RunConfig
from tasks import ConfigError, Task, seeded_generator

SKIP_ENV = "WORKBENCH_SKIP_MEMORY_CHECK"
FLOAT = 4  # bytes of an fp32 value
EVAL_CHUNK = 1000  # samples per evaluation forward pass (models/train.py); bounds memory on long sequences
# fp32 values kept per token and layer, per unit of each width, for a training step's backward
# (TransformerLens keeps every hook point's tensor; measured on the CPU, see the module doc)
SAVED_PER_TOKEN = {"d_model": 10, "d_head": 8, "pos": 4, "d_mlp": 4}
SAMPLING_OVERHEAD = 1.5  # a task's sample(n) holds about this many times its result while it builds it


@dataclass
class MemoryEstimate:
    """Peak bytes a run needs, in parts, each under the setting that scales it."""

    parts: dict[str, int] = field(default_factory=dict)
    device_parts: set[str] = field(default_factory=set)  # the parts that live on a GPU when there is one

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def on(self, device_part: bool) -> int:
        """Bytes of the parts that are (True) or are not (False) on the accelerator."""
        return sum(v for k, v in self.parts.items() if (k in self.device_parts) == device_part)

    def largest(self) -> str:
        return max(self.parts, key=self.parts.__getitem__)


def check_memory(cfg: RunConfig, task: Task, device: torch.device, *, purpose: str = "train",
                 n_samples: int = 0, copies: int = 1) -> MemoryEstimate:
    """Estimate the peak memory of training (`purpose="train"`) or analysing (`"analyze"`,
    `n_samples` sentences) the run of `cfg`, times `copies` runs at once (a sweep's workers), and
    raise ConfigError (exit 2) naming the setting to lower when it exceeds what is available.
    Returns the estimate. A no-op check, but still an estimate, under WORKBENCH_SKIP_MEMORY_CHECK=1."""
    estimate = estimate_peak(cfg, task, purpose=purpose, n_samples=n_samples)
    if os.environ.get(SKIP_ENV, "") in ("", "0"):
        for needed, (available, source) in _needs_and_budgets(estimate, device):
            if available is not None and needed * copies > available:
                raise ConfigError(_too_large(estimate, needed * copies, available, source, copies, purpose))
    return estimate


def _needs_and_budgets(estimate: MemoryEstimate, device: torch.device) -> list[tuple[int, tuple[int | None, str]]]:
    """(bytes needed, (bytes available, what says so)) for each memory the run uses: the host's
    alone on the CPU; on a GPU, the GPU's for the model and activations, the host's for the rest."""
    if device.type != "cuda":
        return [(estimate.total, memory_available(None))]
    return [(estimate.on(True), memory_available(device)), (estimate.on(False), memory_available(None))]


def estimate_peak(cfg: RunConfig, task: Task, *, purpose: str = "train", n_samples: int = 0) -> MemoryEstimate:
    """The peak bytes of training or analysing one run of `cfg`, in parts by setting."""
    m, t = cfg.model, cfg.train
    params = parameter_count(cfg, task)
    per_sample = _activation_bytes(cfg, task)
    sample_bytes = batch_bytes_per_sample(task)
    if purpose == "analyze":  # the weights, as read and as loaded; caches of clean and corrupted runs
        return MemoryEstimate({f"model ({_model_settings(cfg)})": 2 * FLOAT * params,
                               f"analyze --samples={n_samples}": 2 * n_samples * (per_sample + sample_bytes)},
                              {f"model ({_model_settings(cfg)})", f"analyze --samples={n_samples}"})
    chunk = min(t.eval_size, EVAL_CHUNK)
    logits = task.n_ctx * task.d_vocab_out * FLOAT
    model = f"model ({_model_settings(cfg)})"
    train_batch = f"train.batch_size={t.batch_size}"
    evaluation = f"train.eval_size={t.eval_size}"
    parts = {
        # weights, gradients and AdamW's two moments; an evaluation chunk's forward (one layer at a time)
        model: 4 * FLOAT * params + chunk * per_sample // max(1, m.n_layers),
        train_batch: t.batch_size * (per_sample + sample_bytes),
        # the evaluation set, then every chunk's logits and their concatenation
        evaluation: int(t.eval_size * (2 * logits + SAMPLING_OVERHEAD * sample_bytes)),
    }
    if t.n_train:
        parts[f"train.n_train={t.n_train}"] = int(SAMPLING_OVERHEAD * t.n_train * sample_bytes)
    return MemoryEstimate(parts, {model, train_batch, evaluation})


def parameter_count(cfg: RunConfig, task: Task) -> int:
    """Trained values of the run's HookedTransformer, from its sizes (no model is built): tied
    layers count once."""
    m = cfg.model
    d, heads, d_head, d_mlp = m.d_model, m.n_heads, m.head_dim, m.mlp_dim
    n_ctx = m.n_ctx or task.n_ctx
    attention = 4 * d * heads * d_head + 3 * heads * d_head + d
    mlp = 2 * d * d_mlp + d_mlp + d
    layer = attention + mlp + 4 * d  # two LayerNorms
    layers = layer * (1 if m.tie_layers else m.n_layers)
    positions = 0 if m.positional == "rotary" else n_ctx * d
    return task.d_vocab * d + positions + layers + 2 * d + d * task.d_vocab_out + task.d_vocab_out


def _activation_bytes(cfg: RunConfig, task: Task) -> int:
    """Bytes a training step keeps for its backward pass, per sample: every layer's hook points
    at every position, the embeddings and the logits (and their gradients)."""
    m = cfg.model
    pos = m.n_ctx or task.n_ctx
    widths = {"d_model": m.d_model, "d_head": m.n_heads * m.head_dim, "pos": m.n_heads * pos, "d_mlp": m.mlp_dim}
    per_token_layer = sum(SAVED_PER_TOKEN[k] * widths[k] for k in widths)
    per_token = m.n_layers * per_token_layer + 4 * m.d_model + 3 * task.d_vocab_out
    return FLOAT * pos * per_token


def batch_bytes_per_sample(task: Task) -> int:
    """Bytes of one sampled sentence with its labels, positions and masks (measured on 16)."""
    batch = task.sample(16, seeded_generator(0))
    tensors = [getattr(batch, f) for f in vars(batch) if isinstance(getattr(batch, f), torch.Tensor)]
    tensors += [t for t in batch.latents.values() if isinstance(t, torch.Tensor)]
    return -(-sum(t.numel() * t.element_size() for t in tensors) // 16)


def memory_available(device: torch.device | None = None) -> tuple[int | None, str]:
    """Bytes this process may still allocate, and what says so: on a CUDA device its free memory;
    on the host the least of MemAvailable (/proc/meminfo), the cgroup's limit less its usage
    (v2 memory.max, v1 memory.limit_in_bytes) and the address-space limit (ulimit -v). None where
    nothing is known."""
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"free memory of {device} (torch.cuda.mem_get_info)"
    limits = [_meminfo_available(), _cgroup_available(), _address_space_available()]
    known = [(b, s) for b, s in limits if b is not None]
    return min(known) if known else (None, "unknown")


def _meminfo_available() -> tuple[int | None, str]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    return None, ""


def _cgroup_available() -> tuple[int | None, str]:
    """The memory limit of this process's cgroup less what the cgroup already uses (v2, else v1)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, ""
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the unified hierarchy
            folder = Path("/sys/fs/cgroup") / path.lstrip("/")
            found = _limit_less_usage(folder / "memory.max", folder / "memory.current")
        elif "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            found = _limit_less_usage(folder / "memory.limit_in_bytes", folder / "memory.usage_in_bytes")
        else:
            continue
        if found is not None:
            return found, f"the container's memory limit ({folder})"
    return None, ""


def _limit_less_usage(limit_file: Path, usage_file: Path) -> int | None:
    """A cgroup's limit less its usage, in bytes; None without a limit ("max", or v1's near-2^63)."""
    try:
        raw = limit_file.read_text(errors="replace")[:64].strip()
        if raw == "max" or int(raw) >= 2**60:
            return None
        return max(0, int(raw) - int(usage_file.read_text(errors="replace")[:64].strip()))
    except (OSError, ValueError):
        return None


def _address_space_available() -> tuple[int | None, str]:
    """RLIMIT_AS (`ulimit -v`) less this process's virtual size."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return None, ""
    try:
        status = Path("/proc/self/status").read_text()
        size = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        size = 0
    return max(0, limit - size), "the address-space limit (ulimit -v)"


def _model_settings(cfg: RunConfig) -> str:
    m = cfg.model
    return f"model.d_model={m.d_model}, model.d_mlp={m.mlp_dim}, model.n_layers={m.n_layers}, model.n_heads={m.n_heads}"


def _too_large(estimate: MemoryEstimate, needed: int, available: int, source: str, copies: int, purpose: str) -> str:
    """The refusal: how much is needed and available, every part, and the setting to lower."""
    largest = estimate.largest()
    setting = "the model's sizes" if largest.startswith("model (") else largest.split("=")[0]
    at_once = f" for {copies} cells at once (--workers)" if copies > 1 else ""
    what = "training" if purpose == "train" else "analysing"
    parts = "; ".join(f"{name}: {_gb(n)}" for name, n in sorted(estimate.parts.items(), key=lambda kv: -kv[1]))
    return (f"{what} this run needs about {_gb(needed)} of memory at its peak{at_once}, but {_gb(available)} is "
            f"available ({source}). Its parts: {parts}. Lower {setting}{' (or --workers)' if copies > 1 else ''}, "
            f"or set {SKIP_ENV}=1 to try anyway")


def _gb(n: int) -> str:
    return f"{n / 1e9:,.3g} GB" if n < 1e12 else f"{n / 1e12:,.0f} TB"
