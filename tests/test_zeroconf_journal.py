"""The program journal (`kbuild/zeroconf/journal.py`): a warm start answered without
keying, and every kind of change it must notice.

Each scenario runs the program of `zeroconf_support` in fresh processes under the fake
driver: once to fill the store and the journal, once more to see the journal answer, then
after a change (a file edited, an environment variable, a value set at run time, a
closure's cell, other argument types) twice: with the journal, and with it off (every
compile keyed in full). Both must serve the same keys, and those keys must differ from the
ones before the change: a journal that missed the change would serve the old ones.
"""

from __future__ import annotations

import json

import pytest

from zeroconf_support import APP, KERNELS, MATHLIB, dedent, run, write_program

# The kernels read a value from the environment at import, a global the program may set
# at run time, and a closure's cell; `scale` calls a device function in another file.
JOURNAL_KERNELS = KERNELS.replace("import mathlib\n", dedent("""\
    import os

    import numpy as np

    import mathlib

    OFFSET = float(os.environ.get("ZC_OFFSET", "1.0"))
    GAIN = 2.0
    TABLE = np.arange(6, dtype=np.float32).reshape(2, 3)
    """)).replace("out[i] = x[i] + 1.0", "out[i] = x[i] + OFFSET") + dedent("""\


    @cuda.jit
    def gained(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] * GAIN * TABLE[i % 2, i % 3]


    scaled_by = make_scaler(float(os.environ.get("ZC_FACTOR", "3.0")))
    """)

JOURNAL_APP = APP.replace("def main(device_array, which=(\"scale\", \"shift\")):", dedent("""\
    import os


    def main(device_array, which=("scale", "shift")):
        if os.environ.get("ZC_GAIN"):  # a value set at run time: in no file
            K.GAIN = float(os.environ["ZC_GAIN"])
        if os.environ.get("ZC_FORTRAN"):  # the same values in another memory layout
            K.TABLE = np.asfortranarray(K.TABLE)
        if os.environ.get("ZC_F64"):  # other argument types
            x = device_array(np.arange(64, dtype=np.float64))
            out = device_array(np.zeros(64, np.float64))
            for name in which:
                getattr(K, name)[2, 32](x, out)
            return""").rstrip("\n"))

EVERYTHING = ("scale", "shift", "gained", "scaled_by", "smooth")


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """The program after two runs: the store and the journal filled."""
    root = write_program(tmp_path_factory.mktemp("zcj") / "prog", kernels=JOURNAL_KERNELS,
                         app=JOURNAL_APP)
    store = root.parent / "store"
    first = run(root, "kbuild", EVERYTHING, enable={"store": str(store)})
    assert first["counts"] == {"built": 5, "served": 5}, first
    return root, store, first


@pytest.fixture
def program(warm):
    """The warm program; a file a test edits is put back afterwards (the journal then
    holds both states: a later test starts from the first again)."""
    root, store, first = warm
    kept = {path: path.read_text() for path in root.glob("*.py")}
    yield root, store, first
    for path, text in kept.items():
        if path.read_text() != text:
            path.write_text(text)


def _served(report) -> dict:
    return {name: key for name, sig, arch, key in report["served"]}


def test_a_warm_start_is_answered_by_the_journal(program):
    """The second process keys nothing in full: every kernel is served under the key the
    journal holds, the one the first process computed, and nothing is compiled."""
    root, store, first = program
    second = run(root, "kbuild", EVERYTHING, enable={"store": str(store)})
    assert (second["nvvm"], second["links"]) == (0, 0)
    assert second["counts"] == {"hits": 5, "served": 5}
    assert second["journal"] == {"answered": 5, "missed": 0, "not vouched": 0}
    assert second["served"] == first["served"]
    off = run(root, "kbuild", EVERYTHING, enable={"store": str(store), "journal": False})
    assert "journal" not in off and off["served"] == first["served"]


