"""The suite's `built_once` fixture (tests/conftest.py): a folder built once per session."""

import pytest


def test_a_folder_is_built_once_and_a_build_that_failed_is_built_again_from_empty(built_once):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "run").write_text("built")
        return folder / "run"

    first = built_once("test-built-once", build)
    assert built_once("test-built-once", build) == first and first.read_text() == "built" and len(calls) == 1

    def fails(folder):
        (folder / "half").write_text("")
        raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError):
        built_once("test-built-once-failing", fails)
    again = built_once("test-built-once-failing", build)
    assert again.read_text() == "built" and not (again.parent / "half").exists()
