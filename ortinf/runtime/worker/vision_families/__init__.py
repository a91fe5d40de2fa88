"""The vision-language families the runtime serves, by the name a package's manifest stores (VisionSpec.family):
one file each, one line below. A family whose images are served like an existing one's (Gemma 3 as LLaVA,
Qwen2.5-VL as Qwen2-VL, SmolVLM as Idefics3) needs no record here, only its export record
(ortinf/exporter/vision/), which names the family its packages store."""

from __future__ import annotations

from ortinf.errors import ConfigError
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.vision_families import idefics3, llava, llava_next, qwen2_vl
from ortinf.runtime.worker.vision_families.family import ImageFamily

FAMILIES: dict[str, ImageFamily] = {
    family.name: family
    for family in (
        llava.FAMILY,
        llava_next.FAMILY,
        qwen2_vl.FAMILY,
        idefics3.FAMILY,
    )
}


def family_of(vision: VisionSpec) -> ImageFamily:
    """The record of a package's family (a package of an unknown one was written by a newer ortinf)."""
    try:
        return FAMILIES[vision.family]
    except KeyError:
        raise ConfigError(f"the package's images are of family {vision.family!r}, which this ortinf does not serve "
                          f"(it serves {', '.join(FAMILIES)}): upgrade ortinf") from None


__all__ = ["FAMILIES", "ImageFamily", "family_of"]
