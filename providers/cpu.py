"""ONNX Runtime's own CPU provider: host memory, every dtype the exporter writes, dynamic shapes."""

from ortinf.providers.base import HOST, Provider

PROVIDER = Provider(
    name="cpu",
    ort_name="CPUExecutionProvider",
    package="onnxruntime",
    memory=HOST,
    dtypes=("fp32", "fp16"),
)
