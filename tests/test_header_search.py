"""A linked CUDA C file's headers are what NVRTC would open now, not only what it opened.

NVRTC looks a `"..."` include up in the working directory, then in its include path in
order (`NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS` last). A header made since in a folder
searched before the one it was found in, or the folders reordered, makes NVRTC open
another file: the build must compile again and equal a build into an empty store. A
header made where it shadows nothing rebuilds nothing. So does one the source tests for
with `__has_include`, which NVRTC looks for and, while absent, never opens.
"""

from __future__ import annotations

import textwrap

import pytest

from editmatrix_support import artifacts, build, copy_tree, with_status
from mlir_support import MLIR, needs_mlir, port_config, port_sources

TOML = """\
[project]
name = "headers"
paths = ["."]
arch = ["sm_80"]

[kernels."hs.kern:k"]
signatures = ["void(float32[::1], float32[::1])"]
"""

KERNEL = """\
import os

from numba import cuda

gain = cuda.declare_device("hs_gain", "float32(float32)",
                           link=[os.path.join(os.path.dirname(__file__), "gain.cu")])


@cuda.jit
def k(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = gain(x[i])
"""

GAIN_CU = """\
#include "gain.h"
#if __has_include("fast.h")
#define HS_EXTRA 3.0f
#else
#define HS_EXTRA 1.0f
#endif

extern "C" __device__ int hs_gain(float* out, float x) {
    *out = x * HS_GAIN * HS_EXTRA;
    return 0;
}
"""

SEARCH = {"NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS": "inc_a:inc_b"}


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture(scope="module", params=["numba-cuda", pytest.param(MLIR, marks=needs_mlir)])
def baseline(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("headers")
    project = root / "proj"
    _write(project, {"kbuild.toml": TOML, "hs/__init__.py": "", "hs/kern.py": KERNEL,
                     "hs/gain.cu": GAIN_CU, "inc_b/gain.h": "#define HS_GAIN 2.0f\n",
                     "inc_a/other.h": "#define OTHER 1\n"})
    if request.param == MLIR:
        port_sources(project)
        port_config(project / "kbuild.toml")
    store = root / "store"
    first = build(project, store, env_extra=SEARCH)
    assert with_status(first, "built") == {"k"}
    return project, store, artifacts(first)


def _checkout(baseline, where):
    """(a copy of the built project at `where`, a copy of its store, the first build's
    artifacts)."""
    template, template_store, before = baseline
    return (copy_tree(template, where), copy_tree(template_store, where.parent / "store"),
            before)


# (id, files made, the search path after): each changes the header NVRTC opens.
SHADOWING = [
    ("made-in-an-earlier-folder", {"inc_a/gain.h": "#define HS_GAIN 3.0f\n"}, SEARCH),
    ("made-in-the-working-directory", {"gain.h": "#define HS_GAIN 3.0f\n"}, SEARCH),
    ("folders-reordered", {"inc_c/gain.h": "#define HS_GAIN 3.0f\n"},
     {"NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS": "inc_c:inc_a:inc_b"}),
    # A header the source tests for with __has_include: looked for, never opened.
    ("tested-for-and-made", {"inc_b/fast.h": "// present\n"}, SEARCH),
]


@pytest.mark.parametrize("made, search", [c[1:] for c in SHADOWING],
                         ids=[c[0] for c in SHADOWING])
def test_a_header_that_now_shadows_the_one_opened_rebuilds(baseline, tmp_path, made, search):
    project, store, before = _checkout(baseline, tmp_path / "proj")
    _write(project, made)
    again = build(project, store, env_extra=search)
    fresh = build(project, tmp_path / "fresh", env_extra=search)
    assert with_status(again, "built") == {"k"}
    assert artifacts(again) == artifacts(fresh) != before


def test_a_header_that_shadows_nothing_rebuilds_nothing(baseline, tmp_path):
    project, store, before = _checkout(baseline, tmp_path / "proj")
    _write(project, {"inc_a/unused.h": "#define HS_GAIN 3.0f\n",
                     "inc_b/more.h": "#define MORE 1\n"})
    again = build(project, store, env_extra=SEARCH)
    assert with_status(again, "cached") == {"k"}
    assert artifacts(again) == before


def test_the_same_folders_named_from_a_moved_checkout_rebuild_nothing(baseline, tmp_path):
    """The folders are keyed by where they are in the project: a checkout elsewhere that
    names them by absolute path (as a CI job does) is served what the template built."""
    project, store, before = _checkout(baseline, tmp_path / "elsewhere" / "proj")
    search = {"NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS": f"{project / 'inc_a'}:{project / 'inc_b'}"}
    again = build(project, store, env_extra=search)
    assert with_status(again, "cached") == {"k"}
    assert artifacts(again) == before
