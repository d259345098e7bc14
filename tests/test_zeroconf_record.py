"""Turning zero-config caching on with no code change (`kbuild run`, KBUILD_ENABLE, the
pytest plugin) and recording what a run launched into kbuild.toml (`kbuild run --record`),
on a real run (fake driver) and under numba's simulator, then building it ahead of time."""

import json
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from zeroconf_support import declare, env_for, kbuild, run, write_program

SIG = "void(float32[::1], float32[::1])"
ALL = ("scale", "shift", "smooth", "scale3", "scale5")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return write_program(tmp_path_factory.mktemp("zcr") / "prog")


@pytest.fixture
def root(program, tmp_path):
    copy = tmp_path / "prog"
    shutil.copytree(program, copy)
    return copy


def _hook_installed() -> bool:
    from kbuild.zeroconf.startup import hook_installed

    return hook_installed()


needs_hook = pytest.mark.skipif(not _hook_installed(), reason="kbuild-enable.pth is not "
                                "installed in this Python: reinstall kbuild (pip install -e .)")


def _kbuild_run(root, *args, env=None):
    return kbuild(root, "run", *args, env=env)


@needs_hook
def test_kbuild_run_record_writes_kbuild_toml_then_build_makes_the_same_keys(root, tmp_path):
    store = tmp_path / "store"
    done = _kbuild_run(root, "--record", "--store", str(store), "--",
                       sys.executable, "_harness.py", "env", ",".join(ALL))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1][len("REPORT "):])
    assert report["counts"] == {"built": 5, "served": 5}
    text = (root / "kbuild.toml").read_text()
    assert text.startswith("# Written by `kbuild run --record`")
    for name in ("app_kernels:scale", "app_kernels:shift", "app_kernels:Filters.smooth",
                 "app_kernels:scale3", "app_kernels:scale5"):
        assert f'[kernels."{name}"]\nsignatures = [\n    "{SIG}",\n]' in text
    assert "wrote" in done.stderr and "5 new signatures of 5 kernels" in done.stderr

    keys = kbuild(root, "keys", "--json", "--store", str(store))
    assert {r["target"]: r["key"] for r in json.loads(keys.stdout)["targets"]} == \
        {name: key for name, sig, arch, key in report["served"]}
    built = kbuild(root, "build", "--json", "--store", str(store))
    assert {r["status"] for r in json.loads(built.stdout)["targets"]} == {"cached"}

    # Recording again merges: a new signature joins its kernel, the rest of the file stays.
    (root / "kbuild.toml").write_text(text.replace("[project]", "# my comment\n[project]"))
    (root / "app.py").write_text((root / "app.py").read_text().replace(
        "np.arange(64, dtype=np.float32)", "np.arange(64, dtype=np.float64)").replace(
        "np.zeros(64, np.float32)", "np.zeros(64, np.float64)"))
    again = _kbuild_run(root, "--record", "--store", str(store), "--",
                        sys.executable, "_harness.py", "env", "scale")
    assert again.returncode == 0, again.stderr
    merged = (root / "kbuild.toml").read_text()
    assert "# my comment\n[project]" in merged
    assert f'    "{SIG}",\n    "void(float64[::1], float64[::1])",\n]' in merged
    assert "1 new signatures of 1 kernels" in again.stderr


@needs_hook
def test_recording_on_an_sm_90_records_the_arch_served(root, tmp_path):
    """On an sm_90 device numba-cuda's JIT target, and so zero-config's, is sm_90a: the
    record declares that arch, and `kbuild build` then holds what the launch looked up."""
    store = tmp_path / "store"
    done = _kbuild_run(root, "--record", "--store", str(store), "--",
                       sys.executable, "_harness.py", "env", "shift",
                       env={"HARNESS_CC": "[9, 0]"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1][len("REPORT "):])
    (name, _, arch, key), = report["served"]
    assert arch == "sm_90a"
    assert 'arch = ["sm_90a"]' in (root / "kbuild.toml").read_text()
    built = kbuild(root, "build", "--json", "--store", str(store))
    row, = json.loads(built.stdout)["targets"]
    assert (row["target"], row["arch"], row["key"], row["status"]) == \
        (name, "sm_90a", key, "cached")


