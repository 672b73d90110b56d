"""The documentation (README.md and docs/*.md) against the code, without running anything.

Every `python -m dualjax.X` and `python scripts/Y.py` line of a ```bash block (and of an
inline `code` span) names a command that exists and only flags it defines; a
`--config=FILE` names a config file and every `--config.KEY=VALUE` a key of that config
(an inline one alone: a key of configs/default.py); a `pip install` extra is one
pyproject defines; every relative link reaches a file (and a heading, for `#anchor`s);
docs/config.md is what scripts/docs/make_config_doc.py writes; the README stays a first visit.
"""

from __future__ import annotations

import functools
import pathlib
import re
import runpy
import shlex
import tomllib

import conftest
import ml_collections
import pytest

ROOT = conftest.REPO
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
PAGES = ["data", "training", "evaluation", "pretraining", "pretrained", "pses", "scale",
         "serving", "config", "design"]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_PYTHON = re.compile(r"(?:.*/)?python(?:3(?:\.\d+)?)?")
_SEPARATORS = set(";&|()<>")


def bash_blocks(text: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang in ("bash", "sh", "shell")]


def invocations(line: str) -> list[tuple[str, list[str]]]:
    """(`dualjax.X` or `scripts/Y.py`, its arguments) for each python command of one
    shell line; a quoted argument holding a command (`--command="..."`) is read too."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    found = []
    for i, token in enumerate(tokens):
        if " " in token:  # a quoted string: a command for ssh, bash -c, ...
            found += invocations(token.split("=", 1)[1] if token.startswith("--") else token)
        if not _PYTHON.fullmatch(token) or i + 1 >= len(tokens):
            continue
        if tokens[i + 1] == "-m" and i + 2 < len(tokens):
            target, rest = tokens[i + 2], tokens[i + 3:]
        elif tokens[i + 1].endswith(".py"):
            target, rest = tokens[i + 1], tokens[i + 2:]
        else:
            continue
        if not (target.startswith("dualjax") or target.startswith("scripts/")):
            continue  # pytest, pip, ...
        args = []
        for arg in rest:
            if set(arg) <= _SEPARATORS:  # ;, &&, |, & ends the command
                break
            args.append(arg)
        found.append((target, args))
    return found


def doc_commands() -> list[tuple[str, str, str, list[str]]]:
    """(doc, the joined line, target, arguments) of every command in every bash block."""
    out = []
    for doc in DOCS:
        for block in bash_blocks(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                out += [(doc.relative_to(ROOT).as_posix(), line.strip(), target, args)
                        for target, args in invocations(line)]
    return out


def inline_spans() -> list[tuple[str, str]]:
    """(doc, text) of every inline `code` span outside the fenced blocks."""
    return [(doc.relative_to(ROOT).as_posix(), " ".join(span.split()))
            for doc in DOCS for span in re.findall(r"`([^`]+)`", _prose(doc.read_text()))]


def _placeholder(text: str) -> bool:
    """NAME, KEY, DIR: a part of a command the reader fills in."""
    return re.fullmatch(r"[A-Z_]+", text) is not None


def source_of(target: str) -> pathlib.Path:
    """The file `python -m dualjax.X` or `python scripts/Y.py` runs."""
    if target.startswith("dualjax"):
        base = ROOT.joinpath(*target.split("."))
        for path in (base.with_suffix(".py"), base / "__main__.py"):
            if path.is_file():
                return path
        raise FileNotFoundError(f"no module {target}")
    path = ROOT / target
    if not path.is_file():
        raise FileNotFoundError(f"no script {target}")
    return path


@functools.cache
def defined_flags(path: pathlib.Path) -> frozenset[str]:
    """The flags a command defines: absl's DEFINE_*("name") (those of export and index
    are defined inside their run(), so the source is read rather than the registry;
    booleans also as --noname) and argparse's add_argument("--name")."""
    source = path.read_text()
    if "define_process_flags(" in source:  # the multi-process flags, shared (cli.py)
        source += (path.parent / "cli.py").read_text()
    names = set(re.findall(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']", source))
    if names:
        names |= {"help", "helpshort", "helpfull"}
        names |= {"no" + n for n in re.findall(r"DEFINE_bool(?:ean)?\(\s*[\"'](\w+)[\"']",
                                                source)}
    for option in re.findall(r"add_argument\(\s*[\"'](--[\w-]+)[\"']", source):
        names.add(option[2:])
    if "add_argument" in source:
        names.add("help")
    return frozenset(names)


@functools.cache
def load_config(spec: str) -> ml_collections.ConfigDict:
    """`--config=configs/NAME.py[:ARG]`'s get_config(ARG), loaded as main.py does."""
    path, _, arg = spec.partition(":")
    get_config = runpy.run_path(str(ROOT / path))["get_config"]
    return get_config(arg) if arg else get_config()


def has_key(config: ml_collections.ConfigDict, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return False
        node = node[part]
    return True


def command_problems(target: str, args: list[str], complete: bool = True) -> list[str]:
    """What is wrong with one documented command (empty: nothing); `complete=False`: one
    mentioned in passing (`python -m dualjax.main`), which may leave out --config."""
    try:
        flags = defined_flags(source_of(target))
    except FileNotFoundError as e:
        return [str(e)]
    problems = []
    options = [a[2:].split("=", 1) for a in args if a.startswith("--")]
    config = next((kv[1] for kv in options if kv[0] == "config" and len(kv) == 2), None)
    if config is not None and _placeholder(pathlib.Path(config.partition(":")[0]).stem):
        config = None  # configs/NAME.py
    elif target == "dualjax.main" and not any(n in ("help", "helpshort") for n, *_ in options):
        if config is None:
            if complete:
                problems.append("dualjax.main without --config=FILE")
        elif not (ROOT / config.partition(":")[0]).is_file():
            problems.append(f"--config={config}: no such file")
            config = None
    for name, *_ in options:
        if target == "dualjax.main" and name.startswith("config."):
            key = name[len("config."):]
            if (config is not None and not _placeholder(key)
                    and not has_key(load_config(config), key)):
                problems.append(f"--{name}: {config} has no key {key!r}")
        elif name not in flags:
            problems.append(f"--{name}: {target} defines no such flag")
    return problems


def test_every_documented_command_names_a_real_command_flags_and_config_keys():
    commands = doc_commands()
    targets = {target for *_, target, _ in commands}
    # The extraction itself works: the docs run all five commands and some scripts.
    assert {"dualjax.main", "dualjax.search", "dualjax.export", "dualjax.index",
            "dualjax.pretrained"} <= targets, targets
    assert len(commands) >= 25, len(commands)
    problems = [f"{doc}: {problem}\n    {line}"
                for doc, line, target, args in commands
                for problem in command_problems(target, args)]
    assert not problems, "\n".join(problems)


def test_inline_commands_and_overrides_are_real():
    problems = []
    for doc, span in inline_spans():
        line = f"python {span}" if re.match(r"scripts/[\w/]+\.py --", span) else span
        commands = invocations(line)
        problems += [f"{doc}: {p}\n    `{span}`" for target, args in commands
                     for p in command_problems(target, args, complete=False)]
        if commands:
            continue
        for option in re.findall(r"(?:^| )--config\.([\w.]+)", span):
            if not _placeholder(option) and not has_key(load_config("configs/default.py"),
                                                        option):
                problems.append(f"{doc}: --config.{option}: configs/default.py has no such "
                                f"key\n    `{span}`")
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_bad_flag_a_missing_key_and_a_missing_command():
    line = (".venv/bin/python -m dualjax.main --config=configs/pses.py --workdir=w \\\n"
            "  --config.loss.pses.margin=1 --config.loss.pses.nope=1 --bogus=1 && echo done")
    [(target, args)] = invocations(line.replace("\\\n", " "))
    assert target == "dualjax.main" and args[-1] == "--bogus=1"
    problems = command_problems(target, args)
    assert len(problems) == 2, problems
    assert "no key 'loss.pses.nope'" in problems[0] and "--bogus" in problems[1]
    assert command_problems("dualjax.export", ["--workdir=w", "--out=o", "--overwrite"]) == []
    assert command_problems("dualjax.index", ["--kind=hnsw", "--nooverwrite"]) == []
    assert command_problems("dualjax.search", ["--index=i", "--out=o"]) == [
        "--out: dualjax.search defines no such flag"]
    assert command_problems("dualjax.nothing", []) == ["no module dualjax.nothing"]
    assert command_problems("dualjax.main", ["--config=configs/none.py"]) == [
        "--config=configs/none.py: no such file"]
    assert command_problems("scripts/drills/drill.py", ["--serving", "--out=x"]) == []
    assert command_problems("scripts/drills/drill.py", ["--servings"]) == [
        "--servings: scripts/drills/drill.py defines no such flag"]
    # A command inside a quoted argument (gcloud ... --command="...") is found too.
    [(target, args)] = invocations(
        'gcloud ssh N --command="cd dualjax && .venv/bin/python -m dualjax.main '
        '--config=configs/default.py --distributed"')
    assert target == "dualjax.main" and args == ["--config=configs/default.py", "--distributed"]


def test_pip_extras_exist():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    for doc in DOCS:
        for block in bash_blocks(doc.read_text()):
            for line in block.splitlines():
                if "pip install" in line:
                    for named in re.findall(r"\.\[([\w,-]+)\]", line):
                        assert set(named.split(",")) <= extras, (doc.name, line)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(text: str) -> str:
    return _FENCE.sub("", text)


def test_relative_links_reach_files_and_headings():
    problems = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                problems.append(f"{doc.name}: {target}: no such file")
            elif anchor and file.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+ (.*)$", _prose(file.read_text()),
                                                      re.M)}
                if anchor not in slugs:
                    problems.append(f"{doc.name}: {target}: no such heading")
    assert not problems, "\n".join(problems)


def test_docs_pages_exist_and_the_readme_links_them():
    readme = README.read_text()
    for page in PAGES:
        assert (ROOT / "docs" / f"{page}.md").is_file(), page
        assert f"docs/{page}.md" in readme, f"README.md does not link docs/{page}.md"


def test_readme_is_a_first_visit():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move the rest to docs/"
    # Its first commands are the two that work on a fresh machine.
    blocks = bash_blocks(README.read_text())
    assert blocks[0].strip() == (
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python -m "
        "dualjax.main --config=configs/default.py --workdir=runs/default")
    assert blocks[1].strip() == (
        'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && '
        ".venv/bin/python -m dualjax.pretrained fetch all-MiniLM-L6-v2 wordllama && "
        ".venv/bin/python -m pytest")
    # CI runs exactly that command, and nothing else a newcomer would not run.
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    assert ci == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', blocks[1].strip()]


@pytest.fixture(scope="module")
def make_config_doc():
    return runpy.run_path(str(ROOT / "scripts" / "docs" / "make_config_doc.py"))


def test_config_reference_is_generated_from_the_config_comments(make_config_doc):
    expected = make_config_doc["render"]()
    assert (ROOT / "docs" / "config.md").read_text() == expected, (
        "docs/config.md is stale: run .venv/bin/python scripts/docs/make_config_doc.py")
    # Every key of configs/default.py is in it, with its comment.
    for key in ("loss.column_block", "train.encode_chunks", "eval.scann.soar_lambda",
                "mesh.param_sharding", "init_from", "data.tasks", "eval.select_by"):
        assert re.search(rf"^\| `{re.escape(key)}` \| .+ \| \S", expected, re.M), key
