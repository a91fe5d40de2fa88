"""Opening a package for its kind: the one factory LLM, the CLI and the server call. It returns the kind as a type
(ortinf/tasks/kinds.py):

- text generation and text2text (Marian, BART): a TextTask, an LLMEngine over one EngineConfig;
- speech recognition (Whisper): a SpeechTask, a Transcriber whose windows are requests of the same engine;
- encoders (embeddings, classification, rerank): a PoolingTask, Pooling over a PoolingEngine over the encoder graph,
  which take only ENCODER_OPTIONS (the device's, and the step budget's).

An option a kind cannot use is a ConfigError, never silently dropped: from LLM every option given; on the
server (several packages, one set of options) an option set off its default that no served package can use.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ortinf.config import EngineConfig
from ortinf.errors import ConfigError
from ortinf.manifest import TEXT2TEXT, TEXT_GENERATION, Manifest
from ortinf.tasks.kinds import PoolingTask, SpeechTask, Task, TextTask

ENCODER_OPTIONS = frozenset({"provider", "intra_op_threads", "provider_options", "allow_cpu_fallback", "max_num_seqs",
                             "max_num_batched_tokens"})


def open_package(package_dir: str | Path, options: dict[str, Any], *, explicit: bool = True, warm_up: bool = False,
                 name: str | None = None) -> Task:
    """The package's task for its kind. `options`: EngineConfig's keyword arguments but package_dir (provider
    included); `explicit`: every one was asked for (LLM's), else only those off their default count (the server's).
    `warm_up`: run the graphs once before returning (the server's first request is not the slow one). `name`: the
    served name (the server's), else the package folder's."""
    package_dir = Path(package_dir)
    manifest = Manifest.load(package_dir)
    what = name or str(package_dir)
    name = name or package_dir.name
    if manifest.speech is not None:  # Whisper: the transcriber (ortinf/tasks/speech/transcriber.py) on the one engine
        from ortinf.tasks.speech.transcriber import Transcriber

        return SpeechTask(name, package_dir, manifest, Transcriber(package_dir, **options))
    if manifest.task in (TEXT_GENERATION, TEXT2TEXT):  # decoders, and Marian/BART (the source is the encoder's)
        from ortinf.runtime.engine.llm_engine import LLMEngine
        from ortinf.runtime.sample.sampling_params import SamplingParams
        from ortinf.tasks import driver
        from ortinf.tasks.programs import Samples

        try:
            config = EngineConfig(package_dir=package_dir, **options)
        except TypeError as exc:
            raise ConfigError(f"unknown engine option: {exc}") from exc
        engine = LLMEngine(config)
        if warm_up:
            warm = engine.prepare([manifest.bos_token_id or 0] * 4, SamplingParams(max_tokens=2, ignore_eos=True))
            driver.run(engine, [Samples([warm])])
        return TextTask(name, package_dir, manifest, engine)
    from ortinf.runtime.engine.pooling_engine import PoolingEngine
    from ortinf.runtime.worker.encoder_graph import EncoderGraph
    from ortinf.tasks.pooling import Pooling

    unused = unusable(manifest, options) if explicit else []
    if unused:  # never silently dropped
        raise ConfigError(f"{', '.join(unused)}: not an option of a {manifest.task} model ({what}), which takes only "
                          f"{', '.join(sorted(ENCODER_OPTIONS))} (the others are the generating engine's)")
    encoder = EncoderGraph(package_dir, provider=options.get("provider", "auto"), intra_op_threads=options.get("intra_op_threads", 0),
                           provider_options=options.get("provider_options"), allow_cpu_fallback=options.get("allow_cpu_fallback", False))
    pooling = Pooling(PoolingEngine(encoder, options.get("max_num_seqs", _default("max_num_seqs")),
                                    options.get("max_num_batched_tokens", _default("max_num_batched_tokens"))))
    if warm_up:
        encoder.run([[0, 1]])
    return PoolingTask(name, package_dir, manifest, pooling)


def unusable(manifest: Manifest, options: dict[str, Any]) -> list[str]:
    """The options a package of this kind cannot use."""
    if manifest.task in (TEXT_GENERATION, TEXT2TEXT) or manifest.speech is not None:
        return []
    return sorted(set(options) - ENCODER_OPTIONS)


def check_server_options(manifests: list[Manifest], options: dict[str, Any]) -> None:
    """The server's engine options against the packages it serves: an option set off its default that none of
    them can use (an engine option with only embedding models) is a ConfigError naming the flag."""
    changed = {name: value for name, value in options.items() if value != _default(name) and value not in (None, (), {})}
    unused = set(changed)
    for manifest in manifests:
        unused &= set(unusable(manifest, changed))
    if unused:
        kinds = ", ".join(sorted({m.task for m in manifests}))
        flags = ", ".join("--" + name.replace("_", "-") for name in sorted(unused))
        raise ConfigError(f"{flags}: no served model can use it ({kinds} models take only "
                          f"{', '.join('--' + o.replace('_', '-') for o in sorted(ENCODER_OPTIONS))}): drop it")


def _default(name: str) -> Any:
    spec = next((f for f in dataclasses.fields(EngineConfig) if f.name == name), None)
    if spec is None:
        return object()  # not an engine option at all: never its default
    return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default


__all__ = ["ENCODER_OPTIONS", "check_server_options", "open_package", "unusable"]
