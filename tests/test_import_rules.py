"""The package's house rules, checked on its imports (imports inside functions count): the folders and top-level
modules form layers, in the order of the layout map in docs/architecture.md, and each imports only the layers above
it; no circles between modules or between folders; inference, post-processing and scoring never import the training
code."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cellseg"
MAP_PAGE = PACKAGE.parent / "docs" / "architecture.md"  # its "## Layout" section holds the map
DOWNSTREAM_OF_TRAINING = ("cellseg.infer", "cellseg.postprocess", "cellseg.eval")
# The layers, top to bottom: each folder or top-level module imports only those before it (the layout map).
LAYERS = ("classes", "manifests", "logs", "cache", "pool", "config", "data", "fetch", "ingest", "synth", "models",
          "runtime", "losses", "eval", "infer", "postprocess", "volume", "train", "viz", "decide", "export", "report", "cli", "docgen",
          "__main__")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module(f) for f in files}
    graph: dict[str, set[str]] = {}
    for f in files:
        me = _module(f)
        package = me if f.name == "__init__.py" else me.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                # a package's __init__ re-exporting its children (and a child importing its package) is no circle
                if name and name != me and not name.startswith(me + ".") and not me.startswith(name + "."):
                    deps.add(name)
        graph[me] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _documented_map() -> list[str]:
    """The entries of the layout map under `cellseg/`, top to bottom (`classes` for `classes.py`)."""
    section = MAP_PAGE.read_text(encoding="utf-8").split("\n## Layout\n", 1)[1]
    lines = section.split("```", 2)[1].splitlines()
    entries = []
    for line in lines[lines.index("cellseg/") + 1:]:
        if not line.startswith(" "):  # the next top-level folder of the repository (configs/, ...)
            break
        entry = re.match(r" {2}(\w+)(?:/|\.py) ", line)  # continuation lines are indented further
        if entry:
            entries.append(entry.group(1))
    return entries


def test_the_tested_layers_are_the_documented_map():
    assert _documented_map() == list(LAYERS)


def test_every_folder_and_top_level_module_is_a_layer():
    layers = {_folder(m).removeprefix("cellseg.") for m in _graph()} - {"cellseg"}
    assert sorted(layers) == sorted(LAYERS)


def test_each_layer_imports_only_layers_above_it():
    rank = {f"cellseg.{layer}": i for i, layer in enumerate(LAYERS)}
    bad = [f"{m} -> {d}" for m, deps in _graph().items() for d in sorted(deps)
           if _folder(m) != "cellseg" and _folder(d) not in ("cellseg", _folder(m))
           and rank[_folder(d)] > rank[_folder(m)]]
    assert bad == []


def test_no_import_circle_between_modules():
    assert _cycles(_graph()) == []


def test_no_import_circle_between_folders():
    folders: dict[str, set[str]] = {}
    for module, deps in _graph().items():
        for dep in deps:
            if _folder(dep) != _folder(module):
                folders.setdefault(_folder(module), set()).add(_folder(dep))
    folders = {f: {d for d in deps if d != "cellseg"} for f, deps in folders.items() if f != "cellseg"}
    assert _cycles(folders) == []


def test_inference_postprocessing_and_scoring_never_import_training():
    bad = [f"{m} -> {d}" for m, deps in _graph().items() if m.startswith(DOWNSTREAM_OF_TRAINING)
           for d in deps if d == "cellseg.train" or d.startswith("cellseg.train.")]
    assert bad == []