def _cubin_of(store, target):
    """The cubin blob file of `target`'s entry in the store."""
    for entry in (store / "v1" / "entries").glob("*/*.json"):
        manifest = json.loads(entry.read_text())
        if manifest.get("target") == target and "cubin" in manifest.get("artifacts", {}):
            name = manifest["artifacts"]["cubin"]
            return store / "v1" / "blobs" / name[:2] / name[2:4] / name
    raise AssertionError(f"no entry of {target}")


def test_a_damaged_binary_is_rebuilt_not_launched(program):
    """The journal answers from the entry it checked before, and the binary it loads is
    verified against its hash as it is read: a damaged one is refused, and the compile
    goes to the full look-up, which rebuilds that entry (not numba's own compile)."""
    root, store, first = program
    cubin = _cubin_of(store, "app_kernels:gained")
    cubin.chmod(0o644)
    cubin.write_bytes(b"\0" * cubin.stat().st_size)
    done = run(root, "kbuild", EVERYTHING, enable={"store": str(store)})
    assert done["counts"] == {"hits": 4, "built": 1, "served": 5}, done["counts"]
    assert done["served"] == first["served"]
    assert done["journal"]["answered"] == 4
    again = run(root, "kbuild", EVERYTHING, enable={"store": str(store)})
    assert again["journal"]["answered"] == 5 and again["nvvm"] == 0


def test_a_journal_naming_another_kernels_entry_is_not_served_from(program):
    """The entry fields the journal holds must name the kernel being served (its target,
    signature, arch and entry symbol), as a look-up requires: a journal whose row for
    `gained` holds `scale`'s fields is looked up in full instead, and every kernel
    loads its own binary."""
    from kbuild.store import journal

    root, store, first = program
    warm = run(root, "kbuild", EVERYTHING, enable={"store": str(store)})
    [path] = (store / "v1" / "journal").glob("*.json")
    found = journal.read(store, path.stem)
    rows = found.body["rows"]
    [gained] = [t for t in rows if t.startswith("app_kernels:gained\n")]
    [scale] = [t for t in rows if t.startswith("app_kernels:scale\n")]
    other = next(iter(rows[scale].values()))[3]
    for held in rows[gained].values():
        held[3] = other
    journal.write(store, path.stem, found.body)
    done = run(root, "kbuild", EVERYTHING, enable={"store": str(store)})
    assert sorted(done["loads"]) == sorted(warm["loads"])
    assert done["served"] == first["served"] and done["nvvm"] == 0


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


