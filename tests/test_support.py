"""The suite's own machinery (tests/support/): a package the factory hands out is the export its recipe and options
name, made once and never handed out after its source changed; a test cannot spoil the stored copy; the in-process
command line answers as the console script does; the run report adds up what the workers spent. A wrong answer
here would let every other test pass on a stale or foreign package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import packages
from support.cli_helpers import ortinf_in_process
from support.packages import PackageFactory
from support.run_report import RunReport

from ortinf.manifest import Manifest

ORTINF = str(Path(sys.executable).with_name("ortinf"))


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


def test_a_package_is_made_once_and_reused_by_a_later_run(store, tmp_path):
    first = PackageFactory(store, tmp_path / "run1")
    package = first.package("decoder", model_type="qwen2")
    assert Manifest.load(package).architecture == "Qwen2ForCausalLM" and (package.parent / "hf" / "config.json").is_file()
    assert first.package("decoder", model_type="qwen2") == package  # the same run: the same folder
    stored = next(p for p in (store / packages.source_hash()).iterdir() if p.is_dir())
    made = (stored / "pkg" / "ortinf.json").stat().st_mtime_ns
    second = PackageFactory(store, tmp_path / "run2")  # a later run over the same source
    again = second.package("decoder", model_type="qwen2")
    assert again != package  # its own copy
    assert (again / "ortinf.json").read_text() == (package / "ortinf.json").read_text()
    assert (stored / "pkg" / "ortinf.json").stat().st_mtime_ns == made  # taken from the store, not exported again


def test_other_options_or_arguments_are_other_packages(store, tmp_path):
    factory = PackageFactory(store, tmp_path / "run")
    fp32 = factory.package("decoder", model_type="llama")
    int4 = factory.package("decoder", model_type="llama", export={"dtype": "int4"})
    deeper = factory.package("decoder", model_type="llama", num_hidden_layers=3)
    assert len({fp32, int4, deeper}) == 3
    assert (Manifest.load(fp32).dtype, Manifest.load(int4).dtype) == ("fp32", "int4")
    assert Manifest.load(deeper).decoder.num_layers == 3


def test_a_test_that_writes_into_its_package_leaves_the_store_alone(store, tmp_path):
    factory = PackageFactory(store, tmp_path / "run")
    package = factory.package("decoder", model_type="llama")
    manifest = json.loads((package / "ortinf.json").read_text())
    (package / "ortinf.json").write_text(json.dumps({**manifest, "dtype": "spoiled"}))
    later = PackageFactory(store, tmp_path / "later").package("decoder", model_type="llama")
    assert json.loads((later / "ortinf.json").read_text())["dtype"] == "fp32"


def test_a_changed_source_is_a_new_store_and_the_old_one_goes(store, tmp_path, monkeypatch):
    PackageFactory(store, tmp_path / "run").package("decoder", model_type="llama")
    old = store / packages.source_hash()
    assert old.is_dir()
    monkeypatch.setattr(packages, "source_hash", lambda: "0" * 16)  # what an edit of ortinf/ or tests/support/ gives
    factory = PackageFactory(store, tmp_path / "after")
    assert not old.exists() and [p.name for p in store.iterdir()] == ["0" * 16]
    factory.package("decoder", model_type="llama")
    assert any(p.is_dir() for p in (store / ("0" * 16)).iterdir())


def test_the_source_hash_covers_the_builders_and_the_exporter(tmp_path):
    covered = {path.resolve() for path in packages.SOURCES}
    root = Path(__file__).resolve().parents[1]
    assert root / "ortinf" in covered and root / "tests" / "support" in covered
    tree = (tmp_path / "ortinf", tmp_path / "support")  # a copy's worth of each: any byte or name changed is a new hash
    for folder in tree:
        folder.mkdir()
        (folder / "a.py").write_text("x = 1\n")
    before = packages.source_hash(tmp_path, tree)
    assert packages.source_hash(tmp_path, tree) == before and len(before) == 16
    (tree[1] / "a.py").write_text("x = 2\n")
    edited = packages.source_hash(tmp_path, tree)
    (tree[0] / "a.py").rename(tree[0] / "b.py")
    renamed = packages.source_hash(tmp_path, tree)
    assert len({before, edited, renamed}) == 3
    (tree[0] / "__pycache__").mkdir()
    (tree[0] / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"compiled")  # what importing writes: not a source
    assert packages.source_hash(tmp_path, tree) == renamed


@pytest.mark.parametrize("args", [["export", "/no/such/folder", "-o", "x"], ["serve", "--max-num-seqs", "0"], ["inspect", "/nowhere"]])
def test_the_in_process_command_answers_as_the_console_script(args, tmp_path):
    real = subprocess.run([ORTINF, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    here = ortinf_in_process(*args)
    assert real.returncode == here.returncode == 2
    assert real.stdout == here.stdout and real.stderr == here.stderr and real.stderr.startswith("error: ")


def test_the_report_adds_up_the_workers():
    one, two, total = RunReport(), RunReport(), RunReport()
    one.current_file, two.current_file = "tests/a.py", "tests/b.py"
    one.record("export", 2.0)
    one.record("export", 1.0)
    two.record("export", 4.0)
    two.record("server", 3.0)
    for worker in (one, two):
        total.add(json.loads(json.dumps(worker.as_dict())))  # as xdist carries it
    assert total.counts["export"] == 3 and total.seconds["export"] == 7.0 and total.counts["server"] == 1
    assert total.top("export") == "tests/b.py 4 s, tests/a.py 3 s"
    assert total.lines()[0].startswith("exports: 3 made (7 s)")


@pytest.mark.parametrize(("nodeid", "scope"), [
    ("tests/e2e/test_server_load.py::test_metrics_count_what_happened", "tests/e2e/test_server_load.py"),
    ("tests/runtime/engine/test_engine_parity.py::test_prefix_caching_on_and_off[qwen2]", "tests/runtime/engine/test_engine_parity.py"),
    ("tests/test_benchmarks.py::test_benchmark_runs_in_tiny_mode[serve.py]", None),
    ("tests/exporter/test_streaming.py::test_bad_checkpoints_are_one_line_and_leave_nothing", None),
    ("tests/kernels/test_qmatmul_op.py::test_every_build_the_machine_runs[avx2]", None),
])
def test_a_worker_takes_a_file_whole_but_subprocess_tests_one_by_one(nodeid, scope):
    """A file's module fixtures (a server, an export) are made once because its tests share one worker; tests that
    only start a subprocess each are spread (None: the test is its own unit)."""
    from support.scheduling import xdist_scope

    assert xdist_scope(nodeid) == (scope or nodeid)


def test_a_worker_runs_engines_on_its_share_of_the_cores(request, decoder_package):
    """Under pytest-xdist an engine's session gets the worker's share of the cores (docs/testing.md), and a size passed
    explicitly is kept; in one process nothing is changed."""
    import os

    from ortinf import LLM

    _, package = decoder_package("llama")
    workers = int(getattr(request.config, "workerinput", {}).get("workercount", 0))
    share = max(1, (os.cpu_count() or 1) // workers) if workers > 1 else 0
    default = LLM(package, provider="cpu", num_blocks=64).engine.graph.session.get_session_options().intra_op_num_threads
    assert default == share  # 0: ORT sizes the pool itself
    explicit = LLM(package, provider="cpu", num_blocks=64, intra_op_threads=3).engine.graph.session.get_session_options()
    assert explicit.intra_op_num_threads == 3
    if workers > 1:
        assert os.environ["ORTINF_INTRA_OP_THREADS"] == os.environ["OMP_NUM_THREADS"] == str(share)


def test_the_demo_cache_holds_the_bundled_demo_once(demo_cache):
    from ortinf.bundled import DEMO_NAME

    manifests = list(demo_cache.rglob("ortinf.json"))
    assert len(manifests) == 1 and manifests[0].parent.name == DEMO_NAME
    assert Manifest.load(manifests[0].parent).architecture == "LlamaForCausalLM"
