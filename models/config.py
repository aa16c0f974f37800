"""Run configuration: one dataclass per concern, composed in `RunConfig`, round-tripped through
`config.json`, validated on construction with messages that say what to change."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from models.planted import parse_planted
from tasks import ConfigError, TaskConfig, registered_task, task_names

ACT_FNS = ("gelu", "relu", "silu", "gelu_new")
NORMALIZATIONS = ("LN", "LNPre", "RMS", "RMSPre")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
POSITIONALS = ("standard", "rotary")
NORM_POSITIONS = ("pre", "post")
UNEMBED_BIAS_INITS = ("zero", "uniform")
WEIGHT_DECAY_ON = ("matrices", "all")
SOFTMAXES = ("standard", "stablemax")
SAMPLINGS = ("replacement", "epochs")
MAX_SNAPSHOTS = 10_000  # a count or list of train.snapshots; 20 is the default, and each one is a weights file
MAX_SEED = 2**62  # room for the trainer's seed offsets (seed + 3_000_003) within a 64-bit generator seed


@dataclass
class ModelConfig:
    """A HookedTransformer's shape and the variants the studies need.

    init_gamma: every weight matrix drawn N(0, d_in^(-2 gamma)), i.e. std = d_in^-gamma
      (None keeps TransformerLens's default init).
    tie_layers: ALBERT-style; every block shares block 0's parameters, hooks stay per layer.
    min_depth: stochastic depth; each training batch runs the first d blocks, d drawn uniformly
      from min_depth..n_layers; evaluation always uses all n_layers.
    norm_position: "pre" (TransformerLens's blocks: x + Attn(LN(x)), a final LN before the
      unembedding) or "post" (the original Transformer and the composite paper's model:
      x -> LN(x + Attn(x)) -> LN(. + MLP(.)), no final LN; models/factory.py, install_post_norm).
      Post-LN needs normalization "LN".
    positional: "standard" (learned absolute) or "rotary" (relative; rotary_dim = d_head / 2, so
      half of each head's dimensions match content regardless of distance).
    identity_attention: per head trainable a_h, b_h (from 0) adding a_h X X^T to the scores and
      b_h A_h X to the output (models/identity_attention.py); learns same-symbol attention fast.
    identity_off_diagonal: with identity_attention, the a_h X X^T term leaves each position's
      score with itself out, so a_h > 0 favours *other* occurrences of a symbol (in LEGO, a
      right-hand variable's parent clause) rather than the position itself.
    fixed_embeddings: token embeddings stay at their random init and the unembedding is their
      transpose (logit of token j = x . W_E[j]). For unseen-symbol tasks: an unseen symbol then
      looks like a seen one on the way in and out (a learned unembedding never trains the rows of
      symbols it never outputs, and Adam drags them all one way).
    shared_qk: every head's keys use its query weights (W_K = W_Q, b_K = b_Q: one parameter), as
      in Reformer's shared-QK attention. A token's score with itself and with other occurrences
      of its symbol is then |q|^2-like and positive from the start: a prior toward association
      (same-symbol) attention that is an architectural constraint, not a planted pattern.
    planted: hardcoded heads, {"layer.head": kind} with kind association / manipulation /
      broadcast and layer "*" for every layer (models/planted.py); the rest trains around them.
    biases: false removes the attention's (Q/K/V/O) and the MLP's biases, as in the composite
      paper's model: they are zeroed and frozen, so they add nothing and never train. The
      LayerNorms and the unembedding keep theirs.
    unembed_bias_init: the unembedding's bias at init. "zero" (TransformerLens's default, and what
      init_gamma leaves) or "uniform": U(-1/sqrt(d_model), 1/sqrt(d_model)), PyTorch's nn.Linear
      default, not rescaled with init_gamma, as in the composite paper's public code (of the
      parameters its gamma init leaves at PyTorch's defaults, the one whose default differs
      from TransformerLens's).
    """

    n_layers: int = 4
    d_model: int = 64
    n_heads: int = 4
    d_head: int | None = None  # default d_model // n_heads
    d_mlp: int | None = None  # default 4 * d_model
    act_fn: str = "gelu"
    normalization: str = "LN"
    norm_position: str = "pre"
    init_gamma: float | None = None
    tie_layers: bool = False
    min_depth: int | None = None
    n_ctx: int | None = None  # default: the task's sequence length
    positional: str = "standard"
    identity_attention: bool = False
    identity_off_diagonal: bool = False
    fixed_embeddings: bool = False
    shared_qk: bool = False
    planted: dict[str, str] = field(default_factory=dict)
    biases: bool = True
    unembed_bias_init: str = "zero"

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name}={getattr(self, name)} must be >= 1")
        for name in ("d_head", "d_mlp"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"model.{name}={getattr(self, name)} must be >= 1, or null for its default")
        if self.d_head is None and self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; set "
                              "model.d_head")
        if self.act_fn not in ACT_FNS:
            raise ConfigError(f"model.act_fn={self.act_fn!r} is unknown; use one of {ACT_FNS}")
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(f"model.normalization={self.normalization!r} is unknown; use one of {NORMALIZATIONS}")
        if self.norm_position not in NORM_POSITIONS:
            raise ConfigError(f"model.norm_position={self.norm_position!r} is unknown; use one of {NORM_POSITIONS}")
        if self.norm_position == "post" and self.normalization != "LN":
            raise ConfigError(f"model.norm_position='post' needs model.normalization='LN', not {self.normalization!r}")
        if self.positional not in POSITIONALS:
            raise ConfigError(f"model.positional={self.positional!r} is unknown; use one of {POSITIONALS}")
        if self.unembed_bias_init not in UNEMBED_BIAS_INITS:
            raise ConfigError(f"model.unembed_bias_init={self.unembed_bias_init!r} is unknown; use one of "
                              f"{UNEMBED_BIAS_INITS}")
        if self.init_gamma is not None and self.init_gamma <= 0:
            raise ConfigError(f"model.init_gamma={self.init_gamma} must be > 0 (std = d_in^-gamma), or null for the "
                              "default init")
        if self.min_depth is not None and not 1 <= self.min_depth <= self.n_layers:
            raise ConfigError(f"model.min_depth={self.min_depth} is outside 1..n_layers={self.n_layers}")
        if self.identity_off_diagonal and not self.identity_attention:
            raise ConfigError("model.identity_off_diagonal=true needs model.identity_attention=true")
        parse_planted(self.planted, self.n_layers, self.n_heads)

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def mlp_dim(self) -> int:
        return self.d_mlp or 4 * self.d_model


@dataclass
class TrainConfig:
    """AdamW with linear warm-up then cosine decay to `min_lr`; loss only on supervised labels.

    weight_decay_on: "matrices" decays the weight matrices (W_*) only; "all" every trained
      parameter (biases, norms and embeddings included), as AdamW over model.parameters() in the
      composite paper's public code.
    warmup_from: the warm-up's first learning rate. None: the warm-up climbs from lr/warmup_steps
      at step 1; a number: from this lr at step 1 to `lr` at step warmup_steps + 1, linearly (the
      composite group's GradualWarmupScheduler, stepped per batch).
    n_train: None draws fresh training data every step; a number fixes a training set of that
      many samples, which `sampling` draws batches from.
    sampling: how batches are drawn from the fixed training set: "replacement", each row
      uniformly with replacement; "epochs", every row once per epoch in a shuffled order and the
      last partial batch dropped (a DataLoader with shuffle=True, drop_last=True). An epoch's order
      depends on the seed and the epoch only, so a resumed run draws what it would have drawn.
    mimic_steps: before step 0, this many steps of mimicking pre-training on random tokens
      (heads 0 and 1 of every layer imitate conv and same-token patterns; models/mimic.py).
    compile: run the whole training step (forward, loss, backward, clipping, AdamW) through
      torch.compile as one graph, replayed as a CUDA graph on a GPU (the first steps pay the
      compilation: tens of seconds on a CPU); evaluation stays eager.
    precision: "fp32", or "bf16" autocast for the training forward (where the device has bf16
      kernels); weights, optimizer and evaluation stay fp32. Only fp32 without compile gives
      bit-identical weights across runs of one seed (README).
    tf32: on CUDA, fp32 matmuls on TF32 tensor cores (about 8x the fp32 rate on an H100/H200,
      inputs rounded to a 10-bit mantissa); off by default, since it changes the recorded numbers.
      No effect on the CPU.
    adam_beta2, adam_eps: AdamW's second-moment decay and epsilon (torch's defaults); the
      remedies for a loss spike that the slingshot and preconditioner accounts name.
    loss_dtype: "float32", or "float64" for the training loss's softmax and cross-entropy (the
      logits cast up first): below a mean loss of ~1e-7 most samples' float32 loss is exactly 0
      and their gradient too ("softmax collapse"); float64 keeps them.
    softmax: "standard", or "stablemax" for the training loss's probabilities: s(x) = x + 1 for
      x >= 0 and 1 / (1 - x) below, normalised (Prieto et al., ICLR 2025), which grows linearly,
      not exponentially, so a confident answer's loss stays above the dtype's floor. Evaluation
      and every analysis take the argmax, which StableMax does not change.
    identity_lr_scale: the identity-attention scalars a_h, b_h (model.identity_attention) train
      at this multiple of the learning rate; they start at 0 and a same-symbol logit gap of a
      few units needs a_h of order 1, hundreds of steps at Adam's lr 1e-3.
    plateau_evals: a stop rule. None (default) trains all `steps`; a number N stops the run at
      the evaluation where the headline accuracy (supervised variables, seen pairs) has not risen
      more than `plateau_tol` above its best before the last N evaluations. The run is then done
      (resume does not continue it), with its last checkpoint at that step; the lr schedule stays
      that of `steps`.
    plateau_min_steps: the stop rule never ends a run before this step, for a plateau that comes
      before a late rise (the case that asked for it: analyses/lab/composite-protocol.md, section "Protocol
      ablation, stage 2", paragraph "The stop rule on the gamma 0.3 stall").
    plateau_watch: metric names (e.g. held_out_inferential, held_out_symmetric) that must have
      settled too before the rule stops the run: over the last `plateau_evals` evaluations each
      moves by no more than `plateau_watch_tol` (max - min). A run whose held-out answers still
      drift trains on although its headline accuracy is flat.
    init_from: a run folder whose weights (model.safetensors) this run starts from instead of
      its own seed's initialisation: a new schedule and a fresh optimizer on a trained model
      (an lr anneal, or a curriculum: the same model on a harder task config). Its model section
      must equal this run's. The source's path, step and weight digest go to init.json; resume
      continues from this run's own checkpoints and does not need the source.
    snapshots: the weights kept along the way (models/snapshots.py, for `workbench analyze
      --timeline`): a count N keeps step 0, N - 2 log-spaced steps and the final weights; a list
      keeps those of its steps below train.steps (so one list serves every stage of a curriculum); 0 none.
    snapshot_loss_factor: keep the snapshot of the evaluation before the one where the training
      loss rose more than this factor above its running minimum (and by 0.01 at least); null: off.
    keep_state: steps at which the whole training state (weights, AdamW's state, data generators)
      is kept in the run folder's states/, to replay the run from there with a setting changed
      (`workbench train --from RUN@STEP`); each event snapshot keeps its step's state too.
    snapshot_watch: metrics whose move by more than `snapshot_watch_delta` between two evaluations
      keeps the snapshot before (null: the task's headline metric; [] none).
    """

    steps: int = 1000
    batch_size: int = 128
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_steps: int = 100
    warmup_from: float | None = None
    weight_decay: float = 0.01
    weight_decay_on: str = "matrices"
    grad_clip: float | None = 1.0
    n_train: int | None = None
    sampling: str = "replacement"
    eval_every: int = 100
    eval_size: int = 2000
    checkpoint_every: int = 500
    seed: int = 0
    device: str = "auto"
    mimic_steps: int = 0
    compile: bool = False
    precision: str = "fp32"
    tf32: bool = False
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    loss_dtype: str = "float32"
    softmax: str = "standard"
    identity_lr_scale: float = 1.0
    plateau_evals: int | None = None
    plateau_tol: float = 0.002
    plateau_min_steps: int = 0
    plateau_watch: list[str] = field(default_factory=list)
    plateau_watch_tol: float = 0.02
    init_from: str | None = None
    snapshots: int | list[int] = 20
    snapshot_loss_factor: float | None = 4.0
    snapshot_watch: list[str] | None = None
    snapshot_watch_delta: float = 0.2
    keep_state: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._check_snapshots()
        if not (isinstance(self.keep_state, list) and all(isinstance(s, int) and 0 < s <= self.steps
                                                           for s in self.keep_state)):
            raise ConfigError(f"train.keep_state={self.keep_state!r}: need a list of steps within "
                              f"1..train.steps={self.steps}")
        if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from.strip()):
            raise ConfigError(f"train.init_from={self.init_from!r} must name a run folder, or be null")
        if self.init_from is not None and self.mimic_steps:
            raise ConfigError("train.init_from and train.mimic_steps both set the starting weights; use one")
        if self.plateau_evals is not None and self.plateau_evals < 1:
            raise ConfigError(f"train.plateau_evals={self.plateau_evals} must be >= 1, or null to train every step")
        if not 0 <= self.plateau_tol < 1:
            raise ConfigError(f"train.plateau_tol={self.plateau_tol} must be within 0..1")
        if not 0 <= self.plateau_watch_tol < 1:
            raise ConfigError(f"train.plateau_watch_tol={self.plateau_watch_tol} must be within 0..1")
        if self.plateau_min_steps < 0:
            raise ConfigError(f"train.plateau_min_steps={self.plateau_min_steps} must be >= 0")
        if self.plateau_evals is None and (self.plateau_min_steps or self.plateau_watch):
            raise ConfigError("train.plateau_min_steps and train.plateau_watch refine the stop rule; "
                              "set train.plateau_evals too, or leave them unset")
        if not 0 < self.adam_beta2 < 1 or not self.adam_eps > 0:
            raise ConfigError(f"train.adam_beta2={self.adam_beta2}, train.adam_eps={self.adam_eps}: need "
                              "0 < adam_beta2 < 1 and adam_eps > 0")
        if self.loss_dtype not in ("float32", "float64"):
            raise ConfigError(f"train.loss_dtype={self.loss_dtype!r} is unknown; use 'float32' or 'float64'")
        if self.softmax not in SOFTMAXES:
            raise ConfigError(f"train.softmax={self.softmax!r} is unknown; use one of {SOFTMAXES}")
        if self.sampling not in SAMPLINGS:
            raise ConfigError(f"train.sampling={self.sampling!r} is unknown; use one of {SAMPLINGS}")
        if self.sampling == "epochs" and self.n_train is None:
            raise ConfigError("train.sampling='epochs' walks a fixed training set; set train.n_train too")
        if self.warmup_from is not None and not 0 < self.warmup_from <= self.lr:
            raise ConfigError(f"train.warmup_from={self.warmup_from} must be within (0, train.lr={self.lr}], "
                              "or null")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision={self.precision!r} is unknown; use one of {PRECISIONS}")
        if not self.identity_lr_scale > 0:
            raise ConfigError(f"train.identity_lr_scale={self.identity_lr_scale} must be > 0")
        if self.mimic_steps < 0:
            raise ConfigError(f"train.mimic_steps={self.mimic_steps} must be >= 0")
        for name in ("steps", "batch_size", "eval_every", "eval_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"train.lr={self.lr}, train.min_lr={self.min_lr}: need 0 <= min_lr <= lr and lr > 0")
        if self.warmup_steps < 0:
            raise ConfigError(f"train.warmup_steps={self.warmup_steps} must be >= 0")
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay={self.weight_decay} must be >= 0")
        if self.weight_decay_on not in WEIGHT_DECAY_ON:
            raise ConfigError(f"train.weight_decay_on={self.weight_decay_on!r} is unknown; use one of "
                              f"{WEIGHT_DECAY_ON}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"train.grad_clip={self.grad_clip} must be > 0, or null for no clipping")
        if self.n_train is not None and self.n_train < self.batch_size:
            raise ConfigError(f"train.n_train={self.n_train} is smaller than batch_size={self.batch_size}")
        if self.device not in DEVICES:
            raise ConfigError(f"train.device={self.device!r} is unknown; use one of {DEVICES}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"train.seed={self.seed} is outside 0..{MAX_SEED} (the data and evaluation seeds are "
                              f"offsets of it, and torch's generators take 64-bit seeds)")


    def _check_snapshots(self) -> None:
        spec = self.snapshots
        is_count = isinstance(spec, int) and not isinstance(spec, bool)
        if not is_count and not (isinstance(spec, list) and all(isinstance(s, int) and not isinstance(s, bool)
                                                                 for s in spec)):
            raise ConfigError(f"train.snapshots={spec!r} is neither a count nor a list of steps; "
                              "e.g. 20 or [0, 500, 1000]")
        if isinstance(spec, list):
            wrong = [s for s in spec if s < 0]
            if wrong or len(set(spec)) != len(spec):
                raise ConfigError(f"train.snapshots={spec}: each step once, and >= 0"
                                  + (f" ({wrong} are not)" if wrong else ""))
        elif spec == 1 or spec < 0:
            raise ConfigError(f"train.snapshots={spec}: give a count >= 2 (step 0, log-spaced steps and the final "
                              f"weights), a list of steps, or 0 for none")
        if (len(spec) if isinstance(spec, list) else spec) > MAX_SNAPSHOTS:
            shown = f"a list of {len(spec):,} steps" if isinstance(spec, list) else spec
            raise ConfigError(f"train.snapshots={shown} keeps more snapshots than a run folder holds; "
                              f"use <= {MAX_SNAPSHOTS:,}")
        if self.snapshot_loss_factor is not None and not self.snapshot_loss_factor > 1:
            raise ConfigError(f"train.snapshot_loss_factor={self.snapshot_loss_factor} must be > 1, or null for no "
                              f"loss-spike snapshots")
        if not 0 < self.snapshot_watch_delta <= 1:
            raise ConfigError(f"train.snapshot_watch_delta={self.snapshot_watch_delta} must be within (0, 1]")


@dataclass
class RunConfig:
    task: TaskConfig  # the config class the task registry has for task.name (tasks.registry)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def heads_origin(self) -> str:
        """How the model got its attention heads, as every report must say it: "planted" (some
        heads' patterns are hardcoded, so a head classifier finds what was put in), "mimicked"
        (mimicking pre-training on random tokens, then the task), "warm-started" (from another
        run's weights, `train.init_from`: that run's origin applies too), or "learned" (random
        init, nothing given)."""
        if self.model.planted:
            return "planted"
        if self.train.mimic_steps:
            return "mimicked"
        if self.train.init_from is not None:
            return "warm-started"
        return "learned"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        unknown = set(data) - {"task", "model", "train"}
        if unknown:
            raise ConfigError(f"the config has unknown section(s) {sorted(unknown)}; sections: task, model, train")
        if "task" not in data:
            names = task_names()
            raise ConfigError(f"the config has no task section; it must be a JSON object naming the task and its "
                              f"settings, e.g. {{\"name\": \"{names[0]}\"}} with name one of {names}")
        for section in ("task", "model", "train"):
            if section in data and not isinstance(data[section], dict):
                raise ConfigError(f"the {section} section is {data[section]!r}; it must be a JSON object of "
                                  f"{section} settings, e.g. {{\"{_EXAMPLE_KEY[section]}\": ...}}")
        task_data = dict(data["task"])
        task = registered_task(task_data.get("name"))  # ConfigError naming the known tasks
        return cls(
            task=_build(task.config, task_data, "task"),
            model=_build(ModelConfig, data.get("model", {}), "model"),
            train=_build(TrainConfig, data.get("train", {}), "train"),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def with_overrides(self, assignments: list[str]) -> RunConfig:
        """A copy with `section.key=value` assignments applied (values parsed as JSON when they
        parse, else taken as strings), validated like any other config."""
        data = self.to_dict()
        for assignment in assignments:
            key, sep, raw = assignment.partition("=")
            section, _, name = key.strip().partition(".")
            if not sep or section not in data or not name:
                raise ConfigError(f"--set {assignment!r} is not of the form section.key=value with section in "
                                  f"{sorted(data)}")
            if name not in data[section]:
                raise ConfigError(f"--set {key}: {section} has no field {name!r}; fields: {sorted(data[section])}")
            data[section][name] = parse_value(raw, f"--set {key}")
        return RunConfig.from_dict(data)


_EXAMPLE_KEY = {"task": "name", "model": "n_layers", "train": "steps"}  # a field of each section, for messages


def parse_value(raw: str, where: str = "the value") -> Any:
    """A command-line value: JSON when it parses (numbers, true, null, lists, objects), else the
    string. ConfigError naming `where` (e.g. "--set train.steps") for a number too long to parse."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
    except ValueError:  # an integer of more than 4,300 digits (Python's limit)
        raise ConfigError(f"{where}={_short(raw)} is a number of {len(raw):,} characters, too long to be a value; "
                          f"give a number that fits in 64 bits") from None


def _short(text: str) -> str:
    """A long value abbreviated for a message: its first and last characters."""
    return text if len(text) <= 24 else f"{text[:10]}...{text[-10:]}"


INT_LIMIT = 2**63  # every count and size of the workbench fits in a signed 64-bit integer (torch's int64)


def _build(cls: type, values: dict[str, Any], section: str) -> Any:
    """Construct a config dataclass, checking field names and coarse types first."""
    hints = typing.get_type_hints(cls)
    unknown = set(values) - set(hints)
    if unknown:
        raise ConfigError(f"{section} has no field(s) {sorted(unknown)}; fields: {sorted(hints)}")
    coerced = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()}
    return cls(**coerced)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Accept ints for floats; reject values of the wrong kind, non-finite numbers and lists
    with elements of the wrong kind, with a message."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}={value!r} is not a finite number")
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    allowed = typing.get_args(hint) if is_union else (hint,)
    if value is None and type(None) in allowed:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_LIMIT:
        raise ConfigError(f"{where}={_short(str(value))} is too large (a number of {len(str(value))} digits); "
                          f"values must fit in 64 bits (below 2**63)")
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    for kind in allowed:
        origin = typing.get_origin(kind) or kind
        if isinstance(origin, type) and isinstance(value, origin) and not (origin is int and isinstance(value, bool)):
            if origin is list and typing.get_args(kind):
                return [_coerce(item, typing.get_args(kind)[0], f"{where}[{i}]") for i, item in enumerate(value)]
            return value
    raise ConfigError(f"{where}={value!r} has the wrong type; expected {hint}")
