#!/usr/bin/env python3
"""Print the largest import circle of each crate under crates/.

For every crate, the files of its src/ tree are the nodes of a graph. A file has an edge
to another when it declares it (`mod x;`) or names something in it by a path from the
crate root (`use crate::a::b`, `crate::a::f()`) or relative to its own module
(`super::x`, `self::x`). The largest strongly connected component of that graph is the
largest set of files that all import each other, directly or through the others; the
architecture allows no circle of more than 4 files in any crate.

Paths resolve along the module tree the `mod` declarations build (with `#[path]` and
inline `mod name { ... }` blocks honoured), to the deepest module that has a file of its
own: `crate::repo::diff::Change` is an edge to `repo/diff.rs` when that file exists and
to `repo.rs` (or `repo/mod.rs`) otherwise. A crate with both a library and binaries has
one tree per root; each is its own graph, and the largest component of any is reported.

Usage: scripts/import-cycles.py [--all] [--edges] [--max N] [CRATE_DIR ...]
    --all     list every component of more than one file, not only the largest
    --edges   print each crate's file-to-file edges too
    --max N   exit 1 when a crate has a circle of more than N files (scripts/lint.sh: 4)
Standard library only; run it from anywhere in the repository.
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_code(text):
    """The source with comments, string and char literals blanked out (offsets kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif re.match(r'b?r#*"', text[i:i + 40]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            m = re.match(r'b?r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            m = re.match(r"'(?:\\[^']{1,10}|[^\\'])'", text[i:])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:  # a lifetime or a label
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code)


def expand_use_tree(tree):
    """`a::{b, c::{d, self}}` -> ['a::b', 'a::c::d', 'a::c']."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [re.sub(r"::self$", "", tree)]
    prefix, inner = tree[:brace], tree[brace + 1:tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:j])
            start = j + 1
    parts.append(inner[start:])
    paths = []
    for part in filter(None, parts):
        for sub in expand_use_tree(part):
            paths.append(prefix.rstrip(":") if sub == "self" else prefix + sub)
    return paths


class Module:
    def __init__(self, path, file, inline=False):
        self.path = path  # tuple of names from the crate root
        self.file = file  # the file holding its items
        self.inline = inline
        self.children = {}
        self.imports = {}  # name -> (anchor, path) of a `use` in this module
        self.globs = []  # (anchor, path) of `use path::*`


class Tree:
    """The module tree of one crate root, built from its `mod` declarations."""

    def __init__(self, root_file):
        self.files = {}  # file -> (module, stripped code)
        self.refs = []  # (file, module of the reference, path segments)
        self.edges = {}
        self.root = Module((), root_file)
        self._load(self.root, root_file, mod_rs=True)

    def _load(self, module, file, mod_rs):
        if file in self.files or not os.path.isfile(file):
            return
        with open(file, encoding="utf-8") as handle:
            code = strip_code(handle.read())
        self.files[file] = (module, code)
        self.edges.setdefault(file, set())
        base = os.path.dirname(file) if mod_rs else os.path.splitext(file)[0]
        self._scan(module, file, code, 0, len(code), base)

    def _scan(self, module, file, code, start, end, base):
        pattern = re.compile(
            r'(?:#\[path\s*=\s*"(?P<p>[^"]*)"\]\s*)?(?:#\[[^\]]*\]\s*)*'
            r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(?P<name>" + IDENT + r")\s*(?P<end>[;{])"
        )
        raw = None
        pos = start
        inline_spans = []
        while True:
            m = pattern.search(code, pos, end)
            if not m:
                break
            name = m.group("name")
            if m.group("end") == "{":
                close = matching_brace(code, m.end() - 1)
                child = Module(module.path + (name,), file, inline=True)
                module.children[name] = child
                self._scan(child, file, code, m.end(), close, os.path.join(base, name))
                inline_spans.append((m.end(), close))
                pos = close + 1
                continue
            pos = m.end()
            if m.group("p"):
                if raw is None:
                    raw = open(file, encoding="utf-8").read()
                path_attr = re.search(
                    r'#\[path\s*=\s*"([^"]*)"\][^;]*?mod\s+' + name + r"\s*;", raw
                )
                rel = path_attr.group(1) if path_attr else m.group("p")
                target = os.path.normpath(os.path.join(os.path.dirname(file), rel))
                child_mod_rs = True
            else:
                flat = os.path.join(base, name + ".rs")
                nested = os.path.join(base, name, "mod.rs")
                target = flat if os.path.isfile(flat) else nested
                child_mod_rs = target == nested
            child = Module(module.path + (name,), target)
            module.children[name] = child
            self.edges.setdefault(file, set()).add(target)
            self._load(child, target, mod_rs=child_mod_rs)
        # References made by this module's own code (not its inline children's).
        spans = sorted(inline_spans)
        for ref in re.finditer(r"(?<![\w$])(crate|super|self)((?:\s*::\s*(?:" + IDENT + r"|\{))+)", code[start:end]):
            at = start + ref.start()
            if any(a <= at < b for a, b in spans):
                continue
            self.refs.append((file, module, ref.group(1), self._tail(code, start + ref.end(1))))
        # What the module's `use` items bring into scope, so that a path through a re-export
        # (`crate::Error` for `pub use error::Error` in the root) resolves to the file that
        # defines the item, not to the file that re-exports it.
        for use in re.finditer(r"\buse\s+([^;]*);", code[start:end]):
            at = start + use.start()
            if any(a <= at < b for a, b in spans):
                continue
            tree = use.group(1).strip()
            tree = re.sub(r"^::", "", tree)
            for path, alias in self._use_paths(tree):
                segments = [s for s in path.split("::") if s]
                if segments and segments[0] in module.children:
                    # A path relative to this module (`use error::Error;` in the root).
                    segments = ["self"] + segments
                if not segments or segments[0] not in ("crate", "super", "self"):
                    continue
                if segments[-1] == "*":
                    module.globs.append((segments[0], segments[1:-1]))
                else:
                    module.imports[alias or segments[-1]] = (segments[0], segments[1:])

    @staticmethod
    def _use_paths(tree):
        """(path, alias) pairs of a use tree; the alias is None without `as`."""
        found = []
        for part in expand_use_tree(re.sub(r"\s+as\s+", " as ", tree)):
            found.append((part, None))
        aliases = dict(re.findall(r"(" + IDENT + r")\s+as\s+(" + IDENT + r")", tree))
        return [(p, aliases.get(p.split("::")[-1])) for p, _ in found]

    @staticmethod
    def _tail(code, at):
        """The path after `crate`/`super`/`self` at `at`, use-trees expanded."""
        m = re.match(r"\s*::\s*", code[at:])
        rest = code[at + m.end():] if m else ""
        if rest.startswith("{"):
            close = matching_brace(rest, 0)
            return expand_use_tree(rest[: close + 1])
        m = re.match(r"(?:" + IDENT + r"(?:\s*::\s*)?)+(?:\{)?", rest)
        if not m:
            return []
        text = m.group(0)
        if text.endswith("{"):
            close = matching_brace(rest, m.end() - 1)
            return expand_use_tree(rest[: close + 1])
        return [re.sub(r"\s+", "", text).rstrip(":")]

    def module_at(self, path):
        module = self.root
        for name in path:
            module = module.children.get(name)
            if module is None:
                return None
        return module

    def walk(self, module, anchor, segments, depth=0):
        """The deepest module a path names, following `use` re-exports."""
        if anchor == "crate":
            here = self.root
        elif anchor == "self":
            here = module
        else:
            here = self.module_at(module.path[:-1]) or self.root
        for i, name in enumerate(segments):
            if name == "super":
                here = self.module_at(here.path[:-1]) or self.root
                continue
            if name == "self":
                continue
            child = here.children.get(name)
            if child is not None:
                here = child
                continue
            if depth < 8 and name in here.imports:
                via_anchor, via = here.imports[name]
                return self.walk(here, via_anchor, via + segments[i + 1:], depth + 1)
            if depth < 8:
                for via_anchor, via in here.globs:
                    target = self.walk(here, via_anchor, via, depth + 1)
                    if target is not here and (
                        name in target.children or name in target.imports
                    ):
                        return self.walk(target, "self", segments[i:], depth + 1)
            break
        return here

    def resolve(self):
        for file, module, anchor, tails in self.refs:
            for tail in tails:
                segments = [s for s in tail.split("::") if s]
                here = self.walk(module, anchor, segments)
                if here.file != file:
                    self.edges[file].add(here.file)


def components(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
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
                result.append(sorted(component))
    return result


def crate_roots(crate):
    src = os.path.join(crate, "src")
    roots = [os.path.join(src, f) for f in ("lib.rs", "main.rs")]
    bin_dir = os.path.join(src, "bin")
    if os.path.isdir(bin_dir):
        for entry in sorted(os.listdir(bin_dir)):
            path = os.path.join(bin_dir, entry)
            roots.append(path if entry.endswith(".rs") else os.path.join(path, "main.rs"))
    return [r for r in roots if os.path.isfile(r)]


def main(argv):
    show_all = "--all" in argv
    show_edges = "--edges" in argv
    limit = None
    if "--max" in argv:
        at = argv.index("--max")
        limit = int(argv[at + 1])
        argv = argv[:at] + argv[at + 2:]
    crates = [a for a in argv if not a.startswith("--")]
    over = []
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not crates:
        crates_dir = os.path.join(top, "crates")
        crates = [os.path.join(crates_dir, c) for c in sorted(os.listdir(crates_dir))]
    for crate in crates:
        found = []
        files = set()
        if not crate_roots(crate):
            continue
        for root in crate_roots(crate):
            tree = Tree(root)
            tree.resolve()
            files.update(tree.files)
            found.extend(c for c in components(tree.edges) if len(c) > 1)
            if show_edges:
                src_dir = os.path.join(crate, "src") + os.sep
                for source in sorted(tree.edges):
                    for target in sorted(tree.edges[source]):
                        print(f"    {source.replace(src_dir, '')} -> {target.replace(src_dir, '')}")
        found.sort(key=lambda c: (-len(c), c))
        src = os.path.join(crate, "src") + os.sep
        name = os.path.relpath(crate, top)
        largest = len(found[0]) if found else 1
        print(f"{name}: {len(files)} files, largest import circle {largest} files")
        if limit is not None and largest > limit:
            over.append(f"{name} ({largest} files)")
        for component in found if show_all else found[:1]:
            listed = ", ".join(f.replace(src, "") for f in component)
            print(f"  [{len(component)}] {listed}")
    if over:
        print(
            f"import circles of more than {limit} files: {', '.join(over)}; move what the "
            "files share into a module they all import, below them",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
