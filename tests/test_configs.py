"""Every shipped config loads and passes validation on the 8 test devices."""
import pytest

from conftest import CONFIGS, load_config
from dualjax import config_lib, tasks


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.py")))
def test_config_is_valid(name):
    cfg = load_config(name)
    config_lib.validate(cfg, 8)
    assert len(tasks.task_configs(cfg)) == (2 if name == "multitask" else 1)
