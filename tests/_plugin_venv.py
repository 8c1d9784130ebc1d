"""A venv over this environment with the demo plugin (tests/fixtures/srpo-demo-plugin) installed the way a
user installs a package: srpo and its dependencies come from the system site-packages, the plugin's entry
point is its only link to srpo."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "srpo-demo-plugin"


def plugin_venv(base: Path) -> Path:
    """Build the venv under ``base``; its python."""
    where, source = base / "venv", base / "src"
    shutil.copytree(FIXTURE, source)  # a build writes build/ and *.egg-info beside the sources: not in the repo
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    return python
