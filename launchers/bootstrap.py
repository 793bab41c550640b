"""First-use installer: make ./.venv with everything mdk needs and re-run the command inside it
(skipped with your own environment or MDK_NO_BOOTSTRAP=1: README). Standard library only: it runs
before anything is installed. The venv is refreshed when pyproject.toml changes.

``add_plugin_path`` puts ``launchers/plugins`` (the project's ``hydra_plugins`` portion) and the
repository root on ``sys.path`` and on ``PYTHONPATH`` (submitit jobs unpickle the launcher);
run.py calls it before importing Hydra.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "launchers" / "plugins"
VENV = Path(os.environ.get("MDK_VENV", REPO / ".venv"))
NEEDED = ("torch", "torchvision", "hydra", "omegaconf", "submitit", "tqdm", "torchmetrics",
          "tensorboard", "onnxruntime", "pytest")
# torch/torchvision pairs known to import together on the CPU; pinned here because a mismatched
# pair fails at import ('operator torchvision::nms does not exist').
TORCH_PINS = {"x86_64": ("torch==2.14.1", "torchvision==0.29.1"),
              "aarch64": ("torch==2.9.1", "torchvision==0.24.1")}
# Packages an earlier mdk installed, removed on refresh (a leftover Hydra plugin stays on the
# plugin path).
REMOVED = ("hydra-optuna-sweeper",)


def _stamp() -> str:
    return hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]


def _venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _run(cmd: list[str]) -> None:
    print("[mdk setup] $", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def install() -> None:
    """Create or refresh the venv."""
    stamp_file = VENV / ".mdk-stamp"
    if stamp_file.is_file() and stamp_file.read_text() == _stamp():
        return
    print(f"[mdk setup] installing into {VENV} (first use; about 2 minutes)", flush=True)
    if not _venv_python().exists():
        _run([sys.executable, "-m", "venv", str(VENV)])
    py = str(_venv_python())
    pins = TORCH_PINS.get(platform.machine())
    if pins:
        _run([py, "-m", "pip", "install", "-q", *pins])
    # only those there: a fresh venv prints no "Skipping ... not installed" warning
    left = [p for p in REMOVED
            if subprocess.run([py, "-m", "pip", "show", "-q", p], capture_output=True).returncode
            == 0]
    if left:
        _run([py, "-m", "pip", "uninstall", "-y", "-q", *left])
    _run([py, "-m", "pip", "install", "-q", "-e", f"{REPO}[test]"])
    stamp_file.write_text(_stamp())


def ensure_environment() -> None:
    """Return if this interpreter can run mdk; otherwise install and exec the venv's python."""
    if os.environ.get("MDK_NO_BOOTSTRAP") == "1":
        return
    if Path(sys.prefix).resolve() == VENV.resolve():  # running in the venv
        install()  # no-op unless pyproject.toml changed
        return
    if all(importlib.util.find_spec(m) is not None for m in NEEDED) and not VENV.exists():
        return
    try:
        install()
    except subprocess.CalledProcessError as e:
        sys.exit(f"[mdk setup] installing dependencies failed ({e}); see the pip output above. "
                 f"Delete {VENV} and run again, or install with `pip install -e .[test]`")
    py = str(_venv_python())
    os.execv(py, [py, *sys.argv])


def add_plugin_path() -> None:
    # Our conf/hydra/launcher presets share the submitit plugin's names on purpose (so
    # `hydra/launcher=submitit_slurm` picks them); Hydra 1.3 warns about that on every run.
    warnings.filterwarnings("ignore", category=UserWarning,
                            message=r"(?s).*validated against ConfigStore schema with the same name")
    for p in (str(REPO), str(PLUGINS)):
        if p not in sys.path:
            sys.path.insert(0, p)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    new = [p for p in (str(REPO), str(PLUGINS)) if p not in parts]
    if new:
        os.environ["PYTHONPATH"] = os.pathsep.join([*new, *parts])
