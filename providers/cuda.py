"""NVIDIA GPUs through the onnxruntime-gpu wheel (CUDA provider built in)."""

from ortinf.providers.base import DEVICE, Provider

PROVIDER = Provider(
    name="cuda",
    ort_name="CUDAExecutionProvider",
    package="onnxruntime-gpu",
    memory=DEVICE,
    device_type="cuda",
    dtypes=("fp32", "fp16"),
    kernels=("portable", "paged-attention"),  # PagedAttention: fp16, bf16
)
