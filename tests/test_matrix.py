"""`ortinf matrix`: rows per provider x package, quality against the fp32 CPU reference, merging."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from support.tiny_models import build_decoder

import ortinf
from ortinf.matrix import BEGIN, END, Row, write


def test_write_merges_rows_and_replaces_its_section(tmp_path):
    (tmp_path / "RESULTS.md").write_text("# Hardware matrix\n\nkept text\n")
    write([Row("cpu", "a", "fp32", "measured", tok_s_1=10.0), Row("cuda", "a", "fp32", "not measured (not installed here)"),
           Row("openvino", "a", "fp32", "measured", tok_s_1=4.0)], tmp_path)
    # a later run (say, in an environment without OpenVINO, or with --providers cpu) must lose nothing
    write([Row("cpu", "a", "fp32", "measured", tok_s_1=20.0), Row("openvino", "a", "fp32", "not measured (not installed here)"),
           Row("openvino", "b", "int8", "measured")], tmp_path)
    with (tmp_path / "matrix.csv").open() as fh:
        rows = {(r["provider"], r["package"]): r for r in csv.DictReader(fh)}
    assert set(rows) == {("cpu", "a"), ("cuda", "a"), ("openvino", "a"), ("openvino", "b")}
    assert rows[("cuda", "a")]["status"].startswith("not measured")  # the placeholder stays until a row with figures comes
    assert float(rows[("openvino", "a")]["tok_s_1"]) == 4.0  # a placeholder never replaces figures
    assert float(rows[("cpu", "a")]["tok_s_1"]) == 20.0  # replaced, not duplicated
    text = (tmp_path / "RESULTS.md").read_text()
    assert "kept text" in text and text.count(BEGIN) == 1 and text.count(END) == 1
    assert "| openvino | b | int8 | measured |" in text and "| cuda | a | fp32 | not measured (not installed here) |" in text


@pytest.mark.slow
def test_matrix_command_end_to_end_on_cpu(tmp_path):
    build_decoder("llama", tmp_path / "hf")
    ortinf.export(tmp_path / "hf", tmp_path / "fp32", progress=False)
    ortinf.export(tmp_path / "hf", tmp_path / "int8", dtype="int8", progress=False)
    out = tmp_path / "matrix"
    proc = subprocess.run([str(Path(sys.executable).with_name("ortinf")), "matrix", str(tmp_path / "fp32"), str(tmp_path / "int8"), "-o", str(out),
                           "--threads", "2"], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    with (out / "matrix.csv").open() as fh:
        rows = {(r["provider"], r["package"]): r for r in csv.DictReader(fh)}
    fp32, int8 = rows[("cpu", "fp32")], rows[("cpu", "int8")]
    assert fp32["status"] == int8["status"] == "measured"
    assert float(fp32["max_abs_diff"]) == 0.0 and float(fp32["greedy_agreement"]) == 1.0 and float(fp32["top1_agreement"]) == 1.0
    assert float(int8["top1_agreement"]) >= 0.9 and 0 < float(int8["max_abs_diff"]) < 1.0
    for row in (fp32, int8):
        assert float(row["tok_s_1"]) > 0 and float(row["tok_s_32"]) > float(row["tok_s_1"]) and float(row["peak_rss_mib"]) > 50
    assert rows[("cuda", "fp32")]["status"].startswith("not measured")
    assert "| cpu | int8 | int8 | measured |" in (out / "RESULTS.md").read_text()
