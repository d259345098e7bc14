"""The functools caches compile-time code is answered from, and who made their answers.

A module-level `lru_cache`/`cache` wrapper answers a call it has seen before from what it
kept, running nothing: the reads that made the answer are not made again. An answer kept
from before any compile (made at import, or by the program) was made from reads no
compile observed, so the wrapper is keyed by such answers' values
(`keying.values.cache_held`). An answer a compile made was made from reads that compile
observed: each later compile answered from the wrapper reads them too, as numba's kept
typing answers hand theirs on (`Observer.answering`), digested as they are now. Which
compile made an answer, and which compile was answered, are told apart by the keys the
wrapper keeps and the hits it counts before and after each compile. An installed
package's helper that does not build on numba (a parser's, a metadata reader's cache,
which numba's own compiles are answered from too) hands nothing on: what made its
answers is its installation's.
"""

from __future__ import annotations

import contextlib
import weakref

from ...keying.values import is_cache, kept_keys, made_by_compile
from ..libraries import loaded_namespaces
from .reads import _installed_code

# cache -> what the compiles that made its answers observed ({(kind, name): None})
_READ_TO_MAKE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def kept_answers(observer):
    """Within the block a compile runs: the answers it made are noted as made by a compile
    with what it observed; a wrapper that answered it from its kept answers hands it what
    the compiles that made them observed."""
    before = {cache: (kept_keys(cache), cache.cache_info().hits)
              for cache in module_caches()}
    try:
        yield
    finally:
        for cache in module_caches():
            keys, hits = before.get(cache, (frozenset(), 0))
            if cache.cache_info().hits > hits and not _helper(cache):
                for name in list(_READ_TO_MAKE.get(cache, ())):
                    observer.add(*name)
            made = kept_keys(cache) - keys
            if made:
                made_by_compile(cache, made)
                _READ_TO_MAKE.setdefault(cache, {}).update(dict.fromkeys(observer.names))


def _helper(cache) -> bool:
    """Whether a cache is an installed package's that does not build on numba (a parser's,
    a metadata reader's): numba's own compiles are answered from it too, and what made
    its answers is its installation's."""
    code = cache.__wrapped__.__code__
    return _installed_code(code.co_filename, getattr(cache, "__module__", None))


def module_caches() -> list:
    """Every functools cache that is a global of a loaded module not the toolchain's or
    the language's, or an attribute of a class defined there."""
    found: dict = {}  # one imported into another module is found there too
    seen: set = set()
    for name, namespace in loaded_namespaces(skip_libraries=True):
        try:
            _walk(name, list(namespace.values()), seen, found)
        except Exception:  # noqa: BLE001 - a class posing oddly: never break a compile
            continue
    return list(found)


def _walk(name, todo, seen, found) -> None:
    """The caches among `todo` (a module's globals), in classes module `name` defines (as
    named) too."""
    while todo:
        value = todo.pop()
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if is_cache(value):
            found.setdefault(value, None)
        elif isinstance(value, type) and value.__module__ == name and value not in seen:
            seen.add(value)
            todo.extend(vars(value).values())
