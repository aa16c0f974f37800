"""Query-neuron condensation and the embedding spectrum on weights with a known answer."""

import torch

from interp.complexity import embedding_spectrum, leading_share, query_condensation, query_neuron_cosines
from models.factory import build_model
from tasks import CompositeConfig, CompositeTask
from tests.helpers import TINY_MODEL


def test_aligned_query_neurons_count_as_condensed_and_random_ones_do_not():
    model = build_model(TINY_MODEL, CompositeTask(CompositeConfig()), seed=0)
    random = query_condensation(model, 0)
    assert random.share_aligned < 0.05 and abs(random.mean_abs_cosine - random.random_baseline) < 0.1
    direction = torch.randn(model.cfg.d_model)
    with torch.no_grad():  # every neuron of every head along one direction, with either sign
        signs = torch.randint(0, 2, (model.cfg.n_heads, 1, model.cfg.d_head)) * 2 - 1
        model.blocks[0].attn.W_Q.copy_(direction[None, :, None] * signs
                                       + 1e-3 * torch.randn_like(model.blocks[0].attn.W_Q))
    condensed = query_condensation(model, 0)
    assert condensed.share_aligned == 1.0 and condensed.mean_abs_cosine > 0.99
    cosines = query_neuron_cosines(model.blocks[0].attn.W_Q)
    assert cosines.shape == (model.cfg.n_heads, model.cfg.d_head, model.cfg.d_head)


def test_an_ordinal_embedding_has_one_leading_eigenvalue():
    values = list(range(20, 100))
    w_e = torch.randn(110, 16) * 0.01
    w_e[values] += torch.linspace(-1, 1, len(values))[:, None] * torch.randn(16)  # values along one line
    spectrum = embedding_spectrum(w_e, values)
    assert abs(spectrum.sum().item() - 1) < 1e-5 and (spectrum[:-1] >= spectrum[1:]).all()
    assert leading_share(spectrum, 1) > 0.95
    spread = embedding_spectrum(torch.randn(110, 16), values)
    assert leading_share(spread, 1) < 0.3
