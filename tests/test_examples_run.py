"""Every example kernel, launched from a warm store, gives numpy's answer.

Under numba's simulator in CI, and against a fake driver (the real launch path down
to the driver calls, which check what they get); on a GPU (`--gpu`, or
KBUILD_GPU_TESTS=1) the same script launches the stored cubins and also proves
zero compilations.
"""

import json
from pathlib import Path

import pytest
from support import run

SCRIPT = Path(__file__).resolve().parent / "run_examples.py"


@pytest.fixture(scope="module")
def warm(tmp_path_factory, examples_template):
    """(root, env): a copy of the examples and, in root/store, the session's cold build of
    the archs kbuild.toml declares."""
    root = tmp_path_factory.mktemp("run")
    examples_template().copy_to(root, root / "store")
    return root, {}


def _run(root, env, *extra):
    done = run(root / "kbuild.toml", root / "store", *extra, launcher=(SCRIPT,), cwd=root,
               home=root, env=env)
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
    result = _run(root, dict(env, NUMBA_ENABLE_CUDASIM="0"), "--fake-driver", device)
    assert result.pop("compiles") == 0
    assert {k: v for k, v in result.items() if v is not True} == {}


@pytest.mark.gpu
def test_every_example_matches_numpy_on_the_gpu_without_compiling(warm):
    root, env = warm
    result = _run(root, dict(env, NUMBA_ENABLE_CUDASIM="0"))
    assert result.pop("compiles") == 0
    assert {k: v for k, v in result.items() if v is not True} == {}
