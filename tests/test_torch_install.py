"""The CPU install path of the ``torch`` extra: the instructions name PyTorch's CPU index, and pip keeps an installed
``+cpu`` build when it resolves ``.[torch]`` (checked offline: ``--no-index --dry-run``, nothing is installed)."""

import importlib.metadata
import json
import pathlib
import subprocess
import sys
import tomllib

import pytest

import warp_meshad

ROOT = pathlib.Path(__file__).resolve().parents[1]
CPU_INDEX = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def test_the_cpu_index_is_named_where_the_extra_is_documented():
    import importlib.util

    spec = importlib.util.find_spec("warp_meshad.torch")
    doc = pathlib.Path(spec.origin).read_text()  # the module's text: importing it would import torch
    assert CPU_INDEX in doc and 'pip install -e ".[torch]"' in doc
    text = (ROOT / "pyproject.toml").read_text()
    line = next(line for line in text.splitlines() if line.startswith("torch = "))
    assert CPU_INDEX in line
    assert tomllib.loads(text)["project"]["optional-dependencies"]["torch"] == ["torch>=2.0"]


def test_pip_keeps_an_installed_cpu_torch(tmp_path):
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch is not installed")
    if not version.endswith("+cpu"):
        pytest.skip(f"torch {version} is not a CPU build")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "--quiet",
         "--report", str(report), "-e", f"{ROOT}[torch]"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr  # offline: anything pip would have to download fails here
    installs = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert installs == {"warp-meshad": warp_meshad.__version__}, installs
