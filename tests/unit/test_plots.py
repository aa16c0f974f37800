"""The report's figures stay readable at the extremes: one head, one layer, 12 layers, a 62-token
axis (interp/plots.py)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from interp import plots


def _ticks(fig) -> tuple[list[float], list[float]]:
    ax = fig.axes[0]
    return list(ax.get_xticks()), list(ax.get_yticks())


@pytest.mark.parametrize("n_layers, n_heads", [(1, 1), (2, 1), (1, 8), (12, 4), (12, 12)])
def test_a_head_map_has_one_integer_tick_per_head_and_layer(n_layers, n_heads):
    fig = plots.heatmap([[0.5] * n_heads for _ in range(n_layers)], "head", "layer", "head outputs", None, -1.0, 1.0)
    xs, ys = _ticks(fig)
    assert xs == list(range(n_heads)) and ys == list(range(n_layers))  # never -0.5, 0.0, 0.5 under one column
    width, height = fig.get_size_inches()
    assert width >= 3.2 and height >= 2.2  # one head, one layer: still room for the labels and the colour bar
    plt.close(fig)


def test_ticks_are_thinned_where_there_are_many_columns_and_the_figure_grows_with_the_rows():
    fig = plots.heatmap([[0.0] * 60 for _ in range(40)], "position", "layer", "many")
    xs, ys = _ticks(fig)
    assert len(xs) <= 20 and xs[:2] == [0, 3] and len(ys) <= 24 and ys[:2] == [0, 2]
    small = plots.heatmap([[0.0] * 4 for _ in range(2)], "head", "layer", "few")
    assert fig.get_size_inches()[1] > small.get_size_inches()[1]
    plt.close("all")


def test_token_labels_replace_the_integer_ticks():
    tokens = [f"t{i}" for i in range(9)]
    fig = plots.heatmap([[0.0] * 9, [1.0] * 9], "position", "layer", "residual", tokens)
    assert [label.get_text() for label in fig.axes[0].get_xticklabels()] == tokens
    plt.close(fig)


def test_head_score_panels_share_the_layer_axis_and_label_it_once():
    labels = [["manipulation"]] * 12
    fig = plots.head_score_heatmaps({"association": [[0.1]] * 12, "manipulation": [[0.9]] * 12}, labels)
    panels = fig.axes[:2]
    assert [ax.get_ylabel() for ax in panels] == ["layer", ""]
    assert list(panels[0].get_xticks()) == [0] and list(panels[0].get_yticks()) == list(range(12))
    assert fig.get_size_inches()[0] >= 2 * 2.0  # every panel at least 2 inches wide, even for one head
    plt.close(fig)


def test_rate_bars_leave_a_missing_position_out_and_say_so():
    fig = plots.rate_bars({"x-10": [0.9, None, 0.8], "x-6": [0.0, None, 0.1]}, "key position", "share", "answers")
    ax = fig.axes[0]
    assert len(ax.patches) == 4  # two positions x two answers; the position without data has no bar
    assert [t.get_text() for t in ax.texts] == ["n/a"] and ax.get_ylim() == (0.0, 1.05)
    assert [label.get_text() for label in ax.get_xticklabels()] == ["0", "1", "2"]
    plt.close(fig)


def test_a_loss_axis_within_one_decade_has_plain_labels():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [5.25, 5.1, 5.0])
    ax.set_yscale("log")
    plots.plain_log_labels(ax)
    fig.canvas.draw()
    shown = [label.get_text() for label in ax.get_yticklabels(minor=True) + ax.get_yticklabels() if label.get_text()]
    assert shown and all("10^" not in text and "times" not in text for text in shown)
    plt.close(fig)


@pytest.mark.parametrize("n_layers, n_heads, n_pos", [(1, 1, 5), (2, 4, 20), (2, 4, 30), (12, 4, 62)])
def test_the_attention_grid_titles_each_head_with_its_label_and_blanks_a_causal_models_future(n_layers, n_heads,
                                                                                               n_pos):
    import numpy as np

    patterns = np.full((n_layers, n_heads, n_pos, n_pos), 1.0 / n_pos)
    names = [[f"L{layer}H{head} association" for head in range(n_heads)] for layer in range(n_layers)]
    tokens = [f"t{i}" for i in range(n_pos)]
    fig = plots.attention_grid(patterns, tokens, names, causal=True)
    (ax,) = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]  # every head is a tile of one image
    texts = [text.get_text() for text in ax.texts]
    assert [text for text in texts if text.endswith("association")] == [name for row in names for name in row]
    blank = np.ma.getmaskarray(ax.get_images()[0].get_array())
    tiles = [patch.get_xy() for patch in ax.patches]  # each head's frame: its top-left corner
    assert len(tiles) == n_layers * n_heads
    for left, top in tiles:
        row, col = round(top + 0.5), round(left + 0.5)
        assert blank[row, col + 1] and not blank[row + 1, col] and not blank[row, col]  # never a later key
    named = sum(text in tokens for text in texts)  # every head column and layer row names its tokens
    assert named == (n_pos * (n_heads + n_layers) if n_pos <= plots.LABELLED_TOKENS else 0)
    width, height = fig.get_size_inches()
    assert width <= 3.5 * n_heads + 1 and height <= 3.5 * n_layers + 1  # a few inches a head, whatever the model
    plt.close(fig)
