"""kbuild's own build: everything is in pyproject.toml but the start-up hook.

`kbuild-enable.pth` must land in site-packages itself (the root of a wheel), where Python
runs its one line at every start: it does nothing unless KBUILD_ENABLE is set (see
kbuild/zeroconf/startup.py). A normal wheel gets it from `build_py`; an editable install
(`pip install -e .`, PEP 660) from `editable_wheel`, whose wheel holds no build output.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "kbuild-enable.pth"
HERE = Path(__file__).resolve().parent


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            self.copy_file(str(HERE / PTH), str(Path(self.build_lib) / PTH))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return outputs + [str(Path(self.build_lib) / PTH)]


commands = {"build_py": build_py_with_pth}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64: no PEP 660 editable installs
    editable_wheel = None

if editable_wheel is not None:
    class _WithPth:
        """An editable-wheel strategy that also writes the start-up hook."""

        def __init__(self, strategy):
            self.strategy = strategy

        def __enter__(self):
            self.strategy.__enter__()
            return self

        def __exit__(self, *exc):
            return self.strategy.__exit__(*exc)

        def __call__(self, wheel, files, mapping):
            self.strategy(wheel, files, mapping)
            wheel.writestr(PTH, (HERE / PTH).read_bytes())

    class editable_wheel_with_pth(editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            return _WithPth(super()._select_strategy(*args, **kwargs))

    commands["editable_wheel"] = editable_wheel_with_pth

setup(cmdclass=commands)
