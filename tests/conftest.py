"""Shared fixtures. Exports are cached per session: tracing is the slow part of most tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

import ortinf
from tiny_models import add_tokenizer, build_decoder


@pytest.fixture(scope="session")
def decoder_package(tmp_path_factory: pytest.TempPathFactory):
    """Returns a function model_type -> (hf model, package folder), exporting each type once."""
    made: dict[str, tuple[transformers.PreTrainedModel, Path]] = {}

    def get(model_type: str) -> tuple[transformers.PreTrainedModel, Path]:
        if model_type not in made:
            root = tmp_path_factory.mktemp(model_type)
            model = build_decoder(model_type, root / "hf")
            add_tokenizer(root / "hf")
            ortinf.export(root / "hf", root / "pkg", progress=False)
            made[model_type] = (model, root / "pkg")
        return made[model_type]

    return get
