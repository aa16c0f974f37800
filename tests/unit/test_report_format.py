"""How the report shows numbers and dict-valued evidence (interp/report_format.py): rounded to what
they carry, statistics only where they mean something, dicts as tables and grids, never raw JSON."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from interp.report_format import (
    dict_table_html,
    effect,
    evidence_html,
    evidence_text,
    is_series,
    number,
    or_never,
    p_value,
    pair_grid_html,
    rank_correlation,
    rate,
)


def test_rates_show_3_decimals_and_effects_2_never_minus_zero():
    assert rate(0.8777000081539154) == "0.878" and rate(1.0) == "1.000" and rate(9.999999747378752e-05) == "0.000"
    assert effect(0.4555) == "0.46" and effect(-0.7) == "-0.70"
    assert effect(-0.0) == "0.00" and effect(-0.001) == "0.00" and rate(-0.0004) == "0.000"  # no "-0.00" for nothing


def test_numbers_that_are_not_floats_keep_their_form():
    assert number(3000) == "3000" and number(True) == "yes" and number(False) == "no"
    assert number(None) == "n/a" and number(math.nan) == "n/a" and number(math.inf) == "inf"
    assert or_never(None) == "never" and or_never(250) == "250"


@pytest.mark.parametrize("p, shown", [(0.0, "< 0.001"), (0.0004, "< 0.001"), (0.0042, "0.004"), (0.0123, "0.01"),
                                      (0.5, "0.50"), (1.0, "1.00"), (None, "n/a")])
def test_p_values_are_bounded_below_a_thousandth_and_short_above(p, shown):
    assert p_value(p) == shown


def test_a_rank_correlation_over_fewer_than_5_heads_is_not_a_number():
    assert rank_correlation(-1.0, 2) == "n/a (fewer than 5 heads)"
    assert rank_correlation(1.0, 4) == "n/a (fewer than 5 heads)"
    assert rank_correlation(0.8312, 5) == "0.83"
    assert rank_correlation(None, 48).startswith("undefined")


def test_evidence_text_has_no_json_quotes_or_braces_and_rounds_every_number():
    assert evidence_text("L0H0 (manipulation) -> logits") == "L0H0 (manipulation) -> logits"  # no quotes
    assert evidence_text([0.9324, None, 0.12345678]) == "0.932, n/a, 0.123"
    text = evidence_text({"a": [0.30770000815, 9.99e-05]})
    assert text == "a: 0.308, 0.000" and "{" not in text and '"' not in text


FLOW = {"last->key": [0.0982000008225441, 0.0], "last->anchor1": [0.3077000081539154, 9.999999747378752e-05]}


def _cells(table: str) -> list[list[str]]:
    root = ET.fromstring(table)
    return [[(cell.text or "") for cell in row] for row in root.iter("tr")]


def test_a_dict_of_lists_becomes_a_table_with_a_row_per_key_and_a_column_per_index():
    table = dict_table_html(FLOW, ["L0", "L1"], "query -> key")
    assert _cells(table) == [["query -> key", "L0", "L1"],
                             ["last->key", "0.098", "0.000"], ["last->anchor1", "0.308", "0.000"]]
    assert evidence_html(FLOW).startswith("<table")  # dict-valued evidence is never printed as JSON


def test_a_dict_of_scalars_becomes_a_key_value_table():
    assert _cells(dict_table_html({"x-10": 0.91234, "route": "L0H0"})) == [["", "value"], ["x-10", "0.912"],
                                                                            ["route", "L0H0"]]


def test_evidence_html_escapes_text():
    assert evidence_html("<img src=x>") == "&lt;img src=x&gt;"
    assert "<img" not in dict_table_html({"<img src=x>": ["<b>"]})


def test_series_are_dicts_of_equally_long_number_lists():
    assert is_series(FLOW) and is_series({"inferential": [0.9, None]})
    assert not is_series({}) and not is_series([0.1]) and not is_series({"a": [0.1], "b": [0.1, 0.2]})
    assert not is_series({"a": ["x"]}) and not is_series({"a": []}) and not is_series({"a": [True]})


def test_per_pair_accuracy_becomes_a_grid_with_the_held_out_pair_outlined():
    values = {f"{i},{j}": 1.0 for i in range(1, 5) for j in range(1, 5)} | {"4,3": 0.8777}
    grid = pair_grid_html(values, {"4,3"})
    cells = _cells(grid)
    assert cells[0] == ["anchor 1 \\ anchor 2", "1", "2", "3", "4"]
    assert [row[0] for row in cells[1:]] == ["1", "2", "3", "4"]
    assert cells[4][3] == "0.878" and cells[1][1] == "1.000"
    outlined = re.findall(r"<td style='[^']*outline[^']*' title='([^']+)'", grid)
    assert outlined == ["4,3"]  # only the held-out pair
    assert pair_grid_html({"step": 1.0}) is None and pair_grid_html({}) is None  # not pairs: no grid
