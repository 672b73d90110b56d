"""`mypy` passes on dualjax/ (pyproject.toml's [tool.mypy]): the package's annotations
hold, so CI keeps them true. Slow (about 30 s from a cold cache): not in the inner loop."""
import pathlib
import shutil
import subprocess
import sys

import conftest
import pytest

ROOT = conftest.REPO
pytestmark = pytest.mark.slow


def mypy(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    exe = shutil.which("mypy", path=str(pathlib.Path(sys.executable).parent)) or "mypy"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)


def test_mypy_passes_on_the_package():
    done = mypy()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_mypy_sees_a_type_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x: int) -> str:\n    return x\n")
    done = mypy("--config-file", str(ROOT / "pyproject.toml"), str(bad), cwd=tmp_path)
    assert done.returncode == 1 and "[return-value]" in done.stdout, done.stdout
