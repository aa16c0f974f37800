"""Every model option either right or refused (issue 28, part 4; the table is in docs/limits.md).

One row per option that changes how a head's output reaches a later head: TransformerLens's
`HookedTransformerConfig` options and the project's own model options. On a tiny random model
with the option (float64, every parameter random, norms and biases included), path patching
equals its slow textbook reference (`path_patch_reference`: two hooked forwards per path) and
edge ablation equals a reference that cuts one edge by hooks alone (`edge_reference`), to 1e-9;
or both refuse with a ValueError that names the option. Where a refused model still runs, the
refusal is shown to be needed: without the guard, path patching differs from its reference.
Exact patching is checked against TransformerLens's own for the options that touch it."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import interp.circuit
import interp.paths
from interp.circuit import candidate_edges, edge_faithfulness
from interp.patching import LogitDiff, patch_head_out, patch_residual
from interp.paths import INPUTS, check_path_patchable, path_patch, path_patch_reference, per_head_inputs
from models.config import ModelConfig
from models.factory import build_model
from tasks import CompositeConfig, CompositeTask

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from transformer_lens import patching as tl_patching

N_LAYERS, N_HEADS, D_VOCAB, N_POS = 3, 2, 11, 6
BASE = dict(n_layers=N_LAYERS, d_model=16, n_heads=N_HEADS, d_head=4, d_mlp=32, d_vocab=D_VOCAB, n_ctx=N_POS,
            act_fn="gelu", normalization_type="LN", attention_dir="causal", default_prepend_bos=False,
            dtype=torch.float64, seed=0)
TOLERANCE, F32_TOLERANCE = 1e-9, 1e-4  # float64 models; the one float32 model (mixture of experts)
COMPOSITE = CompositeTask(CompositeConfig())

# (row id, HookedTransformerConfig options or a project ModelConfig, what a refusal's message names
# or EXACT: equal to the references)
EXACT = None
ROWS = [
    ("normalization_type=LN", {}, EXACT),
    ("normalization_type=LNPre", {"normalization_type": "LNPre"}, EXACT),
    ("normalization_type=RMS", {"normalization_type": "RMS"}, EXACT),
    ("normalization_type=RMSPre", {"normalization_type": "RMSPre"}, EXACT),
    ("normalization_type=None", {"normalization_type": None}, EXACT),
    ("final_rms", {"final_rms": True}, EXACT),
    ("use_normalization_before_and_after", {"normalization_type": "RMS", "use_normalization_before_and_after": True},
     "use_normalization_before_and_after"),
    ("parallel_attn_mlp", {"parallel_attn_mlp": True}, EXACT),
    ("n_key_value_heads", {"n_key_value_heads": 1}, EXACT),
    ("attn_only", {"attn_only": True}, EXACT),
    ("positional=rotary", {"positional_embedding_type": "rotary", "rotary_dim": 4}, EXACT),
    ("positional=shortformer", {"positional_embedding_type": "shortformer"}, EXACT),
    ("positional=alibi", {"positional_embedding_type": "alibi"}, EXACT),
    ("use_split_qkv_input", {"use_split_qkv_input": True}, EXACT),
    ("use_attn_result", {"use_attn_result": True}, EXACT),
    ("use_attn_in", {"use_attn_in": True}, EXACT),
    ("gated_mlp", {"gated_mlp": True}, EXACT),
    ("num_experts", {"num_experts": 3, "experts_per_token": 2, "gated_mlp": True, "act_fn": "silu",
                     "dtype": torch.float32}, EXACT),  # TransformerLens's MoE fails in float64
    ("use_attn_scale=False", {"use_attn_scale": False}, EXACT),
    ("attn_scale", {"attn_scale": 3.0}, EXACT),
    ("scale_attn_by_inverse_layer_idx", {"scale_attn_by_inverse_layer_idx": True}, EXACT),
    ("use_hook_mlp_in", {"use_hook_mlp_in": True}, EXACT),
    ("use_qk_norm", {"use_qk_norm": True, "normalization_type": "RMS"}, EXACT),
    ("clip_qkv", {"clip_qkv": 0.5}, EXACT),
    ("attn_scores_soft_cap", {"attn_scores_soft_cap": 2.0}, EXACT),
    ("output_logits_soft_cap", {"output_logits_soft_cap": 2.0}, EXACT),
    ("post_embedding_ln", {"post_embedding_ln": True}, EXACT),
    ("use_local_attn", {"use_local_attn": True, "attn_types": ["local", "global", "local"], "window_size": 2}, EXACT),
    ("use_attention_sinks", {"use_attention_sinks": True}, EXACT),
    ("use_logn_attn", {"use_logn_attn": True, "train_seq_length": 3}, EXACT),
    ("attention_dir=bidirectional", {"attention_dir": "bidirectional"}, EXACT),
    ("original_architecture=Olmo2ForCausalLM", {"original_architecture": "Olmo2ForCausalLM",
                                                "normalization_type": "RMS", "d_head": 8}, "original_architecture"),
    ("load_in_4bit", {"load_in_4bit": True}, "load_in_4bit"),
    # the project's own options (models/factory.py build_model)
    ("model.norm_position=post", ModelConfig(n_layers=N_LAYERS, d_model=16, n_heads=N_HEADS, norm_position="post"),
     "norm_position"),
    ("model.identity_attention", ModelConfig(n_layers=N_LAYERS, d_model=16, n_heads=N_HEADS, identity_attention=True),
     "identity_attention"),
    ("model.tie_layers", ModelConfig(n_layers=N_LAYERS, d_model=16, n_heads=N_HEADS, tie_layers=True), EXACT),
    ("model.shared_qk", ModelConfig(n_layers=N_LAYERS, d_model=16, n_heads=N_HEADS, shared_qk=True), EXACT),
]


def tiny_model(options: dict | ModelConfig) -> HookedTransformer:
    """Every parameter random (norms' scales near 1), so no option's weights sit at a value that
    hides it; eval mode (log-n scaling acts only there). `load_in_4bit` is set after construction:
    building it needs bitsandbytes, and the guard reads the config alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if isinstance(options, ModelConfig):
            model = build_model(options, COMPOSITE, seed=0).double()  # a causal decoder; tokens 0..D_VOCAB-1 are its
            model.cfg.dtype = torch.float64
        else:
            in_4bit = options.get("load_in_4bit", False)
            model = HookedTransformer(HookedTransformerConfig(**{**BASE, **options, "load_in_4bit": False}))
            model.cfg.load_in_4bit = in_4bit
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 1.0 if name.endswith((".w", "sinks")) else 0.0
            param.copy_(scale + 0.4 * torch.randn(param.shape, generator=gen, dtype=torch.float64))
    return model.eval()


def pairs(model: HookedTransformer):
    """Three clean/corrupted pairs (two positions changed) and a metric per pair: the last
    position's logits along a fixed random direction."""
    gen = torch.Generator().manual_seed(2)
    clean = torch.randint(D_VOCAB, (3, N_POS), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 1], corrupted[:, 3] = (clean[:, 1] + 1) % D_VOCAB, (clean[:, 3] + 3) % D_VOCAB
    direction = torch.randn(model.cfg.d_vocab_out, generator=gen, dtype=torch.float64).to(model.cfg.dtype)
    return clean, corrupted, lambda logits: logits[:, -1] @ direction


# The paths and single-edge cuts each row checks (every one of the 42 paths and 29 cuts agreed to
# 1e-12 when this table was drawn up; a sample keeps the file fast): each input q/k/v, from layer 0
# into layer 1, into layer 2 past a frozen layer 1, from layer 1 into layer 2, and to the logits.
PATHS = [((0, 1), None), ((1, 0), None), ((2, 1), None),
         ((0, 0), (1, 1, "q")), ((0, 1), (1, 0, "k")), ((0, 0), (1, 0, "v")),
         ((0, 1), (2, 0, "q")), ((0, 0), (2, 1, "k")), ((0, 1), (2, 1, "v")),
         ((1, 1), (2, 0, "v")), ((1, 0), (2, 1, "q"))]
NODES = {(layer, head) for layer in range(N_LAYERS) for head in range(N_HEADS)} - {(1, 1)}  # one head ablated
CUTS = [((0, 0), (1, 0, "q")), ((0, 1), (2, 0, "k")), ((1, 0), (2, 1, "v")), ((0, 0), (2, 1, "v")),
        ((2, 0), "logits"), ((0, 1), "logits")]


def path_differences(model: HookedTransformer, clean, corrupted, metric) -> tuple[float, float]:
    """Max |path_patch - path_patch_reference| over PATHS, and the spread of the values (so that
    a match is not one between constants)."""
    result = path_patch(model, clean, corrupted, metric)
    ours = [result.direct_raw[sender] if receiver is None
            else result.edges_raw[(*sender, *receiver[:2], INPUTS.index(receiver[2]))] for sender, receiver in PATHS]
    references = [path_patch_reference(model, clean, corrupted, metric, sender, receiver) for sender, receiver in PATHS]
    ours = torch.stack(ours)
    return (ours - torch.tensor(references, dtype=ours.dtype)).abs().max().item(), ours.std().item()


def edge_reference(model: HookedTransformer, clean, corrupted, metric, nodes, cuts) -> list[float]:
    """The metric's mean with `nodes` kept (every other head takes its corrupted output) and one
    edge of `cuts` ablated at a time, by hooks alone. The receiver's q/k/v is read from a forward
    in which the sender's output is its corrupted one and every other head's and MLP's output is
    frozen at the node-ablated run's, then swapped into that run; a cut to the logits is that
    frozen forward itself. Query heads have their own copy of a grouped key and value."""
    z_hooks = lambda name: name.endswith("attn.hook_z")  # noqa: E731
    with per_head_inputs(model):
        _, corrupted_cache = model.run_with_cache(corrupted)

        def keep_nodes(z, hook):
            z = z.clone()
            for head in range(N_HEADS):
                if (hook.layer(), head) not in nodes:
                    z[:, :, head] = corrupted_cache[hook.name][:, :, head]
            return z

        with model.hooks(fwd_hooks=[(z_hooks, keep_nodes)]):
            _, base = model.run_with_cache(clean)
        return [_one_cut(model, clean, metric, base, corrupted_cache, keep_nodes, cut) for cut in cuts]


def _one_cut(model, clean, metric, base, corrupted_cache, keep_nodes, cut) -> float:
    (ls, hs), receiver = cut

    def freeze_heads(z, hook):
        frozen = base[hook.name].clone()
        if hook.layer() == ls:
            frozen[:, :, hs] = corrupted_cache[hook.name][:, :, hs]
        return frozen

    frozen = [(lambda name: name.endswith("attn.hook_z"), freeze_heads),
              (lambda name: name.endswith("hook_mlp_out"), lambda out, hook: base[hook.name])]
    if receiver == "logits":
        with model.hooks(fwd_hooks=frozen):
            return metric(model(clean)).mean().item()
    lr, hr, name = receiver
    point, stored = f"blocks.{lr}.attn.hook_{name}", {}
    with model.hooks(fwd_hooks=[*frozen, (point, lambda act, hook: stored.setdefault("act", act.clone()))]):
        model(clean)

    def swap(act, hook):
        act = act.clone()
        act[:, :, hr] = stored["act"][:, :, hr]
        return act

    with model.hooks(fwd_hooks=[(lambda name: name.endswith("attn.hook_z"), keep_nodes), (point, swap)]):
        return metric(model(clean)).mean().item()


def edge_differences(model: HookedTransformer, clean, corrupted, metric) -> tuple[float, float]:
    """Max |edge_faithfulness - reference| over the single-edge cuts of CUTS among NODES (node and
    edge ablation meet), and the spread of the values."""
    everything = set(candidate_edges(NODES))
    ours = edge_faithfulness(model, clean, corrupted, metric, NODES, [everything - {cut} for cut in CUTS])
    with torch.no_grad():
        clean_metric, corrupted_metric = metric(model(clean)).mean().item(), metric(model(corrupted)).mean().item()
    references = [(value - corrupted_metric) / (clean_metric - corrupted_metric)
                  for value in edge_reference(model, clean, corrupted, metric, NODES, CUTS)]
    return max(abs(a - b) for a, b in zip(ours, references)), torch.tensor(ours).std().item()


@pytest.mark.parametrize("options, refused", [pytest.param(o, r, id=i) for i, o, r in ROWS])
@torch.no_grad()
def test_path_patching_and_edge_ablation_equal_their_references_or_refuse_naming_the_option(options, refused):
    model = tiny_model(options)
    clean, corrupted, metric = pairs(model)
    if refused:
        for run in (lambda: path_patch(model, clean, corrupted, metric),
                    lambda: edge_faithfulness(model, clean, corrupted, metric, NODES, [set()])):
            with pytest.raises(ValueError, match=refused):
                run()
        return
    tolerance = TOLERANCE if model.cfg.dtype == torch.float64 else F32_TOLERANCE
    path_diff, path_spread = path_differences(model, clean, corrupted, metric)
    edge_diff, edge_spread = edge_differences(model, clean, corrupted, metric)
    print(f"\npath patching {path_diff:.2g} (spread {path_spread:.2g}), edge ablation {edge_diff:.2g} "
          f"(spread {edge_spread:.2g})")
    assert path_diff <= tolerance and edge_diff <= tolerance
    assert path_spread > 1e-3 and edge_spread > 1e-3


@pytest.mark.parametrize("options", [pytest.param(o, id=i) for i, o, r in ROWS if r and r != "load_in_4bit"])
@torch.no_grad()
def test_each_refused_option_would_give_wrong_numbers(options, monkeypatch):
    """Without the guard, path patching runs on these models and misses its reference: the
    refusal keeps a wrong number out, not a right one."""
    model = tiny_model(options)
    monkeypatch.setattr(interp.paths, "check_path_patchable", lambda model: None)
    path_diff, _ = path_differences(model, *pairs(model))
    assert path_diff > 1e-3


def test_one_guard_serves_path_patching_edge_ablation_and_both_analyses():
    import interp.analysis
    import interp.outside

    for module in (interp.circuit, interp.analysis, interp.outside):
        assert module.check_path_patchable is check_path_patchable


@pytest.mark.parametrize("options", [
    pytest.param({"positional_embedding_type": "shortformer"}, id="shortformer"),
    pytest.param({"positional_embedding_type": "alibi", "attention_dir": "bidirectional"}, id="alibi_bidirectional"),
    pytest.param({"use_logn_attn": True, "train_seq_length": 3, "attention_dir": "bidirectional"},
                 id="logn_bidirectional"),
    pytest.param({"n_key_value_heads": 1}, id="n_key_value_heads"),
    pytest.param({"parallel_attn_mlp": True}, id="parallel_attn_mlp"),
])
@torch.no_grad()
def test_exact_patching_equals_transformer_lens_under_options_that_touch_it(options):
    """Exact patching restarts runs mid-model (`start_at_layer`: a shortformer model's blocks need
    its positions passed) and, for a LogitDiff metric on a bidirectional model, narrows the last
    block's queries to the label row (not where the scores depend on the query's position)."""
    model = tiny_model(options)
    clean, corrupted, _ = pairs(model)
    metric = LogitDiff(torch.tensor([4, 5, 2]), torch.tensor([1, 2, 3]), torch.tensor([4, 0, 7]))
    _, clean_cache = model.run_with_cache(clean)
    for ours, theirs in [(patch_head_out, tl_patching.get_act_patch_attn_head_out_all_pos),
                         (patch_residual, tl_patching.get_act_patch_resid_pre)]:
        expected = theirs(model, corrupted, clean_cache, lambda logits: metric(logits).mean())
        assert (ours(model, clean, corrupted, metric).raw - expected).abs().max() <= 1e-6
        assert expected.std() > 1e-2
