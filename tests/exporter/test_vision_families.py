"""The vision-language families' registries (issue 58): the exporter's records by model type
(ortinf/exporter/vision/) and the runtime's by the family a package's manifest names
(ortinf/runtime/worker/vision_families/). Each family's export and serving are tested end to end in
tests/runtime/worker/test_vision.py, test_llava_next.py, test_qwen_vl.py, test_gemma3_vision.py, test_idefics3.py."""

from __future__ import annotations

import pytest

from ortinf.errors import ConfigError
from ortinf.exporter.architectures import VISION_LANGUAGE, describe_supported
from ortinf.exporter.vision import BY_MODEL_TYPE, FAMILIES
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.vision_families import FAMILIES as SERVED
from ortinf.runtime.worker.vision_families import family_of


def test_each_model_type_has_one_record_with_its_class_and_description():
    model_types = [model_type for family in FAMILIES for model_type in family.classes]
    assert len(model_types) == len(set(model_types)) == len(BY_MODEL_TYPE)
    assert list(VISION_LANGUAGE) == model_types
    for family in FAMILIES:
        assert set(family.examples) == set(family.classes)
        assert all(name.endswith("ForConditionalGeneration") for name in family.classes.values())
    listing = describe_supported()
    assert all(model_type in listing for model_type in model_types)


def test_the_runtime_reads_a_record_by_the_manifests_family():
    assert set(SERVED) == {"llava", "llava_next", "qwen2_vl", "idefics3"}
    assert all(family.name == name for name, family in SERVED.items())
    assert family_of(VisionSpec(image_token_id=1, tokens_per_image=4, image_size=28)).name == "llava"  # the default: older packages
    with pytest.raises(ConfigError, match="'pixtral'.*upgrade ortinf"):
        family_of(VisionSpec(image_token_id=1, tokens_per_image=4, image_size=28, family="pixtral"))
