"""`ruff check .` passes (the rules are pyproject.toml's [tool.ruff]): the suite fails on
a lint error, so CI keeps the package, its tests, scripts, configs and notebook clean."""
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent)) or "ruff"
    return subprocess.run([exe, "check", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_passes_everywhere():
    done = ruff(".")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_ruff_sees_a_lint_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n" + "x = 1  # " + "y" * 120 + "\n")
    done = ruff("--config", str(ROOT / "pyproject.toml"), str(bad))
    assert done.returncode == 1 and "F401" in done.stdout and "E501" in done.stdout
