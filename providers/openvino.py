"""OpenVINO through the onnxruntime-openvino wheel (it replaces the onnxruntime wheel, so it lives
in an environment of its own; the OpenVINO plugin EP for stock onnxruntime refuses non-Intel CPUs).

device_type CPU by default; GPU/NPU with --provider-option device_type=GPU. Its tensors are host
memory as ORT sees them (the plugin copies to an Intel GPU itself).
"""

from ortinf.providers.base import HOST, Provider

PROVIDER = Provider(
    name="openvino",
    ort_name="OpenVINOExecutionProvider",
    package="onnxruntime-openvino",
    memory=HOST,
    dtypes=("fp32", "fp16"),
    options={"device_type": "CPU"},
)
