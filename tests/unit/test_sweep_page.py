"""How the sweep page lays out a grid (axes, facets, seeds aggregated) and sums up a square's
runs (majority verdict, k of n, mean rates), on hand-made cells."""

from interp.sweep_cells import Cell
from interp.sweep_page import choose_axes, grid_figure, group_cells


def test_the_two_keys_with_most_values_are_the_axes_and_the_rest_are_facets():
    grid = {"model.n_layers": [1, 2], "model.init_gamma": [0.3, 0.5, 0.7], "train.lr": [1e-3, 1e-4, 3e-4],
            "train.seed": [0, 1, 2, 3]}
    assert choose_axes(grid) == {"x": "model.init_gamma", "y": "train.lr", "facets": ["model.n_layers"],
                                 "seed": "train.seed"}
    assert choose_axes({"model.init_gamma": [0.5], "train.seed": [0]}) == \
        {"x": "model.init_gamma", "y": None, "facets": [], "seed": "train.seed"}
    assert choose_axes({"train.seed": [0, 1]}) == {"x": None, "y": None, "facets": [], "seed": "train.seed"}


def _cell(gamma, seed, status="done", label="inferential", **rates):
    return Cell(f"init_gamma={gamma}__seed={seed}", {"model.init_gamma": gamma, "train.seed": seed}, status, label,
                "metrics.jsonl", 10, rates)


def test_a_square_holds_its_seeds_majority_verdict_k_of_n_and_mean_rates():
    grid = {"model.init_gamma": [0.5, 0.9], "train.seed": [0, 1, 2]}
    cells = [_cell(0.5, 0, label="symmetric", x=0.2), _cell(0.5, 1, label="symmetric", x=0.4),
             _cell(0.5, 2, label="inferential", x=0.9),
             _cell(0.9, 0, x=1.0), _cell(0.9, 1, status="pending", label=None),
             _cell(0.9, 2, status="failed", label=None)]
    low, high = group_cells(cells, grid, choose_axes(grid))
    assert (low["label"], low["k"], low["n"], low["rates"]) == ("symmetric", 2, 3, {"x": 0.5})
    assert (high["label"], high["k"], high["n"], high["statuses"]) == ("inferential", 1, 3,
                                                                       {"done": 1, "pending": 1, "failed": 1})
    assert not low["tie"] and not low["provisional"]


def test_a_tie_and_a_square_still_training_are_said_so():
    grid = {"model.init_gamma": [0.5], "train.seed": [0, 1]}
    (square,) = group_cells([_cell(0.5, 0, label="symmetric"), _cell(0.5, 1, status="running")], grid,
                            choose_axes(grid))
    assert square["tie"] and square["provisional"] and square["k"] == 1


def test_the_grid_figure_has_one_panel_per_facet_point():
    grid = {"a.x": [1, 2, 3], "a.y": [1, 2, 3], "a.z": [1, 2], "train.seed": [0]}
    axes = choose_axes(grid)
    page = {"grid": grid, "axes": axes, "groups": group_cells([], grid, axes)}
    assert axes["facets"] == ["a.z"] and len(grid_figure(page).axes) == 2


def test_grid_values_reach_the_figures_as_text_not_mathtext():
    """A grid value with `$` (`train.init_from=$x^$`) is drawn as written; matplotlib's mathtext
    failed on it at the sweep's end and no page was written."""
    from interp.sweep_page import page_html

    grid = {"train.init_from": ["$x^$", "b"], "train.lr": ["$\\frac$", 1], "train.seed": [0]}
    axes = choose_axes(grid)
    page = {"sweep": "s", "task": "composite", "preset": "p", "finished": True, "grid": grid, "axes": axes,
            "counts": {}, "groups": group_cells([], grid, axes), "cells": {}, "damaged": [], "notes": []}
    assert "<img" in page_html(page)


def test_every_cell_lands_in_the_square_of_its_values_with_facets_and_mixed_value_types():
    """Cells are placed by their values of the drawn keys (x, y, facets), as JSON compares them:
    each square holds exactly the cells whose point matches it, whatever the value types."""
    import json

    grid = {"model.init_gamma": [0.3, 1, "a"], "train.lr": [1e-3, None], "model.act_fn": ["gelu", "relu"],
            "train.seed": [0, 1]}
    cells = [Cell(f"c{i}", {"model.init_gamma": g, "train.lr": lr, "model.act_fn": act, "train.seed": s}, "done",
                  "inferential", "metrics.jsonl", 1, {})
             for i, (g, lr, act, s) in enumerate((g, lr, act, s) for g in grid["model.init_gamma"]
                                                 for lr in grid["train.lr"] for act in grid["model.act_fn"]
                                                 for s in grid["train.seed"])]
    axes = choose_axes(grid)
    groups = group_cells(cells, grid, axes)
    assert len(groups) == 3 * 2 * 2
    assert sorted(name for g in groups for name in g["runs"]) == sorted(c.name for c in cells)
    for group in groups:
        where = {**group["facet"], axes["x"]: group["x"], axes["y"]: group["y"]}
        expected = [c.name for c in cells if all(json.dumps(c.point[k]) == json.dumps(v) for k, v in where.items())]
        assert group["runs"] == expected and group["n"] == 2