@needs_hook
def test_recording_into_a_project_file_declaring_sm_90_adds_the_arch_served(root, tmp_path):
    """An H100 project whose kbuild.toml declares sm_90: its launches on an sm_90 look up
    sm_90a (numba-cuda's JIT target), so the record adds that arch to the file, and
    `kbuild build` then holds what a zero-config launch that may not compile needs."""
    declare(root, {"app_kernels:scale": [SIG]}, arch="sm_90")
    done = _kbuild_run(root, "--record", "--store", str(tmp_path / "recorded"), "--",
                       sys.executable, "_harness.py", "env", "shift",
                       env={"HARNESS_CC": "[9, 0]"})
    assert done.returncode == 0, done.stderr
    assert 'arch = ["sm_90", "sm_90a"]' in (root / "kbuild.toml").read_text()
    assert "added arch sm_90a" in done.stderr, done.stderr
    assert "next: kbuild build " in done.stderr and "--arch sm_80,sm_90" not in done.stderr
    store = tmp_path / "store"
    built = kbuild(root, "build", "--json", "--store", str(store))
    assert sorted((row["target"], row["arch"]) for row in json.loads(built.stdout)["targets"]) \
        == [(f"app_kernels:{k}", a) for k in ("scale", "shift") for a in ("sm_90", "sm_90a")]
    served = run(root, "kbuild", ("scale", "shift"), env={"HARNESS_CC": "[9, 0]"},
                 enable={"store": str(store), "on_miss": "error"})
    assert served["counts"] == {"hits": 2, "served": 2}
    # Recorded again: nothing new, the file as it was.
    text = (root / "kbuild.toml").read_text()
    again = _kbuild_run(root, "--record", "--store", str(store), "--",
                        sys.executable, "_harness.py", "env", "shift",
                        env={"HARNESS_CC": "[9, 0]"})
    assert again.returncode == 0 and (root / "kbuild.toml").read_text() == text


@needs_hook
def test_recording_under_the_simulator_then_building_for_every_arch(root, tmp_path):
    """No GPU, no driver: numba's simulator runs the program, kbuild records the argument
    types of each launch (numba's typeof), and `kbuild build` builds them for two archs."""
    (root / "more_kernels.py").write_text(textwrap.dedent("""\
        import numpy as np
        from numba import cuda

        POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)


        @cuda.jit
        def grid2d(a, out):
            i, j = cuda.grid(2)
            if i < a.shape[0] and j < a.shape[1]:
                out[i, j] = a[i, j]


        @cuda.jit
        def mixed(t, z, n, pts):
            i = cuda.grid(1)
            if i < pts.size:
                pts[i].x = t[0] + z.real + n
        """))
    (root / "sim_main.py").write_text(textwrap.dedent("""\
        import numpy as np
        from numba import cuda
        import app_kernels as K, more_kernels as M
        x = np.arange(64, dtype=np.float32)
        out = np.zeros_like(x)
        K.scale[2, 32](x, out)
        K.Filters.smooth[2, 32](x, out)
        K.scale3[2, 32](x, out)
        d = cuda.to_device(x)
        K.shift[2, 32](d, cuda.device_array_like(d))
        a = np.ones((4, 4), np.float64)
        M.grid2d[(1, 1), (4, 4)](a, np.zeros_like(a))
        M.mixed[1, 4]((1.0, 2.0), np.complex64(1j), np.int32(3), np.zeros(4, M.POINT))
        K.make_scaler(7.0)[1, 64](x, out)  # kept nowhere: reported, not recorded
        """))
    done = _kbuild_run(root, "--record", "--", sys.executable, "sim_main.py",
                       env={"NUMBA_ENABLE_CUDASIM": "1"})
    assert done.returncode == 0, done.stderr
    assert "not recorded: app_kernels:make_scaler.<locals>.scaler: made by a factory" \
        in done.stderr
    text = (root / "kbuild.toml").read_text()
    assert '"void(float64[:, ::1], float64[:, ::1])"' in text
    assert '"void(UniTuple(float64, 2), complex64, int32, POINT[::1])"' in text
    built = kbuild(root, "build", "--arch", "sm_80,sm_90", "--json", "--store",
                   str(tmp_path / "store"))
    assert built.returncode == 0, built.stdout + built.stderr
    rows = json.loads(built.stdout)["targets"]
    assert len(rows) == 12 and {r["status"] for r in rows} == {"built"}


