"""Compile options of a simulator kernel, recovered from its decorator.

Under NUMBA_ENABLE_CUDASIM=1, `@cuda.jit` returns a FakeCUDAKernel that keeps
no options, yet key checks must give the keys of the real build. The options
are read back from the decorator's keywords and completed with the defaults
numba-cuda's real `jit` applies, so both modes key the same inputs. A kernel
made by calling `cuda.jit(...)(fn)` outside a decorator gets the defaults.
"""

from __future__ import annotations

import ast
import inspect
import textwrap


def real_defaults(device: bool, given: dict) -> dict:
    """The targetoptions numba-cuda's `jit` would record for these keywords."""
    from numba.cuda import config

    debug = given.get("debug")
    debug = config.CUDA_DEBUGINFO_DEFAULT if debug is None else debug
    opt = given.get("opt")
    options = dict(given)
    options.update(
        debug=debug,
        opt=(config.OPT != 0) if opt is None else opt,
        lineinfo=given.get("lineinfo", False),
        link=given.get("link", ()),
        fastmath=given.get("fastmath", False),
        device=device,
        inline=given.get("inline", "never"),
        forceinline=given.get("forceinline", False),
        extensions=given.get("extensions", []),
        launch_bounds=given.get("launch_bounds"),
        lto=_have_nvjitlink() and not debug if given.get("lto") is None else given["lto"],
        shared_memory_carveout=given.get("shared_memory_carveout"),
    )
    options.pop("cache", None)
    return options


def decorator_keywords(py_func) -> dict:
    """The keyword arguments of the function's `@...jit(...)` decorator, evaluated."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(py_func)))
    except (OSError, TypeError, SyntaxError):
        return {}
    fdef = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if fdef is None:
        return {}
    for deco in fdef.decorator_list:
        if isinstance(deco, ast.Call) and _names_jit(deco.func):
            return {kw.arg: _evaluate(kw.value, py_func) for kw in deco.keywords if kw.arg}
    return {}


def _names_jit(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "jit") or \
        (isinstance(node, ast.Name) and node.id == "jit")


def _evaluate(node, py_func):
    # The decorator already ran these expressions at import, in the same globals.
    code = compile(ast.Expression(node), "<decorator>", "eval")
    return eval(code, py_func.__globals__)  # noqa: S307


def _have_nvjitlink() -> bool:
    try:
        from cuda.bindings import nvjitlink

        return nvjitlink.version() >= (12, 3)
    except Exception:  # noqa: BLE001
        return False


def options_for(fake_kernel) -> dict:
    """Real-build options for a simulator kernel (cached on it)."""
    cached = getattr(fake_kernel, "_kbuild_options", None)
    if cached is None:
        given = decorator_keywords(fake_kernel.fn)
        cached = real_defaults(bool(fake_kernel._device), given)
        fake_kernel._kbuild_options = cached
    return cached