# (what changes, how, the kernels whose keys must change)
CHANGES = {
    "the kernel's module source": (
        lambda root: _edit(root / "app_kernels.py", "out[i] = x[i] * GAIN",
                           "out[i] = x[i] * GAIN - 1.0"), {}, {"app_kernels:gained"}),
    "a device function in another module": (
        lambda root: _edit(root / "mathlib.py", "v * 2.0", "v * 4.0"), {},
        {"app_kernels:scale"}),
    "an environment variable read at import": (None, {"ZC_OFFSET": "8.0"},
                                               {"app_kernels:shift"}),
    "a global set at run time before the first launch": (None, {"ZC_GAIN": "5.0"},
                                                         {"app_kernels:gained"}),
    "a closure's cell": (None, {"ZC_FACTOR": "11.0"}, {"app_kernels:scaled_by"}),
    "a global table made a Fortran copy at run time": (None, {"ZC_FORTRAN": "1"},
                                                       {"app_kernels:gained"}),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_kind_of_change_is_noticed(program, change):
    edit, env, changed = CHANGES[change]
    root, store, first = program
    if edit is not None:
        edit(root)
    journaled = run(root, "kbuild", EVERYTHING, enable={"store": str(store)}, env=env)
    full = run(root, "kbuild", EVERYTHING, enable={"store": str(store), "journal": False},
               env=env)
    assert journaled["served"] == full["served"]  # the journal serves what full keying does
    before, after = _served(first), _served(journaled)
    assert {name for name in after if after[name] != before[name]} == changed
    assert journaled["counts"]["built"] == len(changed)
    assert journaled["journal"]["answered"] == len(EVERYTHING) - len(changed)
    # The process after it is answered by the journal again, in the new state.
    again = run(root, "kbuild", EVERYTHING, enable={"store": str(store)}, env=env)
    assert again["served"] == journaled["served"] and again["nvvm"] == 0
    assert again["journal"]["answered"] == len(EVERYTHING)


def test_other_argument_types_are_keyed_in_full(program):
    root, store, first = program
    done = run(root, "kbuild", ("scale", "shift"), enable={"store": str(store)},
               env={"ZC_F64": "1"})
    assert done["counts"]["built"] == 2 and done["journal"]["answered"] == 0
    assert all("float64" in sig for name, sig, arch, key in done["served"])


def test_a_program_changed_back_is_answered_in_either_state(program):
    """A program run with a variable set one way, then the other, finds both states in
    the journal (each kept with its key)."""
    root, store, first = program
    other = run(root, "kbuild", EVERYTHING, enable={"store": str(store)},
                env={"ZC_OFFSET": "7.0"})
    assert other["counts"]["built"] == 1
    back = run(root, "kbuild", EVERYTHING, enable={"store": str(store)})
    assert back["served"] == first["served"]
    assert back["journal"]["answered"] == len(EVERYTHING)
    other_again = run(root, "kbuild", EVERYTHING, enable={"store": str(store)},
                      env={"ZC_OFFSET": "7.0"})
    assert other_again["served"] == other["served"]
    assert other_again["journal"]["answered"] == len(EVERYTHING)


BETWEEN_APP = dedent("""\
    import os

    import numpy as np

    import app_kernels as K


    def main(device_array, which):
        K.gained[2, 32](device_array(np.arange(64, dtype=np.float32)),
                        device_array(np.zeros(64, np.float32)))
        K.GAIN = float(os.environ.get("ZC_LATER", "2.0"))
        K.gained[2, 32](device_array(np.arange(64, dtype=np.int32)),
                        device_array(np.zeros(64, np.int32)))
    """)


def test_a_global_changed_between_launches_in_one_process(tmp_path):
    """A value changed after one launch and before the next compile (of other argument
    types): that compile is keyed with the value as it is now."""
    root = write_program(tmp_path / "prog", kernels=JOURNAL_KERNELS, app=BETWEEN_APP)
    store = tmp_path / "store"
    first = run(root, "kbuild", ("gained",), enable={"store": str(store)})
    assert first["counts"] == {"built": 2, "served": 2}
    warm = run(root, "kbuild", ("gained",), enable={"store": str(store)})
    assert warm["journal"]["answered"] == 2 and warm["nvvm"] == 0
    changed = run(root, "kbuild", ("gained",), enable={"store": str(store)},
                  env={"ZC_LATER": "6.0"})
    full = run(root, "kbuild", ("gained",), enable={"store": str(store), "journal": False},
               env={"ZC_LATER": "6.0"})
    assert changed["served"] == full["served"] != warm["served"]
    assert changed["served"][0] == warm["served"][0]
    assert changed["counts"]["built"] == 1 and changed["journal"]["answered"] == 1


# -- the work of a journal-answered start, counted ----------------------------------------

SMALL, LARGE = 4, 16
# Its entry (the digest of its bytes checked against the journal's) and the cubin loaded
# (verified against its hash): the PTX and the observation record are not read, the
# observations to match are the journal's.
MAX_STORE_READS_PER_KERNEL = 2
# Its live digest's own parts (its code, the kernel's and each device function's digest,
# the whole), the two store files, and the observations matched (one each).
MAX_DIGESTS_PER_KERNEL = 12

COUNTING_APP = dedent("""\
    import collections, json, os, sys

    import numpy as np

    import app_kernels as K

    counts = collections.Counter()


    def _count(owner, name, label):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            counts[label] += 1
            return real(*args, **kwargs)
        setattr(owner, name, counted)


    def main(device_array, which):
        from kbuild.backend import base, numbacuda
        from kbuild.keying import keyer, encode
        from kbuild.store import entries, tree
        import xxhash
        from numba.cuda import config
        _count(keyer.Keyer, "target_node", "keyed")
        _count(config, "reload_config", "numba config reloads")
        _count(keyer.Keyer, "function_node", "function trees")
        _count(base, "type_namespace", "signature namespaces")
        _count(numbacuda, "type_namespace", "signature namespaces")
        _count(entries.EntryShelf, "_validated", "entries checked in full")
        _count(tree, "read_file", "store files read")
        _count(xxhash, "xxh3_128_hexdigest", "digests")
        before = set(sys.modules)
        x = device_array(np.arange(64, dtype=np.float32))
        out = device_array(np.zeros(64, np.float32))
        for name in which:
            getattr(K, name)[2, 32](x, out)
        counts["modules imported"] = len(set(sys.modules) - before)
        with open(os.environ["ZC_COUNTS"], "w") as fh:
            json.dump(counts, fh)
    """)


def _counting_program(root, n):
    kernels = "from numba import cuda\n\nimport mathlib\n" + "".join(dedent(f"""\


        @cuda.jit
        def k{i}(x, out):
            i = cuda.grid(1)
            if i < x.size:
                out[i] = mathlib.twice(x[i]) + {i}.0
        """) for i in range(n))
    return write_program(root, kernels=kernels, app=COUNTING_APP)


def _answered_start(tmp_path, n) -> dict:
    root = _counting_program(tmp_path / f"n{n}", n)
    store, counts = tmp_path / f"store{n}", tmp_path / f"counts{n}.json"
    names = tuple(f"k{i}" for i in range(n))
    run(root, "kbuild", names, enable={"store": str(store)}, env={"ZC_COUNTS": counts})
    done = run(root, "kbuild", names, enable={"store": str(store)}, env={"ZC_COUNTS": counts})
    assert done["journal"]["answered"] == n and done["nvvm"] == 0
    return json.loads(counts.read_text())


def test_the_work_of_a_journal_answered_start_is_bounded_per_kernel(tmp_path):
    """No key tree is built, no entry checked in full, no signature namespace made; each
    kernel reads its entry and its cubin, the digests taken grow by a bounded number per
    kernel, and the modules imported while launching do not grow with the number of
    kernels."""
    small, large = _answered_start(tmp_path, SMALL), _answered_start(tmp_path, LARGE)
    added = LARGE - SMALL
    for counts in (small, large):
        assert counts.get("keyed", 0) == 0 and counts.get("function trees", 0) == 0, counts
        # The entry checked before is not checked in full again.
        assert counts.get("entries checked in full", 0) == 0, counts
    # A signature is parsed name by name, never in a namespace of the module's every
    # global made per kernel (one is made per process, for the types' own names).
    assert large["signature namespaces"] == small["signature namespaces"] <= 1, (small, large)
    assert large["store files read"] - small["store files read"] \
        <= MAX_STORE_READS_PER_KERNEL * added, (small, large)
    assert large["digests"] - small["digests"] <= MAX_DIGESTS_PER_KERNEL * added, \
        (small, large)
    assert large["modules imported"] == small["modules imported"], (small, large)
    # numba's reload of NUMBA_* variables (a scan decoding the whole environment) runs
    # only when one of them changed, not once per kernel.
    assert large.get("numba config reloads", 0) == small.get("numba config reloads", 0), \
        (small, large)


HELD_KERNELS = KERNELS + dedent("""\


    HELD = (mathlib.twice,)


    @cuda.jit
    def through_tuple(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = HELD[0](x[i])
    """)


def test_what_the_journal_cannot_vouch_for_is_keyed_in_full(tmp_path):
    """A device function held in a tuple (the Keyer keys it through the container) is not
    vouched for: each start keys it in full; closures kept nowhere are answered."""
    root = write_program(tmp_path / "prog", kernels=HELD_KERNELS)
    store = tmp_path / "store"
    which = ("through_tuple", "closures")
    first = run(root, "kbuild", which, enable={"store": str(store)})
    assert first["counts"] == {"built": 3, "served": 3}
    second = run(root, "kbuild", which, enable={"store": str(store)})
    assert second["served"] == first["served"] and second["nvvm"] == 0
    assert second["journal"] == {"answered": 2, "missed": 0, "not vouched": 1}
