"""AMD GPUs through the onnxruntime-migraphx wheel (ROCm). MIGraphX compiles per input shape."""

from ortinf.providers.base import DEVICE, Buckets, Provider

POWERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

PROVIDER = Provider(
    name="migraphx",
    ort_name="MIGraphXExecutionProvider",
    package="onnxruntime-migraphx",
    memory=DEVICE,
    device_type="gpu",
    dtypes=("fp32", "fp16"),
    buckets=Buckets(tokens=(*POWERS, 512, 1024, 2048), seqs=POWERS, blocks=(*POWERS, 512, 1024)),
)
