"""Zero-config caching (`kbuild.enable()`), proved without a GPU.

A program with lazy kernels whose device function lives in another file runs in fresh
processes under kbuild's fake driver (the launch path is real down to the `cuda.core`
call). What a run compiled is counted (NVVM compiles, nvJitLink links), never timed.
"""

import json
import shutil

import pytest

from zeroconf_support import cubin_of, declare, kbuild, run, write_program

SIG = "void(float32[::1], float32[::1])"


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return write_program(tmp_path_factory.mktemp("zc") / "prog")


def _fresh_copy(program, tmp_path, name="prog"):
    root = tmp_path / name
    shutil.copytree(program, root)
    return root


def _loaded(report, entry_part):
    return [digest for entry, kind, digest in report["loads"] if entry_part in entry]


def test_three_processes_and_numba_cache_side_by_side(program, tmp_path):
    """Issue 25, item 5. kbuild: the second process compiles nothing and loads the binary
    a `kbuild build` of the same targets makes; after the callee's file is edited the
    third loads a new binary. numba's own cache=True, the same program beside it, serves
    the stale kernel in its third process."""
    ours, theirs = _fresh_copy(program, tmp_path, "ours"), _fresh_copy(program, tmp_path, "numba")
    store = tmp_path / "store"

    first = run(ours, "kbuild", enable={"store": str(store)})
    assert first["counts"] == {"built": 2, "served": 2}
    assert first["nvvm"] > 0 and first["launches"] == 2
    second = run(ours, "kbuild", enable={"store": str(store)})
    assert (second["nvvm"], second["links"]) == (0, 0)
    assert second["counts"] == {"hits": 2, "served": 2}
    assert second["served"] == first["served"]
    assert _loaded(second, "scale") == _loaded(first, "scale")

    # The binary a `kbuild build` of the same targets makes: same keys, same cubin.
    declare(ours, {"app_kernels:scale": [SIG], "app_kernels:shift": [SIG]})
    aot = tmp_path / "aot"
    done = kbuild(ours, "build", "--json", "--store", str(aot))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["target"]: r for r in json.loads(done.stdout)["targets"]}
    served = {name: key for name, sig, arch, key in second["served"]}
    for name in ("app_kernels:scale", "app_kernels:shift"):
        assert rows[name]["key"] == served[name]
        assert rows[name]["artifacts"]["cubin"] == cubin_of(store, served[name])
    (ours / "kbuild.toml").unlink()

    numba_first = run(theirs, "numba")
    assert numba_first["nvvm"] > 0 and numba_first["numba_cache_hits"] == 0
    numba_second = run(theirs, "numba")
    assert numba_second["nvvm"] == 0 and numba_second["numba_cache_hits"] == 2

    for root in (ours, theirs):  # the callee, in another file, changes
        path = root / "mathlib.py"
        path.write_text(path.read_text().replace("v * 2.0", "v * 3.0"))

    third = run(ours, "kbuild", enable={"store": str(store)})
    assert third["nvvm"] > 0 and third["counts"]["built"] == 1  # scale; shift is unchanged
    new_scale, = _loaded(third, "scale")
    assert new_scale not in _loaded(first, "scale")
    assert _loaded(third, "shift") == _loaded(first, "shift")
    assert {k for *_, k in third["served"]} != {k for *_, k in first["served"]}

    numba_third = run(theirs, "numba")
    # numba's index is keyed by app_kernels.py's timestamp alone: the edit in mathlib.py
    # goes unseen and the kernel compiled for `v * 2.0` is loaded again.
    assert numba_third["nvvm"] == 0 and numba_third["numba_cache_hits"] == 2
    assert _loaded(numba_third, "scale") == _loaded(numba_first, "scale")


def test_same_key_both_ways_for_classes_and_factories(program, tmp_path):
    """A kernel in a class body and the kernels of a factory, declared in kbuild.toml and
    launched under enable(): the same keys and cubins; the two closures of one factory
    never share an entry."""
    root = _fresh_copy(program, tmp_path)
    store = tmp_path / "store"
    report = run(root, "kbuild", ("smooth", "scale3", "scale5"),
                 enable={"store": str(store)})
    assert report["counts"] == {"built": 3, "served": 3}, report["stderr"]
    served = {name: key for name, sig, arch, key in report["served"]}
    assert set(served) == {"app_kernels:Filters.smooth", "app_kernels:scale3",
                           "app_kernels:scale5"}
    assert served["app_kernels:scale3"] != served["app_kernels:scale5"]
    assert len(set(_loaded(report, "scaler"))) == 2  # two binaries, one per closure value

    declare(root, {name: [SIG] for name in served})
    done = kbuild(root, "keys", "--json", "--store", str(store))
    assert done.returncode == 0, done.stdout + done.stderr
    keys = {r["target"]: r["key"] for r in json.loads(done.stdout)["targets"]}
    assert keys == served
    built = kbuild(root, "build", "--json", "--store", str(store))
    assert {r["status"] for r in json.loads(built.stdout)["targets"]} == {"cached"}


