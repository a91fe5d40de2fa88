"""Tiny random-weight models built from transformers config classes (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

COMMON = dict(vocab_size=256, max_position_embeddings=512, initializer_range=0.1, bos_token_id=1, eos_token_id=2)
DECODER = dict(COMMON, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

# model_type -> (config class, model class, config kwargs). Sizes are small but keep GQA (4 heads
# over 2 KV heads), and the quirks each architecture is here for: sliding windows short enough for
# the test prompts to cross them, soft-capping, qk-norm, learned positions.
DECODERS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, DECODER),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(DECODER, sliding_window=24)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, DECODER),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(DECODER, head_dim=16)),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM, dict(DECODER, pad_token_id=0)),
    "gemma2": (
        transformers.Gemma2Config,
        transformers.Gemma2ForCausalLM,
        dict(DECODER, head_dim=16, sliding_window=16, query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
             final_logit_softcapping=3.0, pad_token_id=0),
    ),
    "gemma3_text": (
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForCausalLM,
        # local (sliding, RoPE base 10k) then global (base 1M) layers, qk-norm, soft-capped final logits
        dict(DECODER, num_hidden_layers=3, head_dim=16, sliding_window=16, query_pre_attn_scalar=16, pad_token_id=0,
             layer_types=["sliding_attention", "full_attention", "sliding_attention"], rope_local_base_freq=10000.0,
             rope_theta=1000000.0, final_logit_softcapping=3.0),
    ),
    "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM, dict(DECODER, pad_token_id=0)),
    "granite": (
        transformers.GraniteConfig,
        transformers.GraniteForCausalLM,
        dict(DECODER, embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=4.0),
    ),
    "smollm3": (  # the second of every 2 layers has no RoPE (NoPE)
        transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM, dict(DECODER, num_hidden_layers=3, no_rope_layer_interval=2, pad_token_id=0),
    ),
    "gpt_neox": (  # Pythia: partial rotary, parallel residual, fused qkv
        transformers.GPTNeoXConfig,
        transformers.GPTNeoXForCausalLM,
        dict(COMMON, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, rotary_pct=0.25),
    ),
    # mixture of experts: 8 experts, 2 per token, small enough that some get no token in a short step
    "qwen3_moe": (
        transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
        dict(DECODER, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    ),
    "qwen2_moe": (  # with the gated shared expert
        transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
        dict(DECODER, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
             norm_topk_prob=False),
    ),
    "olmoe": (
        transformers.OlmoeConfig, transformers.OlmoeForCausalLM,
        dict(DECODER, num_experts=8, num_experts_per_tok=2, intermediate_size=32, pad_token_id=0, clip_qkv=4.0),
    ),
    "mixtral": (
        transformers.MixtralConfig, transformers.MixtralForCausalLM,
        dict(DECODER, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=None),
    ),
    "gpt_oss": (  # attention sinks, alternating sliding window, biased experts with clamped SwiGLU
        transformers.GptOssConfig, transformers.GptOssForCausalLM,
        dict(DECODER, head_dim=16, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=16,
             layer_types=["sliding_attention", "full_attention"], pad_token_id=0),
    ),
    "gpt2": (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(COMMON, n_embd=64, n_layer=2, n_head=4, n_positions=512, n_inner=128),
    ),
}


def build_decoder(model_type: str, folder: Path, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """Saves a tiny random `model_type` decoder to `folder` and returns it (fp32, eval, eager), every parameter
    distinct per layer (every_parameter_random)."""
    config_class, model_class, kwargs = DECODERS[model_type]
    torch.manual_seed(seed)
    config = config_class(**{**kwargs, **overrides})
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    every_parameter_random(model)
    model.save_pretrained(folder)
    return model


def every_parameter_random(model: torch.nn.Module, spread: float = 0.1) -> None:
    """Perturbs every 1-D parameter (norm weights, biases, attention sinks) by N(0, `spread`) around its initial
    value. HF's init leaves every layer's norms at one value (1, or 0 where the model reads 1 + weight) and biases
    at 0, so an export that binds layer 0's norm or bias to every layer computes the right logits on such a
    checkpoint; a trained checkpoint's differ per layer, and so do these. 2-D weights are random already."""
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1 and parameter.is_floating_point():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * spread)


def build_llava(folder: Path, image_token: int = 299, layers: int = 2, seed: int = 0) -> transformers.PreTrainedModel:
    """Saves a tiny random LLaVA (a CLIP tower at 28 px in 7-px patches: 16 image tokens, a projector, a llama of
    vocabulary 300) and CLIP's image processor at its size to `folder`; returns the model (fp32, eval)."""
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                           image_size=28, patch_size=7, projection_dim=32)
    text = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=image_token, image_seq_length=16,
        vision_feature_layer=-2, vision_feature_select_strategy="default")).eval()
    model.save_pretrained(folder)
    transformers.CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}).save_pretrained(folder)
    return model


