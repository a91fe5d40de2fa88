"""ONNX Runtime's own CPU provider: host memory, every dtype the exporter writes (int8/int4 through
com.microsoft.MatMulNBits), dynamic shapes."""

from ortinf.providers.base import HOST, Provider

PROVIDER = Provider(
    name="cpu",
    ort_name="CPUExecutionProvider",
    package="onnxruntime",
    memory=HOST,
    dtypes=("fp32", "bf16", "fp16", "int8", "int4"),  # int8/int4: MatMulNBits weights; bf16: Cast to fp32 at load
)
