"""The rules of docs/architecture.md that code can break silently: no import cycle among the project's
modules, nothing imported upward (a model file knows neither the experiment, nor the data, nor
checkpoints; utils/ is the floor, importing none of the other packages; the product imports neither
benchmarks/ nor lab/), and a training loop small enough to read top to bottom."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("exp", "utils", "data_provider", "layers", "models")
# The harnesses users run (benchmarks/) and the cross-checks and one-off measurements (lab/, lab/README.md) import
# the product; the product (run.py and PACKAGES) imports neither, and benchmarks/ does not import lab/.
TOOLING = {"benchmarks": ("lab",), "lab": ()}

# package (or module) -> what it must never import, imports inside functions included
UPWARD = {
    "utils": ("exp", "run", "models", "layers", "data_provider"),  # the floor: it serves every package
    "data_provider": ("exp", "run", "models", "layers"),
    "layers": ("exp", "run", "models", "data_provider"),
    "models": ("exp", "run", "data_provider", "utils.checkpoint"),
    "exp": ("run",),
}
# A release's reference cross-check, models/foundation/<release>/crosscheck.py, is lab code kept beside its release:
# it reads the release as the product does (utils.checkpoint, exp.export) and runs in a side environment, so the
# models' rules do not bind it; instead no module of the product imports it.
CROSSCHECK = ("models.foundation.", ".crosscheck")
LOOP, LOOP_LINES, FUNCTION_LINES = "exp/exp_forecast.py", 300, 50


def project_modules(root):
    """{dotted name: path} of run.py and every module of the project's packages under `root`, less a release's own
    tests (models/foundation/<release>/tests/: test code beside its release, no module of the product)."""
    modules = {"run": root / "run.py"} if (root / "run.py").exists() else {}
    for package in (*PACKAGES, *TOOLING):
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[:2] == ("models", "foundation") and "tests" in parts[3:-1]:
                continue
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(root):
    """{module: the project modules it imports, anywhere in its file}."""
    modules = project_modules(root)
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)  # `from utils import distributed`
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def import_cycle(graph):
    """One cycle of the graph as [a, b, ..., a], or None."""
    done, path = set(), []

    def visit(module):
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            cycle = visit(imported)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    return next(filter(None, map(visit, sorted(graph))), None)


def is_crosscheck(module):
    return module.startswith(CROSSCHECK[0]) and module.endswith(CROSSCHECK[1])


def upward_imports(graph):
    """'a imports b' for each import that UPWARD forbids, and each import of a release's cross-check."""
    def within(module, prefix):
        return module == prefix or module.startswith(prefix + ".")

    def banned_for(module):
        return ("run",) if is_crosscheck(module) else next(
            (banned for package, banned in UPWARD.items() if within(module, package)), ())

    return [f"{module} imports {imported}" for module, imports in sorted(graph.items()) for imported in sorted(imports)
            if any(within(imported, b) for b in banned_for(module)) or is_crosscheck(imported)]


def tooling_imports(graph):
    """'a imports b' for each module of the product importing benchmarks/ or lab/, and of benchmarks/ importing lab/."""
    def top(module):
        return module.split(".")[0]

    banned = {**{package: tuple(TOOLING) for package in ("run", *PACKAGES)}, **TOOLING}
    return [f"{module} imports {imported}" for module, imports in sorted(graph.items()) for imported in sorted(imports)
            if top(imported) in banned.get(top(module), ())]


