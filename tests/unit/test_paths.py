"""Path patching against the textbook recipe, and on planted circuits whose edges are known by
construction. Run with -s to see the measured max |difference| and each circuit's recall and
precision."""

import itertools
import warnings

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from interp.patching import logit_diff_metric, patch_head_out
from interp.paths import INPUTS, path_patch, path_patch_reference
from models.config import ModelConfig
from models.factory import build_model
from models.planted import install_planted_heads
from tasks import CompositeConfig, CompositeTask, LegoConfig, LegoTask, seeded_generator

LEGO = LegoTask(LegoConfig(n_vars=4, n_supervised=2))
COMPOSITE = CompositeTask(CompositeConfig())


def pairs(task, n=6, seed=0):
    clean, corrupted, _ = task.counterfactual_pairs(n, seeded_generator(seed))
    slot = 1 if task is LEGO else 0
    return clean, corrupted, logit_diff_metric(clean, corrupted, label_index=slot)


@pytest.mark.parametrize("task, model_cfg, direction", [
    (LEGO, ModelConfig(n_layers=3, d_model=32, n_heads=2, positional="rotary"), "clean_to_corrupted"),
    (COMPOSITE, ModelConfig(n_layers=3, d_model=32, n_heads=2, init_gamma=0.3), "corrupted_to_clean"),
    (LEGO, ModelConfig(n_layers=3, d_model=32, n_heads=2, planted={"1.0": "association"}), "clean_to_corrupted"),
])
def test_path_patching_equals_the_slow_reference(task, model_cfg, direction):
    model = build_model(model_cfg, task, seed=2)
    clean, corrupted, metric = pairs(task)
    result = path_patch(model, clean.tokens, corrupted.tokens, metric, direction=direction, max_batch=16)
    diffs = []
    for ls in range(3):
        for hs in range(2):
            ref = path_patch_reference(model, clean.tokens, corrupted.tokens, metric, (ls, hs), None, direction)
            diffs.append(abs(result.direct_raw[ls, hs].item() - ref))
            for lr in range(ls + 1, 3):
                for hr in range(2):
                    for i, name in enumerate(INPUTS):
                        ref = path_patch_reference(model, clean.tokens, corrupted.tokens, metric, (ls, hs),
                                                   (lr, hr, name), direction)
                        diffs.append(abs(result.edges_raw[ls, hs, lr, hr, i].item() - ref))
    print(f"\npath patching vs the slow reference ({len(diffs)} paths, {direction}): max |difference| {max(diffs):.2g}")
    assert max(diffs) <= 1e-4
    assert torch.isnan(result.edges[2, :, 0]).all() and torch.isnan(result.edges[1, :, 1]).all()  # no backward paths
    assert result.edges[0, :, 1:].isfinite().all()
    assert result.edges_raw[0, :, 1:].std() > 1e-4  # edges differ: the comparison is not between constants


def test_planted_heads_have_no_query_or_key_paths_and_zeroed_outputs_no_edges():
    """Known by construction: a planted head's pattern ignores its queries and keys, so every
    Q and K edge into it is exactly 0 (normalised) while its V edges are not; a head whose
    W_O is zero sends nothing."""
    model = build_model(ModelConfig(n_layers=3, d_model=32, n_heads=2,
                                    planted={"1.0": "association", "2.1": "manipulation"}),
                        LEGO, seed=4)
    with torch.no_grad():
        model.blocks[0].attn.W_O[1].zero_()
    clean, corrupted, metric = pairs(LEGO, n=8, seed=1)
    result = path_patch(model, clean.tokens, corrupted.tokens, metric)
    for layer, head in [(1, 0), (2, 1)]:
        into = result.edges[:layer, :, layer, head]  # [sender layer, sender head, input]
        assert into[..., :2].abs().max() <= 1e-6  # q and k
        assert into[..., 2].abs().max() > 1e-3  # v
    assert result.edges[0, 1, 1:].abs().max() <= 1e-6
    assert abs(result.direct[0, 1]) <= 1e-6
    learned = result.edges[:1, :1, 1, 1, :2]  # a learned receiver's q/k paths are not zero
    assert learned.abs().max() > 1e-4