def test_closures_kept_nowhere_are_keyed_by_their_values(program, tmp_path):
    """Two closures of one factory, never stored on a module attribute, share a name
    (`app_kernels:make_scaler.<locals>.scaler`) but not a key: each closure value its own
    entry, found again by a fresh process."""
    root = _fresh_copy(program, tmp_path)
    store = tmp_path / "store"
    first = run(root, "kbuild", ("closures",), enable={"store": str(store)})
    assert first["counts"] == {"built": 2, "served": 2}, first["stderr"]
    names = {name for name, *_ in first["served"]}
    assert names == {"app_kernels:make_scaler.<locals>.scaler"}
    assert len({key for *_, key in first["served"]}) == 2
    second = run(root, "kbuild", ("closures",), enable={"store": str(store)})
    assert (second["nvvm"], second["counts"]) == (0, {"hits": 2, "served": 2})
    assert second["served"] == first["served"]


def test_extra_archs_are_built_for_a_fleet(program, tmp_path):
    """`archs=`: each kernel is also built for the other GPUs sharing the store; the one
    launched is the device's (sm_80 here)."""
    root = _fresh_copy(program, tmp_path)
    store = tmp_path / "store"
    report = run(root, "kbuild", ("scale",), enable={"store": str(store), "archs": ["sm_90"]})
    assert report["counts"] == {"built": 2, "served": 1}
    assert [arch for _, _, arch, _ in report["served"]] == ["sm_80"]
    declare(root, {"app_kernels:scale": [SIG]}, extra='')
    (root / "kbuild.toml").write_text((root / "kbuild.toml").read_text().replace(
        'arch = ["sm_80"]', 'arch = ["sm_80", "sm_90"]'))
    done = kbuild(root, "status", "--json", "--store", str(store))
    assert done.returncode == 0, done.stdout + done.stderr
    assert {(r["arch"], r["status"]) for r in json.loads(done.stdout)["targets"]} == \
        {("sm_80", "up-to-date"), ("sm_90", "up-to-date")}


def test_an_entry_declared_with_another_spelling_is_taken_not_refused(program, tmp_path):
    """`void(f4[::1], f4[::1])` declared and built; the same types launched with no project
    file in sight are the same key: the entry is served as it is, and stays."""
    root = _fresh_copy(program, tmp_path)
    store = tmp_path / "store"
    declare(root, {"app_kernels:scale": ["void(f4[::1], f4[::1])"]})
    assert kbuild(root, "build", "--store", str(store)).returncode == 0
    toml = (root / "kbuild.toml").read_text()
    (root / "kbuild.toml").unlink()
    report = run(root, "kbuild", ("scale",), enable={"store": str(store)})
    assert (report["nvvm"], report["counts"]) == (0, {"hits": 1, "served": 1})
    assert report["served"][0][1] == "void(f4[::1], f4[::1])"
    (root / "kbuild.toml").write_text(toml)
    done = kbuild(root, "status", "--json", "--store", str(store))
    assert [r["status"] for r in json.loads(done.stdout)["targets"]] == ["up-to-date"]


def test_an_edited_callee_is_compiled_once_and_its_other_callers_relinked(tmp_path):
    """Separate compilation under enable(): after `twice` changes, the first kernel that
    calls it is compiled (making twice's new object) and the second only relinked."""
    from zeroconf_support import KERNELS

    root = write_program(tmp_path / "prog", KERNELS + '''

@cuda.jit
def scale_too(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = mathlib.twice(x[i]) + 1.0
''')
    store = tmp_path / "store"
    first = run(root, "kbuild", ("scale", "scale_too"), enable={"store": str(store)})
    assert first["counts"] == {"built": 2, "served": 2}
    path = root / "mathlib.py"
    path.write_text(path.read_text().replace("v * 2.0", "v * 3.0"))
    after = run(root, "kbuild", ("scale", "scale_too"), enable={"store": str(store)})
    assert after["counts"] == {"built": 2, "served": 2}
    links = {}
    for name, sig, arch, key in after["served"]:
        manifest = json.loads((store / "v1" / "entries" / key[:2] / f"{key}.json").read_text())
        links[name] = manifest["link"]["mode"]
    assert links == {"app_kernels:scale": "lto", "app_kernels:scale_too": "relink"}


def test_one_function_jitted_with_two_sets_of_options_is_served_in_any_launch_order(tmp_path):
    """Two device functions of one Python function (`exact`, and `fast` with fastmath):
    zero-config keys, compiles and serves each kernel whatever ran first, and numba
    compiles none itself (it did when the kernel calling `exact` came after `fast`'s
    compile: the two were one device function whose key had "changed")."""
    from test_separate import TWICE_JITTED

    root = write_program(tmp_path / "prog", TWICE_JITTED)
    store = str(tmp_path / "store")
    loads = {}
    for order, counts in ((("k_fast", "k_both", "k_exact"), {"built": 3, "served": 3}),
                          (("k_exact", "k_both", "k_fast"), {"served": 3, "hits": 3})):
        done = run(root, "kbuild", order, enable={"store": store})
        assert done["counts"] == counts, done["stderr"]
        for name, load in zip(order, done["loads"]):
            assert loads.setdefault(name, load) == load, name
