"""Overloads that decide what numba compiles from what they ask the system while numba
types a kernel: each through a route no module attribute shows."""

import importlib
import os
import pathlib
import pkgutil
from os import environ

import numpy as np
from numba import cuda
from numba.core.extending import overload

NAME = "SC" + "ALE"


def flagged(x):
    pass


@overload(flagged)
def ol_flagged(x):
    if os.path.exists("fast.flag"):  # a stat
        return lambda x: x * 3.0
    return lambda x: x * 2.0


def tabled(x):
    pass


@overload(tabled)
def ol_tabled(x):
    t = float(pathlib.Path("table.txt").read_text())  # open, through pathlib
    return lambda x: x + t


def weighted(x):
    pass


@overload(weighted)
def ol_weighted(x):
    w = float(np.loadtxt("weights.txt"))  # open, through numpy
    return lambda x: x * w


def packaged(x):
    pass


@overload(packaged)
def ol_packaged(x):
    d = float(pkgutil.get_data("sp", "data.txt"))  # open, by the package's loader
    return lambda x: x + d


def counted(x):
    pass


@overload(counted)
def ol_counted(x):
    n = float(len(os.listdir("plugins")))  # a folder listed
    return lambda x: x + n


def scanned(x):
    pass


@overload(scanned)
def ol_scanned(x):
    n = float(sum(1 for k, _ in os.environ.items() if k.startswith("SP_OPT_")))  # a scan
    return lambda x: x + n


def gained(x):
    pass


@overload(gained)
def ol_gained(x):
    g = float(os.environ.get("SP_GAIN", "1.0"))  # by name, in an answer numba keeps
    return lambda x: x * g


def aliased(x):
    pass


@overload(aliased)
def ol_aliased(x):
    g = float(environ.get("SP_ALIAS", "1.0"))  # through a name bound at import
    b = float(os.environb.get(b"SP_BYTES", b"0.0"))  # bytes names
    return lambda x: x * g + b


def scaled(x):
    pass


@overload(scaled)
def ol_scaled(x):
    v = getattr(importlib.import_module("sp.consts"), NAME)  # by computed name
    return lambda x: x * v


def shelled(x):
    pass


@overload(shelled)
def ol_shelled(x):
    import subprocess

    v = float(subprocess.check_output(["cat", "table.txt"]).decode())
    return lambda x: x + v


def threaded(x):
    pass


@overload(threaded)
def ol_threaded(x):
    from concurrent.futures import ThreadPoolExecutor

    def read():
        return float(pathlib.Path("threaded.txt").read_text())

    with ThreadPoolExecutor(1) as pool:  # read in a thread the overload starts
        t = pool.submit(read).result()
    return lambda x: x * t


def spawned(x):
    pass


@overload(spawned)
def ol_spawned(x):
    import shutil
    from multiprocessing import util

    # A process started the way multiprocessing's spawn and forkserver start theirs (no
    # audit event): what it did cannot be keyed.
    true = os.fsencode(shutil.which("true"))
    os.waitpid(util.spawnv_passfds(true, [true], ()), 0)
    return lambda x: x + 1.0


def asked(x):
    pass


@overload(asked)
def ol_asked(x):
    import socket

    with socket.socket() as sock:  # a service asked: what it answers cannot be keyed
        sock.settimeout(1)
        sock.connect_ex(("127.0.0.1", 9))
    return lambda x: x + 1.0


@cuda.jit(device=True)
def dev_scaled(x):
    return scaled(x) + 1.0


# Compiled when the module is imported (an eager signature): numba never compiles it
# again on its own, and its compile read SCALE through `scaled`'s overload.
@cuda.jit("float32(float32)", device=True)
def dev_eager(x):
    return scaled(x) + 2.0