@needs_hook
def test_kbuild_enable_variable_and_the_startup_hook(root, tmp_path):
    store = tmp_path / "store"
    first = run(root, "env", env={"KBUILD_ENABLE": "1", "KBUILD_STORE": str(store)})
    assert first["counts"] == {"built": 2, "served": 2}
    second = run(root, "env", env={"KBUILD_ENABLE": "1", "KBUILD_STORE": str(store)})
    assert (second["nvvm"], second["counts"]) == (0, {"hits": 2, "served": 2})
    off = run(root, "env", env={"KBUILD_ENABLE": "0", "KBUILD_STORE": str(store)})
    assert "counts" not in off and off["nvvm"] > 0
    # kbuild's own commands stand it down: `kbuild build` compiles for itself.
    declare(root, {"app_kernels:scale": [SIG]})
    built = kbuild(root, "build", "--store", str(tmp_path / "aot"), env={"KBUILD_ENABLE": "1"})
    assert built.returncode == 0 and "kbuild:" not in built.stderr, built.stderr
    # A process that never imports numba.cuda never imports kbuild's zero-config code.
    done = subprocess.run([sys.executable, "-c", "import sys; print('kbuild.zeroconf.session'"
                           " in sys.modules, 'numba' in sys.modules)"],
                          env=env_for(root, KBUILD_ENABLE="1"), capture_output=True, text=True)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_kbuild_run_passes_the_exit_code_and_wants_a_command(root):
    done = _kbuild_run(root, "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3
    missing = _kbuild_run(root)
    assert missing.returncode == 2
    assert "name the command to run after --" in missing.stderr


@pytest.mark.skipif(not any(ep.name == "kbuild" for ep in metadata.entry_points(group="pytest11")),
                    reason="kbuild's pytest11 entry point is not installed: reinstall kbuild")
@pytest.mark.parametrize("how", [["-p", "kbuild"], ["--kbuild"], ["ini"]])
def test_pytest_plugin(root, tmp_path, how):
    store = tmp_path / "store"
    (root / "test_app.py").write_text(textwrap.dedent("""\
        import json, os

        from kbuild import testing, zeroconf


        def test_launch():
            with testing.fake_device("sm_80", record=False) as device:
                import app
                app.main(device.array, ("scale",))
                assert device.launch_count == 1
            with open(os.environ["RESULT"], "w") as fh:
                json.dump(dict(zeroconf.current().counts), fh)
        """))
    args = ["-p", "no:cacheprovider", "-q"]
    if how == ["ini"]:
        (root / "pytest.ini").write_text("[pytest]\nkbuild = true\n")
        env = {"KBUILD_STORE": str(store)}
    else:
        args += how + ["--kbuild-store", str(store)] if how == ["--kbuild"] else how
        env = {"KBUILD_STORE": str(store)}
    counts = []
    for _ in range(2):
        result = tmp_path / "result.json"
        done = subprocess.run([sys.executable, "-m", "pytest", *args, "test_app.py"], cwd=root,
                              env=env_for(root, RESULT=result, **env), capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        counts.append(json.loads(result.read_text()))
    assert counts == [{"built": 1, "served": 1}, {"hits": 1, "served": 1}]


def test_init_finds_kernels_in_class_bodies(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "ops.py").write_text(textwrap.dedent("""\
        from numba import cuda


        class Filters:
            @staticmethod
            @cuda.jit
            def smooth(x, out):
                pass

            @staticmethod
            @cuda.jit("void(float32[::1])")
            def clear(x):
                pass

            class Inner:
                @cuda.jit
                def deep(x):
                    pass


        @cuda.jit
        def top(x):
            pass
        """))
    done = kbuild(tmp_path, "init", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["kernels"] == ["pkg.ops:Filters.clear"]
    assert result["lazy"] == ["pkg.ops:Filters.smooth", "pkg.ops:Filters.Inner.deep",
                              "pkg.ops:top"]
    text = (tmp_path / "kbuild.toml").read_text()
    assert '# [kernels."pkg.ops:Filters.smooth"]' in text
    assert '# signatures = ["void(float32[::1], float32[::1])"]' in text