def build_llava_next(folder: Path, seed: int = 0) -> transformers.PreTrainedModel:
    """Saves a tiny random LLaVA-NeXT with its tokenizer (add_tokenizer's plus <image>) and image processor: a CLIP tower
    over 28-px tiles in 7-px patches (16 tokens a tile), grid resolutions 28x56, 56x28 and 56x56, a llama of vocabulary
    300 and a random newline embedding."""
    image = add_special_tokens(folder, 290, ["<image>"])["<image>"]
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           image_size=28, patch_size=7, projection_dim=32)
    text = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=512)
    pinpoints = [[28, 56], [56, 28], [56, 56]]
    torch.manual_seed(seed)
    model = transformers.LlavaNextForConditionalGeneration(transformers.LlavaNextConfig(
        vision_config=vision, text_config=text, image_token_index=image, image_grid_pinpoints=pinpoints,
        vision_feature_layer=-2, vision_feature_select_strategy="default")).eval()
    with torch.no_grad():
        model.model.image_newline.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    transformers.LlavaNextImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28},
                                         image_grid_pinpoints=pinpoints).save_pretrained(folder)
    return model


QWEN_VL_TOKENS = {"image_token_id": 297, "video_token_id": 298, "vision_start_token_id": 295, "vision_end_token_id": 296}


def build_qwen_vl(folder: Path, family: str = "qwen2_5_vl", layers: int = 2, seed: int = 0,
                  tokens: dict[str, int] | None = None) -> transformers.PreTrainedModel:
    """Saves a tiny random Qwen2.5-VL (or Qwen2-VL): a 3-block vision tower in 14-px patches (Qwen2.5-VL: windows of
    2x2 tokens, block 1 attending over the whole image), a Qwen2 language model of vocabulary 300 with M-RoPE
    sections (2, 3, 3), and Qwen2-VL's image processor (`tokens`: its special ids, by default QWEN_VL_TOKENS)."""
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, max_position_embeddings=512)
    if family == "qwen2_5_vl":
        vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=64, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
        config, model_class = transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
    else:
        vision = dict(depth=3, embed_dim=32, mlp_ratio=2, num_heads=4, hidden_size=64, patch_size=14, spatial_merge_size=2,
                      temporal_patch_size=2)
        config, model_class = transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
    torch.manual_seed(seed)
    model = model_class(config(vision_config=vision, text_config=text, **(tokens or QWEN_VL_TOKENS))).eval()
    model.save_pretrained(folder)
    transformers.Qwen2VLImageProcessor(max_pixels=56 * 56 * 16).save_pretrained(folder)
    return model


GEMMA3_TOKENS = {"boi_token_index": 296, "eoi_token_index": 297, "image_token_index": 298}


def build_gemma3_vl(folder: Path, seed: int = 0, tokens: dict[str, int] | None = None) -> transformers.PreTrainedModel:
    """Saves a tiny random Gemma 3 (a SigLIP tower at 56 px in 7-px patches, pooled 2x2 to 16 tokens an image; a Gemma 3
    text model of vocabulary 300 with a sliding layer of window 16 and a global one) and its image processor."""
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, max_position_embeddings=512, sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=56, patch_size=7)
    torch.manual_seed(seed)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=16, **(tokens or GEMMA3_TOKENS))
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # transformers starts the projection at zeros (every image's embeddings 0): random here
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    transformers.Gemma3ImageProcessor(size={"height": 56, "width": 56}).save_pretrained(folder)
    return model


def build_idefics3(folder: Path, seed: int = 0, family: str = "idefics3") -> transformers.PreTrainedModel:
    """Saves a tiny random Idefics3 with its tokenizer (add_tokenizer's, plus Idefics3's special tokens) and image
    processor: a SigLIP tower over 28-px tiles in 7-px patches, pixel shuffle 2 (4 tokens a tile), images up to
    56 px on the longest edge (2 x 2 tiles and the whole), a llama of vocabulary 300."""
    ids = add_special_tokens(folder, 250, ["<fake_token_around_image>", "<global-img>", "<image>"]
                             + [f"<row_{r}_col_{c}>" for r in range(1, 3) for c in range(1, 3)])
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=1024)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=7)
    torch.manual_seed(seed)
    config_class, model_class, processor_class = ((transformers.Idefics3Config, transformers.Idefics3ForConditionalGeneration,
                                                   transformers.Idefics3ImageProcessor) if family == "idefics3" else
                                                  (transformers.SmolVLMConfig, transformers.SmolVLMForConditionalGeneration,
                                                   transformers.SmolVLMImageProcessor))
    config = config_class(text_config=text, vision_config=vision, scale_factor=2, image_token_id=ids["<image>"])
    model = model_class(config).eval()
    model.save_pretrained(folder)
    processor_class(size={"longest_edge": 56}, max_image_size={"longest_edge": 28}).save_pretrained(folder)
    return model


