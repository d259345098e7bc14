"""Kernels written in notebooks (issue 34): real notebooks in a real ipykernel.

Each notebook runs in a kernel of its own (nbclient) under kbuild's fake driver
(`notebook_support`), counting NVVM compiles and the binaries loaded. A restart is a new
kernel process (a new process id in every cell's file name) running the notebook again.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from notebook_support import CLOSURES, DEVICE, DEVICE_EDITED, KERNEL_NAMES, KERNELS, RUN_ALL, \
    execute, notebook, write_files
from zeroconf_support import env_for

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

LAUNCH_TWO = """\
scale[2, 32](x, out)
shift[2, 32](x, out)
snap(LABEL)
"""

SHIFT_BY_TWO = KERNELS.split("\n\n\n")[1].replace("x[i] + 1.0", "x[i] + 2.0")
SHIFT_AGAIN = KERNELS.split("\n\n\n")[1]


def _names(row):
    return sorted(name for name, _ in row["served"])


def _keys(row):
    return dict(row["served"])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The notebook run once on a cold store: (its folder, its store, its SNAP rows)."""
    root = write_files(tmp_path_factory.mktemp("nb") / "nb")
    store = root.parent / "store"
    return root, store, execute(root, RUN_ALL, env={"KBUILD_STORE": store})


def test_a_cold_run_builds_every_kernel_of_the_notebook(first_run):
    _, _, (row,) = first_run
    # Cells, a record dtype, closures, a module and a %run script: all keyed, none left
    # to numba (from_script twice: launched by the script, and later for float64).
    assert row["warnings"] == []
    assert row["counts"] == {"built": 8, "served": 8}, row
    assert _names(row) == sorted(KERNEL_NAMES + ["__main__:from_script"])
    assert row["nvvm"] >= 8


def test_restart_run_all_compiles_nothing_then_an_edit_recompiles_only_its_dependants(
        first_run):
    root, store, (cold,) = first_run
    redefine = f"LABEL = 'redefined'\n{SHIFT_BY_TWO}\n{LAUNCH_TWO}"
    back = f"LABEL = 'back'\n{SHIFT_AGAIN}\n{LAUNCH_TWO}"
    edit = ["LABEL = 'edited'\n" + DEVICE_EDITED, KERNELS, LAUNCH_TWO]
    device_only = ["LABEL = 'device only'\n" + DEVICE.replace("v * 2.0", "v * 2.0 + 2.0"),
                   LAUNCH_TWO]
    constant = ["SCALE = 2.0\n\n\n@cuda.jit\ndef by_scale(x):\n    x[0] = x[1] * SCALE\n",
                "by_scale[1, 1](x)\nsnap('constant')", "SCALE = 3.0",
                "by_scale[1, 1](x)\nsnap('constant changed')"]
    restarted, edited, redefined, again, followed, first_value, second_value = execute(
        root, RUN_ALL + edit + [redefine, back] + device_only + constant,
        env={"KBUILD_STORE": store})

    # Restart and run all: a new kernel process, every kernel from the store, the very
    # binaries the cold run compiled.
    assert restarted["nvvm"] == 0 and restarted["counts"] == {"hits": 8, "served": 8}, restarted
    assert restarted["served"] == cold["served"]
    assert sorted(restarted["loads"]) == sorted(cold["loads"])

    # The device function's cell edited and run again, then the kernels' cell: scale
    # (which calls it) compiles again, shift comes from the store.
    assert edited["counts"] == {"built": 1, "hits": 1, "served": 2}, edited
    assert _keys(edited)["__main__:scale"] != _keys(cold)["__main__:scale"]
    assert _keys(edited)["__main__:shift"] == _keys(cold)["__main__:shift"]

    # shift redefined in a later cell: the new kernel, never the old binary; defined as
    # it was again: the first binary, from the store.
    assert redefined["counts"] == {"built": 1, "served": 1}, redefined
    assert _keys(redefined)["__main__:shift"] != _keys(cold)["__main__:shift"]
    old_binaries = {d for _, d in cold["loads"]}
    assert [d for _, d in redefined["loads"]] and \
        not {d for _, d in redefined["loads"]} & old_binaries
    assert again["counts"] == {"hits": 1, "served": 1}, again
    assert _keys(again)["__main__:shift"] == _keys(cold)["__main__:shift"]

    # Only the device function's cell run again (not the kernels'): numba would launch the
    # scale it compiled with the old device function; kbuild compiles scale again at its
    # next launch, and shift, which does not call it, launches as it was.
    assert followed["counts"] == {"built": 1, "served": 1}, followed
    assert _names(followed) == ["__main__:scale"]
    assert _keys(followed)["__main__:scale"] not in (_keys(cold)["__main__:scale"],
                                                     _keys(edited)["__main__:scale"])

    # A notebook global a kernel reads, set again in a later cell: keyed by its value, so
    # the kernel compiles again for the new value (numba alone keeps the old one).
    assert first_value["counts"] == second_value["counts"] == {"built": 1, "served": 1}
    assert _keys(first_value)["__main__:by_scale"] != _keys(second_value)["__main__:by_scale"]


