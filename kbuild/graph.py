"""The project graph: kernels, the device functions they reach, the globals they read.

One node per function, not per kernel x signature x arch (a project of 45 kernels
has hundreds of targets): a kernel node counts its signatures and architectures and
how many of its targets are stale. Built from the key trees alone, so it needs no
compile. Rendered as DOT text (with a legend), node-link JSON, or PNG through
Graphviz's `dot` when it is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import networkx as nx

from .keying.objects import kernel_node
from .model import TargetState
from .keying.tree import LabelKind, label_name

# A global whose value is a library name (cuda.grid -> numba.cuda.grid) is an API call, and
# one naming a function (sq -> examples.mathx:sq) is a call the graph draws as an edge:
# neither is data the kernel reads, so the graph leaves them out.
_NOT_DATA = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$|^[\w.]+:[\w.<>]+$")


def target_graph(the_plan, is_built) -> nx.DiGraph:
    """Kernels, device functions and globals as nodes, calls and reads as edges;
    `is_built(key)` counts each kernel's up-to-date targets."""
    graph = nx.DiGraph()
    for target in the_plan.targets:
        node = the_plan.keys[target]
        kid = f"kernel {target.name}"
        if kid not in graph:
            graph.add_node(kid, kind="kernel", name=target.name, signatures=[], archs=[],
                           targets=0, stale=0)
            _add_reads(graph, kid, kernel_node(node))
        data = graph.nodes[kid]
        data["targets"] += 1
        data["stale"] += not is_built(node.digest)
        for field, value in (("signatures", target.signature), ("archs", target.arch)):
            if value not in data[field]:
                data[field].append(value)
    for target, error in getattr(the_plan, "failed", {}).items():
        kid = f"kernel {target.name}"
        graph.add_node(kid, kind="kernel", name=target.name, signatures=[], archs=[],
                       targets=0, stale=0, error=str(error))
    return graph


def _add_reads(graph, parent: str, node) -> None:
    """The callees and globals `node` reads, below `parent`; a callee's own reads once."""
    for child in node.children:
        if child.kind is LabelKind.CALLEE:
            fid = f"function {child.summary}"
            seen = fid in graph
            graph.add_node(fid, kind="device function", name=child.summary)
            graph.add_edge(parent, fid)
            if not seen:
                _add_reads(graph, fid, child)
        elif child.kind is LabelKind.GLOBAL and not _NOT_DATA.match(child.summary):
            name = label_name(child.label)
            gid = f"global {name} = {child.summary}"
            graph.add_node(gid, kind="global", name=name, value=child.summary)
            graph.add_edge(parent, gid)


def _status(data) -> str:
    if data.get("error"):
        return "failed to import"
    if data["stale"] == 0:
        return TargetState.UP_TO_DATE.value
    return f"{data['stale']} of {data['targets']} stale"


def _count(items, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _label(data) -> str:
    if data["kind"] == "kernel":
        return (f"{data['name']}\n{_count(data['signatures'], 'signature')} x "
                f"{_count(data['archs'], 'arch')}\n{_status(data)}")
    if data["kind"] == "global":
        value = data["value"] if len(data["value"]) <= 40 else data["value"][:37] + "..."
        return f"{data['name']} = {value}"
    return data["name"]


_STYLE = {"kernel": "shape=box, style=filled", "device function": "shape=ellipse",
          "global": "shape=note, fontsize=9"}

LEGEND = [
    ("legend kernel", 'shape=box, style=filled, fillcolor=palegreen, '
                      'label="kernel: signatures x archs, up-to-date"'),
    ("legend stale", 'shape=box, style=filled, fillcolor=lightcoral, '
                     'label="kernel with stale or failed targets"'),
    ("legend function", 'shape=ellipse, label="device function"'),
    ("legend global", 'shape=note, fontsize=9, label="global it reads = value"'),
]


def to_dot(graph: nx.DiGraph) -> str:
    """Graphviz text: kernels as boxes (green up-to-date, red stale), device functions as
    ellipses, globals as notes; edges are calls and reads; a legend in a box of its own."""
    lines = ["digraph kbuild {", "  rankdir=LR;", "  node [fontname=Helvetica, fontsize=10];"]
    for name, data in sorted(graph.nodes(data=True)):
        style = _STYLE[data["kind"]]
        if data["kind"] == "kernel":
            fresh = not data.get("error") and data["stale"] == 0
            style += f", fillcolor={'palegreen' if fresh else 'lightcoral'}"
        lines.append(f"  {_quote(name)} [{style}, label={_quote(_label(data))}];")
    for a, b in sorted(graph.edges()):
        lines.append(f"  {_quote(a)} -> {_quote(b)};")
    lines += ["  subgraph cluster_legend {", '    label="legend"; style=dashed;']
    lines += [f"    {_quote(name)} [{style}];" for name, style in LEGEND]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def to_json(graph: nx.DiGraph) -> str:
    data = nx.node_link_data(graph, edges="edges")
    data["nodes"] = sorted(data["nodes"], key=lambda n: n["id"])
    data["edges"] = sorted(data["edges"], key=lambda e: (e["source"], e["target"]))
    return json.dumps(data, indent=1)


def to_png(graph: nx.DiGraph) -> bytes:
    """PNG bytes via Graphviz; `RuntimeError` when `dot` is not installed."""
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError("Graphviz 'dot' is not installed; use --format dot or json "
                           "(or install graphviz)")
    done = subprocess.run([dot, "-Tpng"], input=to_dot(graph).encode(), capture_output=True,
                          check=True)
    return done.stdout


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
