"""AMD GPUs through the onnxruntime-migraphx wheel (ROCm). MIGraphX compiles per input shape."""

from ortinf.providers.base import DEVICE, POWER_OF_TWO_BUCKETS, Provider

PROVIDER = Provider(
    name="migraphx",
    ort_name="MIGraphXExecutionProvider",
    package="onnxruntime-migraphx",
    memory=DEVICE,
    device_type="gpu",
    dtypes=("fp32", "fp16"),
    buckets=POWER_OF_TWO_BUCKETS,
)
