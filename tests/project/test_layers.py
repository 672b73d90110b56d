"""The shape of the code: the package's folders are the stages of the flow, and imports
point one way, from a layer to the layers below it (docs/design.md draws the map). The
lower layers take plain values and typed specs, never the ConfigDict: `config/`
resolves it at the top, once."""
import ast
import pathlib

import conftest
import pytest

ROOT = conftest.REPO / "dualjax"
# Bottom first. A package may import the packages of the layers below its own, never
# one of its own layer or above: serve/ never reaches the training loop, eval/ never
# train/, the lower stages never config/.
LAYERS = [
    ("errors",),
    ("runtime",),                   # meshes, files, processes, signals, progress
    ("text", "models", "losses"),   # tokens; towers; in-batch losses
    ("retrieval", "pretrained"),    # search and its scores; pretrained starts
    ("data", "objectives", "eval"),  # the TFDS tables; what a step learns; evaluation
    ("config",),                    # validation, resolution into specs
    ("train", "serve"),             # the loop and its workdir; the exported bundle
]
COMMANDS = ("__init__", "main", "export", "index", "search", "cli")  # may import any
CONFIG_FREE = ("runtime", "text", "models", "losses", "retrieval", "pretrained", "data",
               "objectives", "eval")
MAX_TOP_LEVEL = 10


def imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports (`from dualjax import x` as dualjax.x)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def package_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def reached(path: pathlib.Path) -> set[str]:
    """The dualjax packages (or top-level modules) `path` imports, its own left out."""
    own = package_of(path)
    return {m.split(".")[1] for m in imports(path)
            if m.startswith("dualjax.") and m.split(".")[1] != own}


def offences() -> list[str]:
    rank = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        pkg = package_of(path)
        if pkg in COMMANDS:
            continue
        for other in sorted(reached(path)):
            if other in COMMANDS or rank.get(other, 99) >= rank[pkg]:
                out.append(f"{path.relative_to(ROOT)} imports dualjax.{other}")
    return out


def test_every_package_is_on_the_map_and_few_modules_lie_on_top():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in ROOT.glob("*.py")}
    assert packages == {pkg for layer in LAYERS for pkg in layer} - {"errors"}
    assert modules == set(COMMANDS) | {"errors"}
    assert len(modules) <= MAX_TOP_LEVEL


def test_imports_point_down_the_layers():
    assert offences() == [], "an import that points up or sideways (see LAYERS)"


def test_lower_layers_never_read_the_config():
    lower = [p for pkg in CONFIG_FREE for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(lower) > 30
    offenders = [str(p.relative_to(ROOT)) for p in lower
                 if any(m == f or m.startswith(f + ".") for m in imports(p)
                        for f in ("ml_collections", "dualjax.config"))]
    assert offenders == [], "these read the config: give them plain values or a spec"


def error_names() -> set[str]:
    """The exceptions of dualjax/errors.py."""
    tree = ast.parse((ROOT / "errors.py").read_text())
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef)}


def misrouted_errors(paths) -> list[str]:
    """`from M import SomeError` (a dualjax exception) with M not dualjax.errors."""
    names = error_names()
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and node.module != "dualjax.errors"
                    and any(a.name in names for a in node.names)):
                out.append(f"{path.name}:{node.lineno} from {node.module} import ...")
    return out


def test_exceptions_come_from_dualjax_errors_only():
    """One home for every exception: none is imported through the module that raises it
    (re-exports made main.py import five exceptions from five places)."""
    tests = conftest.TESTS
    paths = [*ROOT.rglob("*.py"), *tests.rglob("*.py"), *(ROOT.parent / "scripts").rglob("*.py")]
    assert len(error_names()) >= 10
    assert misrouted_errors(paths) == []
    errors = __import__("dualjax.errors").errors
    base = [n for n in error_names() - {"DualjaxError", "Terminated", "PeerStopped"}
            if not issubclass(getattr(errors, n), errors.DualjaxError)]
    assert base == [], "every error dualjax raises on purpose is a DualjaxError"


def test_the_errors_guard_sees_a_re_export(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from dualjax.data.pairs_file import DataError\n"
                   "from dualjax.errors import ConfigError\n")
    assert misrouted_errors([bad]) == ["bad.py:1 from dualjax.data.pairs_file import ..."]


# What train/ may take from config/: the resolved RunSpec (`config.run`) and the flattening
# of a config dict (`config.keys.flatten`, for comparing saved configs), never the
# ConfigDict, its validation or the spec builders.
TRAIN_MAY_IMPORT = ("dualjax.config.run", "dualjax.config.keys")


