"""NVIDIA GPUs through the onnxruntime-gpu wheel (CUDA provider built in).

onnxruntime-gpu replaces the onnxruntime wheel (both install the `onnxruntime` module), so it needs an
environment of its own: scripts/setup_cuda_env.sh makes .venv-cuda with onnxruntime-gpu 1.31.1 and its
`cuda` and `cudnn` extras, which bring the CUDA 13 runtime and cuDNN 9 as nvidia-* wheels (an NVIDIA
driver for CUDA 13 is the only system requirement); ortinf calls onnxruntime.preload_dlls() so that
ORT finds them. docs/providers.md has the versions per provider.
"""

from ortinf.providers.base import DEVICE, Provider

PROVIDER = Provider(
    name="cuda",
    ort_name="CUDAExecutionProvider",
    package="onnxruntime-gpu",
    memory=DEVICE,
    device_type="cuda",
    dtypes=("fp32", "fp16"),
    kernels=("portable", "paged-attention"),  # PagedAttention: fp16, bf16
    install="bash scripts/setup_cuda_env.sh (onnxruntime-gpu replaces onnxruntime: its own .venv-cuda; CUDA 13, cuDNN 9)",
    pip_install="in a virtual environment of its own (onnxruntime-gpu replaces onnxruntime): pip install ortinf onnxruntime-gpu; CUDA 13, cuDNN 9",
    preload_dlls=True,
)
