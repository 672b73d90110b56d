"""Test setup: 8 fake CPU devices, set before jax is imported anywhere."""
import os
import tempfile

# The tests' programs are tiny, so XLA compiling them is most of the suite's time and
# running them little (BENCHMARKS.md "Test suite wall time"). So the tests compile
# cheaply: LLVM at -O0, XLA's classic CPU emitters instead of its fusion emitters (which
# lower every fusion through MLIR first), and one LLVM module per program (no parallel
# codegen split: two pytest workers already use both cores). The programs compute the
# same operations either way; the benchmarks, the quick start and users run XLA's
# defaults.
COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                 "--xla_cpu_parallel_codegen_split_count=1")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" {COMPILE_FLAGS} --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One compilation cache for the session (and the CLI runs it starts): many tests train
# the same tiny model, and XLA compiles for 8 devices take most of the suite's time.
# A fresh directory each session, so a run of the suite costs what it costs in CI; the
# session that made it removes it when it ends (tens of MB a run).
OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # (the workers inherit the session's)
    OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="dualjax-xla-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


import pathlib  # noqa: E402
import runpy  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402

import ml_collections  # noqa: E402
import pytest  # noqa: E402

TESTS = pathlib.Path(__file__).resolve().parent  # tests/: one folder per stage package
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
CONFIGS = REPO / "configs"


def load_config(name: str) -> ml_collections.ConfigDict:
    """`configs/<name>.py`'s get_config(), loaded by path as main.py does."""
    return runpy.run_path(str(CONFIGS / f"{name}.py"))["get_config"]()


TRAINED_FIXTURES = {"trained_tiny", "bundle"}  # a training run (and an export) each


def pytest_unconfigure(config):
    """The session's own compilation cache goes with it (a worker inherits it, not owns it)."""
    if OWN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(OWN_CACHE, ignore_errors=True)


def tasks_of(cfg: ml_collections.ConfigDict, workdir: str = ""):
    """The training tasks of `cfg` (resolved unchecked), as the loop makes them."""
    from dualjax.config import run
    from dualjax.train import tasks
    spec = run.resolve(cfg, str(workdir), checked=False)
    return tasks.make_tasks(spec.tasks, spec.schedule.seed)


def files_of(cfg: ml_collections.ConfigDict):
    """The input files of `cfg`'s data groups, as the workdir records them."""
    from dualjax.config import run
    from dualjax.train import tasks
    return tasks.data_files(run.resolve(cfg, checked=False).tasks)


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    """A test that reads a trained workdir is slow too (its fixture trains one), and the
    slow tests run first: pytest-xdist hands tests out in collection order, and a long
    one started last would leave the other worker idle."""
    for item in items:
        if TRAINED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


SYNTHETIC_SEED = 0  # the seed of the synthetic tables below


@pytest.fixture(scope="module")
def tiny_data():
    """The tiny config's data group (synthetic paraphrases)."""
    return load_config("tiny").data


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds_synthetic"))


@pytest.fixture(scope="module")
def train_src(tiny_data, synthetic_dir):
    """The tiny synthetic data's pairs table, written once a module (the builders' and the
    pipeline's tests read it)."""
    from dualjax.config.specs import dataset_spec
    from dualjax.data import builders
    return builders.train_source(dataset_spec(tiny_data, SYNTHETIC_SEED), synthetic_dir)


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory):
    """A workdir of the tiny config trained to the end (no untrained or baseline rows),
    shared by the search and index tests of a worker: they read it, never change it."""
    from dualjax.train import loop as train
    path = tmp_path_factory.mktemp("trained")
    cfg = load_config("tiny")
    cfg.eval.untrained, cfg.eval.baselines = False, ""
    train.train_and_evaluate(cfg, str(path))
    return path


@pytest.fixture(scope="session")
def bundle(trained_tiny, tmp_path_factory):
    """`trained_tiny` exported (CPU): tests copy it before changing a file."""
    from dualjax import export
    path = str(tmp_path_factory.mktemp("bundle") / "export")
    export.export(str(trained_tiny), path, platforms=("cpu",))
    return path


@pytest.fixture
def ctrl_c():
    """SIGINT as Python sets it in a terminal (KeyboardInterrupt), for tests of Ctrl-C: a
    background job, nohup and some CI runners start the tests with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def write_beir_folder(folder, texts) -> None:
    """`texts` as a BEIR folder: document i "d{i}", its query "q{i}" (its first 6 words)
    judged relevant to it alone."""
    import json
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(texts)))
    (folder / "queries.jsonl").write_text("".join(
        json.dumps({"_id": f"q{i}", "text": " ".join(t.split()[:6])}) + "\n"
        for i, t in enumerate(texts)))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\td{i}\t1\n" for i in range(len(texts))))


def stop_at(last: int):
    """A training hook that interrupts the run after step `last` (as Ctrl-C would), its
    checkpoint saved: the first half of a resume test."""
    def hook(step, metrics):
        if step == last:
            raise KeyboardInterrupt
    return hook

