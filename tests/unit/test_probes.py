import json

import pytest
import torch
from jaxtyping import install_import_hook

# conftest checks the jaxtyping shapes of the modules it imports; probes is not among them yet
with install_import_hook("interp.probes", "beartype.beartype"):
    from interp.probes import ProbeSet, fit_probes, probe_grid, residual_streams, residuals_at

from interp.tasks.composite import composite_probe_map  # noqa: E402
from interp.tasks.lego_probes import (  # noqa: E402
    first_layer_reaching,
    lego_probe_map,
    percolation_findings,
    percolation_fit,
    percolation_summary,
)
from models.factory import build_model  # noqa: E402
from tasks import CompositeConfig, CompositeTask, LegoConfig, LegoTask  # noqa: E402
from tests.helpers import TINY_MODEL, tiny_composite_run  # noqa: E402

LEGO = LegoTask(LegoConfig(n_vars=4, n_supervised=2))
COMPOSITE = CompositeTask(CompositeConfig())
METHODS = ["lda", "ridge", "logistic"]


@pytest.fixture(scope="module")
def lego_model():
    return build_model(TINY_MODEL, LEGO, seed=0).eval()


def clusters(n: int, centres: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian blobs (unit noise) around the given class centres: [probe, class, d_model]."""
    n_probes, n_classes, d_model = centres.shape
    labels = torch.randint(n_classes, (n_probes, n), generator=gen)
    noise = torch.randn(n_probes, n, d_model, generator=gen)
    return centres.gather(1, labels.unsqueeze(-1).expand(-1, -1, d_model)) + noise, labels


@pytest.mark.parametrize("method", METHODS)
def test_fitter_separates_clusters_and_stays_at_chance_on_random_labels(method, gen):
    centres = 4 * torch.randn(3, 5, 16, generator=gen)  # 3 probes, 5 well separated classes
    train_x, train_y = clusters(600, centres, gen)
    test_x, test_y = clusters(600, centres, gen)
    # probe 2 gets random labels: fitted in the same batch, it must learn nothing from the others
    train_y[2] = torch.randint(5, (600,), generator=gen)
    test_y[2] = torch.randint(5, (600,), generator=gen)
    accuracy = fit_probes(train_x, train_y, n_classes=5, method=method).accuracy(test_x, test_y)
    assert (accuracy[:2] > 0.98).all(), accuracy
    assert abs(accuracy[2].item() - 0.2) < 0.06, accuracy


def test_masked_samples_are_left_out_of_the_fit(gen):
    centres = 4 * torch.randn(1, 2, 8, generator=gen)
    x, y = clusters(400, centres, gen)
    mask = torch.rand(y.shape, generator=gen) < 0.5
    poisoned = torch.where(mask, y, 1 - y)  # every masked-out label is wrong
    probes = fit_probes(x, poisoned, n_classes=2, mask=mask)
    assert probes.accuracy(x, y).item() > 0.98
    assert probes.accuracy(x, poisoned, mask).item() > 0.98


def test_fitter_names_bad_arguments():
    x, y = torch.randn(1, 10, 4), torch.zeros(1, 10, dtype=torch.long)
    with pytest.raises(ValueError, match="method='svm' is unknown"):
        fit_probes(x, y, 2, method="svm")
    with pytest.raises(ValueError, match="n_classes-1=1"):
        fit_probes(x, y + 2, 2)


def test_residual_streams_are_the_embedding_and_every_block_output(lego_model, gen):
    tokens = LEGO.sample(5, gen).tokens
    streams = residual_streams(lego_model, tokens, chunk_size=2)
    assert streams.shape == (TINY_MODEL.n_layers + 1, 5, LEGO.n_ctx, TINY_MODEL.d_model)
    _, cache = lego_model.run_with_cache(tokens)
    assert torch.allclose(streams[0], cache["hook_embed"] + cache["hook_pos_embed"], atol=1e-6)
    assert torch.allclose(streams[-1], lego_model(tokens, stop_at_layer=TINY_MODEL.n_layers), atol=1e-5)
    positions = LEGO.sample(5, gen).label_pos
    gathered = residuals_at(lego_model, tokens, positions, chunk_size=2)
    assert torch.equal(gathered[:, 3, 1], streams[:, 3, positions[3, 1]])


def test_lego_map_has_a_layer_per_stream_a_depth_per_variable_and_serialises(lego_model):
    result = lego_probe_map(lego_model, LEGO, n_train=200, n_test=100, seed=0)
    assert result.accuracy.shape == (TINY_MODEL.n_layers + 1, LEGO.cfg.n_vars)
    assert result.layer_names == ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert result.depth_names == ["#0", "#1", "#2", "#3"] and result.chance == 0.5
    assert len(result.first_layer) == len(result.majority) == LEGO.cfg.n_vars
    data = json.loads(json.dumps(result.to_dict()))
    assert len(data["accuracy"]) == TINY_MODEL.n_layers + 1 and len(data["accuracy"][0]) == LEGO.cfg.n_vars


def test_random_model_probes_are_at_chance_beyond_what_a_clause_shows():
    task = LegoTask(LegoConfig(n_vars=6, n_supervised=3))
    model = build_model(TINY_MODEL, task, seed=1).eval()
    result = lego_probe_map(model, task, n_train=1000, n_test=1000, seed=3)
    # the embedding of a variable token says nothing about its value; in a random model no deeper
    # variable's value (it depends on clauses elsewhere in the sentence) becomes readable either
    assert (result.accuracy[0] - 0.5).abs().max() < 0.06, result.accuracy
    assert (result.accuracy[1:, 1:] - 0.5).abs().max() < 0.06, result.accuracy
    assert result.first_layer == [None] * 6 and result.slope is None


def test_first_layer_and_percolation_fit_on_a_hand_made_map():
    accuracy = torch.full((6, 5), 0.5)
    for depth, layer in enumerate([1, 2, 3, 4]):
        accuracy[layer:, depth] = 0.97  # depth 4 never reaches 95%
    accuracy[2, 4] = 0.949
    first = first_layer_reaching(accuracy)
    assert first == [1, 2, 3, 4, None]
    assert percolation_fit(first) == pytest.approx((1.0, 1.0))
    slope, r2 = percolation_fit([1, 3, 3, 5])  # residuals (-.2, .6, -.6, .2) against a total of 8
    assert slope == pytest.approx(1.2) and r2 == pytest.approx(0.9)
    assert percolation_fit([None, 2, None]) == (None, None)
    assert percolation_fit([1, 2, None, None]) == (None, None)  # two points always lie on a line: no slope
    assert percolation_fit([2, 2, 2]) == (pytest.approx(0.0), None)  # flat: nothing for R^2 to explain


def test_every_percolation_line_names_its_resolved_depths_and_none_gives_a_slope_from_two():
    assert percolation_summary([1, 3, 3, 5, None]) == ("percolation slope 1.20 layers per reasoning step (R^2 0.90), "
                                                      "fitted on 4 of 5 resolved depths")
    assert "R^2 n/a" in percolation_summary([2, 2, 2]) and "fitted on 3 of 3" in percolation_summary([2, 2, 2])
    for first in ([1, 2, None, None], [None, 4, None], [None, None]):
        line = percolation_summary(first)
        assert "slope" in line and "layers per" not in line, line  # no number is printed as a slope
        assert f"{sum(f is not None for f in first)} of {len(first)} depths resolved" in line
    finding, = percolation_findings([1, 2, None, None])
    assert finding.startswith("probes: no percolation slope: 2 of 4 depths resolved") and "layers per" not in finding
    finding, = percolation_findings([0, 1, 2, 3])
    assert "percolation slope 1.00 layers per reasoning step" in finding
    assert "fitted on 4 of 4 resolved depths" in finding


def test_composite_map_names_its_axes_and_reads_the_key_from_the_embedding():
    model = build_model(tiny_composite_run().model, COMPOSITE)
    result = composite_probe_map(model.eval(), COMPOSITE, n_train=1200, n_test=300, seed=0)
    assert result.accuracy.shape == (3, 4, 4)
    assert result.site_names == ["key", "anchor1", "anchor2", "last"]
    assert result.quantity_names == ["key", "intermediate", "intermediate_a2", "target"]
    assert result.at("key", "key")[0] > 0.9  # the embedding at the key's position is the key's token
    assert result.at("last", "key")[0] < 0.1  # ... and at the last position it is a noise token
    assert len(result.chance) == len(result.majority) == 4
    assert json.loads(json.dumps(result.to_dict()))["site_names"][2] == "anchor2"


def test_probe_grid_reads_a_quantity_planted_in_the_tokens(lego_model, gen):
    """The root value token of a LEGO sentence is its own embedding: ~100% from layer 0 on."""
    train, test = (LEGO.sample(300, gen) for _ in range(2))

    def root_set(batch):
        root_pos = (batch.tokens >= LEGO.first_value).float().argmax(1, keepdim=True)
        return ProbeSet(batch.tokens, root_pos, batch.latents["root"][:, None, None], torch.ones_like(root_pos).bool())

    grid = probe_grid(lego_model, root_set(train), root_set(test), n_classes=LEGO.d_vocab_out)
    assert grid.accuracy.shape == (TINY_MODEL.n_layers + 1, 1, 1)
    assert grid.accuracy[0].item() > 0.99
    assert grid.train_accuracy.min().item() > 0.95
