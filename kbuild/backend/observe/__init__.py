"""Observe what numba consults while it types and lowers a target, and digest it by name.

Beyond the static key, a compile may consult what no source names: overloads and
their registrations, module attributes read through a computed name, environment
variables, files, the headers NVRTC opens. While numba compiles (in the process that
compiles, a forked worker usually), the hooks record every such thing by name; a
later build digests each name again and finds the target fresh or stale. Four
modules, one job each:

- `observer`: the `Observer`, the record of one compile's names (`Kind`, name) and of
  what the answers numba keeps read when they were made; `link_files` and
  `linked_paths` add the files linked in;
- `hooks`: `observing(observer, front_end)`, the patches of a numba front end
  (`FrontEnd`) installed for one compile:
  - `Interpreter.interpret` / `get_global_value`: every Python function numba turns
    into IR and every global (or builtin) it freezes from it;
  - `BaseContext.resolve_module_constants`: every module attribute it types (`mod.X`);
  - the `@overload`/`@overload_method`/`@overload_attribute` and `@intrinsic`
    templates: the Python function each runs at typing time;
  - NVRTC's compiles of CUDA C (`link=` and `declare_device` files, `cuda.CUSource`):
    every header it opened, through whatever include path and form (`"..."`, `<...>`,
    transitively), as NVRTC's own time trace lists them (`_nvrtc_headers`);
- `reads`: the stand-ins for what Python code reads meanwhile: module attributes,
  `globals()`, `__import__`, `os.environ` (and `oscalls`: files opened by any route,
  paths stat'ed, folders listed, subprocesses run);
- `current`: `Current`, a name's digest in this process now, the same way when the
  compile records it and when a later build checks it.

The rest of kbuild reaches these through the backend interface (`base.Backend.observer`,
`base.observed_now`); a backend's compiler imports them from this package.
"""

from .current import Current
from .hooks import NUMBA_CUDA_FRONT_END, FrontEnd, observing
from .observer import Observer, link_files, linked_paths

__all__ = ["Current", "FrontEnd", "NUMBA_CUDA_FRONT_END", "Observer", "link_files",
           "linked_paths", "observing"]
