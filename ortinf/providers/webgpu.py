"""WebGPU through the onnxruntime-ep-webgpu plugin (Dawn over Vulkan, Metal or D3D12) on the stock
onnxruntime wheel: any GPU, and on a machine with none, Mesa's software Vulkan driver (lavapipe,
scripts/setup_webgpu.sh; set ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 for the plugin to list it).

Measured here (docs/providers.md): a tensor larger than 128 MiB (Dawn's default
maxStorageBufferBindingSize) silently computes wrong results, so one layer's K or V pool is capped
at 128 MiB. Shaders compile per program, not per input shape: the first call pays nearly all of it
(the server's warm-up request does), later new shapes little, and padding to buckets saved no
compile time while costing 1.2x per step; so no buckets by default (--shape-buckets turns them on).

PagedAttention (the contrib paged kernel, fp16) computes wrong attention for a sequence with 32 or
more new tokens in one call (onnxruntime-ep-webgpu 0.4.0 on lavapipe: max error 0.23-0.30 against a
numpy reference at head_dim 16 and 64, and 1e-3 up to 31 tokens; tests/providers/test_webgpu.py
keeps the check), so prefills run in chunks of at most 31 tokens per sequence with that kernel.
"""

from ortinf.providers.base import DEVICE, Provider

PROVIDER = Provider(
    name="webgpu",
    ort_name="WebGpuExecutionProvider",
    package="onnxruntime-ep-webgpu",
    memory=DEVICE,
    device_type="webgpu",
    dtypes=("fp32", "fp16"),
    kernels=("portable", "paged-attention"),  # PagedAttention: fp16
    max_query_len={"paged-attention": 31},
    plugin_module="onnxruntime_ep_webgpu",
    install="bash scripts/setup_webgpu.sh (the plugin goes into .venv beside onnxruntime)",
    pip_install="pip install onnxruntime-ep-webgpu (the plugin goes beside onnxruntime)",
    max_tensor_bytes=128 * 2**20,
    no_device_hint=(": it needs a Vulkan (Linux), Metal or D3D12 driver; on a machine without a GPU, install lavapipe "
                    "(scripts/setup_webgpu.sh) and set ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1"),
)
