"""Shared fixtures: where the built binaries are, and a small checkpoint."""
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("LOWBIT_BUILD_DIR", REPO / "build"))


def built(name):
    """Path of a program built by CMake, or skip the test with a message."""
    path = BUILD / name
    if not path.exists():
        pytest.skip(f"{path} is not built (build first, or set LOWBIT_BUILD_DIR)")
    return path


@pytest.fixture(scope="session")
def lowbit():
    return built("lowbit")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A small random Llama checkpoint made by scripts/make_tiny_checkpoint.py."""
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_checkpoint.py"), str(out),
                    "--layers", "1", "--hidden", "256", "--intermediate", "512"],
                   check=True, capture_output=True)
    return out
