"""The installed providers, found through ORT's device API, and the one place 'auto' is resolved.

A provider is available when the installed onnxruntime offers its name (providers built into the
wheel: onnxruntime-gpu, -openvino, -migraphx, -directml) or when its plugin package is installed and
its library registers devices (`register_execution_provider_library`, `get_ep_devices`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from ortinf.errors import ConfigError, ProviderUnavailableError
from ortinf.providers import coreml, cpu, cuda, dml, migraphx, openvino, webgpu
from ortinf.providers.base import Provider

log = logging.getLogger(__name__)

PROVIDERS: dict[str, Provider] = {m.PROVIDER.name: m.PROVIDER for m in (cuda, migraphx, dml, webgpu, openvino, coreml, cpu)}
# 'auto' takes the first usable provider in this order: hardware accelerators first, CPU last.
AUTO_ORDER = ("cuda", "migraphx", "dml", "webgpu", "openvino", "coreml", "cpu")

_registered: dict[str, str] = {}  # plugin module -> library path, registered once per process


@dataclass(frozen=True, slots=True)
class Found:
    """An available provider with the ORT devices it offers (empty for name-only providers)."""

    provider: Provider
    devices: tuple[ort.OrtEpDevice, ...]

    @property
    def software(self) -> bool:
        """Only a CPU device stands behind a GPU-style provider (e.g. WebGPU on lavapipe)."""
        cpu_only = all(d.device.type == ort.OrtHardwareDeviceType.CPU for d in self.devices)
        return self.provider.memory == "device" and bool(self.devices) and cpu_only


def register_plugin(provider: Provider) -> bool:
    """Registers the provider's plugin library with ORT (once); False when its package is missing."""
    module_name = provider.plugin_module
    if module_name is None:
        return False
    if module_name in _registered:
        return True
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return False
    library = module.get_library_path()
    # ORT's default logger would print the plugin's start-up warnings (e.g. about a software adapter)
    # on stderr of every command; ortinf reports what matters itself (errors stay on).
    ort.set_default_logger_severity(3)
    try:
        ort.register_execution_provider_library(provider.name, library)
    except Exception as exc:  # noqa: BLE001 - ORT raises a bare Fail for an incompatible library
        log.warning("%s is installed but its library does not load (%s)", provider.package, exc)
        return False
    _registered[module_name] = library
    return True


_preloaded: list[bool] = []


def preload_dlls() -> None:
    """onnxruntime.preload_dlls() once per process (onnxruntime-gpu >= 1.21): it loads the CUDA and
    cuDNN libraries of the nvidia-* wheels that onnxruntime-gpu[cuda,cudnn] installs, which ORT does
    not find by itself. Without those wheels (a system CUDA), it finds nothing and that is fine."""
    if _preloaded:
        return
    _preloaded.append(True)
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    try:
        preload()
    except Exception as exc:  # noqa: BLE001 - a missing wheel is not an error: a system CUDA may serve
        log.debug("onnxruntime.preload_dlls() found nothing to load (%s)", exc)


def installed(provider: Provider) -> bool:
    """Whether the package carrying the provider is installed (it may still find no device)."""
    if provider.plugin_module is not None:
        return importlib.util.find_spec(provider.plugin_module) is not None
    return provider.ort_name in ort.get_available_providers()


def environment(provider: Provider) -> Path | None:
    """The environment of its own that the provider's setup script made beside this clone (its package
    replaces the onnxruntime wheel: `.venv-openvino` and the like), when it exists."""
    named = re.search(r"\.venv-[a-z]+", provider.install_hint)
    if named is None:
        return None
    folder = Path(__file__).resolve().parents[2] / named.group(0)
    return folder if (folder / "bin" / "ortinf").exists() or (folder / "Scripts" / "ortinf.exe").exists() else None


def not_here(provider: Provider) -> str:
    """What to do about a provider this environment lacks: use its environment, or install it."""
    folder = environment(provider)
    if folder is not None:
        return f"it runs in {folder.name}, made by its setup script: {folder.name}/bin/ortinf ... --provider {provider.name}"
    return provider.install_hint


def find(provider: Provider) -> Found | None:
    """The provider with its devices, or None when this install cannot run it."""
    if provider.plugin_module is not None:
        if not register_plugin(provider):
            return None
        devices = tuple(d for d in ort.get_ep_devices() if d.ep_name == provider.ort_name)
        return Found(provider, devices) if devices else None
    if provider.ort_name not in ort.get_available_providers():
        return None
    if provider.preload_dlls:
        preload_dlls()
    devices = tuple(d for d in ort.get_ep_devices() if d.ep_name == provider.ort_name)
    return Found(provider, devices)


def available() -> list[Found]:
    """Every provider this install can run, in AUTO_ORDER."""
    return [found for name in AUTO_ORDER if (found := find(PROVIDERS[name])) is not None]


def resolve(name: str) -> Found:
    """The provider for `name` ('auto' or one of PROVIDERS); raises with the pip package to install."""
    if name == "auto":
        have = available()
        for found in have:
            if found.software:
                log.info("provider auto: skipping %s (its only device is a software adapter)", found.provider.name)
                continue
            log.info("provider auto -> %s (available: %s)", found.provider.name, ", ".join(f.provider.name for f in have))
            return found
        raise ProviderUnavailableError("no usable execution provider (not even the CPU one): reinstall onnxruntime")
    if name not in PROVIDERS:
        raise ProviderUnavailableError(f"unknown provider '{name}': choose one of auto, {', '.join(PROVIDERS)}")
    found = find(PROVIDERS[name])
    if found is None:
        provider = PROVIDERS[name]
        if not installed(provider):
            raise ProviderUnavailableError(f"provider '{name}' is not installed in this environment: {not_here(provider)}")
        raise ProviderUnavailableError(f"provider '{name}' is installed but finds no device{provider.no_device_hint}")
    return found


def parse_options(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """['key=value', ...] (--provider-option) -> {key: value}; a malformed pair is a ConfigError."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--provider-option {pair!r} is not key=value (e.g. --provider-option device_type=GPU)")
        options[key.strip()] = value.strip()
    return options
