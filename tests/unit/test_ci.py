"""`.ci/run`'s browser step (`.ci/browser`): in CI (the `CI` variable set) a missing Chromium, or
one that fails to install, fails the run instead of letting the browser tests skip; elsewhere
they skip and say why. Run with a PATH that holds no Chromium and an apt-get that fails."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def browser_step(tmp_path: Path, ci: str | None, chromium: bool = False) -> subprocess.CompletedProcess:
    """Source .ci/browser in bash with only bash, env, id and a failing apt-get on PATH (and a
    stand-in `chromium` where asked); print what it exported."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env", "id"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    fakes = {"apt-get": "echo 'E: Unable to locate package chromium' >&2; exit 100"}
    fakes |= {"chromium": "exit 0"} if chromium else {}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)} | ({"CI": ci} if ci is not None else {})
    script = f"source {REPO / '.ci' / 'browser'}; echo \"require=${{WORKBENCH_REQUIRE_BROWSER:-}}\""
    return subprocess.run([str(bin_dir / "bash"), "-c", script], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_browser_that_cannot_be_installed_fails_the_run(tmp_path, ci):
    result = browser_step(tmp_path, ci)
    assert result.returncode != 0, result
    assert "require=" not in result.stdout  # make test never starts
    assert "CI" in result.stderr and "chromium" in result.stderr.lower()


def test_outside_ci_the_browser_tests_skip_and_say_why(tmp_path):
    result = browser_step(tmp_path, ci=None)
    assert result.returncode == 0, result
    assert "require=\n" in result.stdout
    assert "skip" in result.stdout + result.stderr


@pytest.mark.parametrize("ci", [None, "true"])
def test_once_chromium_is_there_the_browser_tests_must_run(tmp_path, ci):
    result = browser_step(tmp_path, ci, chromium=True)
    assert result.returncode == 0, result
    assert "require=1" in result.stdout


@pytest.mark.parametrize(("env", "fails"), [({"CI": "true"}, True), ({"WORKBENCH_REQUIRE_BROWSER": "1"}, True),
                                            ({}, False)])
def test_the_browser_fixture_fails_in_ci_and_skips_elsewhere(monkeypatch, env, fails):
    from tests.browser import skip_or_fail

    for name in ("CI", "WORKBENCH_REQUIRE_BROWSER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception), match="no Chromium") as raised:
        skip_or_fail("no Chromium")
    assert isinstance(raised.value, pytest.fail.Exception if fails else pytest.skip.Exception)
