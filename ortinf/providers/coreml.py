"""Apple devices through CoreML (built into the macOS onnxruntime wheel). Host memory as ORT sees it."""

from ortinf.providers.base import HOST, Provider

PROVIDER = Provider(
    name="coreml",
    ort_name="CoreMLExecutionProvider",
    package="onnxruntime (macOS)",
    install="pip install onnxruntime, on a Mac (CoreML is built into its macOS wheel)",
    memory=HOST,
)
