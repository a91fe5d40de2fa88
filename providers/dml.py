"""Windows GPUs through the onnxruntime-directml wheel (DirectML)."""

from ortinf.providers.base import DEVICE, Provider

PROVIDER = Provider(
    name="dml",
    ort_name="DmlExecutionProvider",
    package="onnxruntime-directml",
    memory=DEVICE,
    device_type="dml",
    dtypes=("fp32", "fp16"),
)
