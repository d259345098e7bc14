"""numba's dispatchers as zero-config sees them: whose they are, the function each
compiles, and the code their device functions hold, kept in step with kbuild's keys.

numba compiles a device function once per argument types in a process and reuses that
code for every later kernel, with the values it read then. kbuild keys each compile by
what the program holds now, so a process serving kernels must know what numba holds:
`DeviceCode` remembers the key of each device function when this process first keyed it
and when kbuild last compiled it, drops code a changed key makes stale, and refuses a
kernel whose compile numba would make from stale code it cannot drop.
"""

from __future__ import annotations

from ..errors import KbuildError


def backend_of(dispatcher):
    """The backend whose dispatcher this is (numba-cuda's when it is no other's)."""
    from ..backend.backends import DEFAULT, get, of_object

    return of_object(dispatcher) or get(DEFAULT)


def function_of(dispatcher):
    """The Python function a device function's dispatcher compiles (its backend says)."""
    return backend_of(dispatcher).python_function(dispatcher)


class DeviceCode:
    """What this process's device functions hold compiled, by the key digest of each."""

    def __init__(self):
        # By dispatcher: one Python function jitted twice with other options is two
        # device functions, each with its own code and key.
        self._compiled: dict = {}  # dispatcher -> its key digest when kbuild compiled it
        self._first_keyed: dict = {}  # dispatcher -> its key digest when first keyed here

    def check_reused(self, keyer) -> None:
        """A device function whose key has changed since this process first keyed it (a
        global it reads set at run time), and whose earlier code numba holds, is reused by
        numba's compile of this kernel: kbuild's, typed again with today's values, would
        compute something else (KbuildError: numba compiles it)."""
        for disp in keyer.device_functions:
            node = keyer.nodes.get(disp)
            if node is None:
                continue
            first = self._first_keyed.setdefault(disp, node.digest)
            if first != node.digest and backend_of(disp).holds_compiled(disp):
                raise KbuildError(
                    f"device function {function_of(disp).__qualname__} changed since numba "
                    "compiled it in this process (a value it reads was set at run time); "
                    "numba reuses that code, so numba compiles this kernel")

    def compiled(self, keyer, compile):
        """`compile()` in this process. A device function numba compiled earlier here
        holds the values it read then: it is typed again if its key has changed since;
        what it holds after is remembered under its key now."""
        for disp in keyer.device_functions:
            node = keyer.nodes.get(disp)
            if backend_of(disp).holds_compiled(disp) and node is not None \
                    and self._compiled.get(disp) != node.digest:
                backend_of(disp).forget_code(disp)
        outcome = compile()
        for disp in keyer.device_functions:
            node = keyer.nodes.get(disp)
            if node is not None and backend_of(disp).holds_compiled(disp):
                self._compiled[disp] = node.digest
        return outcome

    def forget(self, keyer) -> None:
        """The device functions' code dropped (it was made for another arch or launch):
        typed again when next needed, as a fresh process types them."""
        for disp in keyer.device_functions:
            backend_of(disp).forget_code(disp)
            self._compiled.pop(disp, None)

    def disown(self, keyer) -> None:
        """Whatever the device functions hold is no longer taken as kbuild's compile (a
        fresh build, `--verify`, types them again)."""
        for disp in keyer.device_functions:
            self._compiled.pop(disp, None)
