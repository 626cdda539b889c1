"""A spec's file and its ``--set`` overrides, before validation: YAML read into a plain
dict (:func:`load_raw`), ``KEY=VALUE`` parsed (:func:`parse_override`) and applied to
it (:func:`apply_override`). Public through :mod:`pipeline.spec`; knows no model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from phasesweep._config import SpecError, parse_yaml, yaml_problem


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as YAML; returns (dotted key, value)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise SpecError("--set", text, "expected KEY=VALUE")
    try:
        parsed = parse_yaml(value) if value.strip() else None
    except yaml.YAMLError as e:
        raise SpecError(key.strip(), value, yaml_problem(e)) from None
    return key.strip(), parsed


def apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set ``raw[k1][k2]...`` = value for the dotted ``key``, creating sections as needed.

    Under ``grid.`` the rest of the key is one axis name, which may itself be a
    dotted path: ``grid.data.delta=[0, 0.1]`` sets the axis ``data.delta``.
    """
    parts = key.split(".")
    if parts[0] == "grid" and len(parts) > 2:
        parts = ["grid", ".".join(parts[1:])]
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError(
                ".".join(parts[: i + 1]), child, "is not a section, cannot set a key in it"
            )
        node = child
    node[parts[-1]] = value


#: Largest spec file read (bytes); larger ones (or endless ones, /dev/zero) are refused.
MAX_SPEC_BYTES = 16 * 2**20


def load_raw(path: str | Path) -> dict[str, Any]:
    """Read a spec file (UTF-8 YAML, at most :data:`MAX_SPEC_BYTES`) as a plain dict.

    No validation beyond the YAML itself and a mapping at the top level.
    """
    parts, size = [], 0
    try:
        with open(path, "rb") as f:
            while size <= MAX_SPEC_BYTES and (part := f.read(2**16)):  # no 16 MiB buffer
                parts.append(part)
                size += len(part)
    except OSError as e:
        raise SpecError("SPEC", str(path), f"cannot read: {e.strerror}") from None
    if size > MAX_SPEC_BYTES:
        raise SpecError("SPEC", str(path), f"larger than {MAX_SPEC_BYTES} bytes: not a spec")
    data = b"".join(parts)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            "SPEC", str(path), f"not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})"
        ) from None
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as e:
        raise SpecError("SPEC", str(path), yaml_problem(e)) from None
    if not isinstance(raw, dict):
        raise SpecError("SPEC", str(path), "top level must be a mapping of keys")
    return raw
