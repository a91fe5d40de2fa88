"""ExportConfig: the export's options, written once (issue 55, item 4).

The CLI (ortinf/cli/export.py) builds one from its flags, `ortinf.export(model, out, **options)` from its keywords, and
every family exporter (decoders, encoders, Whisper, seq2seq, vision-language) reads the same object, so an option is
named, defaulted and checked in one place. `check()` refuses a value that is wrong whatever the model; what depends
on the model (a --kv-dtype for an encoder, bf16 for a vision-language model) is refused by the exporter that knows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ortinf.errors import ExportError
from ortinf.manifest import KERNELS, PORTABLE, TASKS

DTYPES = ("fp32", "bf16", "fp16", "int8", "int4")
QUANTIZED = ("int8", "int4")
QUALITY_GATES = ("enforce", "record")
KV_DTYPES = ("auto", "fp32", "fp16", "int8")
# Above this many bytes of weights an encoder's graph keeps them in model.onnx.data (protobuf stops at 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1 << 30
DEFAULT_ACCURACY_LEVEL = 4  # int8 activations in MatMulNBits (ortinf/exporter/quantize.py)
DEFAULT_BLOCK_SIZES = {"int8": 128, "int4": 32}  # weights per scale
# layer weight bytes one verification session may hold; larger packages verify in windows (ortinf/exporter/windows.py)
VERIFY_MEMORY = 2 << 30


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """What `ortinf export` and `ortinf.export` take, besides the model and the output folder.

    `dtype` None: fp32 for a folder, a GGUF file's own precision. `tolerance` None: the dtype's (api.DEFAULT_TOLERANCE).
    `quant_block_size` None: int8 128, int4 32. `cpu_kernel`: also write model.cpu.onnx for ortinf's CPU kernel
    library. `quality_gate`: "enforce" refuses an int8/int4 package below its quality thresholds, "record" keeps it
    with the figures. `vision_dtype`: a vision-language model's tower weights. `in_memory`: export a decoder the way
    models the streaming exporter does not cover are exported (comparisons). `verify_memory`: bytes of layer weights
    verified in one window."""

    task: str = "auto"
    dtype: str | None = None
    overwrite: bool = False
    tolerance: float | None = None
    progress: bool = True
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD
    kernel: str = PORTABLE
    quant_block_size: int | None = None
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL
    kv_dtype: str = "auto"
    cpu_kernel: bool = True
    enable_lora: bool = False
    quality_gate: str = "enforce"
    vision_dtype: str = "fp32"
    in_memory: bool = False
    verify_memory: int = VERIFY_MEMORY

    @classmethod
    def of(cls, config: ExportConfig | None = None, **options: object) -> ExportConfig:
        """`config` (default: the defaults) with `options` replacing its fields; an unknown option is an ExportError
        that names the known ones."""
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise ExportError(f"unknown export option {', '.join(unknown)}: choose among {', '.join(f.name for f in fields(cls))}")
        return replace(config or cls(), **options)

    def check(self) -> ExportConfig:
        """Refuses a value that is wrong for any model, with what to choose instead; returns self."""
        if self.task != "auto" and self.task not in TASKS:
            raise ExportError(f"unknown task '{self.task}': choose auto, {', '.join(TASKS)}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ExportError(f"unknown dtype '{self.dtype}': choose {', '.join(DTYPES)}")
        if self.quality_gate not in QUALITY_GATES:
            raise ExportError(f"unknown quality gate '{self.quality_gate}': choose {' or '.join(QUALITY_GATES)}")
        if isinstance(self.verify_memory, bool) or not isinstance(self.verify_memory, int) or self.verify_memory < 1:
            raise ExportError(f"verify_memory must be a positive number of bytes, got {self.verify_memory!r}")
        if self.kernel not in KERNELS:
            raise ExportError(f"unknown kernel '{self.kernel}': choose {', '.join(KERNELS)}")
        if self.kv_dtype not in KV_DTYPES:
            raise ExportError(f"unknown KV cache dtype '{self.kv_dtype}': choose {', '.join(KV_DTYPES)}")
        if self.vision_dtype not in ("fp32", *QUANTIZED):
            raise ExportError(f"unknown vision dtype '{self.vision_dtype}': choose fp32, {', '.join(QUANTIZED)}")
        if self.kv_dtype == "int8" and (self.kernel != PORTABLE or not self.cpu_kernel):
            raise ExportError("--kv-dtype int8 is read by ortinf's CPU kernel graph only: drop --kernel/--no-cpu-kernel, "
                              "or choose --kv-dtype fp16")
        _ = self.block_size  # a power of two >= 16 where the dtype quantizes
        return self

    @property
    def block_size(self) -> int:
        """int8/int4 weights per scale: the option, else the dtype's default."""
        block = self.quant_block_size or DEFAULT_BLOCK_SIZES.get(self.dtype or "fp32", 32)
        if (self.dtype or "fp32") in QUANTIZED and (block < 16 or block & (block - 1)):
            raise ExportError(f"--quant-block-size must be a power of two >= 16, got {block}")
        return block
