"""Checks docs/design.md §4's sizes, which ruff has no rule for: a module of t2t_lite/
or scripts/ (the benchmarks and their benchkit package) under MAX_MODULE_LINES lines,
a function under MAX_FUNCTION_LINES.

A module or function may exceed them only when EXCEPTIONS names it with the reason.
Prints one line per finding and exits 1 if there is any, and also when an exception
no longer applies, so that the list stays true.
"""

import ast
import pathlib
import sys

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECKED = (ROOT / "t2t_lite", ROOT / "scripts")

# "path" for a module, "path:qualified.name" for a function.
EXCEPTIONS = {
    "t2t_lite/hparams_sets.py:transformer_base": (
        "every hparam is declared here once, one line and comment each (design.md §5)"
    ),
}


def functions(tree):
    """(qualified name, node) of every function, methods and nested ones included."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((name, child))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def findings():
    """(key, message) of every size over its limit under CHECKED."""
    out = []
    for path in sorted(p for folder in CHECKED for p in folder.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES:
            out.append((relative, f"{relative}: {lines} lines > {MAX_MODULE_LINES}"))
        for name, node in functions(ast.parse(source)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                key = f"{relative}:{name}"
                message = f"{relative}:{node.lineno}: {name} is {length} lines"
                out.append((key, f"{message} > {MAX_FUNCTION_LINES}"))
    return out


def main():
    found = findings()
    problems = [message for key, message in found if key not in EXCEPTIONS]
    excused = {key for key, _ in found}
    problems += [
        f"{key}: listed in EXCEPTIONS but within the limits; remove it"
        for key in EXCEPTIONS
        if key not in excused
    ]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