def test_what_a_notebook_cannot_key_falls_back_saying_why_once(tmp_path):
    root = write_files(tmp_path / "nb")
    unkeyable = textwrap.dedent("""\
        ns = {"cuda": cuda, "__name__": "__main__"}
        exec("def from_string(x):\\n    x[0] = 1.0\\n", ns)
        from_string = cuda.jit(ns["from_string"])

        @cuda.jit(lineinfo=True)
        def with_lines(x):
            x[0] = 2.0

        x = device_array(np.zeros(4, np.float32))
        for _ in range(2):
            from_string[1, 1](x)
            with_lines[1, 1](x)
        from_string[1, 1](device_array(np.zeros(4)))
        snap("fallbacks")
        """)
    # A closure kernel a cell displayed: named after the global that keeps it, never after
    # IPython's output history (`_3`), whose names move with every cell run.
    displayed = "k7 = make_scaler(7.0)\nk7"
    launch_k7 = "k7[2, 32](x, x)\nsnap('displayed')"
    timed = "%%time\n@cuda.jit\ndef timed(x):\n    x[0] = 3.0\n"
    launch_timed = "timed[1, 1](x)\nsnap('timed')"
    row, shown, magic = execute(root, [DEVICE, CLOSURES, displayed, unkeyable, launch_k7,
                                       timed, launch_timed],
                                env={"KBUILD_STORE": tmp_path / "store"})
    assert [name for name, _ in shown["served"]] == ["__main__:k7"]
    assert magic["warnings"] == [
        "kbuild: __main__:timed is compiled by numba, not cached: kbuild cannot key it: it "
        "has no source file (<timed exec>: compiled by an IPython cell magic such as "
        "%%time, which keeps no text); define the kernel in a cell without the magic, or "
        "in a module"]
    assert row["counts"] == {"fallback": 3}, row
    assert len(row["warnings"]) == 2, row["warnings"]
    exec_warning, lines_warning = sorted(row["warnings"])
    assert exec_warning.startswith("kbuild: __main__:from_string is compiled by numba, not "
                                   "cached: kbuild cannot key it: it has no source file "
                                   "(<string>: made with exec of a string")
    assert "__main__:with_lines" in lines_warning
    assert "a lineinfo or debug kernel names its cell's file" in lines_warning


def _launch_program(body: str) -> str:
    return textwrap.dedent("""\
        import warnings
        warnings.simplefilter("always")
        import numpy as np
        from numba import cuda
        from kbuild import testing
        fake = testing.fake_device("sm_80", record=False)  # kept: closed when collected
        fake.__enter__()  # for the whole session: a prompt has no block to run in
        import kbuild
        kbuild.enable()
        """) + body


