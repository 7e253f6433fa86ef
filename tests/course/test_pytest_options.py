"""The GPU-REQ marker: a visible skip without CUDA, a failure under --require-gpu."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GPU_TEST = """
import pytest

@pytest.mark.gpu
def test_needs_a_gpu():
    assert True
"""


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    test_file = tmp_path / "test_gpu_probe.py"
    test_file.write_text(GPU_TEST)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(test_file),
            "-rs",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(ROOT),
            "-c",
            str(ROOT / "pyproject.toml"),
            "-p",
            "conftest",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_gpu_test_skips_with_reason_or_fails_under_require_gpu(tmp_path):
    import torch

    plain = run(tmp_path)
    required = run(tmp_path, "--require-gpu")
    if torch.cuda.is_available():
        assert plain.returncode == 0 and required.returncode == 0
        return
    assert plain.returncode == 0 and "GPU-REQ" in plain.stdout and "1 skipped" in plain.stdout
    assert required.returncode == 1 and "--require-gpu" in required.stdout


def test_impl_option_rejects_unknown_values(tmp_path):
    result = run(tmp_path, "--impl=mine")
    assert result.returncode != 0 and "invalid choice" in result.stderr
