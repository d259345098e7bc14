"""The `kbuild` command line, a thin shell: parse arguments, call the project API, print,
and map errors to exit codes. Its rooms:

- `entry`: `main` and `run`, exit codes and the mapping of errors to them;
- `commands`: the command table (name, function, help, options) the parser is built from;
- `project_cmds`: build, watch, init, status, explain, clean, keys, graph, show, bundle;
- `store_cmds`: gc, stats, cat, export, import;
- `report`: a build's rows, summary and progress bar; `common`: what every command shares.

Commands import the layers below inside their functions, so `kbuild --help` starts fast.
"""

from .entry import main, run

__all__ = ["main", "run"]
