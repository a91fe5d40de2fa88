"""The serving side imports neither torch nor transformers (docs/architecture.md: an edge box installs only it)."""

from __future__ import annotations

import subprocess
import sys

SERVING_MODULES = [
    "ortinf",
    "ortinf.cli",
    "ortinf.manifest",
    "ortinf.cli.inspect_table",
    "ortinf.runtime.worker.decoder_graph",
    "ortinf.runtime.worker.encoder_graph",
    "ortinf.runtime.worker.model_input",
    "ortinf.runtime.worker.kv_pool",
    "ortinf.providers.registry",
    "ortinf.providers.session",
    "ortinf.providers.table",
    "ortinf.runtime.engine.llm_engine",  # with structured output (llguidance) and speculative decoding
    "ortinf.serve.app",
    "ortinf.cli.chat",
]


def test_serving_modules_do_not_import_torch_or_transformers():
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in SERVING_MODULES)
        + "heavy = sorted(m for m in ('torch', 'transformers', 'optimum', 'ray') if m in sys.modules)\n"
        + "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"serving imports pulled in: {result.stdout.strip()}"


# The floors of docs/architecture.md, lowest first: a module imports only from its own floor or below
# (lazy imports inside functions included). The exporter sits beside the runtime: only the public API,
# the bundled models and the CLI reach it (lazily), and it reaches nothing above the manifest's floor
# but the worker's graphs it verifies with.
FLOORS = {"errors": 0, "manifest": 0, "json_text": 0, "tokenizer": 0, "kernels": 1, "providers": 1, "config": 2, "sample": 3,
          "worker": 4, "core": 5, "engine": 6, "tasks": 7, "llm": 8, "bundled": 8, "serve": 8, "matrix": 9, "cli": 10}
EXPORTER_USERS = {"ortinf", "ortinf.bundled", "ortinf.cli.export"}


def room(parts) -> str:
    """The floor a module stands on: ortinf.x.* is x's, and the runtime's floors are its subpackages
    (ortinf.runtime.engine.* is the engine's)."""
    if len(parts) > 2 and parts[1] == "runtime":
        return parts[2]
    return parts[1] if len(parts) > 1 else ""


def imports(path) -> list[str]:
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] if node.module != "ortinf" else [f"ortinf.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [name for name in found if name.startswith("ortinf.")]


def test_imports_point_down_the_floors():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    upward = []
    for path in sorted((root / "ortinf").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mine = FLOORS.get(room(parts)) if len(parts) > 1 and parts[1] != "__init__" else 11
        for name in imports(path):
            target = room(name.split("."))
            if target == "exporter":
                if module not in EXPORTER_USERS and not module.startswith("ortinf.exporter"):
                    upward.append(f"{module} -> {name}")
            elif mine is not None and FLOORS.get(target, 0) > mine:
                upward.append(f"{module} -> {name}")
            elif module.startswith("ortinf.exporter") and FLOORS.get(target, 0) > FLOORS["worker"]:
                upward.append(f"{module} -> {name}")
    assert not upward, "imports that run back up: " + ", ".join(upward)


def imported_modules(path) -> list[str]:
    """Every ortinf name an import statement may bring in: `from ortinf.x import y` gives ortinf.x.y (a
    module, when it is one) and ortinf.x."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [name for name in found if name.startswith("ortinf.")]


def test_no_import_circles():
    """No module reaches itself through imports (lazy ones included): the exporter's circle (api <-> whisper
    <-> whisper_cpu <-> seq2seq) was opened in issue 30 by a neutral cross-attention decoder module."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    graph: dict[str, set[str]] = {}
    for path in (root / "ortinf").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        graph[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = set()
    for path in (root / "ortinf").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for name in imported_modules(path):
            while name and name not in graph:  # `from ortinf.x import name`: the module is ortinf.x
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # a package's own __init__ is not a circle
                graph[module].add(name)
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, f"import circles: {circles}"


def test_only_tasks_call_the_engine_and_the_front_ends_stay_off_the_server():
    """tasks/ is the engine's only caller (issue 44): the public API, the CLI and the server's routes reach the
    engine through ortinf.tasks (a driver, a program, the package factory), and llm/cli import nothing of
    serve/ but the `serve` command itself (which starts it) and its option machinery (which reads ServerConfig's
    fields)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted((root / "ortinf").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        text = path.read_text()
        if module.startswith(("ortinf.llm", "ortinf.cli")) and module not in ("ortinf.cli.serve", "ortinf.cli.serve_options"):
            found += [f"{module} -> {name}" for name in imports(path) if name.startswith("ortinf.serve")]
        if not module.startswith(("ortinf.tasks", "ortinf.runtime")):
            for call in (".step()", ".add_request("):
                if call in text:
                    found.append(f"{module} calls the engine's {call}")
    assert not found, "; ".join(found)


def test_routes_import_no_route_and_never_prepare_by_hand():
    """serve/'s route modules (those with an APIRouter, in serve/api/<front-end>/) import no other route module: what
    generating routes share is in ortinf/serve/generation.py; and no server module prepares an engine request itself (LLMEngine.prepare
    is called through ortinf/tasks/text.py, which fans out n samples and picks beams once for every caller)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    serve = root / "ortinf" / "serve"

    def name(path: Path) -> str:
        return ".".join(path.relative_to(root).with_suffix("").parts)

    routes = {name(p) for p in serve.rglob("*.py") if "APIRouter(" in p.read_text()}
    assert {"ortinf.serve.api.openai.chat", "ortinf.serve.api.openai.responses", "ortinf.serve.api.anthropic.routes"} <= routes
    found = []
    for path in sorted(serve.rglob("*.py")):
        module = name(path)
        if module in routes:
            found += [f"{module} -> {name}" for name in imported_modules(path) if name in routes and name != module]
        if ".prepare(" in path.read_text():
            found.append(f"{module} calls .prepare(")
    assert not found, "; ".join(found)
