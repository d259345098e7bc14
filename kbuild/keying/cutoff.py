"""Early cutoff keys (pure): a build's last steps keyed by the bytes they read.

A target's key changes with every edit it depends on, but what its compile hands
to the last steps often does not: a device function's `if DEBUG:` branch edited
under `DEBUG = False` compiles to the same LTO-IR object, a function moved to
another module to the same linked PTX. Those steps are pure functions of their
inputs' bytes: nvJitLink's link-time-optimising link of LTO-IR objects, and the
making of a cubin from PTX (or from a whole program's LTO-IR, as numba does). Keyed here by those bytes (blob names, in the order they
are handed over), the options the tool is called with, and the architecture,
toolchain and codegen config the target is keyed with, an earlier build's
output for the same key is the output this build would make (the build system
idea of *early cutoff*: a rebuilt input whose result did not change stops the
rebuild there).

Soundness: a cutoff key holds everything the step reads, so reusing its output
changes no byte that is launched; it only skips the step. The target's own key
(and its entry) is untouched by cutoff.
"""

from __future__ import annotations

from .encode import digest_of
from .tree import KEY_SCHEMA, KeyNode, LabelKind

CUTOFF_SCHEMA = 1

# What a step's output depends on besides its input bytes and options: the target's arch,
# the toolchain (nvJitLink's, NVVM's and numba-cuda's versions) and numba's codegen config.
_CONTEXT = (LabelKind.ARCH, LabelKind.TOOLCHAIN, LabelKind.CONFIG)


def step_options(cc: tuple, max_registers) -> tuple:
    """The options a link or PTX -> cubin step is called with, as key material."""
    return (("cc", tuple(cc)), ("max_registers", max_registers or None))


def link_options(options: tuple, flags) -> tuple:
    """A link's options: the step's, and the kernel's float flags nvJitLink is given
    (`-ftz=1`, ...: they change the linked PTX, so the same objects linked with other
    flags are another link)."""
    return options + (("flags", tuple(flags)),) if flags else options


def link_key(target: KeyNode, ltoirs, options: tuple) -> str:
    """The key of linking LTO-IR objects (their blob names, in link order) into PTX and a
    cubin for `target`'s arch, toolchain and config."""
    return _key("link", target, ltoirs, options)


def cubin_key(target: KeyNode, inputs, options: tuple) -> str:
    """The key of making a cubin from `inputs` (blob names, in the order given to the
    linker: PTX modules, or a whole program's LTO-IR, as `options` say) for `target`'s
    arch, toolchain and config."""
    return _key("cubin", target, inputs, options)


def _key(step: str, target: KeyNode, inputs, options: tuple) -> str:
    context = tuple((k.label, k.digest) for k in target.children if k.kind in _CONTEXT)
    return digest_of(("cutoff", KEY_SCHEMA, CUTOFF_SCHEMA, step, context, tuple(inputs),
                      options))
