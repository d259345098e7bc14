"""Separate compilation: a compiled kernel split into LTO-IR objects, and their link.

numba-cuda compiles each device function a kernel calls into a code library
of its own and hands all of them to NVVM as one program. Here each library's
module becomes an LTO-IR object instead (NVVM `-gen-lto`), keyed by
`objects.kernel_object_key` / `objects.device_object_key`, and nvJitLink links
the objects with link-time optimisation, so callees are still inlined across
objects. The linked PTX is what the whole-program build would produce, up to
the optimiser's choices; ptxas then makes the cubin, as numba does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..artifacts import OBJECT_KIND
from ..keying import objects
from ..keying.encode import Unencodable, digest, digest_of
from ..keying.values import type_canonical
from .base import Object  # noqa: F401 - what a separate compile makes, named by the interface


def split(compiled, cc, device_functions, nodes, target_node, *, outputs=None):
    """The objects of a compiled `_Kernel`, kernel object first; or, as a string, why
    it has to be built as one program. An object this process made, or `outputs` has
    stored, with the same key and interface is taken as it is: NVVM compiles only the
    new ones."""
    library = compiled._codelibrary
    reason = _whole_program_reason(compiled, library)
    if reason:
        return reason
    owners = _library_owners(device_functions)
    context = objects.link_context(target_node)
    exports, units = {}, []
    for lib in dict.fromkeys(library.linking_libraries):
        if lib not in owners:
            return f"it links {lib.name}, which kbuild does not compile on its own"
        disp, cres = owners[lib]
        node = nodes.get(disp)
        if node is None or node.ident is None:
            return f"callee {disp.py_func.__qualname__} is compiled into its caller"
        try:
            argtypes = _types_digest(cres.signature.args)
            restype = _types_digest((cres.signature.return_type,))
        except Unencodable as exc:
            return f"callee {disp.py_func.__qualname__} has a type kbuild cannot key ({exc})"
        symbol = cres.fndesc.llvm_func_name
        key = objects.device_object_key(node, argtypes, context)
        exports[symbol] = objects.Import(symbol, node.ident, argtypes, restype)
        units.append((key, lib._module, symbol, node.summary, [[symbol, restype]]))
    kernel = objects.kernel_node(target_node)
    units.insert(0, (objects.kernel_object_key(target_node), library._module,
                     compiled.entry_name, kernel.summary, []))
    options = dict(library._nvvm_options)
    lto = bool(getattr(library, "_lto", False))
    flags = list(link_flags(options, lto))
    made = []
    for key, module, root, function, defines in units:
        imports = [exports[fn.name].as_json() for fn in module.functions
                   if fn.is_declaration and fn.name in exports]
        manifest = {"kind": OBJECT_KIND, "function": function, "exports": defines,
                    "imports": imports}
        if not defines:  # the kernel's own object, and how the target must be linked
            manifest.update(entry=compiled.entry_name, cooperative=bool(compiled.cooperative),
                            link_flags=flags, lto=lto)
        obj = _made.get(key)
        # One key, another interface (a callee's return type changed): other code.
        if obj is None or objects.interface(obj.manifest) != objects.interface(manifest):
            stored = outputs.ltoir(key, manifest) if outputs is not None else None
            obj = _remember(Object(key, stored or _ltoir(module, root, options, cc), manifest))
        made.append(obj)
    by_key = {o.key: o for o in made}
    blobs = {o.key: digest(o.ltoir) for o in made}
    return tuple(by_key[k] for k in objects.link_order(made[0].key, blobs))


# Objects this process has made, by key. A device function reached by many kernels is
# one object: its LTO-IR is made once per process, not once per kernel that links it
# (the key holds everything its bytes depend on, as the store's reuse of objects assumes).
_made: dict[str, Object] = {}
_MADE_LIMIT = 4096


def forget(keys) -> None:
    """Objects made for one launch configuration (a compile marked launch-config sensitive,
    whose target key did not hold it yet): never reused for another."""
    for key in keys:
        _made.pop(key, None)


def made_keys() -> tuple:
    """The keys of the objects this process made (`--verify` forgets them all: its
    compile reuses nothing)."""
    return tuple(_made)


def _remember(obj: Object) -> Object:
    if len(_made) >= _MADE_LIMIT:
        _made.clear()
    _made[obj.key] = obj
    return obj


# The float semantics of numba's own binary. numba's `get_cubin` links a kernel whose `lto`
# option is on (numba-cuda's default wherever nvJitLink is installed, `debug=True` aside)
# as LTO-IR, and its `LinkerOptions` name no float flags: nvJitLink's link-time NVVM runs
# with its defaults, so the binary numba launches keeps denormals and divides exactly
# (`cvt.f64.f32`, `div.rn.f32`) even under `fastmath=True`; its PTX before the link
# (`inspect_asm`, `compile_ptx`) says `.ftz`, but that PTX is never what numba loads.
# With `lto=False` numba assembles the whole program's NVVM PTX, made with the kernel's
# flags (`nvvm.compile_ir`: a truthy `fastmath`, True or a set of LLVM flags, becomes
# all four); a separately compiled kernel of that kind gets them at its own link.
_FLOAT_FLAGS = ("fma", "ftz", "prec_div", "prec_sqrt")
_FASTMATH = {"ftz": True, "fma": True, "prec_div": False, "prec_sqrt": False}


def link_flags(nvvm_options: dict, lto: bool) -> tuple:
    """The nvJitLink options (`-ftz=1`, ...) that give a link the float semantics of the
    binary numba launches for the same kernel, in one order; () for nvJitLink's defaults
    (`lto`: the kernel's own `lto` option, under which numba links with those)."""
    if lto:
        return ()
    chosen = {k: nvvm_options[k] for k in _FLOAT_FLAGS if k in nvvm_options}
    if nvvm_options.get("fastmath"):
        chosen.update(_FASTMATH)
    return tuple(f"-{k.replace('_', '-')}={int(bool(v))}" for k, v in sorted(chosen.items()))


def _whole_program_reason(compiled, library) -> str | None:
    options = library._nvvm_options
    if compiled.debug or "g" in options:
        return "debug=True (kept as one program for its debug info)"
    if compiled.lineinfo:
        return "lineinfo=True (kept as one program for its line table)"
    if not options.get("opt", 3):
        return "opt=False (link-time optimisation would optimise it)"
    if library._linking_files:
        return "it links files (link=..., declare_device or numba helpers)"
    if library.needs_cudadevrt or compiled.cooperative:
        return "it synchronises the grid (links cudadevrt)"
    if compiled.target_context.enable_nrt:
        return "numba's NRT is enabled"
    return None


def _library_owners(device_functions) -> dict:
    """Code library -> (dispatcher, compile result), for every compiled device function."""
    owners = {}
    for disp in device_functions:
        for cres in list(getattr(disp, "overloads", {}).values()):
            lib = getattr(cres, "library", None)
            if lib is not None:
                owners[lib] = (disp, cres)
    return owners


def _types_digest(types_) -> str:
    return digest_of(tuple(type_canonical(t) for t in types_))


def _ltoir(module, root: str, nvvm_options: dict, cc) -> bytes:
    """NVVM `-gen-lto` of one module. numba gives linked device functions linkonce_odr
    linkage, which lets NVVM drop a definition nothing in its own module calls; the
    object's own function is made external for the compile, the rest stay linkonce_odr
    so two objects may both carry a helper."""
    from numba.cuda.cudadrv import nvrtc, nvvm

    saved = [(fn, fn.linkage) for fn in module.functions if not fn.is_declaration]
    try:
        for fn, linkage in saved:
            if fn.name == root:
                fn.linkage = "" if linkage in ("linkonce_odr", "weak_odr") else linkage
            elif linkage in ("", "external"):
                fn.linkage = "linkonce_odr"
        text = str(module)
    finally:
        for fn, linkage in saved:
            fn.linkage = linkage
    options = dict(nvvm_options, arch=nvrtc.get_arch_option(*arch_cc(cc)))
    options["gen-lto"] = None
    return bytes(nvvm.compile_ir([text], **options))


@dataclass(frozen=True)
class Linked:
    """What a link gave: PTX and cubin, what early cutoff took from an earlier build
    (`model.Cutoff`'s value, or None) and the cutoff keys these bytes are recorded under."""

    ptx: bytes
    cubin: bytes
    cutoff: str | None = None
    keys: tuple = ()


def arch_cc(cc) -> tuple:
    """`cc` as (major, minor), or (major, minor, 'a') for an arch-specific target: NVVM,
    nvJitLink and ptxas must all be given the suffix, or `sm_90a` code comes out as `sm_90`
    PTX (which the store rightly refuses as another arch's) and loses its sm_90a features."""
    cc = tuple(cc)
    return cc[:3] if len(cc) > 2 and cc[2] else cc[:2]


def link(ltoirs, cc, *, max_registers=None, outputs=None, entry: str = "",
         flags=(), lto: bool = False) -> Linked:
    """PTX and cubin of LTO-IR objects, linked with link-time optimisation for `cc`.

    With `outputs` (the build's `cutoff.Outputs`), early cutoff: objects byte-identical
    to an earlier link's take its PTX and cubin (no link), a linked PTX byte-identical
    to an earlier one takes its cubin (no PTX -> cubin). `entry` is the kernel the
    stored output must define; `flags` the kernel's float semantics (`link_flags`);
    `lto` the kernel's own `lto` option, which decides how numba makes its cubin (see
    `cubin_of`)."""
    from ..keying.cutoff import link_options, step_options

    cc2 = arch_cc(cc)
    flags = tuple(flags)
    options = step_options(cc2, max_registers) + ((("lto", True),) if lto else ())
    if outputs is None:
        ptx = link_ptx(ltoirs, cc2, flags)
        return Linked(ptx, cubin_of(ltoirs, ptx, cc2, max_registers, lto))
    link_key, found = outputs.linked(ltoirs, link_options(options, flags), entry)
    if found is not None:
        return Linked(*found, cutoff="link", keys=(link_key,))
    ptx = link_ptx(ltoirs, cc2, flags)
    cubin_key, cubin = outputs.cubin([ptx], options, entry)
    if cubin is not None:
        return Linked(ptx, cubin, cutoff="cubin", keys=(link_key, cubin_key))
    return Linked(ptx, cubin_of(ltoirs, ptx, cc2, max_registers, lto),
                  keys=(link_key, cubin_key))


def cubin_of(ltoirs, ptx: bytes, cc, max_registers=None, lto: bool = False) -> bytes:
    """The cubin numba would make of the same program. numba's `get_cubin` hands a kernel
    whose `lto` option is on to nvJitLink as LTO-IR, which optimises and assembles it as
    one program; it assembles a kernel with `lto` off from its PTX (ptxas on PTX as an
    input of a link gives other machine code for the same PTX). Both through numba's own
    linker, with its options."""
    if not lto:
        return ptx_to_cubin(ptx, cc, max_registers)
    from numba.cuda.cudadrv.driver import _Linker

    linker = _Linker(max_registers=max_registers, cc=arch_cc(cc), lto=True)
    for i, data in enumerate(ltoirs):
        linker.add_ltoir(bytes(data), name=f"object{i}")
    cubin = linker.complete()
    return bytes(getattr(cubin, "code", cubin))


def link_ptx(ltoirs, cc, flags=()) -> bytes:
    """nvJitLink's link-time-optimising link of LTO-IR objects into PTX for `cc`, with
    the kernel's float flags (`link_flags`). Through nvJitLink's own API: cuda.core's
    `LinkerOptions` spells them `-ftz=true`, which the NVVM inside nvJitLink refuses."""
    from cuda.bindings import nvjitlink

    arch = "sm_" + "".join(str(part) for part in arch_cc(cc))
    options = [f"-arch={arch}", "-lto", "-ptx", *flags]
    handle = nvjitlink.create(len(options), options)
    try:
        for i, data in enumerate(ltoirs):
            nvjitlink.add_data(handle, nvjitlink.InputType.LTOIR, data, len(data), f"object{i}")
        try:
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            raise RuntimeError(f"nvJitLink: {exc}: {_error_log(handle)}") from None
        ptx = bytearray(nvjitlink.get_linked_ptx_size(handle))
        nvjitlink.get_linked_ptx(handle, ptx)
        return bytes(ptx).rstrip(b"\x00").strip()
    finally:
        nvjitlink.destroy(handle)


def _error_log(handle) -> str:
    from cuda.bindings import nvjitlink

    log = bytearray(nvjitlink.get_error_log_size(handle))
    nvjitlink.get_error_log(handle, log)
    return log.decode(errors="replace").strip("\x00").strip()


def ptx_to_cubin(ptx: bytes, cc, max_registers=None) -> bytes:
    """PTX to cubin exactly as numba links a whole-program kernel's PTX."""
    from numba.cuda.cudadrv.driver import _Linker

    linker = _Linker(max_registers=max_registers, cc=arch_cc(cc))
    linker.add_ptx(ptx)
    cubin = linker.complete()
    return bytes(getattr(cubin, "code", cubin))
