"""Creating ORT sessions on a provider, and proving which provider really runs the graph.

ORT falls back to the CPU provider silently: for a provider that fails to initialise, and node by
node for ops the provider lacks. ortinf records ORT's node assignment and refuses a session whose
graph did not land on the chosen provider (unless allow_cpu_fallback), and reports the compute ops
that fell back to the CPU. Integer shape and index ops on the CPU are normal for GPU providers
(ORT keeps them there on purpose) and are not reported.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from ortinf.errors import ConfigError, ProviderUnavailableError
from ortinf.kernels import library
from ortinf.providers.base import Provider
from ortinf.providers.registry import Found

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
DAMAGED_STORE = "the packed weights in "  # how packed_store.cc starts a refusal
# Ops that do the model's arithmetic: one of these on the CPU under a device provider costs copies.
COMPUTE_OPS = frozenset({
    "MatMul", "Gemm", "MatMulNBits", "FusedMatMul", "Softmax", "ScatterND", "LayerNormalization",
    "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "PagedAttention", "RotaryEmbedding",
    "Erf", "Gelu", "FastGelu", "Tanh", "Sigmoid", "Exp", "Pow", "Sqrt", "ReduceMean", "Conv", "Einsum", "Det",
})


@dataclass(frozen=True, slots=True)
class Placement:
    """Where ORT put the graph's nodes: counts per provider and the compute ops left on the CPU."""

    nodes: dict[str, int]  # provider -> node count; empty where this ORT cannot report it
    cpu_compute_ops: dict[str, int]

    def describe(self) -> str:
        if not self.nodes:
            return "node placement not reported by this onnxruntime"
        return ", ".join(f"{count} nodes on {name}" for name, count in self.nodes.items())


def create_session(model_path: Path, found: Found, intra_op_threads: int = 0, options: dict[str, str] | None = None,
                   allow_cpu_fallback: bool = False, custom_ops_library: Path | None = None,
                   profile_prefix: str | None = None, spin: bool = True,
                   fold_constants: bool = True, bf16_math: str = "bf16") -> tuple[ort.InferenceSession, Placement]:
    """An InferenceSession on `found`'s provider (CPU for the nodes it lacks), and where its nodes run;
    `custom_ops_library` (ortinf's CPU kernels) is registered first when given.

    `spin`: whether the session's intra-op threads spin after a call, waiting for the next one
    (ORT's default). Only the session that runs back to back (the engine's decoder) should: the
    spinning threads of a second session in the process (an encoder beside the decoder, a draft
    model) steal the cores from the decoder's. Measured on 2 cores: the demo's decode step took
    17.0 ms with MiniLM's spinning session beside it, 8.1 ms alone (benchmarks/two_models.py).
    One global ORT pool for every session would also fix it, but ORT then refuses every session
    in the process that has a pool of its own, the user's and other libraries' included.

    `bf16_math`: the arithmetic of the kernel library's BMatMul (bf16 weights): "bf16" or "fp32"
    (ortinf/kernels/cpu/bmatmul.cc; EngineConfig.bf16_math).

    `fold_constants`: False keeps ORT's ConstantFolding off, so that a bf16 weight's Cast to fp32 runs per call
    (the weight stays bf16 in memory) instead of becoming an fp32 copy at load (ortinf/exporter/bf16.py).

    Raises ProviderUnavailableError when the provider does not run the graph, unless allow_cpu_fallback."""
    provider = found.provider
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ORT's own log: errors only under --verbose's debug level; every error that matters is raised, and is shown as
    # one line (ORT also logs a failed initialisation, which would print it twice, with a timestamp)
    session_options.log_severity_level = 3 if log.isEnabledFor(logging.DEBUG) else 4
    session_options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if intra_op_threads:
        session_options.intra_op_num_threads = intra_op_threads
    if not spin:
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix is not None:  # ORT's profiler (benchmarks): session.end_profiling() writes the file
        session_options.enable_profiling = True
        session_options.profile_file_prefix = profile_prefix
    if custom_ops_library is not None:
        library.set_bf16_math(session_options, bf16_math)
        session_options.register_custom_ops_library(str(custom_ops_library))
    provider_options = {**provider.options, **(options or {})}
    disabled = {}
    if not fold_constants:  # and no arena or memory pattern, which would keep every widened weight's buffer for reuse
        disabled = {"disabled_optimizers": ["ConstantFolding"]}
        session_options.enable_cpu_mem_arena = False
        session_options.enable_mem_pattern = False
    try:
        if provider.plugin_module is not None:
            session_options.add_provider_for_devices(list(found.devices[:1]), provider_options)
            session = ort.InferenceSession(str(model_path), sess_options=session_options, **disabled)
        else:
            providers: list = [(provider.ort_name, provider_options)]
            if provider.ort_name != CPU:
                providers.append((CPU, {}))
            session = ort.InferenceSession(str(model_path), sess_options=session_options, providers=providers, **disabled)
    except Exception as exc:  # ORT raises bare Fail/InvalidArgument for bad options
        if "No such file" in str(exc) or "Load model" in str(exc):
            raise
        if DAMAGED_STORE in str(exc):  # packed_store.cc's one line: the package is at fault, not the provider
            raise ConfigError(str(exc)[str(exc).index(DAMAGED_STORE):].strip()) from None
        raise ProviderUnavailableError(f"the {provider.name} provider failed to start: {_first_line(exc)}") from exc
    if custom_ops_library is not None:
        for line in library.flush_packed():
            log.info("packed weights: %s", line)
    placement = placement_of(session)
    check_placement(session, provider, placement, allow_cpu_fallback)
    return session, placement


def placement_of(session: ort.InferenceSession) -> Placement:
    """Node counts per provider, from ORT's assignment record (ORT >= 1.31; empty before)."""
    try:
        subgraphs = session.get_provider_graph_assignment_info()
    except (AttributeError, RuntimeError):
        return Placement({}, {})
    nodes: Counter[str] = Counter()
    cpu_ops: Counter[str] = Counter()
    for subgraph in subgraphs:
        for node in subgraph.get_nodes():
            nodes[subgraph.ep_name] += 1
            if subgraph.ep_name == CPU and node.op_type in COMPUTE_OPS:
                cpu_ops[node.op_type] += 1
    return Placement(dict(nodes), dict(cpu_ops))


def check_placement(session: ort.InferenceSession, provider: Provider, placement: Placement, allow_cpu_fallback: bool) -> None:
    """Refuses (or, when allowed, warns about) a graph that the provider does not run."""
    if provider.ort_name == CPU:
        return
    runs = provider.ort_name in session.get_providers() and (not placement.nodes or placement.nodes.get(provider.ort_name, 0) > 0)
    if not runs:
        message = (f"the {provider.name} provider runs none of the graph ({placement.describe()}; session providers: "
                   f"{', '.join(session.get_providers())})")
        if not allow_cpu_fallback:
            raise ProviderUnavailableError(f"{message}: pass --allow-cpu-fallback to run on the CPU anyway")
        log.warning("%s: running on the CPU (--allow-cpu-fallback)", message)
        return
    log.info("%s: %s", provider.name, placement.describe())
    if placement.cpu_compute_ops:
        ops = ", ".join(f"{op} x{count}" for op, count in sorted(placement.cpu_compute_ops.items()))
        log.warning("%s does not run these compute ops, which run on the CPU instead: %s", provider.name, ops)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