def build_classifier(model_type: str, folder: Path, seed: int = 0,
                     labels: tuple[str, ...] = ("neg", "neu", "pos")) -> transformers.PreTrainedModel:
    """Saves a tiny random sequence classifier with `labels` to `folder` (one label: a cross-encoder's relevance logit)."""
    torch.manual_seed(seed)
    config_class = transformers.AutoConfig.for_model(model_type).__class__
    kwargs = dict(vocab_size=256, max_position_embeddings=128, num_labels=len(labels),
                  id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    if model_type == "distilbert":
        kwargs.update(dim=64, hidden_dim=128, n_layers=2, n_heads=4)
    else:
        kwargs.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, pad_token_id=1)
    config = config_class(**kwargs)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    model.save_pretrained(folder)
    return model


TOKENIZER_TEXT = (
    "the quick brown fox jumps over the lazy dog while a small cat watches from the warm window. "
    "paged attention keeps keys and values in fixed blocks; continuous batching lets requests join "
    "and leave a running batch. numbers like 12, 345 and 6789 appear too, with punctuation: (a) [b] {c}!"
)


def add_tokenizer(folder: Path, vocab_size: int = 256) -> None:
    """Trains a small SentencePiece-style BPE (ids < vocab_size; <unk>=0, <s>=1, </s>=2) into `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tokenizer.train_from_iterator([TOKENIZER_TEXT] * 4, trainer)
    assert tokenizer.get_vocab_size() <= vocab_size
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}'
    )


def add_special_tokens(folder: Path, vocab_size: int, names: list[str], chat_template: str | None = None) -> dict[str, int]:
    """add_tokenizer's tokenizer in `folder` (created) with `names` as special tokens after its vocabulary (and a chat
    template in tokenizer_config.json); returns their ids."""
    import json

    from tokenizers import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    add_tokenizer(folder, vocab_size)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_special_tokens(names)
    tokenizer.save(str(folder / "tokenizer.json"))
    if chat_template is not None:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": chat_template}))
    return {name: tokenizer.token_to_id(name) for name in names}


BYTE_TOKENIZER_TEXT = (
    '{"name": "fox", "count": 12, "tags": ["quick", "brown"], "ok": true, "rate": -0.5e3, "none": null}\n'
    "def jumps(over, the=None):\n    return [lazy, dog]  # (a) <b> 'c' @d $e %f ^g &h *i +j =k |l ~m `n ?o\\p/q"
)


def add_bert_tokenizer(folder: Path, vocab_size: int = 256) -> None:
    """Trains a small BERT-style WordPiece tokenizer into `folder`, with BERT's single and pair templates
    ([CLS] a [SEP] b [SEP], the second text's token type 1): what a cross-encoder reads pairs with."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                        show_progress=False)
    tokenizer.train_from_iterator([TOKENIZER_TEXT] * 4, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                             special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", '
        '"unk_token": "[UNK]", "mask_token": "[MASK]", "model_max_length": 128}'
    )


def add_byte_tokenizer(folder: Path, vocab_size: int = 384) -> None:
    """A byte-level BPE (every byte is a token, so any text, JSON included, can be written; <unk>=0,
    <s>=1, </s>=2) with merges learnt from a little JSON and code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([BYTE_TOKENIZER_TEXT] * 4, trainer)
    assert tokenizer.get_vocab_size() <= vocab_size
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}'
    )


# A tiny Whisper: 2 + 2 layers of 64, 4 heads, 80 mel bins, start token 1, EOS 2; 30-second windows
# (1500 source positions) unless a test asks for shorter ones.
WHISPER = dict(vocab_size=256, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=1500,
               max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)


def build_whisper(folder: Path | None = None, seed: int = 0, **overrides) -> transformers.WhisperForConditionalGeneration:
    """A tiny random Whisper (fp32, eval, eager), saved to `folder` when given."""
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**{**WHISPER, **overrides})).eval()
    model.config._attn_implementation = "eager"
    if folder is not None:
        model.save_pretrained(folder)
    return model
