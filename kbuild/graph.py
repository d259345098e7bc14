"""The target graph: kernels, the device functions they reach, and which are stale.

Built from the key trees alone (callee nodes are device functions), so it
needs no compile. Rendered as DOT text, node-link JSON, or PNG through
Graphviz's `dot` when it is installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import networkx as nx

from .keying.objects import kernel_node


def target_graph(the_plan, is_built) -> nx.DiGraph:
    """Targets and functions as nodes, calls as edges; `is_built(key)` marks freshness."""
    graph = nx.DiGraph()
    for target in the_plan.targets:
        node = the_plan.keys[target]
        graph.add_node(target.label, kind="target", key=node.digest,
                       status="up-to-date" if is_built(node.digest) else "stale")
        _add_function(graph, target.label, kernel_node(node))
    return graph


def _add_function(graph, parent: str, node) -> None:
    for child in node.children:
        if not child.label.startswith("callee "):
            continue
        fid = f"{child.summary}#{child.digest[:8]}"
        seen = fid in graph  # one digest, one subtree: walk a shared callee once
        graph.add_node(fid, kind="device function", name=child.summary, key=child.digest)
        graph.add_edge(parent, fid)
        if not seen:
            _add_function(graph, fid, child)


def to_dot(graph: nx.DiGraph) -> str:
    """Graphviz text: targets as boxes (green up-to-date, red stale), functions as ellipses."""
    lines = ["digraph kbuild {", "  rankdir=LR;", "  node [fontname=Helvetica, fontsize=10];"]
    for name, data in sorted(graph.nodes(data=True)):
        if data["kind"] == "target":
            color = "palegreen" if data["status"] == "up-to-date" else "lightcoral"
            lines.append(f"  {_quote(name)} [shape=box, style=filled, fillcolor={color}, "
                         f"label={_quote(name + chr(10) + data['status'])}];")
        else:
            lines.append(f"  {_quote(name)} [shape=ellipse, label={_quote(data['name'])}];")
    for a, b in sorted(graph.edges()):
        lines.append(f"  {_quote(a)} -> {_quote(b)};")
    lines.append("}")
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
