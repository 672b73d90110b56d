"""`ruff check .` passes (the rules are pyproject.toml's [tool.ruff]): the suite fails on
a lint error, so CI keeps the package, its tests, scripts, configs and notebook clean."""
import ast
import io
import pathlib
import re
import shutil
import subprocess
import sys
import tokenize

import conftest

ROOT = conftest.REPO


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


# A measured figure in a comment goes stale: BENCHMARKS.md keeps it (with the command and
# the machine), and the comment links there. Times and rates are what such comments
# carried; these are constants, not measurements.
FIGURE = re.compile(r"\b\d[\d,.]*\s?(?:ms|s|min|minutes)\b(?!-)"
                    r"|\b\d+(?:\.\d+)?x (?:faster|slower)"
                    r"|\b[\d,.]+\s?(?:docs|pairs|queries|steps|texts)/s\b")
CONSTANTS = {("runtime/peers.py", "100 s")}  # jax's heartbeat timeout, its default


def figures_in_comments(path: pathlib.Path, root: pathlib.Path) -> list[str]:
    """"file:line: figure" for each time or rate in `path`'s comments and docstrings."""
    source = path.read_text()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    texts = [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                texts.append((node.body[0].lineno, doc))
    rel = str(path.relative_to(root))
    return [f"{rel}:{line}: {m.group(0)}" for line, text in texts
            for m in FIGURE.finditer(text) if (rel, m.group(0)) not in CONSTANTS]


def test_measured_figures_live_in_benchmarks_md_not_in_comments():
    root = ROOT / "dualjax"
    found = [f for p in sorted(root.rglob("*.py")) for f in figures_in_comments(p, root)]
    assert found == [], "move the figure to BENCHMARKS.md and link it from the comment"


def test_the_figures_guard_sees_a_timing(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text('"""Fast: 0.3 s a call."""\n# 12 ms a batch; 3,130 docs/s; 1.6x slower\n'
                   'x = "2 s"  # a string, not a comment\n')
    assert [f.split(": ", 1)[1] for f in figures_in_comments(bad, tmp_path)] == [
        "12 ms", "3,130 docs/s", "1.6x slower", "0.3 s"]