@pytest.mark.parametrize("how", ["python -c", ">>> prompt"])
def test_a_kernel_with_no_kept_text_falls_back_saying_why_once(tmp_path, how):
    body = ("@cuda.jit\ndef k(x):\n    x[0] = 1.0\n\n"
            "for _ in range(2): k[1, 1](testing.device_array(np.zeros(4, np.float32)))\n\n")
    program = _launch_program(body)
    env = env_for(tmp_path, KBUILD_STORE=tmp_path / "store")
    if how == "python -c":
        done = subprocess.run([sys.executable, "-c", program], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        expected = "(<string>: made with exec of a string, or python -c"
    else:
        done = subprocess.run([sys.executable, "-i", "-q"], input=program, env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        expected = "(<stdin>: typed at a plain >>> prompt, which keeps no text)"
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "kbuild: __main__:k" in line]
    if how == ">>> prompt" and sys.version_info >= (3, 13):
        # Python 3.13's prompt keeps each input's text (`<python-input-N>` in linecache),
        # as IPython keeps a cell's: the kernel is keyed from it, and served.
        assert warned == [], done.stderr
        assert list((tmp_path / "store" / "v1" / "entries").glob("??/*.json"))
        return
    assert len(warned) == 1, done.stderr
    assert "is compiled by numba, not cached: kbuild cannot key it: it has no source " \
        f"file {expected}" in warned[0]


def test_kbuild_run_record_over_nbconvert_records_module_kernels_and_says_why_not_cells(
        tmp_path):
    import nbformat

    root = write_files(tmp_path / "nb")
    nbformat.write(notebook(RUN_ALL, mode="env"), root / "nb.ipynb")
    done = subprocess.run(
        [sys.executable, "-m", "kbuild", "run", "--record", "--store", str(tmp_path / "store"),
         "--", sys.executable, "-m", "nbconvert", "--execute", "--to", "notebook",
         "--output", "ran.ipynb", "nb.ipynb"],
        cwd=root, env=env_for(root), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    toml = (root / "kbuild.toml").read_text()
    assert '[kernels."modkernels:add1"]' in toml
    assert "void(float32[::1], float32[::1])" in toml
    assert "__main__" not in toml
    told = [line for line in done.stderr.splitlines() if "not recorded" in line]
    cells = [line for line in told if "notebook cell" in line]
    assert len(cells) == 1, done.stderr
    assert cells[0].startswith("kbuild run: not recorded: __main__:norm1, __main__:scale, "
                               "__main__:scale3, __main__:scale5, __main__:shift: defined in "
                               "a notebook cell, which is no module `kbuild build` can import")
    script = [line for line in told if "from_script" in line]
    assert script == ["kbuild run: not recorded: __main__:from_script: defined in the script "
                      "run as __main__ (script.py): `kbuild build` imports it under another "
                      "module name; move the kernel into a module"], done.stderr


def test_a_cell_name_registered_again_with_other_text_is_refused_never_mixed(tmp_path):
    """The text keyed is the text the code was compiled from: a function of a cell whose
    name now holds other text is refused, naming the cell; the new text keys its own."""
    import linecache

    from kbuild import cells
    from kbuild.errors import KeyingError
    from kbuild.sources import ProjectSources

    name = f"<ipython-input-1-{tmp_path.name}>"

    def run_cell(text):
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
        namespace = {"__name__": "__main__"}
        exec(compile(text, name, "exec"), namespace)
        return namespace["f"]

    sources = ProjectSources([str(tmp_path)])
    try:
        first = run_cell("def f(x):\n    return x + 1\n")
        assert sources.function_def(first)[0].name == "f"
        assert cells.namespace_source(first)
        second = run_cell("# edited\ndef f(x):\n    return x + 2\n")
        with pytest.raises(KeyingError, match=r"the text registered for <ipython-input-1-.*> "
                                              r"is not the text 'f' was compiled from"):
            sources.function_def(first)
        assert sources.function_def(second)[0].body[0].value.right.value == 2
    finally:
        linecache.cache.pop(name, None)
    assert cells.registered_text(second.__code__) is None  # nothing registered: no text


def test_a_script_run_again_after_an_edit_is_keyed_from_its_new_text(tmp_path):
    """`%run script.py`, edit it, `%run` again: the new kernel is keyed from the new text
    (not the text first run), so a restart that runs the edited script is served it."""
    root = write_files(tmp_path / "nb")
    env = {"KBUILD_STORE": tmp_path / "store"}
    edit = ("text = open('script.py').read().replace('x[i] - 1.0', 'x[i] - 3.0')\n"
            "open('script.py', 'w').write(text)\n")
    first, again = execute(root, ["%run script.py\nsnap('first')",
                                  edit + "%run script.py\nsnap('again')"], env=env)
    assert first["counts"] == again["counts"] == {"built": 1, "served": 1}, again
    assert again["warnings"] == []
    (restarted,) = execute(root, ["%run script.py\nsnap('restarted')"], env=env)
    assert restarted["nvvm"] == 0 and restarted["counts"] == {"hits": 1, "served": 1}
    assert restarted["served"] == again["served"] != first["served"]
