"""AMD GPUs through the onnxruntime-migraphx wheel (ROCm). MIGraphX compiles per input shape.

onnxruntime-migraphx replaces the onnxruntime wheel, so it needs an environment of its own
(scripts/setup_migraphx_env.sh: .venv-migraphx, onnxruntime-migraphx 1.27.1). The wheel links against
the system's ROCm 7 and MIGraphX libraries (libamdhip64.so.7, libmigraphx_c.so.3): install ROCm 7
with MIGraphX from AMD first.
"""

from ortinf.providers.base import DEVICE, POWER_OF_TWO_BUCKETS, Provider

PROVIDER = Provider(
    name="migraphx",
    ort_name="MIGraphXExecutionProvider",
    package="onnxruntime-migraphx",
    memory=DEVICE,
    device_type="gpu",
    dtypes=("fp32", "fp16"),
    buckets=POWER_OF_TWO_BUCKETS,
    install="bash scripts/setup_migraphx_env.sh (onnxruntime-migraphx replaces onnxruntime: its own .venv-migraphx; ROCm 7 with MIGraphX)",
    pip_install="in a virtual environment of its own (onnxruntime-migraphx replaces onnxruntime): pip install ortinf "
                "onnxruntime-migraphx; ROCm 7 with MIGraphX",
)
