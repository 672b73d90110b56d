"""notebooks/colab_tpu.ipynb runs top to bottom on CPU (the tiny config, a few steps), so
it cannot rot. It starts in another working directory than the checkout's."""

import conftest
import nbformat
import pytest
from conftest import COMPILE_FLAGS
from nbclient import NotebookClient

ROOT = conftest.REPO


@pytest.mark.slow
def test_colab_notebook_runs_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALJAX_NOTEBOOK_CONFIG", "tiny")
    monkeypatch.setenv("DUALJAX_NOTEBOOK_STEPS", "5")
    monkeypatch.setenv("DUALJAX_NOTEBOOK_WORKDIR", str(tmp_path / "run"))
    monkeypatch.setenv("XLA_FLAGS", COMPILE_FLAGS)  # one CPU device, as a CPU runtime has
    nb = nbformat.read(ROOT / "notebooks" / "colab_tpu.ipynb", as_version=4)
    # From another working directory, as after a runtime restart (Colab's is /content).
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                      for o in cell.get("outputs", []))
    assert "1 cpu device(s)" in outputs
    assert "dual_encoder [exact]" in outputs and "bm25 [exact]" in outputs
    assert "> how do i fix my car" in outputs
    assert (tmp_path / "run" / "export" / "encoder.json").exists()
    images = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the loss curve and recall@k
