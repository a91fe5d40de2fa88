"""ortinf/serve/app.py load_model in process: every model kind the server loads is the one engine, built
from the server's engine options (issue 30: `ortinf serve WHISPER --max-num-seqs 2 --kv-cache-memory
64MiB` is obeyed; speech used to take only the thread count), and a text-only option is refused for
the kinds that cannot use it instead of being dropped."""

from __future__ import annotations

from pathlib import Path

from support.tiny_models import add_byte_tokenizer, build_whisper

import ortinf
from ortinf.runtime.worker.kv_pool import block_bytes
from ortinf.serve.app import load_model
from ortinf.serve.state import ServerConfig, ServerState


def test_a_whisper_model_obeys_the_engine_options(tmp_path: Path):
    build_whisper(tmp_path / "hf", vocab_size=384, max_target_positions=32)  # 384: room for the byte tokenizer
    add_byte_tokenizer(tmp_path / "hf", 384)
    ortinf.export(tmp_path / "hf", tmp_path / "pkg", progress=False)
    config = ServerConfig(packages=(tmp_path / "pkg",), engine_options={"max_num_seqs": 2, "kv_cache_memory": 8 * 2**20,
                                                                        "max_num_batched_tokens": 512,
                                                                        "max_num_encoder_input_tokens": 3000, "block_size": 16})
    state = ServerState(config)
    model = load_model(tmp_path / "pkg", "whisper", config, state)
    try:
        engine = model.task.engine  # the speech task's LLMEngine: the text engine's scheduler and pool
        assert model.transcriber.transcriber.engine is engine and model.transcriber.engine is model.engine
        assert engine.scheduler.config.max_num_seqs == 2 and engine.scheduler.config.max_num_batched_tokens == 512
        assert engine.scheduler.config.max_num_encoder_input_tokens == 3000
        used = engine.kv_cache.pool.num_blocks * block_bytes(engine.manifest.decoder, 16)
        assert used <= 8 * 2**20 and engine.kv_cache.pool.num_blocks >= 94 + 2  # the memory, and one whole window
    finally:
        model.engine.shutdown()


def test_a_preloaded_package_is_the_one_served(byte_package):
    """`ortinf serve PKG` opens the package on a thread while the app imports (serve/preload.py): load_model takes that
    engine (no second session), times the load from the preload's start, and opens anew for other options."""
    from ortinf.serve import preload
    from ortinf.serve.config import engine_options

    config = ServerConfig(packages=(byte_package,), engine_options={"kv_cache_memory": 16 * 2**20})
    options = engine_options(byte_package, config, False)
    preload.start(byte_package, "tiny-bytes", options)
    opened, started, _ = preload._pending[(str(byte_package), "tiny-bytes")][1].result(timeout=120)
    model = load_model(byte_package, "tiny-bytes", config, ServerState(config))
    try:
        assert model.task is opened and model.load_seconds > 0
        assert preload.take(byte_package, "tiny-bytes", options) is None  # taken once
    finally:
        model.engine.shutdown()
    preload.start(byte_package, "tiny-bytes", options)
    assert preload.take(byte_package, "tiny-bytes", {**options, "max_num_seqs": 3}) is None  # not what is asked: closed
