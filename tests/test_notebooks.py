"""Every notebook runs top to bottom at its smallest setting, and is committed clean."""

import json
import os
import pathlib

import pytest

from jaxdistill import data

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# FedMD's private data is Fashion-MNIST; without the Debian package (or tfds with network)
# the notebook cannot run locally.
NEEDS_FASHION_MNIST = {"fedmd_nfdp.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs_and_has_colab_badge(path):
  nb = json.loads(path.read_text())
  assert "colab-badge.svg" in "".join(nb["cells"][0]["source"])
  for cell in nb["cells"]:
    if cell["cell_type"] == "code":
      assert cell.get("outputs", []) == [] and cell.get("execution_count") is None


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path, monkeypatch):
  if path.name in NEEDS_FASHION_MNIST and data.find_fashion_mnist() is None:
    if os.environ.get("JAXDISTILL_REQUIRE_FASHION_MNIST") == "1":
      pytest.fail("JAXDISTILL_REQUIRE_FASHION_MNIST=1 but Fashion-MNIST is not installed")
    pytest.skip("needs Fashion-MNIST offline (Debian package dataset-fashion-mnist)")
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  monkeypatch.setenv("JAXDISTILL_NOTEBOOK_SMALL", "1")
  # The kernel imports this checkout's jaxdistill, installed or not.
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
  monkeypatch.chdir(tmp_path)
  nb = nbformat.read(str(path), as_version=4)
  client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors
  if path.name == "reverse_knn_labeling.ipynb":  # its outputs (ledger, votes, report) stay in the working folder;
    assert len(list(tmp_path.glob("runs/notebook-label-*/report.json"))) == 1  # the system /tmp kept every run's
