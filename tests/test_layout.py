"""
The layout that shows the method: the top level holds the design's files and nothing else; every other module lives
in a folder named for its role; the method's files import no folder, train.py and eval.py only the readers and the
run management; nothing imports upward; train.py's import chain is at most 3 deep and never reaches a picture; one
training step, counted by following its imports, stays within its budget, and no file grows fat; every relative link
and file path the README names exists.

    python -m pytest -q tests/test_layout.py
    python -m pytest -q -n 0 -s tests/test_layout.py     # also prints the step's files and lines (one process)
"""
import ast
import functools
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHOD = ("train.py", "model.py", "loss.py", "lora.py", "data.py", "eval.py", "configurator.py")  # the design card's
GROUND_FLOOR = ("common.py", "media.py", "train_step.py", "deltanet.py", "rerank.py")  # process; media; the shared
# step; a kernel; the reranker's head
FOLDERS = ("readers", "runs", "tools", "shapes", "bench", "cluster", "config", "tests", "docs")
STEP = ("train", "train_step", "model", "loss", "data", "lora", "runs.outdir")  # the loop, what its steps call, its log
# Guards with room for a fork, not targets: a step runs about 3,300 lines today, the largest module about 510.
STEP_LINES = 4000  # the most lines one step may run (DESIGN: a reader holds a step in mind)
FILE_LINES = 550  # the most lines a module may have


def project_modules():
    """{module name: its file} of every Python module of the project (config files and tests aside)."""
    modules = {name[:-3]: os.path.join(ROOT, name) for name in METHOD + GROUND_FLOOR}
    for folder in ("readers", "runs", "tools", "shapes", "bench"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith(".py") and name != "__init__.py":
                modules[f"{folder}.{name[:-3]}"] = os.path.join(ROOT, folder, name)
    return modules


@functools.lru_cache(maxsize=None)
def imports_of(module):
    """The project modules `module` imports anywhere in its file (at the top or inside a function)."""
    modules = project_modules()
    tree = ast.parse(open(modules[module]).read())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in modules and name != module}
    return frozenset(found)


def depth(module, seen=()):
    """The longest chain of project imports that starts at module (its edges)."""
    assert module not in seen, f"an import cycle: {' -> '.join(seen + (module,))}"
    return max((1 + depth(other, seen + (module,)) for other in imports_of(module)), default=0)


def chain(module):
    """One longest import chain from module, for the message."""
    longest = max(imports_of(module), key=depth, default=None)
    return [module] + (chain(longest) if longest else [])


def test_the_top_level_holds_the_design_and_the_rest_lives_in_rooms():
    python = sorted(name for name in os.listdir(ROOT) if name.endswith(".py"))
    assert python == sorted(METHOD + GROUND_FLOOR)
    folders = sorted(name for name in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, name))
                     and not name.startswith(".") and name not in ("data", "out", "__pycache__"))
    assert folders == sorted(FOLDERS)
    for folder in ("readers", "runs", "tools", "shapes", "bench"):  # run as python -m folder.script, no path tricks
        assert os.path.isfile(os.path.join(ROOT, folder, "__init__.py")), folder
    for module, path in project_modules().items():
        assert "sys.path" not in open(path).read(), module


def test_nothing_imports_upward_and_the_method_imports_no_room():
    modules = project_modules()
    for module in modules:
        if "." in module:
            continue  # a folder may import the top level and other folders
        rooms = {other.split(".")[0] for other in imports_of(module) if "." in other}
        allowed = {"readers", "runs"} if module in ("train", "eval") else set()
        assert rooms <= allowed, (module, sorted(imports_of(module)))
    for module in modules:  # the readers stand below the run management (runs/ reads results through them)
        if module.startswith("readers."):
            assert not any(other.startswith("runs") for other in imports_of(module)), (module, sorted(imports_of(module)))
    for module in ("common", "media", "deltanet"):  # the ground floor stands on nothing
        assert imports_of(module) == frozenset(), (module, sorted(imports_of(module)))
    assert imports_of("configurator") <= {"common"}


def test_trains_imports_are_at_most_three_deep_and_draw_nothing():
    assert depth("train") <= 3, " -> ".join(chain("train"))
    direct = imports_of("train")
    assert not any(module.startswith("tools") for module in direct) and "readers.mmeb" not in direct

    def reached(module):
        return {module} | {m for other in imports_of(module) for m in reached(other)}
    everything = reached("train")
    assert not any(module.startswith("tools") for module in everything)  # no picture on the training path
    sources = "".join(open(project_modules()[module]).read() for module in everything)
    assert "matplotlib" not in sources


def step_modules():
    """The modules one training step runs: train.py's loop, the modules it calls in a step (STEP: the shared step,
    the method, the per-step log), and everything those import, followed to the end (train.py's other imports are
    its set-up: the config, the readers, the checkpoints)."""
    found, todo = {"train"}, list(STEP[1:])
    while todo:
        module = todo.pop()
        if module not in found:
            found.add(module)
            todo += imports_of(module)
    return sorted(found)


def line_count(module):
    with open(project_modules()[module]) as f:
        return sum(1 for _ in f)


def test_one_step_is_counted_as_it_runs_and_stays_within_its_budget():
    lines = {module: line_count(module) for module in step_modules()}
    print(f"one training step: {len(lines)} files, {sum(lines.values()):,} lines: {lines}")
    assert set(lines) >= set(STEP) and sum(lines.values()) <= STEP_LINES, lines


def test_no_module_grows_fat():
    fat = {module: line_count(module) for module in project_modules() if line_count(module) > FILE_LINES}
    assert not fat, f"over {FILE_LINES} lines: {fat}"


def named_paths():
    """(page, path) of every relative link of README.md and docs/*.md (relative to its page) and every repository
    path they name in backticks (relative to the root: a folder of the layout, then a name)."""
    pages = ["README.md"] + [os.path.join("docs", name) for name in sorted(os.listdir(os.path.join(ROOT, "docs")))
                             if name.endswith(".md")]
    found = set()
    for page in pages:
        text = open(os.path.join(ROOT, page)).read()
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if not re.match(r"\w+://", link) and link.split("#")[0]:
                found.add((page, os.path.normpath(os.path.join(os.path.dirname(page), link.split("#")[0]))))
        for path in re.findall(r"`((?:readers|runs|tools|shapes|bench|cluster|config|tests|docs)/[\w./-]*\w)`", text):
            found.add((page, path))
    return sorted(found)


def test_the_readme_and_the_docs_name_paths_that_exist():
    missing = [(page, path) for page, path in named_paths() if not os.path.exists(os.path.join(ROOT, path))]
    assert len(named_paths()) > 30 and not missing, missing
    linked = {path for page, path in named_paths() if page == "README.md"}
    assert all(os.path.join("docs", name) in linked for name in os.listdir(os.path.join(ROOT, "docs"))
               if name.endswith(".md")), "every page of docs/ is linked from the README"
