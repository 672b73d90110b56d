"""The shape of the code: the lower layers (models, losses, data, indexes) take plain
values and typed specs, never the ConfigDict (issue 22). `specs.py` and `config_lib.py`
resolve the config at the top, once."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "dualjax"
LOWER = [*sorted((ROOT / "models").glob("*.py")), *sorted((ROOT / "losses").glob("*.py")),
         *sorted((ROOT / "data").glob("*.py")), ROOT / "index.py", ROOT / "ann.py"]
FORBIDDEN = ("ml_collections", "dualjax.config_lib", "dualjax.specs")


def imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports (`from dualjax import config_lib` as dualjax.config_lib)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def offends(path: pathlib.Path) -> bool:
    return any(m == f or m.startswith(f + ".") for m in imports(path) for f in FORBIDDEN)


def test_lower_layers_never_read_the_config():
    assert len(LOWER) > 20
    offenders = [str(p.relative_to(ROOT)) for p in LOWER if offends(p)]
    assert offenders == [], "these read the config: give them plain values or a spec"


def test_the_guard_sees_an_import(tmp_path):
    for line in ("import ml_collections", "from dualjax import config_lib",
                 "from dualjax.config_lib import validate", "from dualjax import specs"):
        (tmp_path / "m.py").write_text(line + "\n")
        assert offends(tmp_path / "m.py"), line
    (tmp_path / "m.py").write_text("from dualjax import sharding\n")
    assert not offends(tmp_path / "m.py")


def test_a_saved_config_without_newer_keys_still_makes_its_model_spec():
    """A workdir's config.json from before the cnn tower, dtype, per-side towers, PSES or
    the Transformer preset: the spec of its bow_mlp model is read all the same."""
    import ml_collections
    from conftest import load_config
    from dualjax import specs
    model = load_config("tiny").model.to_dict()
    for key in ("cnn_filters", "cnn_windows", "dtype", "query_tower", "doc_tower",
                "shared_embedding", "pses", "transformer", "name"):
        del model[key]
    spec = specs.model_spec(ml_collections.ConfigDict(model))
    assert (spec.query_tower, spec.doc_tower, spec.dtype) == ("bow_mlp", "bow_mlp", "float32")
