"""The small parts of zero-config caching, in this process: signature texts, merging a
recording into a project file's text, naming kernels, settings, and the shipped start-up
hook."""

import shutil
import subprocess
import sys
import types as pytypes
import zipfile

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

import numpy as np
import pytest

from zeroconf_support import REPO

# -- signature texts -----------------------------------------------------------------


def _module(**globals_):
    module = pytypes.ModuleType("zc_sig_module")
    module.__dict__.update(globals_)
    return module


@pytest.mark.parametrize("value, text", [
    (np.zeros(3, np.float32), "float32[::1]"),
    (np.zeros((3, 4), np.float64), "float64[:, ::1]"),
    (np.zeros((3, 4), np.int16, order="F"), "int16[::1, :]"),
    (np.zeros((3, 4))[:, ::2], "float64[:, :]"),
    (np.zeros(()), "Array(float64, 0, 'C')"),
    (np.float32(1), "float32"),
    (1, "int64"),
    (1.5, "float64"),
    (True, "boolean"),
    (1j, "complex128"),
    ((1.0, 2.0, 3.0), "UniTuple(float64, 3)"),
    ((1, 2.0), "Tuple((int64, float64,))"),
    (np.datetime64("2020-01-01", "D"), "NPDatetime('D')"),
])
def test_signature_text_round_trips(value, text):
    from numba import typeof
    from numba.core.typing.typeof import Purpose

    from kbuild.zeroconf import sigtext

    argtypes = (typeof(value, Purpose.argument),)
    assert sigtext.checked_text(argtypes, _module()) == f"void({text})"


def test_signature_text_names_records_by_their_global_and_refuses_the_unnamed():
    from numba import typeof
    from numba.core.typing.typeof import Purpose

    from kbuild.zeroconf import sigtext

    point = np.dtype([("x", np.float32), ("y", np.float32)], align=True)
    readonly = np.zeros(4, point)
    readonly.flags.writeable = False
    argtypes = (typeof(np.zeros(4, point), Purpose.argument),
                typeof(readonly, Purpose.argument))
    assert sigtext.checked_text(argtypes, _module(POINT=point)) == \
        "void(POINT[::1], Array(POINT, 1, 'C', readonly=True))"
    assert sigtext.checked_text(argtypes, _module()) is None  # no global names the record


def test_a_signature_sees_the_module_as_it_is_now():
    """Signatures are parsed name by name from the module's globals now (not a namespace
    kept from an earlier parse): a record defined, or redefined, after a first parse is
    the one a later parse names."""
    from numba import typeof
    from numba.core.typing.typeof import Purpose

    from kbuild.backend.backends import DEFAULT, get
    from kbuild.zeroconf import sigtext

    module, parse = _module(), get(DEFAULT).parse_signature
    first = np.dtype([("x", np.float32)], align=True)
    argtypes = (typeof(np.zeros(4, first), Purpose.argument),)
    assert sigtext.checked_text(argtypes, module) is None
    module.POINT = first
    assert sigtext.checked_text(argtypes, module) == "void(POINT[::1])"
    assert parse("void(POINT[::1])", module)[0] == argtypes
    module.POINT = np.dtype([("y", np.float64)], align=True)
    assert parse("void(POINT[::1])", module)[0] != argtypes
    module.float32 = np.dtype([("z", np.int8)])  # the module's own type wins, as in numba
    assert parse("void(float32)", module)[0] != parse("void(float32)", _module())[0]


def test_matching_text_finds_a_declared_spelling_of_the_same_types():
    from numba.core import types

    from kbuild.zeroconf import sigtext

    argtypes = (types.float32[::1], types.int32)
    assert sigtext.matching_text(["void(float64)", "void(f4[::1], i4)"], argtypes,
                                 _module()) == "void(f4[::1], i4)"


def test_a_served_signature_is_the_declared_spelling_else_its_checked_text():
    from numba.core import types

    from kbuild.backend import backends
    from kbuild.zeroconf import sigtext

    backend = backends.get(backends.DEFAULT)
    argtypes = (types.float32[::1], types.int32)
    assert sigtext.spelled(argtypes, _module(), backend, ["void(f4[::1], i4)"]) \
        == "void(f4[::1], i4)"
    assert sigtext.spelled(argtypes, _module(), backend, ["void(float64)"]) \
        == sigtext.spelled(argtypes, _module(), backend) == "void(float32[::1], int32)"


