"""Creating ORT inference sessions for a package's graph on a chosen provider."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from ortinf.providers.registry import ProviderSpec


def create_session(model_path: Path, provider: ProviderSpec, intra_op_threads: int = 0) -> ort.InferenceSession:
    """An InferenceSession on `provider` (CPU as fallback for nodes it cannot run)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    providers: list[tuple[str, dict[str, str]]] = [(provider.ort_name, dict(provider.options))]
    if provider.name != "cpu":
        providers.append(("CPUExecutionProvider", {}))
    return ort.InferenceSession(str(model_path), sess_options=options, providers=providers)
