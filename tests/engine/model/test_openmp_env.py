"""OpenMP settings for the page's worker threads: set before torch loads, a user's value kept."""

import os
import subprocess
import sys
from pathlib import Path

from engine.model import openmp_env

ROOT = Path(__file__).resolve().parents[3]
PRINT_ENV = "import app, os; print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])"


def _app_env(**extra) -> str:
    env = {k: v for k, v in os.environ.items() if k not in openmp_env.SETTINGS}
    env.update(extra)
    done = subprocess.run(
        [sys.executable, "-c", PRINT_ENV], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_app_sets_both_before_torch_loads():
    """Importing app.py sets OMP_WAIT_POLICY=ACTIVE and GOMP_SPINCOUNT=300000."""
    assert _app_env() == ["ACTIVE", "300000"]


def test_a_value_the_user_set_is_kept():
    """A host's own OMP_WAIT_POLICY wins over the default."""
    assert _app_env(OMP_WAIT_POLICY="PASSIVE") == ["PASSIVE", "300000"]


def test_configure_after_torch_changes_nothing(monkeypatch):
    """Too late to matter once torch is loaded: it says so and leaves the environment alone."""
    import torch  # noqa: F401

    for name in openmp_env.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert openmp_env.configure() is False
    assert not any(name in os.environ for name in openmp_env.SETTINGS)