def test_a_backend_says_whether_a_kernel_was_compiled_for_one_launch():
    """`kbuild run --record` keeps a launch configuration only for a kernel compiled for
    that one alone: the kernel's backend says which (numba's `launch_config_sensitive`,
    set by numba's compile or by the store's `dispatch.mark_sensitive`)."""
    from kbuild.backend import backends

    names = [backends.DEFAULT] + [n for n in backends.KNOWN
                                  if n != backends.DEFAULT and backends.installed(n)]
    for name in names:
        backend = backends.get(name)
        kernel = pytypes.SimpleNamespace(launch_config_sensitive=False)
        assert backend.kernel_launch_sensitive(kernel) is False, name
        kernel.launch_config_sensitive = True
        assert backend.kernel_launch_sensitive(kernel) is True, name
        assert backend.kernel_launch_sensitive(object()) is False, name


# -- merging a recording into a project file ------------------------------------------


def test_merge_keeps_the_file_and_fills_init_placeholders(tmp_path):
    from kbuild.zeroconf import tomledit

    path = tmp_path / "kbuild.toml"
    path.write_text(
        '[project]\nname = "p"  # mine\n\n'
        '[kernels."m:one"]\nsignatures = ["void(int8)"]  # first\narch = ["sm_90"]\n\n'
        '[kernels."m:multi"]\nsignatures = [\n    "void(int32[:, ::1])"  # a ] in a comment\n]\n\n'
        "# m.py:3: a lazy kernel; declare the signatures it is launched with\n"
        '# [kernels."m:lazy"]\n# signatures = ["void(float32[::1])"]\n')
    result = tomledit.merge(path, {
        "m:one": {"signatures": ["void(int8)", "void(int16)"],
                  "launch": [{"grid": [2, 1, 1], "block": [64, 1, 1], "shared": 0}]},
        "m:multi": {"signatures": ["void(int64[:, ::1])"]},
        "m:lazy": {"signatures": ["void(float32[::1])"]},
    }, name="p")
    text = path.read_text()
    assert result["added"] == [["m:lazy", "void(float32[::1])"], ["m:multi", "void(int64[:, ::1])"],
                               ["m:one", "void(int16)"]]
    assert 'signatures = ["void(int8)", "void(int16)"]  # first\narch = ["sm_90"]\n' \
           "launch = [{grid = 2, block = 64}]\n" in text
    assert '    "void(int32[:, ::1])",  # a ] in a comment\n    "void(int64[:, ::1])"\n]' in text
    assert "a lazy kernel" not in text and '# [kernels."m:lazy"]' not in text
    data = tomllib.loads(text)
    assert data["project"] == {"name": "p"}
    assert data["kernels"]["m:lazy"] == {"signatures": ["void(float32[::1])"]}
    assert data["kernels"]["m:one"]["launch"] == [{"grid": 2, "block": 64}]
    again = tomledit.merge(path, {"m:one": {"signatures": ["void(int16)"]}}, name="p")
    assert again["added"] == [] and path.read_text() == text


def test_merge_into_pyproject_and_a_new_file(tmp_path):
    from kbuild.zeroconf import tomledit

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "lib"\n\n[tool.kbuild.project]\narch = ["sm_80"]\n')
    tomledit.merge(pyproject, {"lib.k:a": {"signatures": ["void(int8)"]}}, name="lib")
    assert tomllib.loads(pyproject.read_text())["tool"]["kbuild"]["kernels"] == \
        {"lib.k:a": {"signatures": ["void(int8)"]}}
    new = tmp_path / "sub" / "kbuild.toml"
    new.parent.mkdir()
    tomledit.merge(new, {"k:a": {"signatures": ["void(int8)"]}}, name="sub", paths=["..", "."],
                   archs=["sm_80", "sm_90"])
    data = tomllib.loads(new.read_text())
    assert data["project"] == {"name": "sub", "paths": ["..", "."], "arch": ["sm_80", "sm_90"]}


def test_merge_adds_the_archs_served_to_an_existing_file(tmp_path):
    """The archs the launches looked up (sm_90a on an sm_90) join the project's list, a
    pyproject's too; a file without one builds sm_80 and says so now; a recorded kernel's
    own list gets them; nothing is written when each list has them."""
    from kbuild.zeroconf import tomledit

    path = tmp_path / "kbuild.toml"
    path.write_text('[project]\nname = "p"\n\n[kernels."m:own"]\n'
                    'signatures = ["void(int8)"]\narch = ["sm_80"]\n')
    result = tomledit.merge(path, {"m:own": {"signatures": ["void(int8)"]},
                                   "m:new": {"signatures": ["void(int8)"]}},
                            name="p", served=["sm_90a"])
    data = tomllib.loads(path.read_text())
    assert result["archs"] == ["sm_90a"]
    assert data["project"]["arch"] == ["sm_80", "sm_90a"]
    assert data["kernels"]["m:own"]["arch"] == ["sm_80", "sm_90a"]
    text = path.read_text()
    again = tomledit.merge(path, {"m:new": {"signatures": ["void(int8)"]}}, name="p",
                           served=["sm_90a"])
    assert again["archs"] == [] and path.read_text() == text

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "lib"\n\n[tool.kbuild.project]\narch = ["sm_90"]\n')
    tomledit.merge(pyproject, {"lib.k:a": {"signatures": ["void(int8)"]}}, name="lib",
                   served=["sm_90a"])
    data = tomllib.loads(pyproject.read_text())
    assert data["tool"]["kbuild"]["project"]["arch"] == ["sm_90", "sm_90a"]
    assert "arch" not in data["project"]


