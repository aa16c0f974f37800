"""The shape language analysis.json and timeline.json are checked with (models/shapes.py): it
names where a document differs from its shape, and how."""

from __future__ import annotations

import pytest

from models.shapes import ANY, Grid, Keyed, Many, Maybe, OrNone, shape_problem

SHAPE = {"name": str, "grid": Grid(float), "pairs": Many((str, float), least=1), "by": Keyed(OrNone(int)),
         "flag": bool, "note": Maybe(str), "free": ANY}
GOOD = {"name": "x", "grid": [[1, 2.5], [float("nan"), 0]], "pairs": [["a", 1]], "by": {"k": None, "j": 3},
        "flag": False, "free": [{}], "extra": "allowed"}


@pytest.mark.parametrize(("change", "said"), [
    ({"name": 1}, "name must be a string"),
    ({"grid": [[1, 2], [3]]}, "grid must be a grid: rows of one nonzero length"),
    ({"grid": []}, "grid must be a grid: rows of one nonzero length"),
    ({"grid": [[1, "2"]]}, "grid[0][1] must be a number"),
    ({"grid": [[True]]}, "grid[0][0] must be a number"),  # a bool is no number
    ({"pairs": []}, "pairs must hold at least 1 item(s)"),
    ({"pairs": [["a"]]}, "pairs[0] must be a list of 2"),
    ({"pairs": [["a", None]]}, "pairs[0][1] must be a number"),
    ({"by": {"k": 1.5}}, "by.k must be an integer"),
    ({"by": []}, "by must be an object"),
    ({"flag": 0}, "flag must be true or false"),
    ({"note": None}, "note must be a string"),  # may be absent, but not null
    ({"name": None}, "name must be a string"),
])
def test_a_shape_names_where_a_document_differs_and_how(change, said):
    assert shape_problem(GOOD, SHAPE) is None and shape_problem({**GOOD, "note": "n"}, SHAPE) is None
    assert shape_problem({**GOOD, **change}, SHAPE) == said
    missing = {k: v for k, v in GOOD.items() if k != "flag"}
    assert shape_problem(missing, SHAPE) == "the document lacks ['flag']"