def test_a_heads_direct_effect_is_its_exact_patch_when_nothing_reads_it():
    """In the last layer a head's output reaches the logits only directly: its direct path
    effect equals exact patching of its output."""
    model = build_model(ModelConfig(n_layers=2, d_model=32, n_heads=2), COMPOSITE, seed=5)
    clean, corrupted, metric = pairs(COMPOSITE, n=8)
    with torch.no_grad():  # the last layer's MLP reads the head's output too: take it out of the comparison
        for p in model.blocks[1].mlp.parameters():
            p.zero_()
    paths = path_patch(model, clean.tokens, corrupted.tokens, metric)
    exact = patch_head_out(model, clean.tokens, corrupted.tokens, metric)
    torch.testing.assert_close(paths.direct[1], exact.values[1], atol=1e-4, rtol=0)


def test_post_ln_and_identity_attention_models_are_refused():
    clean, corrupted, metric = pairs(LEGO)
    for cfg in (ModelConfig(n_layers=2, d_model=32, n_heads=2, norm_position="post"),
                ModelConfig(n_layers=2, d_model=32, n_heads=2, identity_attention=True)):
        with pytest.raises(ValueError, match="post-LN|identity"):
            path_patch(build_model(cfg, LEGO), clean.tokens, corrupted.tokens, metric)


# Planted circuits: which heads feed which is fixed by the weights, so the edge set is known.
# A layout lists head -> head edges and the heads the unembedding reads; every other head has a
# zero W_O. (n_layers, edges, heads read by the logits, planted receivers whose pattern ignores
# q and k, task)
PLANTED_CIRCUITS = {
    "chain": (3, [("L0H1", "L1H0"), ("L1H0", "L2H1")], ["L2H1"], {}, LEGO),
    "skip_and_branch": (3, [("L0H0", "L1H1"), ("L1H1", "L2H0"), ("L0H0", "L2H0")], ["L2H0", "L1H1"], {}, LEGO),
    "parallel_chains": (3, [("L0H0", "L1H0"), ("L1H0", "L2H0"), ("L0H1", "L1H1"), ("L1H1", "L2H1")],
                        ["L2H0", "L2H1"], {}, COMPOSITE),
    "fan_in_to_planted": (4, [("L0H0", "L1H1"), ("L0H1", "L1H1"), ("L1H1", "L2H0"), ("L2H0", "L3H1")], ["L3H1"],
                          {"2.0": "association"}, LEGO),
}
EMBED_DIMS, HEAD_DIMS = 8, 4  # the residual stream: embeddings, then one private subspace per live head


