"""ExportConfig (issue 55, item 4; ortinf/exporter/config.py): the export's options in one place, read by the CLI,
`ortinf.export` and every family exporter."""

from __future__ import annotations

import re

import click
import pytest
from support.tiny_models import build_decoder

import ortinf
from ortinf.cli.export import export as export_command
from ortinf.errors import ExportError
from ortinf.exporter.config import ExportConfig

# options of the Python API only: a test's or a benchmark's (the CLI keeps the defaults)
API_ONLY = {"external_data_threshold", "in_memory"}
CLI_NAMES = {"out": None, "quiet": "progress", "model": None}


def test_every_option_is_the_clis_and_the_apis():
    """The CLI's flags and ExportConfig's fields are one list: a field added without its flag (or the reverse) fails."""
    flags = {CLI_NAMES.get(p.name, p.name) for p in export_command.params if isinstance(p, click.Option) and p.expose_value}
    assert flags - {None} == set(ExportConfig.__dataclass_fields__) - API_ONLY


def test_keywords_replace_the_configs_fields_and_an_unknown_one_is_named():
    base = ExportConfig(dtype="int8", quality_gate="record")
    assert ExportConfig.of(base, dtype="int4") == ExportConfig(dtype="int4", quality_gate="record")
    with pytest.raises(ExportError, match="unknown export option dtpye: choose among task, dtype"):
        ExportConfig.of(base, dtpye="int4")


@pytest.mark.parametrize("dtype, given, block", [("int8", None, 128), ("int4", None, 32), ("int4", 64, 64), ("fp32", None, 32)])
def test_the_block_size_defaults_per_dtype(dtype, given, block):
    assert ExportConfig(dtype=dtype, quant_block_size=given).block_size == block


@pytest.mark.parametrize("options, message", [
    ({"task": "translation"}, "unknown task 'translation': choose auto, "),
    ({"dtype": "int3"}, "unknown dtype 'int3': choose fp32, bf16, fp16, int8, int4"),
    ({"quality_gate": "warn"}, "unknown quality gate 'warn': choose enforce or record"),
    ({"verify_memory": 0}, "verify_memory must be a positive number of bytes, got 0"),
    ({"verify_memory": True}, "verify_memory must be a positive number of bytes, got True"),
    ({"kernel": "flash"}, "unknown kernel 'flash': choose "),
    ({"kv_dtype": "fp8"}, "unknown KV cache dtype 'fp8': choose auto, fp32, fp16, int8"),
    ({"vision_dtype": "bf16"}, "unknown vision dtype 'bf16': choose fp32, int8, int4"),
    ({"kv_dtype": "int8", "cpu_kernel": False}, "--kv-dtype int8 is read by ortinf's CPU kernel graph only"),
    ({"dtype": "int4", "quant_block_size": 24}, "--quant-block-size must be a power of two >= 16, got 24"),
])
def test_a_wrong_value_is_refused_before_any_model_is_read(tmp_path, options, message):
    with pytest.raises(ExportError, match=re.escape(message)):
        ortinf.export(tmp_path / "no-such-model", tmp_path / "pkg", **options)


def test_a_config_and_keywords_export_together(tmp_path):
    build_decoder("llama", tmp_path / "hf")
    manifest = ortinf.export(tmp_path / "hf", tmp_path / "pkg", ExportConfig(dtype="int4", progress=False), quant_block_size=16,
                             quality_gate="record")
    assert manifest.dtype == "int4" and manifest.quantization.block_size == 16 and manifest.quality is not None
