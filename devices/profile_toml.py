"""Writing a device profile as TOML (tomllib only reads): enough TOML for devices/profile.py's
schema, figures ({value, unit, source}) inline and sub-tables as [tables]. What it is not: the
schema or its checks (devices/profile.py), nor a general TOML writer.
"""

from __future__ import annotations

import json
import math


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if isinstance(v, int) or math.isfinite(v) else "nan"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_inline(v) -> bool:
    return isinstance(v, dict) and ("value" in v or "source" in v)


def dumps_toml(data: dict, header: str = "") -> str:
    """Serialize a profile dict: scalars and figures inline, sub-dicts as [tables]."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []

    def emit(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if not isinstance(v, dict) or _is_inline(v):
                lines.append(f"{k} = {_toml_value(v)}")
        for k, v in d.items():
            if isinstance(v, dict) and not _is_inline(v):
                name = f"{prefix}{k}"
                if any(not isinstance(x, dict) or _is_inline(x) for x in v.values()):
                    lines.extend(["", f"[{name}]"])
                emit(v, name + ".")

    emit(data, "")
    return "\n".join(lines) + "\n"
