"""ServerConfig: every `ortinf serve` option of the server's own, declared once as a field with its command-line
metadata (ortinf/config.py `option`, as EngineConfig's are). ortinf/cli/serve_options.py generates the options
(flag, type, default, help, ORTINF_<NAME> environment variable, --config YAML key) from these fields and turns
what was given into the field's value (`parse`): a size as bytes, image=N as N, comma-separated hosts as a tuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ortinf.config import option, parse_size
from ortinf.tasks.chat.reasoning import PARSERS as REASONING_PARSERS
from ortinf.tasks.chat.tool_parsers import PARSERS as TOOL_PARSERS

RESPONSES_STORE_SIZE = 256 * 2**20  # ortinf/serve/api/openai/responses_store.py: bytes of stored Responses API responses


def _limit_mm(value: str) -> int:
    from ortinf.tasks.chat.media import parse_limit_mm_per_prompt

    return parse_limit_mm_per_prompt(value)


def _domains(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(d.strip() for given in values for d in given.split(",") if d.strip())


def _choices(*words: str) -> dict[str, str]:
    return {word: word for word in words}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The server's options (below, each a CLI option) and the engine's (`engine_options`: EngineConfig's keyword
    arguments but package_dir, from the options generated off its fields). CLI flags, environment variables and
    the YAML file map onto it."""

    packages: tuple[Path, ...]
    host: str = option("127.0.0.1", "Address to listen on.", "server")
    port: int = option(8000, "Port to listen on (1-65535).", "server", maximum=65535)
    served_model_names: tuple[str, ...] = option((), "Name clients use in `model` (one per package) [default: the package folder's "
                                                 "name].", "server", flag="--served-model-name", multiple=True, parse=tuple)
    api_key: str | None = option(None, "Require `Authorization: Bearer KEY` on every route but /health, /version, /load and "
                                 "/metrics.", "server")
    max_queued_requests: int = option(256, "Requests that may wait beyond the running batch; past that the server answers 429.",
                                      "server", minimum=0)
    shutdown_timeout: float = option(30.0, "On SIGTERM, seconds to let in-flight requests finish.", "server", minimum=0.0)
    request_header_timeout: float = option(10.0, "Seconds a client has to send a request's headers once it starts one (a "
                                           "connection that trickles them is closed: slowloris).", "server", minimum=0.1)
    max_body_size: int = option(2 * 2**20, "Largest request body accepted (413 beyond), on every route but the audio uploads "
                                "(--max-audio-body-size).", "server", shown="2MiB", parse=parse_size, metavar="SIZE")
    max_audio_body_size: int = option(26 * 2**20, "Largest body of /v1/audio/transcriptions and /v1/audio/translations (413 "
                                      "beyond): the audio file (OpenAI's limit is 25 MiB) and its form fields.", "server",
                                      shown="26MiB", parse=parse_size, metavar="SIZE")
    responses_store_size: int = option(RESPONSES_STORE_SIZE, "Memory for stored /v1/responses responses (GET and previous_response_id): "
                                       "the newest that fit stay, the oldest go first; 0 stores none.", "server", shown="256MiB",
                                       parse=parse_size, metavar="SIZE")
    limit_mm_per_prompt: int = option(8, "Images a conversation may hold on a vision-language model: image=N (vLLM's form; JSON "
                                      "{\"image\": N} too); more is a 400.", "server", shown="image=8", parse=_limit_mm)
    allowed_media_domains: tuple[str, ...] = option((), "Hosts whose http(s) image URLs the server fetches, on ports 80/443 unless "
                                                    "written host:port or [v6 address]:port (repeat, or separate with commas; redirects are held to "
                                                    "them) [default: none: images come inline as data URLs].", "server",
                                                    multiple=True, parse=_domains)
    media_fetch_timeout: float = option(5.0, "Seconds an image URL's fetch may take in all, redirects and a slow sender included "
                                        "(a 400 beyond).", "server", minimum=0.1)
    tool_call_parser: str = option("auto", "How tool calls are read from a model's text for tool_choice 'auto': hermes "
                                   "(<tool_call>{json}</tool_call>: Qwen, Hermes), llama3_json (Llama 3.x), mistral ([TOOL_CALLS]), "
                                   "granite (<|tool_call|>), none, or auto (the one whose markers the chat template writes; a model "
                                   "with none answers tool_choice auto as plain text).", "server",
                                   choices=_choices("auto", *TOOL_PARSERS, "none"))
    hosted_tools: str = option("ignore", "Tools a request declares that only the API's vendor runs (the Responses API's web_search, "
                               "file_search, code_interpreter, ...; Anthropic's server tools): ignore (left out of what the model "
                               "sees and named in X-Ignored-Fields: Codex sends web_search by default) or refuse (a 400).", "server",
                               choices=_choices("ignore", "refuse"))
    default_tool_choice: str = option("auto", "The tool_choice of a request that sends tools and leaves it at auto: required makes "
                                      "the model call one of them every turn (a small model that never calls tools unprompted; an "
                                      "agent's tool loop under test). A client's any, named or none still applies.", "server",
                                      choices=_choices("auto", "required"))
    reasoning_parser: str = option("none", "Split a reasoning model's thinking into message.reasoning_content (vLLM's field): qwen3 "
                                   "(<think>...</think>, Qwen3, QwQ), deepseek_r1 (the template opens <think>: DeepSeek-R1 and its "
                                   "distills), gpt_oss (harmony's analysis and final channels), or auto (from the chat template's "
                                   "<think> or <|channel|>).", "server", choices=_choices("none", "auto", *REASONING_PARSERS))
    metrics_prefix: str = option("ortinf", "Prefix of the /metrics names; vllm gives vllm:num_requests_waiting, "
                                 "vllm:kv_cache_usage_perc, ... for dashboards and cluster routers (llm-d, the Gateway API "
                                 "Inference Extension) that look for them.", "server", choices=_choices("ortinf", "vllm"))
    access_log: bool = option(False, "Log one line per request: client, method, path and status (uvicorn's access log), as "
                              "vLLM and llama-server do.", "server")
    allow_runtime_lora_updates: bool = option(False, "Mount /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's): a client "
                                              "may then make the server read any adapter folder it names; set --max-loras for the "
                                              "slots.", "server")
    transcription_fallback: bool = option(True, "Whisper models: at temperature 0, retry windows that repeat or are unlikely at "
                                          "hotter temperatures and skip silent ones (OpenAI's and openai-whisper's behaviour); "
                                          "off: the request's temperature alone.", "server")
    models_dir: str | None = option(None, "A folder of models served on demand: every package, Hugging Face folder and GGUF "
                                    "directly under it is listed without loading, loads on its first request (a folder or GGUF is "
                                    "exported once, into DIR/.ortinf/) and unloads when idle or to make room (ortinf/serve/model_manager.py).",
                                    "server", metavar="DIR")
    max_loaded_models: int = option(0, "With --models-dir: at most this many of its models loaded at once (the least recently used "
                                    "idle one unloads to make room); 0: as many as --models-memory holds.", "server", minimum=0)
    models_memory: int | str | None = option(None, "With --models-dir: the memory its loaded models may take together, e.g. 12GiB "
                                       "(what each took when it loaded, its package's size before) [default: 90% of the memory "
                                       "available at start].", "server", parse=lambda value: None if value is None else parse_size(value),
                                       metavar="SIZE")
    idle_unload: float = option(0.0, "With --models-dir: unload a model idle this many seconds (0: only to make room; Ollama's "
                                "keep_alive of a request overrides it for its model).", "server", minimum=0.0)
    model_load_timeout: float = option(120.0, "With --models-dir: seconds a request waits for its model to load (or for room) "
                                       "before a 503; the load goes on.", "server", minimum=0.1)
    engine_options: dict = field(default_factory=dict)  # EngineConfig's keyword arguments (but package_dir)

    def engine_setting(self, name: str):
        """An engine setting as the engines get it: given, or EngineConfig's default."""
        import dataclasses

        from ortinf.config import EngineConfig

        if name in self.engine_options:
            return self.engine_options[name]
        spec = next(f for f in dataclasses.fields(EngineConfig) if f.name == name)
        return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default

    @property
    def media_policy(self):  # a MediaPolicy
        from ortinf.tasks.chat.media import MediaPolicy

        return MediaPolicy(max_images=self.limit_mm_per_prompt, allowed_domains=self.allowed_media_domains,
                           fetch_timeout=self.media_fetch_timeout)

    @property
    def max_num_seqs(self) -> int:
        return self.engine_setting("max_num_seqs")


__all__ = ["ServerConfig"]


def model_names(config: ServerConfig) -> list[str]:
    """Served names: --served-model-name, else each package folder's name."""
    return list(config.served_model_names) or [p.resolve().name for p in config.packages]


def engine_options(package: Path, config: ServerConfig, lora_base: bool) -> dict:
    """The server's engine settings for one package (EngineConfig's keyword arguments but package_dir):
    only the LoRA base gets the adapters and their slots, and only a text decoder speculates."""
    from ortinf.manifest import TEXT_GENERATION, Manifest

    options = dict(config.engine_options)
    if not lora_base:
        options.pop("lora_modules", None)
        options.pop("max_loras", None)
    if Manifest.load(package).task != TEXT_GENERATION:
        options.pop("speculative_config", None)
    return options
