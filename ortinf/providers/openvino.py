"""OpenVINO through the onnxruntime-openvino wheel (it replaces the onnxruntime wheel, so it lives
in an environment of its own; the OpenVINO plugin EP for stock onnxruntime refuses non-Intel CPUs).

device_type CPU by default; GPU/NPU with --provider-option device_type=GPU. Its tensors are host
memory as ORT sees them (the plugin copies to an Intel GPU itself).

K/V are written by numpy (HOST_WRITE): the provider copies every bound output back from its own
tensors, so a pool bound as the graph's output costs a whole-pool copy per call (33.6M llama, 16
sequences: 61 ms per decode step with a 64 MiB pool, 254 ms with 512 MiB, against 30-31 ms either way
with the host write; hardware_matrix/RESULTS.md).
"""

from ortinf.providers.base import HOST, HOST_WRITE, Provider

PROVIDER = Provider(
    name="openvino",
    ort_name="OpenVINOExecutionProvider",
    package="onnxruntime-openvino",
    memory=HOST,
    kv_write=HOST_WRITE,
    dtypes=("fp32", "fp16"),
    options={"device_type": "CPU"},
    install="bash scripts/setup_openvino_env.sh (onnxruntime-openvino replaces onnxruntime: its own .venv-openvino)",
    pip_install="in a virtual environment of its own (onnxruntime-openvino replaces onnxruntime): pip install ortinf onnxruntime-openvino",
)
