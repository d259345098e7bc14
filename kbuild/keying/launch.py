"""Launch configurations in keys: a target built for one launch configuration.

numba-cuda 0.30 lets an extension make a kernel's code depend on the launch
configuration it is first launched with (`dispatcher.mark_launch_config_sensitive()`,
used by block-wide cooperative primitives that need the block size); numba then
compiles it again for every other (grid, block, shared memory). Such a target's key
holds the launch configuration it was compiled for, as numba's own specialisation
key does: grid and block as 3-tuples and the dynamic shared memory in bytes. A target
with no launch configuration keys none (its key is unchanged).
"""

from __future__ import annotations

from ..model import launch_text  # noqa: F401 - named here too (keys and rows name launches alike)
from .tree import KeyNode, LabelKind, branch, leaf

Launch = tuple  # ((grid x, y, z), (block x, y, z), shared memory bytes)


def launch_json(launch: Launch | None):
    """A launch as JSON (and TOML) data: {"grid": [..], "block": [..], "shared": n}."""
    if launch is None:
        return None
    grid, block, shared = launch
    return {"grid": list(grid), "block": list(block), "shared": shared}


def launch_of(data: dict) -> Launch:
    """The launch `launch_json` made JSON data of."""
    return tuple(data["grid"]), tuple(data["block"]), int(data["shared"])


def launch_node(launch: Launch) -> KeyNode:
    grid, block, shared = launch
    return leaf(LabelKind.LAUNCH.label(), ("launch", tuple(grid), tuple(block), int(shared)),
                launch_text(launch))


def with_launch(node: KeyNode, launch: Launch | None) -> KeyNode:
    """A target's key tree with its launch configuration (`node` itself for None)."""
    if launch is None:
        return node
    return branch(node.label, node.summary, node.children + (launch_node(launch),))
