#!/usr/bin/env python3
"""Check that the engine's imports run only downward through its layers.

crates/engine/src is a stack of layers (docs/architecture.md, "Engine layers"); a module
may import its own layer and the layers below it, never one above. LAYERS below names each
layer, bottom first, with the top-level modules (a folder, or a file at the crate root)
that belong to it. The import graph is the one scripts/import-cycles.py builds (`use
crate::...`, `crate::x::` paths, `super::`, re-exports followed to the file that defines
the item), so a path through the crate root's re-exports counts as an import of the
module that defines the item. The crate root (lib.rs) wires the layers together and is
not checked.

Exits 1 naming every edge from a lower layer to a higher one, or a module the table does
not place; prints that the layering is OK otherwise.

Usage: scripts/layers.py [CRATE_DIR]   (crates/engine unless given)
Standard library only; run it from anywhere in the repository.
"""

import importlib.util
import os
import sys

# Bottom first: (layer, top-level modules of crates/engine/src in it).
LAYERS = [
    ("foundation", ["foundation"]),
    ("model", ["model"]),
    ("host", ["host"]),
    ("store", ["store"]),
    ("image", ["image"]),
    ("backend", ["backend"]),
    ("supervisor", ["supervisor"]),
    ("facade", ["facade"]),
]

CRATE = os.path.join("crates", "engine")


def load_import_graph():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "import_cycles", os.path.join(here, "import-cycles.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def top_module(src, file):
    """The top-level module a file belongs to: its folder under src/, or its own stem."""
    rel = os.path.relpath(file, src)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def main():
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    crate = sys.argv[1] if len(sys.argv) > 1 else os.path.join(top, CRATE)
    src = os.path.join(crate, "src")
    rank = {}
    for index, (layer, modules) in enumerate(LAYERS):
        for name in modules:
            rank[name] = (index, layer)
    cycles = load_import_graph()
    problems = []
    for root in cycles.crate_roots(crate):
        tree = cycles.Tree(root)
        tree.resolve()
        for source in sorted(tree.edges):
            if source == root:
                continue
            source_module = top_module(src, source)
            if source_module not in rank:
                problems.append(
                    f"{os.path.relpath(source, src)}: module `{source_module}` is in no layer; "
                    "add it to LAYERS in scripts/layers.py"
                )
                continue
            for target in sorted(tree.edges[source]):
                if target == root:
                    # A path through the root that names no module: its real target, and so
                    # its layer, is unknown.
                    problems.append(
                        f"{os.path.relpath(source, src)} names something through the crate "
                        "root that resolves to no module; name its module instead"
                    )
                    continue
                target_module = top_module(src, target)
                if target_module not in rank:
                    continue  # reported as a source of its own
                (low, low_name), (high, high_name) = rank[source_module], rank[target_module]
                if high > low:
                    problems.append(
                        f"{os.path.relpath(source, src)} ({low_name}) imports "
                        f"{os.path.relpath(target, src)} ({high_name}), a layer above it"
                    )
    names = " < ".join(layer for layer, _ in LAYERS)
    if problems:
        for problem in sorted(set(problems)):
            print(f"layers: {problem}")
        print(f"layers: {os.path.relpath(crate, top)}: {len(set(problems))} problems; the order is {names}")
        return 1
    print(f"layers: {os.path.relpath(crate, top)}: OK, every import runs downward ({names})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
