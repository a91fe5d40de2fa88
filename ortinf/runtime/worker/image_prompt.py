"""A vision-language prompt's images: each decoded and preprocessed for the package's family, and the prompt's
placeholder for it written out as the tokens the family's processor writes (the image's tokens, with Gemma 3's
or Idefics3's text around them), or found already written; each image placed where its embeddings go. What
differs between families is read from the family's record (ortinf/runtime/worker/vision_families/)."""

from __future__ import annotations

from collections.abc import Sequence

from ortinf.errors import RequestError
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage
from ortinf.runtime.worker.images import check_request_pixels, load_image
from ortinf.runtime.worker.vision_families import family_of


def place_images(ids: list[int], images: Sequence[object], vision: VisionSpec, step: int) -> tuple[list[int], tuple[PlacedImage, ...]]:
    """(the prompt's token ids with every image written out, the images placed); RequestError naming what is wrong.
    `step`: the most tokens one step prefills (an image that must be prefilled whole may not be longer)."""
    marker = vision.image_token_id
    placeholder = vision.placeholder_id if vision.placeholder_id is not None else marker
    family = family_of(vision)
    check_request_pixels(list(images))
    pictures = [family.preprocess(load_image(image), vision) for image in images]
    counts = [count for _, count, _ in pictures]
    spans: list = [(None, 0)] * len(pictures)  # Idefics3's: each image's embedding rows among its tokens, and their span
    found = [i for i, t in enumerate(ids) if t == marker]
    if found and (placeholder != marker or len(found) != len(images)):  # already one run of image tokens per image
        if family.tokens_among_text:  # its image tokens lie among text tokens: written here from the image alone
            raise RequestError(f"the prompt has {len(found)} image tokens for {len(images)} images: put one image token "
                               f"({marker}) where each image goes; {family.title}'s images are written into the prompt here",
                               param="prompt")
        if len(found) != sum(counts):
            what = "placeholders" if placeholder == marker else f"tokens (token {marker})"
            raise RequestError(f"the prompt has {len(found)} image {what} for {len(images)} images: put one placeholder "
                               f"(token {placeholder}) where each image goes, or each image's own tokens ({sum(counts)} in all)",
                               param="prompt")
        starts, index = [], 0
        for count in counts:
            if found[index : index + count] != list(range(found[index], found[index] + count)):
                raise RequestError("the prompt's image tokens are not in runs of one image each", param="prompt")
            starts.append(found[index])
            index += count
    else:  # one placeholder per image: expanded here (with the family's tokens around it)
        marks = [i for i, t in enumerate(ids) if t == placeholder]
        if len(marks) != len(images):
            raise RequestError(f"the prompt has {len(marks)} image placeholders for {len(images)} images: put one "
                               f"placeholder (token {placeholder}) where each image goes", param="prompt")
        layouts = [family.layout(vision, count, grid) for _, count, grid in pictures]
        expanded, starts, spans = [], [], []
        for token in ids:
            if token == placeholder:
                tokens, rows = layouts[len(starts)]
                starts.append(len(expanded) + rows[0])
                spans.append((tuple(r - rows[0] for r in rows), len(tokens) - rows[0]) if family.tokens_among_text else (None, 0))
                expanded += tokens
            else:
                expanded.append(token)
        ids = expanded
    if vision.whole_images and counts and max(counts) > step:
        raise RequestError(f"an image is {max(counts)} tokens, which one step must prefill whole, and a step takes {step}: "
                           f"serve with --max-num-batched-tokens {max(counts)} or more", param="images")
    placed = tuple(PlacedImage(start, EncoderInput.of(data, count, "image"), grid if family.keeps_grid else None,
                               vision.whole_images, rows, span)
                   for start, (data, count, grid), (rows, span) in zip(starts, pictures, spans))
    return ids, placed


def placeholder_text(vision: VisionSpec, tokenizer) -> str:  # a tokenizers.Tokenizer
    """The text that marks an image in a prompt (chat templates, `ortinf chat`): the placeholder token's, between
    Qwen2-VL's vision start and end tokens (as its template writes an image); Gemma 3's is <start_of_image>."""
    marker = vision.placeholder_id if vision.placeholder_id is not None else vision.image_token_id
    return "".join(tokenizer.id_to_token(i) for i in (vision.image_start_id, marker, vision.image_end_id) if i is not None)


__all__ = ["place_images", "placeholder_text"]