def config_readers(paths) -> list[str]:
    """The modules of `paths` that import ml_collections, or dualjax.config beyond
    TRAIN_MAY_IMPORT."""
    def reads(m: str) -> bool:
        if m == "ml_collections" or m.startswith("ml_collections."):
            return True
        return (m.startswith("dualjax.config.")  # (the package alone: `from dualjax.config
                # import run` names dualjax.config.run too)
                and not any(m == ok or m.startswith(ok + ".") for ok in TRAIN_MAY_IMPORT))
    return [p.name for p in paths if any(reads(m) for m in imports(p))]


def test_nothing_under_train_reads_the_config():
    """Issue 44: the loop and every stage under it take the RunSpec `config.run.resolve`
    made once; none imports ml_collections or the spec builders."""
    paths = sorted((ROOT / "train").rglob("*.py"))
    assert len(paths) >= 14
    assert config_readers(paths) == [], "these read the config: give them the RunSpec"


def test_the_train_guard_sees_a_config_import(tmp_path):
    bad, good = tmp_path / "bad.py", tmp_path / "good.py"
    bad.write_text("import ml_collections\nfrom dualjax.config import specs\n")
    good.write_text("from dualjax.config.run import RunSpec\n")
    assert config_readers([bad, good]) == ["bad.py"]


@pytest.mark.parametrize("line, where, offends", [
    ("from dualjax.train import loop", "serve/x.py", True),      # serve never trains
    ("from dualjax import train", "eval/x.py", True),            # eval below train
    ("from dualjax.config import specs", "eval/x.py", True),     # eval takes an EvalSpec
    ("from dualjax.config import specs", "data/x.py", True),     # up a layer
    ("from dualjax.retrieval import ann", "pretrained/x.py", True),  # sideways
    ("from dualjax.runtime import files", "text/x.py", False),
    ("from dualjax.eval import scoring", "train/x.py", False),
    ("from dualjax.text import words", "text/x.py", False),      # its own package
])
def test_the_guard_sees_an_import(tmp_path, monkeypatch, line, where, offends):
    fake = tmp_path / "dualjax"
    (fake / where).parent.mkdir(parents=True)
    (fake / where).write_text(line + "\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    assert bool(offences()) == offends


def test_a_saved_config_without_newer_keys_still_makes_its_model_spec():
    """A workdir's config.json from before the cnn tower, dtype, per-side towers, PSES or
    the Transformer preset: the spec of its bow_mlp model is read all the same."""
    from conftest import load_config

    from dualjax.config import run, specs
    model = load_config("tiny").model.to_dict()
    for key in ("cnn_filters", "cnn_windows", "dtype", "query_tower", "doc_tower",
                "shared_embedding", "pses", "transformer", "name"):
        del model[key]
    spec = specs.model_spec(run.upgrade({"model": model}).model)
    assert (spec.query_tower, spec.doc_tower, spec.dtype) == ("bow_mlp", "bow_mlp", "float32")


def test_the_tests_mirror_the_stage_packages():
    """tests/<package>/ holds the tests of dualjax/<package>/; tests/project/ those of the
    whole package; no test module lies loose at the top or in a folder of no package."""
    tests = conftest.TESTS
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders - packages == {"project"}
    assert list(tests.glob("test_*.py")) == []
    assert len(folders) >= 10


def script_imports(scripts: pathlib.Path) -> list[str]:
    """"script imports other" for each script importing another script's module: the
    scripts share through scripts/common.py; only the drill runner composes the drills,
    and the fixture makers share their readers, each within its own folder."""
    stems = {p.stem: p.parent.name for p in scripts.rglob("*.py") if p.parent != scripts}
    out = []
    for path in sorted(scripts.rglob("*.py")):
        for top in sorted({name.split(".")[0] for name in imports(path)}):
            if top in stems and top != path.stem and not (
                    stems[top] == path.parent.name in ("drills", "fixtures")):
                out.append(f"{path.relative_to(scripts)} imports {top}")
        for node in ast.walk(ast.parse(path.read_text())):  # what they share is public
            if isinstance(node, ast.ImportFrom) and node.module in stems:
                out += [f"{path.relative_to(scripts)} imports {node.module}.{a.name}"
                        for a in node.names if a.name.startswith("_")]
    return out


def test_scripts_are_split_by_kind_and_share_through_common_only():
    scripts = conftest.REPO / "scripts"
    assert {p.name for p in scripts.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "bench", "drills", "fixtures", "docs"}
    assert sorted(p.name for p in scripts.glob("*.py")) == ["common.py"]
    assert script_imports(scripts) == []


def test_the_scripts_guard_sees_a_script_importing_another(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "a.py").write_text("from b import helper\nimport common\n")
    (tmp_path / "bench" / "b.py").write_text("")
    assert script_imports(tmp_path) == ["bench/a.py imports b"]
    (tmp_path / "drills").mkdir()
    (tmp_path / "drills" / "c.py").write_text("from d import shared, _private\n")
    (tmp_path / "drills" / "d.py").write_text("")
    assert script_imports(tmp_path) == ["bench/a.py imports b", "drills/c.py imports d._private"]
