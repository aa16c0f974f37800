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


def poisoned_configs(data: dict, payload: str):
    """(where, config) for each string or null in the config, and each string key of its objects,
    replaced by the payload; one at a time, so every other field stays valid."""
    def walk(node, path):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(value, str) or value is None:  # a null may stand for a string (train.init_from)
                yield (*path, key), "value"
            if isinstance(key, str) and path:  # a key inside a section (a planted head, a composite override)
                yield (*path, key), "key"
            yield from walk(value, (*path, key))
    for where, what in walk(data, ()):
        poisoned = copy.deepcopy(data)
        parent = poisoned
        for step in where[:-1]:
            parent = parent[step]
        if what == "value":
            parent[where[-1]] = payload
        else:
            parent[payload] = parent.pop(where[-1])
        yield f"{'.'.join(map(str, where))} ({what})", poisoned
    for section in ("task", "model", "train"):  # a field the config does not have: refused, named
        poisoned = copy.deepcopy(data)
        poisoned[section][payload] = 1
        yield f"{section}.<payload> (new key)", poisoned


def assert_escaped(page: str) -> None:
    for raw in RAW:
        assert raw not in page, f"unescaped {raw!r} in report.html"


@pytest.mark.parametrize("preset", ["lego-cpu", "composite-cpu", "templates-cpu"])
def test_a_payload_in_any_string_of_config_json_reaches_the_report_only_as_text(tmp_path, capsys, preset):
    out = tmp_path / "run"
    assert main(["train", "--preset", preset, "--out", str(out), *TINY]) == 0
    original = json.loads((out / "config.json").read_text())
    shown = []
    for payload in [BOTH]:
        for where, config in poisoned_configs(original, payload):
            (out / "config.json").write_text(json.dumps(config))
            (out / "report.html").unlink(missing_ok=True)
            code = main(["report", str(out)])
            err = capsys.readouterr().err
            assert code in (0, 2), (where, code, err)
            if code == 0:  # the config still loads: the payload is in the page, escaped
                page = (out / "report.html").read_text()
                assert_escaped(page)
                if not where.startswith("versions."):  # package versions are recorded, not shown
                    assert html.escape(payload) in page, where
                    shown.append(where)
            else:  # refused by validation: exit 2 with a message, and no page
                assert "configuration error" in err and not (out / "report.html").exists(), where
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