def long_functions(path, limit):
    """'name (n lines)' for each function or method of the file longer than `limit` lines, decorators included."""
    tree = ast.parse(path.read_text(), str(path))
    spans = [(node.name, node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1)
             for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [f"{name} ({lines} lines)" for name, lines in spans if lines > limit]


def test_no_import_cycle_among_the_projects_modules():
    cycle = import_cycle(import_graph(REPO))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_is_imported_upward():
    assert upward_imports(import_graph(REPO)) == []


def test_the_checks_find_a_planted_cycle_and_upward_import(tmp_path):
    """The checkers on a tiny tree: a model that reads checkpoints, utils that reach into exp and, inside a
    function, into models, and a relative import that closes a cycle."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "models" / "Net.py").write_text("def load():\n    from utils.checkpoint import load_weights\n")
    (tmp_path / "utils" / "checkpoint.py").write_text("from exp import steps\n")
    (tmp_path / "utils" / "arguments.py").write_text("def parse_args():\n    from models import canonical_name\n")
    (tmp_path / "exp" / "steps.py").write_text("from .loop import run\n")
    (tmp_path / "exp" / "loop.py").write_text("import exp.steps\n")
    (tmp_path / "models" / "foundation" / "net").mkdir(parents=True)
    (tmp_path / "models" / "foundation" / "net" / "crosscheck.py").write_text("from utils.checkpoint import export\n")
    (tmp_path / "models" / "foundation" / "net" / "Net.py").write_text("from . import crosscheck\n")
    graph = import_graph(tmp_path)
    assert import_cycle(graph) == ["exp.loop", "exp.steps", "exp.loop"]
    assert upward_imports(graph) == ["models.Net imports utils.checkpoint",
                                     "models.foundation.net.Net imports models.foundation.net.crosscheck",
                                     "utils.arguments imports models", "utils.checkpoint imports exp",
                                     "utils.checkpoint imports exp.steps"]


def test_the_product_imports_neither_benchmarks_nor_lab(tmp_path):
    assert tooling_imports(import_graph(REPO)) == []
    for package in (*PACKAGES, *TOOLING):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "run.py").write_text("import lab.tool\n")
    (tmp_path / "exp" / "outputs.py").write_text("def table():\n    from benchmarks.report import summarise\n")
    (tmp_path / "benchmarks" / "report.py").write_text("from lab import tool\n")
    (tmp_path / "lab" / "tool.py").write_text("from benchmarks import report\nimport exp.outputs\n")
    assert tooling_imports(import_graph(tmp_path)) == [
        "benchmarks.report imports lab", "benchmarks.report imports lab.tool", "exp.outputs imports benchmarks.report",
        "run imports lab.tool"]


def test_the_training_loop_stays_small_enough_to_read_top_to_bottom():
    """exp/exp_forecast.py grew from 232 to 384 lines before issue 37 cut it back: bookkeeping belongs in
    exp/steps.py, files in exp/outputs.py, the training state in utils/checkpoint.py."""
    lines = len((REPO / LOOP).read_text().splitlines())
    assert lines < LOOP_LINES, f"{LOOP} has {lines} lines (under {LOOP_LINES}, please)"
    assert long_functions(REPO / LOOP, FUNCTION_LINES) == []


# The run is settled once: exp.settings.resolve_args (through these functions, before it returns the read-only Run)
# and the parse are the only code that writes a run's arguments; every other module reads them.
SETTLING = {"utils.arguments": ("parse_args",),
            "exp.settings": ("fill_defaults", "resolve_args", "check_task", "_native_quantiles", "_check_probabilistic",
                             "_fill_shapes", "_split_data_parallel_batch", "_split_global_batch",
                             "_check_weights_sources", "settle", "replace", "for_itr")}


def _is_run(node):
    """`args` or `<anything>.args`: the names the code gives a run."""
    return (isinstance(node, ast.Name) and node.id == "args") or (isinstance(node, ast.Attribute) and node.attr == "args")


def run_writes(root):
    """'module.function writes args.name' for every write to a run outside SETTLING: an assignment (augmented or
    not) to an attribute of it, setattr, delattr or an item of its vars() / __dict__."""
    found = []
    for module, path in project_modules(root).items():
        if module.split(".")[0] not in ("run", "exp", "utils", "data_provider", "layers", "models"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                continue
            name = getattr(function, "name", "<module>")
            if name in SETTLING.get(module, ()):
                continue
            body = ([s for s in function.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
                    if isinstance(function, ast.Module) else [function])  # a module's functions: walked on their own
            for node in (n for part in body for n in ast.walk(part)):
                targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                           [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
                for target in (t for each in targets for t in ast.walk(each)):
                    if isinstance(target, ast.Attribute) and _is_run(target.value):
                        found.append(f"{module}.{name} writes args.{target.attr}")
                    elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Call)
                          and getattr(target.value.func, "id", None) == "vars" and target.value.args
                          and _is_run(target.value.args[0])):
                        found.append(f"{module}.{name} writes vars(args)[...]")
                    elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
                          and target.value.attr == "__dict__" and _is_run(target.value.value)):
                        found.append(f"{module}.{name} writes args.__dict__[...]")
                if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr")
                        and node.args and _is_run(node.args[0])):
                    found.append(f"{module}.{name} calls {node.func.id}(args, ...)")
    return sorted(set(found))


def test_no_module_writes_the_run_after_it_is_settled():
    assert run_writes(REPO) == []


def test_the_check_finds_a_planted_write_to_the_run(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "run.py").write_text("def main(args):\n    args.seed += 1\nclass A:\n    pass\nargs.ddp = True\n")
    (tmp_path / "exp" / "exp_basic.py").write_text("class Exp:\n    def __init__(self, args):\n"
                                                   "        self.args = args\n        self.args.dropout_keyed = {}\n")
    (tmp_path / "exp" / "settings.py").write_text("def resolve_args(args):\n    args.mark_dim = 4\n"
                                                  "def later(args):\n    setattr(args, 'gpu', None)\n")
    (tmp_path / "data_provider" / "m4.py").write_text("def short_term(args):\n    args.pred_len, args.seq_len = 6, 12\n"
                                                      "    vars(args)['label_len'] = 6\n")
    (tmp_path / "models" / "Net.py").write_text("class Model:\n    def __init__(self, configs):\n"
                                                "        configs.pred_len *= 2\n")  # its own copy: allowed
    assert run_writes(tmp_path) == [
        "data_provider.m4.short_term writes args.pred_len", "data_provider.m4.short_term writes args.seq_len",
        "data_provider.m4.short_term writes vars(args)[...]", "exp.exp_basic.__init__ writes args.dropout_keyed",
        "exp.settings.later calls setattr(args, ...)", "run.<module> writes args.ddp", "run.main writes args.seed"]


def test_a_settled_run_refuses_every_write():
    """resolve_args returns a read-only Run: assignment and deletion raise, naming the field; replace and for_itr
    give other runs; the model's configs is a plain copy, widened explicitly; what was given comes from the parse."""
    import argparse

    import pytest

    from exp.settings import Run, SettledError, model_configs, resolve_args
    from tests.helpers import make_args

    run = resolve_args(make_args("--model", "DLinear", "--data", "synthetic", "--loss", "quantile",
                                 "--quantiles", "0.1,0.5,0.9", "--seq_len", "48", "--pred_len", "12"), 1)
    assert isinstance(run, Run)
    with pytest.raises(SettledError, match="seq_len cannot change"):
        run.seq_len = 96
    with pytest.raises(SettledError):
        setattr(run, "dropout_keyed", {})
    with pytest.raises(SettledError):
        del run.loss
    assert resolve_args(run, 1) is run  # settled once
    assert run.given >= {"model", "data", "loss", "quantiles", "seq_len", "pred_len"} and "batch_size" not in run.given
    assert run.objective.levels == (0.1, 0.5, 0.9) and run.width == 3 and run.weights_source is None  # it trains
    second = run.for_itr(1)
    assert (second.seed, run.seed) == (run.seed + 1, run.seed) and second.setting.endswith(f"seed{run.seed + 1}_1")
    with pytest.raises(SettledError):
        second.seed = 0
    configs = model_configs(run)
    assert type(configs) is argparse.Namespace and (configs.pred_len, configs.output_width, run.pred_len) == (36, 3, 12)
    assert not set(Run.RUN_FIELDS) & set(vars(configs))
    configs.seq_len = 1  # the model's own copy
    assert run.seq_len == 48


# ------------------------------------------------------------ a release is one folder
# A released foundation model is models/foundation/<release>/: its model (<Name>.py, --model <Name>), adapter,
# cross-check and README. No other file of code or configuration names it, by its --model name or its folder's
# path, so that adding a release is one new folder and one row of the foundation contract's table: that row is the
# one line of tests/test_foundation.py that may name it. pyproject.toml's optional dependencies name packages (their
# comments say which --model each installs for), so that section may too.
ROW_FILE = "tests/test_foundation.py"
RULE_FILE = "tests/test_architecture.py"  # this file
OPTIONAL_DEPENDENCIES = "[project.optional-dependencies]"
# The files that may name releases outside their folders, each with the release folders it names: none is left (a
# release's own tests live in its folder, models/foundation/<release>/tests/, and every other check picks its release
# from tests/test_foundation.py's table), and none may join.
PENDING = {}


def releases(root):
    """{folder: --model name} of root/models/foundation/<folder>/<Name>.py defining a Model class."""
    found = {}
    for folder in sorted(path for path in (root / "models" / "foundation").glob("*") if path.is_dir()):
        for path in sorted(folder.glob("*.py")):
            if "class Model(" in path.read_text():
                found[folder.name] = path.stem
    return found


def _checked_lines(rel, text):
    """The lines of a file the rule reads: pyproject.toml without its optional-dependencies section."""
    lines, inside = [], False
    for line in text.splitlines():
        if rel == "pyproject.toml" and line.startswith("["):
            inside = line.strip() == OPTIONAL_DEPENDENCIES
        if not inside:
            lines.append(line)
    return lines


def files_naming_releases(root):
    """{file: the release folders whose release it names (by --model name or folder path) outside them, beyond the
    table's one row}, for every .py and .toml file."""
    found = releases(root)
    # a name followed by "-<digit>" is another release's (NX-AI/TiRex-2 is TiRex2's, not TiRex's)
    patterns = {name: re.compile(rf"\b{re.escape(name)}\b(?!-\d)|foundation[./]{re.escape(folder)}\b")
                for folder, name in found.items()}
    named = {}
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.toml")]):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") or part.endswith(".egg-info") for part in parts):
            continue
        rel = "/".join(parts)
        if rel == RULE_FILE:
            continue
        lines = _checked_lines(rel, path.read_text(errors="replace"))
        for folder, name in found.items():
            if rel.startswith(f"models/foundation/{folder}/"):
                continue
            hits = sum(1 for line in lines if patterns[name].search(line))
            if hits > (1 if rel == ROW_FILE else 0):
                named.setdefault(rel, []).append(folder)
    return named


