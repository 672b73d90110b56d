"""Every shipped config loads, passes validation on the 8 test devices and resolves into
a RunSpec."""
import os

import pytest
from conftest import CONFIGS, load_config

from dualjax import errors
from dualjax.config import keys as config_keys
from dualjax.config import run
from dualjax.config import validation as config_lib
from dualjax.pretrained import sources


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.py")))
def test_config_is_valid(name):
    cfg = load_config(name)
    if name == "distill" and not os.path.isdir(sources.folder_of("all-mpnet-base-v2")):
        # CI fetches only what the tests read: a teacher not fetched is refused in one line
        with pytest.raises(errors.ConfigError, match="config.distill.teacher: model."
                           "pretrained='all-mpnet-base-v2' is not fetched yet; run: python -m "
                           "dualjax.pretrained fetch all-mpnet-base-v2"):
            config_lib.validate(cfg, 8)
        return
    config_lib.validate(cfg, 8)
    spec = run.resolve(cfg, "/tmp/w", checked=False)
    assert len(spec.tasks) == (2 if name == "multitask" else 1)
    assert spec.tasks[0].tfds_dir == (cfg.data.tfds_dir or "/tmp/w/tfds")


def test_every_config_key_says_what_it_means():
    """`--keys` lists every key with a meaning: each key of configs/default.py has a
    comment there (or, for eval.scann, in index.py)."""
    cfg = load_config("default")
    text = config_keys.describe_keys(cfg, *config_keys.key_sources())
    lines = text.splitlines()
    assert len(lines) > 100
    bare = [line.split(" = ")[0] for line in lines if "  # " not in line]
    assert bare == [], f"config keys without a comment in configs/default.py: {bare}"
    model_name = next(line for line in lines if line.startswith("model.name = "))
    assert "'dual_encoder'" in model_name and "pses" in model_name
    assert any(line.startswith("eval.scann.mode = 'auto'") and "brute_force" in line
               for line in lines)
