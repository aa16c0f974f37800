"""How the report shows a number or a piece of evidence: rounded to what it can carry (rates and
accuracies to 3 decimals, normalised effects to 2, p-values as "< 0.001" below a thousandth), a
statistic only where it means something (no rank correlation over fewer than MIN_RANKED heads),
and dict-valued evidence as a small table or grid instead of raw JSON. analysis.json keeps every
number at full precision; only the page rounds."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from typing import Any

RATE_DECIMALS = 3  # accuracies, shares, attention mass: 2000 test rows carry about 3 decimals
EFFECT_DECIMALS = 2  # normalised patching effects, faithfulness, correlations
MIN_RANKED = 5  # heads below which a rank correlation is shown as n/a: over 2-4 heads it takes a few values only
PAIR_KEY = re.compile(r"^\s*(-?\d+)\s*,\s*(-?\d+)\s*$")  # "4,3": an (anchor 1, anchor 2) pair


def number(value: Any, decimals: int = RATE_DECIMALS) -> str:
    """A float to `decimals` places, never "-0.00"; an int as it is; None or NaN "n/a"; a bool
    "yes" or "no"; anything else as text."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = f"{value:.{decimals}f}"
        return text[1:] if text.startswith("-") and float(text) == 0 else text  # -0.000 is 0.000
    return str(value)


def rate(value: Any) -> str:
    """An accuracy, share or attention mass: 3 decimals."""
    return number(value, RATE_DECIMALS)


def effect(value: Any) -> str:
    """A normalised patching effect, faithfulness or correlation: 2 decimals."""
    return number(value, EFFECT_DECIMALS)


def p_value(p: float | None) -> str:
    """"< 0.001" below a thousandth, 3 decimals below 0.01, else 2."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    if p < 0.001:
        return "< 0.001"
    return number(float(p), 3 if p < 0.01 else 2)


def rank_correlation(value: float | None, n_heads: int) -> str:
    """A Spearman correlation over `n_heads` heads: n/a below MIN_RANKED heads (two rankings of
    two heads agree or disagree completely, so +-1 says nothing), "undefined" where one ranking is
    constant, else 2 decimals."""
    if n_heads < MIN_RANKED:
        return f"n/a (fewer than {MIN_RANKED} heads)"
    if value is None:
        return "undefined (one of the two rankings is constant)"
    return effect(value)


def has_rank_correlation(n_heads: int) -> bool:
    return n_heads >= MIN_RANKED


def or_never(step: int | None) -> str:
    """A step at which something first happened, or "never"."""
    return "never" if step is None else str(step)


def evidence_text(value: Any, decimals: int = RATE_DECIMALS) -> str:
    """A scalar or a list as plain text (strings unquoted, lists comma-separated); a dict as
    "key: value" pairs. Not escaped."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return ", ".join(evidence_text(v, decimals) for v in value) if value else "none"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {evidence_text(v, decimals)}" for k, v in value.items()) if value else "none"
    return number(value, decimals)


def evidence_html(value: Any, decimals: int = RATE_DECIMALS) -> str:
    """One piece of evidence as HTML: a dict as a small table (`dict_table_html`), anything else
    as escaped text."""
    if isinstance(value, dict) and value:
        return dict_table_html(value, decimals=decimals)
    return html.escape(evidence_text(value, decimals))


def dict_table_html(value: dict[str, Any], columns: list[str] | None = None, row_header: str = "",
                    decimals: int = RATE_DECIMALS) -> str:
    """A dict as a small table. Lists of one length become rows, one column per index (named by
    `columns`, else 0, 1, ...); other values a two-column key/value table."""
    lists = [v for v in value.values() if isinstance(v, (list, tuple))]
    if value and len(lists) == len(value) and len({len(v) for v in lists}) == 1:
        width = len(lists[0])
        header = [row_header, *(columns if columns and len(columns) == width else [str(i) for i in range(width)])]
        rows = [[key, *[evidence_text(v, decimals) for v in values]] for key, values in value.items()]
    else:
        header = [row_header or "", "value"]
        rows = [[key, evidence_text(v, decimals)] for key, v in value.items()]
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='evidence'><tr>{head}</tr>{body}</table>"


def is_series(value: Any) -> bool:
    """A non-empty dict of equally long, non-empty lists of numbers (None allowed): drawable as
    bars or a table row per key."""
    if not isinstance(value, dict) or not value:
        return False
    lists = list(value.values())
    return (all(isinstance(v, list) and v for v in lists) and len({len(v) for v in lists}) == 1
            and all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for v in lists for x in v))


def pair_keys(value: Any) -> dict[tuple[int, int], Any] | None:
    """A dict keyed "i,j" (per-pair accuracy) as {(i, j): value}; None for any other value."""
    if not isinstance(value, dict) or not value:
        return None
    pairs = {}
    for key, v in value.items():
        found = PAIR_KEY.match(str(key))
        if found is None:
            return None
        pairs[(int(found[1]), int(found[2]))] = v
    return pairs


def pair_grid_html(value: dict[str, Any], marked: set[str] | None = None, row_name: str = "anchor 1",
                   column_name: str = "anchor 2") -> str | None:
    """Per-pair values keyed "i,j" as a grid (rows i, columns j), each cell shaded by its value
    (white 0, green 1) and the `marked` pairs (e.g. held out of training) outlined; None where the
    keys are not pairs."""
    pairs = pair_keys(value)
    if pairs is None:
        return None
    rows, cols = sorted({i for i, _ in pairs}), sorted({j for _, j in pairs})
    marked = {(int(m[1]), int(m[2])) for m in (PAIR_KEY.match(str(k)) for k in marked or ()) if m}
    head = f"<th>{html.escape(row_name)} \\ {html.escape(column_name)}</th>" + "".join(f"<th>{j}</th>" for j in cols)
    body = []
    for i in rows:
        cells = [f"<th>{i}</th>"]
        for j in cols:
            v = pairs.get((i, j))
            style = _shade(v) + ("outline: 2px solid #b2182b; outline-offset: -2px;" if (i, j) in marked else "")
            cells.append(f"<td style='{style}' title='{i},{j}'>{html.escape(evidence_text(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table class='grid'><tr>{head}</tr>{''.join(body)}</table>"


def _shade(value: Any) -> str:
    """A background from white (0) to green (1) for a rate; none for anything else."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        return ""
    level = min(1.0, max(0.0, float(value)))
    red, green, blue = (round(255 - (255 - c) * level * 0.75) for c in (27, 158, 119))
    return f"background: rgb({red},{green},{blue});"


def table_verdict_html(verdict: dict[str, Any], drawn: dict[str, Callable[[Any], str]] | None = None) -> str:
    """A verdict section for tasks whose verdict names a solution (`verdict`), then its evidence:
    numbers rounded (`interp.report_format`), a dict of lists as a small table in its row, and the
    evidence named in `drawn` (key -> its HTML, a chart or a grid) below the table instead of in it."""
    drawn = drawn or {}
    head = f"<p class='verdict'>Solution: {html.escape(str(verdict['verdict']))}</p>"
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{evidence_html(v)}</td></tr>" for k, v in verdict.items()
                   if k != "verdict" and k not in drawn)
    below = "".join(draw(verdict[k]) for k, draw in drawn.items() if verdict.get(k))
    return head + f"<table><tr><th>evidence</th><th>value</th></tr>{rows}</table>" + below
