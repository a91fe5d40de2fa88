"""The runtime: the engine's floors, lowest first (docs/architecture.md).

- sample/: what a request asked for (SamplingParams) and how a token is chosen from logits.
- worker/: the graphs, the paged KV pool and the model runner that feeds them.
- core/: the scheduler, the KV cache manager over the block pool, stopping and detokenizing.
- engine/: one `step()` over all of them, sync (LLMEngine) and async (AsyncLLMEngine).

Only ortinf.tasks calls the engine; the public API, the CLI and the server call tasks.
"""
