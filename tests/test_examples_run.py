"""Every example kernel, launched from a warm store, gives numpy's answer.

Under numba's simulator in CI, and against a fake driver (the real launch path down
to the driver calls, which check what they get); on a GPU (`--gpu`, or
KBUILD_GPU_TESTS=1) the same script launches the stored cubins and also proves
zero compilations.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_examples

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    copy_examples(REPO, root)
    env = dict(os.environ, HOME=str(root), XDG_CACHE_HOME=str(root / "cache"))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    done = subprocess.run([sys.executable, "-m", "kbuild", "build", "--store", str(root / "store")],
                          cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return root, env


def _run(root, env, *extra):
    done = subprocess.run([sys.executable, str(REPO / "tests" / "run_examples.py"),
                           str(root / "kbuild.toml"), str(root / "store"), *extra],
                          cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_example_matches_numpy_under_the_simulator(warm):
    root, env = warm
    result = _run(root, dict(env, NUMBA_ENABLE_CUDASIM="1"))
    assert {k: v for k, v in result.items() if v is not True and k != "compiles"} == {}


@pytest.mark.parametrize("device", ["sm_90", "sm_86"])
def test_every_example_reaches_the_driver_with_the_right_arguments(warm, device):
    """No GPU: the real launch path against a fake driver that checks the stream,
    the launch config and every parameter's size (sm_86: sm_80's PTX, JIT-compiled)."""
    root, env = warm
    result = _run(root, dict(env, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=str(REPO)),
                  "--fake-driver", device)
    assert result.pop("compiles") == 0
    assert {k: v for k, v in result.items() if v is not True} == {}


@pytest.mark.gpu
def test_every_example_matches_numpy_on_the_gpu_without_compiling(warm):
    root, env = warm
    result = _run(root, dict(env, NUMBA_ENABLE_CUDASIM="0"))
    assert result.pop("compiles") == 0
    assert {k: v for k, v in result.items() if v is not True} == {}
