"""What a kernel is called when nobody declared it: `module:attr.path`, as kbuild.toml names it.

A target's name is part of its key, so a kernel launched under `kbuild.enable()` must
be named as `kbuild build` names it for its key to be the same both ways:

1. a name the project file declares for it (`[kernels."pkg.mod:ns.func"]`), when that
   attribute path leads, right now, to a dispatcher of this very function;
2. `module:qualname` for a module-level kernel (`pkg.mod:saxpy`) or one in a class body
   (`pkg.mod:Filters.smooth`, a `@staticmethod`);
3. for a kernel made by a factory or a closure (`make.<locals>.kern`), the attribute
   path where the module keeps it (`pkg.mod:ns.func`, `pkg.mod:KERNELS.scale3`),
   searched through the module's globals, its classes and plain objects, a few levels
   deep, shortest path first, in name order;
4. else `module:qualname` itself (`pkg.mod:make.<locals>.kern`): it still keys the
   kernel by content (closure values included), but cannot be imported, so a
   recording leaves it out.

Attributes are read from `__dict__`s only (never through a property or a module
`__getattr__`): naming a kernel runs none of the program's code.
"""

from __future__ import annotations

import re
import sys
import types as pytypes
import weakref

_MAX_DEPTH = 3
_MAX_VISITS = 4000
_found: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # py_func -> name


def target_name(py_func, declared=()) -> str:
    """The target name of the kernel whose Python function is `py_func` (see above);
    `declared`: the names the project file declares."""
    try:
        return _found[py_func]
    except (KeyError, TypeError):
        pass
    name = import_path(py_func, declared)
    if name is None:  # not kept anywhere yet: asked again next time
        return f"{py_func.__module__}:{py_func.__qualname__}"
    try:
        _found[py_func] = name
    except TypeError:
        pass
    return name


def import_path(py_func, declared=()) -> str | None:
    """`module:attr.path` that leads to a dispatcher of `py_func` now, or None."""
    module_name = getattr(py_func, "__module__", None)
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    if module is None:
        return None
    for name in sorted(declared):
        mod, _, path = name.partition(":")
        if mod == module_name and _is_kernel_of(_follow(module, path.split(".")), py_func):
            return name
    qualname = py_func.__qualname__
    if "<locals>" not in qualname and \
            _is_kernel_of(_follow(module, qualname.split(".")), py_func):
        return f"{module_name}:{qualname}"
    path = _search(module, py_func)
    return f"{module_name}:{'.'.join(path)}" if path else None


def importable_module(module_name: str) -> bool:
    """Whether `kbuild build` can import the module under this name (a script run as
    `__main__` cannot: the same file imported is another module, with other symbols)."""
    return module_name != "__main__" and not module_name.startswith("<")


def _is_kernel_of(obj, py_func) -> bool:
    """Whether `obj` is a dispatcher of `py_func` (numba-cuda's, or its simulator's)."""
    from ..backend.backends import DEFAULT, get
    from ..keying.interfaces import Role

    if obj is None:
        return False
    found = get(DEFAULT).objects.function_of(obj)
    return found is not None and found.role is not Role.FUNCTION and found.py_func is py_func


def _attribute(obj, name: str):
    """`obj.name` read from `__dict__`s (a class's through its MRO), a staticmethod
    unwrapped; None when absent. No descriptor, property or `__getattr__` runs."""
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if name in klass.__dict__:
                return _unwrap(klass.__dict__[name])
        return None
    found = getattr(obj, "__dict__", None)
    if not isinstance(found, dict) or name not in found:
        return None
    return _unwrap(found[name])


def _unwrap(value):
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def _follow(obj, parts):
    for part in parts:
        if obj is None or not part:
            return None
        obj = _attribute(obj, part)
    return obj


def _search(module, py_func):
    """The shortest attribute path (in name order) from `module` to a dispatcher of
    `py_func`, through the module's classes and plain objects; None."""
    level = [((), module)]
    seen = {id(module)}
    visits = 0
    for _ in range(_MAX_DEPTH):
        following = []
        for path, obj in level:
            for name, value in _members(obj):
                visits += 1
                if visits > _MAX_VISITS:
                    return None
                if _is_kernel_of(value, py_func):
                    return path + (name,)
                if id(value) not in seen and _searchable(value, module.__name__):
                    seen.add(id(value))
                    following.append((path + (name,), value))
        level = following
    return None


def _members(obj):
    names = obj.__dict__ if not isinstance(obj, type) else \
        {n: v for klass in reversed(obj.__mro__) for n, v in vars(klass).items()}
    history = _is_interactive(obj)
    for name in sorted(n for n in names if isinstance(n, str) and n.isidentifier()):
        if history and _HISTORY.fullmatch(name):
            continue
        yield name, _unwrap(names[name])


# IPython's output history in a notebook's namespace (`_`, `__`, `_7`, `_i7`, `_oh`, ...):
# a kernel a cell displayed is kept there too, under a name that moves with every cell.
_HISTORY = re.compile(r"_+|_i*\d+|_i+|_[oid]h|In|Out")


def _is_interactive(obj) -> bool:
    from ..cells import is_interactive_module

    return isinstance(obj, pytypes.ModuleType) and is_interactive_module(obj)


def _searchable(value, module_name: str) -> bool:
    """Objects a kernel may be kept on: this module's classes, and instances of this
    module's classes or of SimpleNamespace (never other modules or libraries)."""
    if isinstance(value, pytypes.ModuleType):
        return False
    if isinstance(value, type):
        return value.__module__ == module_name
    cls = type(value)
    return cls is pytypes.SimpleNamespace or (
        cls.__module__ == module_name and isinstance(getattr(value, "__dict__", None), dict))
