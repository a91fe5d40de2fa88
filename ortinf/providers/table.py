"""`ortinf providers`: every provider family ortinf knows, whether this install runs it, on which
devices, what it runs, and the pip package that adds a missing one."""

from __future__ import annotations

import onnxruntime as ort

from ortinf.providers.registry import AUTO_ORDER, PROVIDERS, environment, find, installed, not_here, resolve

COLUMNS = ("provider", "status", "devices", "pool", "dtypes", "kernels", "install")


def device_text(device: ort.OrtEpDevice) -> str:
    """'GPU NVIDIA 80.0 GiB' style: type, vendor and memory where ORT reports it."""
    hardware = device.device
    kind = str(hardware.type).rsplit(".", 1)[-1]
    memory = next((v for k, v in dict(hardware.metadata).items() if "memory" in k.lower()), None)
    parts = [kind, hardware.vendor or f"vendor 0x{hardware.vendor_id:04x}"]
    if memory:
        parts.append(f"{int(memory) / 2**30:.1f} GiB" if str(memory).isdigit() else str(memory))
    return " ".join(parts)


def rows() -> list[tuple[str, ...]]:
    """One row per provider family, in the order 'auto' tries them."""
    try:
        chosen = resolve("auto").provider.name
    except Exception:  # noqa: BLE001 - the table is still useful without a choice
        chosen = None
    table = []
    for name in AUTO_ORDER:
        provider = PROVIDERS[name]
        found = find(provider)
        if found is None:
            if installed(provider):
                status = "installed, no device"
            else:
                status = f"in {environment(provider).name}" if environment(provider) is not None else "not installed"
            devices = "-"
        else:
            status = "available" + (" (auto)" if name == chosen else "") + (" (software device)" if found.software else "")
            devices = "; ".join(device_text(d) for d in found.devices) or "(not reported)"
        table.append((name, status, devices, provider.memory, ",".join(provider.dtypes), ",".join(provider.kernels),
                      "-" if installed(provider) else not_here(provider)))
    return table


def format_table(table: list[tuple[str, ...]]) -> str:
    widths = [max(len(COLUMNS[i]), *(len(row[i]) for row in table)) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)