def test_a_release_is_named_only_in_its_folder():
    named = files_naming_releases(REPO)
    new = {rel: names for rel, names in named.items() if not set(names) <= set(PENDING.get(rel, ()))}
    assert not new, f"files naming a release outside its folder (models/foundation/<release>/): {new}"
    gone = {rel: sorted(set(names) - set(named.get(rel, ()))) for rel, names in PENDING.items()
            if set(names) - set(named.get(rel, ()))}
    assert not gone, f"no longer named, drop them from PENDING: {gone}"


def test_the_release_rule_finds_a_planted_name(tmp_path):
    """A tiny tree: a release folder, its name in the product, in a second line of the table, and in pyproject's
    optional dependencies (allowed) and elsewhere in pyproject (not)."""
    (tmp_path / "models" / "foundation" / "net").mkdir(parents=True)
    (tmp_path / "models" / "foundation" / "net" / "NetX.py").write_text("class Model(object):\n    pass\n")
    (tmp_path / "models" / "foundation" / "net" / "adapter.py").write_text("MODEL = 'NetX'\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_foundation.py").write_text("ROWS = [Row('NetX', folder='net')]\n")
    (tmp_path / "pyproject.toml").write_text("[project.optional-dependencies]\nnet = ['netx']  # --model NetX\n")
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "tools.py").write_text("import os\n")
    assert files_naming_releases(tmp_path) == {}
    (tmp_path / "utils" / "tools.py").write_text("from models.foundation.net import adapter  # for NetX\n")
    (tmp_path / "tests" / "test_foundation.py").write_text("ROWS = [Row('NetX', folder='net')]\nSPECIAL = 'NetX'\n")
    (tmp_path / "pyproject.toml").write_text("[project.optional-dependencies]\nnet = ['netx']  # --model NetX\n"
                                             "[tool.x]\nname = 'NetX'\n")
    assert files_naming_releases(tmp_path) == {"pyproject.toml": ["net"], "tests/test_foundation.py": ["net"],
                                               "utils/tools.py": ["net"]}
