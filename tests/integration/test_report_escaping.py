"""Everything read from a run folder reaches report.html as text, never as markup (issue 16):
a hostile payload in every string of config.json (values and keys, one at a time) and in the
string keys and values of metrics.jsonl. Browser-free; the browser test covers token text."""

from __future__ import annotations

import copy
import html
import json

import pytest

from analyses.cli import main
from tests.integration.test_cli import TINY

PAYLOADS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>']
RAW = ["<script>alert(1)", "<img src=x onerror"]  # what an unescaped payload leaves in the page
BOTH = PAYLOADS[1] + PAYLOADS[0]  # both payloads in one string: each config field is poisoned once


def poisonings(data: dict):
    """(where, path, what) for each string or null in the config, and each string key of its
    objects: what `poison` replaces by a payload."""
    def walk(node, path):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(value, str) or value is None:  # a null may stand for a string (train.init_from)
                yield (*path, key), "value"
            if isinstance(key, str) and path:  # a key inside a section (a planted head, a composite override)
                yield (*path, key), "key"
            yield from walk(value, (*path, key))
    for path, what in walk(data, ()):
        yield f"{'.'.join(map(str, path))} ({what})", path, what
    for section in ("task", "model", "train"):  # a field the config does not have: refused, named
        yield f"{section}.<payload> (new key)", (section, None), "new key"


def poison(data: dict, changes: list[tuple[tuple, str, str]]) -> dict:
    """A copy of `data` with each (path, what, payload) change made: values first, then keys (a
    renamed key would move the values under it), deepest first."""
    poisoned = copy.deepcopy(data)
    for path, what, payload in sorted(changes, key=lambda c: (c[1] != "value", -len(c[0]))):
        parent = poisoned
        for step in path[:-1]:
            parent = parent[step]
        if what == "value":
            parent[path[-1]] = payload
        elif what == "key":
            parent[payload] = parent.pop(path[-1])
        else:
            parent[payload] = 1
    return poisoned


def assert_escaped(page: str) -> None:
    for raw in RAW:
        assert raw not in page, f"unescaped {raw!r} in report.html"


@pytest.mark.parametrize("preset", ["lego-cpu", "composite-cpu", "templates-cpu"])
def test_a_payload_in_any_string_of_config_json_reaches_the_report_only_as_text(tmp_path, capsys, preset):
    """Each field poisoned alone: a config the run no longer loads with is refused by `report`
    (exit 2, no page); the fields whose poisoned config still loads are then poisoned together, each
    with a payload of its own (numbered), in one report, and each must reach that page as text. The
    one-at-a-time reports said the same at ten times the cost."""
    from models.runs import load_run
    from tasks import ConfigError

    out = tmp_path / "run"
    assert main(["train", "--preset", preset, "--out", str(out), *TINY]) == 0
    original = json.loads((out / "config.json").read_text())
    loading: list[tuple[str, tuple, str]] = []
    for where, path, what in poisonings(original):
        (out / "config.json").write_text(json.dumps(poison(original, [(path, what, BOTH)])))
        try:
            load_run(out)
            loading.append((where, path, what))
            continue
        except ConfigError:
            pass
        (out / "report.html").unlink(missing_ok=True)
        capsys.readouterr()
        assert main(["report", str(out)]) == 2, where  # refused by validation: exit 2 with a message, and no page
        assert "configuration error" in capsys.readouterr().err and not (out / "report.html").exists(), where
    payloads = {where: f"{BOTH}~{i:03d}" for i, (where, _, _) in enumerate(loading)}
    (out / "config.json").write_text(json.dumps(poison(original, [(p, w, payloads[where]) for where, p, w in loading])))
    (out / "report.html").unlink(missing_ok=True)
    code = main(["report", str(out)])
    assert code == 0, capsys.readouterr().err
    page = (out / "report.html").read_text()
    assert_escaped(page)
    shown = [where for where, payload in payloads.items() if html.escape(payload) in page]
    # package versions are recorded, not shown; every other field that loads reaches the page, as text
    assert shown == [where for where in payloads if not where.startswith("versions.")]
    assert any(w.startswith("train.init_from") for w in shown), shown  # a free-form string does reach the page


def test_a_payload_in_the_keys_and_values_of_metrics_jsonl_reaches_the_report_only_as_text(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--preset", "composite-cpu", "--out", str(out), *TINY]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records[-1].update({PAYLOADS[0]: PAYLOADS[1], PAYLOADS[1]: [PAYLOADS[0]], "stopped": PAYLOADS[0],
                        "note": {PAYLOADS[1]: PAYLOADS[0]}})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert_escaped(page)
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3
    assert page.count("&lt;img src=x onerror=alert(1)&gt;") >= 3
