"""The shape of a JSON document a reader draws from (analysis.json, timeline.json, a task's
verdict), checked once where the file is read, so that the code drawing it does not catch what a
damaged or hand-edited file throws. `shape_problem` says where a document differs and how.

A shape is: a type (str, bool, int, dict, list; float means any number, NaN included); a dict of
required keys -> shapes (other keys allowed; Maybe marks one that may be absent); a tuple of
shapes (a list of exactly those); ANY; or one of the classes below."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ANY = object()


@dataclass(frozen=True)
class Many:
    """A list (at least `least` long) whose items all have shape `of`."""

    of: Any
    least: int = 0


@dataclass(frozen=True)
class Grid:
    """A list of at least one row, each a list of the same nonzero length, items of shape `of`
    (what a heatmap draws)."""

    of: Any


@dataclass(frozen=True)
class Keyed:
    """An object with any keys, every value of shape `of`."""

    of: Any


@dataclass(frozen=True)
class OrNone:
    """null, or shape `of`."""

    of: Any


@dataclass(frozen=True)
class Maybe:
    """In an object's shape: a key that may be absent, of shape `of` where it is there."""

    of: Any


_KINDS = {str: "a string", bool: "true or false", int: "an integer", float: "a number", dict: "an object",
          list: "a list"}


def shape_problem(value: Any, shape: Any, where: str = "") -> str | None:
    """Where `value` differs from `shape` and how ("heads.labels[1][0] must be a string"), or
    None where it has that shape."""
    at = where or "the document"
    if shape is ANY or (isinstance(shape, OrNone) and value is None):
        return None
    if isinstance(shape, OrNone):
        return shape_problem(value, shape.of, where)
    if isinstance(shape, type):
        ok = isinstance(value, (int, float)) if shape is float else isinstance(value, shape)
        return None if ok and (shape is bool or not isinstance(value, bool)) else f"{at} must be {_KINDS[shape]}"
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{at} must be an object"
        missing = [key for key, inner in shape.items() if key not in value and not isinstance(inner, Maybe)]
        if missing:
            return f"{at} lacks {missing}"
        return first_problem(shape_problem(value[key], inner.of if isinstance(inner, Maybe) else inner, _at(where, key))
                      for key, inner in shape.items() if key in value)
    if isinstance(shape, Keyed):
        if not isinstance(value, dict):
            return f"{at} must be an object"
        return first_problem(shape_problem(inner, shape.of, _at(where, key)) for key, inner in value.items())
    if not isinstance(value, list):
        return f"{at} must be a list"
    if isinstance(shape, tuple):
        if len(value) != len(shape):
            return f"{at} must be a list of {len(shape)}"
        return first_problem(shape_problem(item, inner, f"{where}[{i}]")
                             for i, (item, inner) in enumerate(zip(value, shape)))
    if isinstance(shape, Many):
        if len(value) < shape.least:
            return f"{at} must hold at least {shape.least} item(s)"
        return first_problem(shape_problem(item, shape.of, f"{where}[{i}]") for i, item in enumerate(value))
    if not value or any(not isinstance(row, list) or not row or len(row) != len(value[0]) for row in value):
        return f"{at} must be a grid: rows of one nonzero length"
    return first_problem(shape_problem(item, shape.of, f"{where}[{i}][{j}]")
                  for i, row in enumerate(value) for j, item in enumerate(row))


def is_shape(shape: Any) -> bool:
    """Whether `shape` is a shape `shape_problem` reads."""
    if shape is ANY or (isinstance(shape, type) and shape in _KINDS):
        return True
    if isinstance(shape, dict):
        return all(isinstance(key, str) and is_shape(inner) for key, inner in shape.items())
    if isinstance(shape, tuple):
        return all(is_shape(inner) for inner in shape)
    return isinstance(shape, (Many, Grid, Keyed, OrNone, Maybe)) and is_shape(shape.of)


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def first_problem(problems: Any) -> str | None:
    """The first of `problems` (strings or None) that is a problem, or None."""
    return next((problem for problem in problems if problem), None)