def planted_circuit(layout, seed: int) -> HookedTransformer:
    """Random weights confined to subspaces: tokens and positions write the first EMBED_DIMS
    directions; each live head writes its own HEAD_DIMS and reads (q, k and v) the embeddings
    and its senders' subspaces only; the unembedding reads the output heads' subspaces. No
    norms and no MLPs: a norm's scale couples every direction, so an unread subspace would
    still move its readers. Any path not in the layout is then exactly zero."""
    n_layers, edges, outputs, planted, task = layout
    live = sorted({head for edge in edges for head in edge} | set(outputs))
    d_model = EMBED_DIMS + HEAD_DIMS * len(live)
    subspace = {head: slice(EMBED_DIMS + HEAD_DIMS * i, EMBED_DIMS + HEAD_DIMS * (i + 1))
                for i, head in enumerate(live)}
    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=d_model, n_heads=2, d_head=4, d_vocab=task.d_vocab,
                                  d_vocab_out=task.d_vocab_out, n_ctx=task.n_ctx, attn_only=True,
                                  normalization_type=None,
                                  attention_dir="causal" if task.causal else "bidirectional", seed=seed)
    with warnings.catch_warnings():  # TL 3.x announces 4.0 on every construction (models/factory.py)
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg)
    gen = seeded_generator(seed)

    def confined(shape, rows=None, cols=None):  # random, zero outside the given rows / columns
        mask = torch.zeros(shape)
        mask[rows if rows is not None else slice(None), cols if cols is not None else slice(None)] = 1
        return torch.randn(shape, generator=gen) * mask

    with torch.no_grad():
        model.embed.W_E.copy_(confined(model.embed.W_E.shape, cols=slice(EMBED_DIMS)))
        model.pos_embed.W_pos.copy_(confined(model.pos_embed.W_pos.shape, cols=slice(EMBED_DIMS)))
        for layer, head in itertools.product(range(n_layers), range(2)):
            name, attn = f"L{layer}H{head}", model.blocks[layer].attn
            reads = [slice(EMBED_DIMS)] + [subspace[sender] for sender, receiver in edges if receiver == name]
            for w in (attn.W_Q, attn.W_K, attn.W_V):
                w[head] = sum(confined((d_model, 4), rows=rows) for rows in reads) / len(reads) ** 0.5
            attn.W_O[head] = confined((4, d_model), cols=subspace[name]) / 2 if name in live else 0
        model.unembed.W_U.copy_(sum(confined(model.unembed.W_U.shape, rows=subspace[head]) for head in outputs))
    if planted:
        install_planted_heads(model, task, planted)
    return model


def planted_edges(layout) -> set[tuple[str, str]]:
    """The edges of a layout as PathPatchResult.strongest names them; into a planted head, v only."""
    _, edges, outputs, planted, _ = layout
    pattern_fixed = {"L{}H{}".format(*where.split(".")) for where in planted}
    inputs = lambda receiver: ("v",) if receiver in pattern_fixed else INPUTS  # noqa: E731
    return ({(sender, f"{receiver}.{name}") for sender, receiver in edges for name in inputs(receiver)}
            | {(head, "logits") for head in outputs})


class DistanceFromTarget:
    """Per pair, how far the logits are from the target run's (L2 over positions and classes).
    Never negative, so a path's mean effect cannot cancel across pairs: it is > 0 exactly when
    the path changes the output. (A signed metric such as a logit difference can average to
    near 0 over pairs by chance, which no construction rules out.)"""

    def __init__(self, target_logits):
        self.target_logits = target_logits

    def __call__(self, logits):
        return (logits - self.target_logits).flatten(1).norm(dim=1)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("layout", list(PLANTED_CIRCUITS))
def test_path_patching_finds_exactly_the_planted_edges(layout, seed):
    model, expected = planted_circuit(PLANTED_CIRCUITS[layout], seed), planted_edges(PLANTED_CIRCUITS[layout])
    task = PLANTED_CIRCUITS[layout][-1]
    clean, corrupted, _ = task.counterfactual_pairs(8, seeded_generator(seed))
    with torch.no_grad():
        metric = DistanceFromTarget(model(corrupted.tokens))
    result = path_patch(model, clean.tokens, corrupted.tokens, metric)
    values = {(sender, receiver): abs(value) for sender, receiver, value in result.strongest(k=10_000)}
    found = {edge for edge, value in values.items() if value > 1e-4}
    recall, precision = len(found & expected) / len(expected), len(found & expected) / max(len(found), 1)
    weakest = min(values[edge] for edge in expected)
    strongest_other = max(value for edge, value in values.items() if edge not in expected)
    print(f"\nplanted {layout} seed {seed}: recall {recall:.0%}, precision {precision:.0%} "
          f"({len(expected)} edges of {len(values)}); weakest planted {weakest:.3g}, strongest other "
          f"{strongest_other:.1g}")
    assert found == expected
    assert {(s, r) for s, r, _ in result.strongest(k=len(expected))} == expected
