"""notebooks/quickstart.ipynb runs top to bottom on CPU (a micro model, a few steps) and draws its figures."""

import json
import os

import pytest

from conftest import REPO

NOTEBOOK = os.path.join(REPO, "notebooks", "quickstart.ipynb")
STEPS = 20


def test_the_first_cell_needs_no_editing_on_colab():
  """The source is a form field (empty: a checkout beside the notebook or uploaded is found), never a
  placeholder URL to edit; without either, one line says what to set."""
  with open(NOTEBOOK) as f:
    first = "".join(next(c for c in json.load(f)["cells"] if c["cell_type"] == "code")["source"])
  assert 'REPO_URL = ""  # @param {type:"string"}' in first
  assert "github.com/ORG" not in first and "raise SystemExit(\"bertjax not found: set REPO_URL" in first


@pytest.mark.slow  # > 15 s cold: the normal tier stays under 8 minutes (README)
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  workdir = tmp_path / "run"
  # The kernel inherits the environment: a micro config, few steps, a private workdir, CPU only.
  monkeypatch.setenv("BERTJAX_NB_STEPS", str(STEPS))
  monkeypatch.setenv("BERTJAX_NB_MICRO", "1")
  monkeypatch.setenv("BERTJAX_NB_WORKDIR", str(workdir))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  # The notebook is run from its own folder, as a user opening it in Jupyter would.
  client = nbclient.NotebookClient(nb, timeout=170, kernel_name="python3",
                                   resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
  client.execute()

  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 3, "expected the loss/accuracy figure, the attention heatmap and the analysis grid"
  text = "".join(o.get("text", "") for o in outputs)
  assert f"restored step {STEPS}" in text
  assert "The [MASK] statement is used to leave a loop." in text
  assert "eval/nsp_accuracy" in text
  assert "100 inputs" in text and (workdir / "attention" / "attention.json").exists()  # bertjax.compress.analysis
  with open(workdir / "metrics.jsonl") as f:
    steps = [json.loads(line)["step"] for line in f]
  assert steps[-1] == STEPS