def test_merge_refuses_to_break_a_file(tmp_path):
    from kbuild.errors import ConfigError
    from kbuild.zeroconf import tomledit

    path = tmp_path / "kbuild.toml"
    path.write_text('[kernels]\n"m:k" = {signatures = "void(int8)"}\n')
    before = path.read_text()
    with pytest.raises(ConfigError, match="kernel 'm:k' has a 'signatures' that is not an array"):
        tomledit.merge(path, {"m:k": {"signatures": ["void(int16)"]}}, name="p")
    assert path.read_text() == before


# -- naming ---------------------------------------------------------------------------


def test_names_come_from_declarations_qualnames_and_module_attributes(tmp_path, monkeypatch):
    from kbuild.zeroconf import naming

    (tmp_path / "zc_named.py").write_text(
        "from types import SimpleNamespace\n"
        "class D:\n"
        "    def __init__(self, f):\n        self.py_func, self.targetoptions = f, {}\n"
        "def top(): pass\n"
        "kern = D(top)\n"
        "class Box:\n    inner = staticmethod(D(lambda: None))\n"
        "def make():\n    def k(): pass\n    return D(k)\n"
        "ns = SimpleNamespace(func=make())\n"
        "alias = ns.func\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import zc_named as m

    assert naming.target_name(m.top) == "zc_named:kern"  # top's dispatcher is kept as kern
    assert naming.target_name(m.Box.__dict__["inner"].__func__.py_func) == "zc_named:Box.inner"
    assert naming.target_name(m.ns.func.py_func) == "zc_named:alias"  # shortest, then by name
    assert naming.target_name(m.ns.func.py_func, ["zc_named:ns.func"]) == "zc_named:alias"
    m.__dict__.pop("alias")
    naming._found.clear()
    assert naming.target_name(m.ns.func.py_func) == "zc_named:ns.func"
    lost = m.make()  # kept on nothing of the module
    assert naming.import_path(lost.py_func) is None
    assert naming.target_name(lost.py_func) == "zc_named:make.<locals>.k"


# -- settings -------------------------------------------------------------------------


def test_settings_follow_project_load(tmp_path, monkeypatch):
    from kbuild.errors import ConfigError
    from kbuild.zeroconf import settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KBUILD_STORE", str(tmp_path / "env-store"))
    assert settings.resolve().store == tmp_path / "env-store"
    (tmp_path / "kbuild.toml").write_text('[project]\nname = "x"\nstore = "here"\n')
    found = settings.resolve()
    assert (found.store, found.name, found.config.kernels) == (tmp_path / "here", "x", ())
    assert settings.resolve(store=tmp_path / "arg").store == tmp_path / "arg"
    (tmp_path / "kbuild.toml").write_text("[project\n")
    broken = settings.resolve()
    assert broken.config is None and "ignoring" in broken.warnings[0]
    with pytest.raises(ConfigError, match="on_miss must be one of build, error, jit"):
        settings.resolve(on_miss="later")
    assert settings.from_environment({"KBUILD_ENABLE": "0"}) is None
    assert settings.from_environment({"KBUILD_ENABLE": "1"}) == {}
    assert settings.from_environment({"KBUILD_ENABLE": '{"on_miss": "jit"}'}) == {"on_miss": "jit"}


# -- the shipped start-up hook ---------------------------------------------------------


def _build_copy(tmp_path):
    """kbuild's sources in a scratch folder (building writes build/ and egg-info)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "kbuild-enable.pth", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "kbuild", src / "kbuild",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_the_startup_hook_ships_in_wheels_and_editable_wheels(tmp_path):
    src = _build_copy(tmp_path)
    built = []
    for hook in ("build_wheel", "build_editable"):  # one process each, as pip runs them
        code = (f"import sys; from setuptools import build_meta as b; "
                f"print('WHEEL', b.{hook}(sys.argv[1]))")
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=src,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        built.append(done.stdout.split("WHEEL")[-1].split()[0])
    wheel, editable = built
    line = (REPO / "kbuild-enable.pth").read_text()
    assert line.startswith("import os;") and line.count("\n") == 1
    for name in (wheel, editable):
        with zipfile.ZipFile(tmp_path / "dist" / name) as archive:
            assert archive.read("kbuild-enable.pth").decode() == line
            assert "kbuild-enable.pth" in archive.read(
                next(n for n in archive.namelist() if n.endswith("RECORD"))).decode()
