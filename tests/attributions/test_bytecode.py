"""The bytecode reading of hooks, on every interpreter the package declares: each compiles the same hooks
(``bytecode_cases.py``) to its own instruction forms, and the reading must find what each hook does."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("bytecode_cases.py")


def _declared() -> list[str]:
    """The minor versions ``requires-python`` admits, e.g. ["3.11", "3.12", "3.13"]."""
    spec = re.search(r'requires-python\s*=\s*">=3\.(\d+),\s*<3\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert spec, "requires-python must bound the versions: >=3.A,<3.B"
    return [f"3.{minor}" for minor in range(int(spec[1]), int(spec[2]))]


def _interpreter(version: str) -> str | None:
    """A runnable CPython ``version``: this one, one on PATH, or one pyenv installed."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    for candidate in [shutil.which(f"python{version}"), *sorted(glob.glob(f"{root}/versions/{version}.*/bin/python"))]:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.parametrize("version", _declared())
def test_the_reading_finds_what_each_hook_does_on_every_declared_interpreter(version):
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no CPython {version} on this machine (PATH or pyenv): its instruction forms are untested here")
    done = subprocess.run([python, str(CASES)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert {row["python"][:4] for row in rows} == {version}
    assert len(rows) == 47
    wrong = [(r["case"], r["expected"], r["read"], r["why"]) for r in rows if r["expected"] != r["read"]]
    assert wrong == []


def test_unresolved_reasons_name_the_hook_and_what_was_not_followed():
    sys.path.insert(0, str(CASES.parent))
    try:
        import bytecode_cases as cases

        from attributions.bytecode import read_hook
    finally:
        sys.path.remove(str(CASES.parent))
    (why,) = read_hook(cases.unnamed_callable).unresolved
    assert why.startswith("unnamed_callable (") and "a callable the reading cannot resolve" in why
    (why,) = read_hook(cases.through_star_args).unresolved
    assert "'_scale'" in why and "*args" in why
    assert "deeper than the 4 helpers" in read_hook(cases.too_deep).unresolved[0]
    (why,) = read_hook(cases.bound_method_in_dict).unresolved
    assert "calls a value reached from an argument as a function, whose target the reading cannot name" in why
    (why,) = read_hook(cases.getattr_unknown_name).unresolved
    assert "through getattr under a name the reading cannot see" in why
    (why,) = read_hook(cases.through_library_call).unresolved
    assert "writes in place (zero_()) into a value that 'flatten' returned from an argument" in why
    (why,) = read_hook(cases.map_in_place).unresolved
    assert "hands 'map' an argument and the in-place 'zero_'" in why
    partial, called = read_hook(cases.partial_of_argument).unresolved
    assert "hands 'partial' an argument and the in-place 'mul_'" in partial and "through 'partial'" in called
