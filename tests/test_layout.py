"""The code layout is what docs/design.md §4 and docs/layout.md say it is: imports
run one way through the layers, and docs/layout.md lists every module that exists and
no other."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "t2t_lite"

# Bottom-up (design.md §4): a module may import its own layer and those before it.
# A layer is a top-level module, a package, or a part of training/.
LAYERS = [
    {
        "errors",
        "constants",
        "fileio",
        "console",
        "graph",
        "tf_data",
        "usr_dir",
        "state_variables",
    },
    {"hparams", "registry"},
    {"hparams_sets", "hparams_checks", "data", "models", "optim", "outputs"},
    {"registrations", "decoding"},
    {"training/cluster"},
    {"training/step"},
    {"training/reporting"},
    {"training/opening"},
    {"training/loop"},
    {"bin", "t2t_lite"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _modules():
    """{dotted module name: path} of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _unit(module):
    """The layer unit of a dotted module name (see LAYERS)."""
    parts = module.split(".")[1:]
    if not parts:
        return "t2t_lite"
    if parts[0] == "training" and len(parts) > 1:
        return "training/" + parts[1]
    return parts[0]


def _imports(path, modules):
    """The package's modules that `path` imports (`from a import b` counts as a.b
    when b is a module)."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                imported.add(name if name in modules else node.module)
    return {name for name in imported if name.split(".")[0] == "t2t_lite"}


def test_every_unit_has_a_layer():
    units = {_unit(module) for module in _modules()} - {"training"}
    assert units - set(RANK) == set()


def test_imports_run_one_way():
    modules = _modules()
    upward = []
    for module, path in sorted(modules.items()):
        rank = RANK.get(_unit(module))
        if rank is None:  # training/__init__.py: documentation only
            continue
        for imported in _imports(path, modules):
            if RANK[_unit(imported)] > rank:
                upward.append(f"{module} imports {imported}")
    assert upward == []


def _readme_layout():
    """The module paths docs/layout.md lists under t2t_lite/."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    block = text.split("\n    t2t_lite/\n", 1)[1].split("\n    configs/", 1)[0]
    listed = set()
    for line in block.splitlines():
        # An entry starts in column 6; deeper lines continue a description.
        if not line.startswith("      ") or line[6:7] in ("", " "):
            continue
        names = re.findall(r"[\w/]+\.py", line[6:].split("  ")[0])
        if not names:  # a folder's own line
            continue
        folder = names[0].rpartition("/")[0]
        for name in names:
            listed.add(name if "/" in name or not folder else f"{folder}/{name}")
    return listed


def test_layout_page_lists_every_module():
    on_disk = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
    }
    listed = _readme_layout()
    assert sorted(on_disk - listed) == [], "missing from docs/layout.md"
    assert sorted(listed - on_disk) == [], "in docs/layout.md, not on disk"
