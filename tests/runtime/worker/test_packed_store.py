"""The packed-weight store (issue 55, item 1; ortinf/kernels/cpu/packed_store.h): the export writes the CPU graph's
packed weights beside model.onnx.data, a load maps them instead of packing, and what it computes is what a load that
packs computes, token for token. A store for another CPU kind is left alone (this CPU packs and writes its own), a
stale one is rewritten, a damaged one is refused in one line, and two processes share the mapped pages."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.engine_helpers import make_engine, run_to_completion
from support.server_helpers import ORTINF

from ortinf.kernels import library

pytestmark = pytest.mark.skipif(library.load() is None, reason="the kernel library is not built")
PROMPTS = [[1, 5, 9, 13, 17, 21], [2, 4, 6]]


@pytest.fixture(scope="module", params=["int4", "bf16"])
def package(request, package_factory) -> Path:
    return package_factory.package("decoder", model_type="llama", export={"dtype": request.param})


def store_of(package: Path, isa: str | None = None) -> Path:
    return package / f"model.onnx.data.{isa or library.qmatmul_isa()}.packed"


def load_lines(package: Path, caplog) -> tuple[list[str], dict]:
    """Loads the package once (a fresh look at its store) and greedily generates; the store's log lines, the tokens."""
    library.forget_packed()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ortinf.providers.session"):
        engine = make_engine(package, num_blocks=32)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("packed weights:")]
    outputs = run_to_completion(engine, PROMPTS)
    return lines, {rid: out.outputs[0].token_ids for rid, out in sorted(outputs.items())}


def test_the_export_writes_the_store_and_a_load_maps_it(package, caplog, monkeypatch):
    assert store_of(package).is_file()  # written by the export's verification session
    lines, mapped = load_lines(package, caplog)
    assert len(lines) == 1 and " mapped, 0 packed" in lines[0] and not lines[0].endswith(": 0 mapped, 0 packed"), lines
    monkeypatch.setenv("ORTINF_PACKED_STORE", "0")  # the load as before: every kernel packs, nothing is read or written
    lines, packed = load_lines(package, caplog)
    assert lines == [] and packed == mapped and all(len(tokens) > 0 for tokens in mapped.values())


def test_a_stale_store_is_rewritten(package, caplog):
    store = store_of(package)
    before = store.stat().st_mtime_ns
    os.utime(package / "model.onnx.data")  # as a package written again in place would be
    lines, _ = load_lines(package, caplog)
    assert len(lines) == 1 and "0 mapped" in lines[0] and "stale" in lines[0] and "wrote " in lines[0], lines
    assert store.stat().st_mtime_ns != before
    lines, _ = load_lines(package, caplog)
    assert " mapped, 0 packed" in lines[0] and "wrote" not in lines[0]


def test_a_store_for_another_cpu_kind_is_left_alone(package, tmp_path):
    """A package packed on another CPU kind (here: ORTINF_KERNEL_ISA caps this one at the portable build) loads: this
    CPU packs, says so in one log line, and writes its own store beside the other."""
    if library.qmatmul_isa() == "generic":
        pytest.skip("this CPU's kernels are the portable build already")
    theirs = store_of(package)
    before = theirs.read_bytes()
    script = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
              "from support.engine_helpers import make_engine\n"
              "make_engine(__import__('pathlib').Path(sys.argv[1]), num_blocks=32)\n")
    env = {**os.environ, "ORTINF_KERNEL_ISA": "generic", "PYTHONPATH": str(Path(__file__).parents[2])}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script, str(package)], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("packed weights:")]
    assert len(lines) == 1 and " mapped, 0 packed" in lines[0], out.stderr[-2000:]  # the second load maps its own
    assert store_of(package, "generic").is_file() and theirs.read_bytes() == before
    store_of(package, "generic").unlink()


def generate(package: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ORTINF, "generate", str(package), "--prompt-ids", "1,2,3", "-n", "2"],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("damage", ["truncated", "a flipped byte"])
def test_a_damaged_store_is_refused_in_one_line(package, tmp_path, damage):
    copy = tmp_path / "pkg"
    subprocess.run(["cp", "-a", str(package), str(copy)], check=True)  # -a: the data file's mtime, so the store is current
    store = store_of(copy)
    data = bytearray(store.read_bytes())
    if damage == "truncated":
        store.write_bytes(data[: len(data) // 2])
    else:
        data[8192] ^= 0x40  # inside the first weight's region (the header is 4 KiB)
        store.write_bytes(bytes(data))
    os.utime(store)
    result = generate(copy)
    assert result.returncode == 2
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert str(store) in message and "damaged" in message and "delete that file" in message, message
    store.unlink()  # what the line says to do: the next load packs and writes it again
    assert generate(copy).returncode == 0
    assert store.is_file()


SHARER = """
import sys
from pathlib import Path
from support.engine_helpers import make_engine
engine = make_engine(Path(sys.argv[1]), num_blocks=32)
print("ready", flush=True)
sys.stdin.readline()
rss = pss = 0
inside = False
for line in open("/proc/self/smaps"):
    if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
        inside = line.rstrip().endswith(".packed")
    elif inside and line.startswith("Rss:"):
        rss += int(line.split()[1])
    elif inside and line.startswith("Pss:"):
        pss += int(line.split()[1])
print(rss, pss, flush=True)
"""


def test_two_processes_share_the_mapped_pages(package):
    """Each process maps the store (page cache pages, not a private copy): with two alive, each one's proportional
    share of the store's resident pages is about half of them."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", SHARER, str(package)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        figures = []
        for proc in procs:
            proc.stdin.write("\n")
            proc.stdin.flush()
            figures.append([int(x) for x in proc.stdout.readline().split()])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
    store_kib = store_of(package).stat().st_size / 1024
    for rss, pss in figures:
        assert rss >= 0.5 * store_kib, (rss, store_kib)  # the store is resident (its checksums were read)
        assert pss <= 0.6 * rss, figures  # and shared: one process alone would have pss == rss
