"""Windows GPUs through the onnxruntime-directml wheel (DirectML).

onnxruntime-directml (Windows x64 only) replaces the onnxruntime wheel, so it needs an environment of
its own (scripts/setup_directml_env.sh, from Git Bash: .venv-dml, onnxruntime-directml 1.24.4). It
needs a DirectX 12 GPU and nothing else installed.
"""

from ortinf.providers.base import DEVICE, Provider

PROVIDER = Provider(
    name="dml",
    ort_name="DmlExecutionProvider",
    package="onnxruntime-directml",
    memory=DEVICE,
    device_type="dml",
    dtypes=("fp32", "fp16"),
    install="bash scripts/setup_directml_env.sh (Windows; onnxruntime-directml replaces onnxruntime: its own .venv-dml)",
    pip_install="in a virtual environment of its own on Windows (onnxruntime-directml replaces onnxruntime): pip install ortinf onnxruntime-directml",
)
