"""Strict reading of training config files (JSON, YAML): what `TrainConfig.load` accepts.

- `read_config_file`: a key given twice in one mapping is refused (JSON and YAML), naming it; a
  syntax error is one line, `FILE:LINE:COLUMN: not valid JSON|YAML: PROBLEM`. YAML floats written
  without a dot (`3e-4`, which YAML 1.1 reads as a string) are read as floats, as in JSON.
- `check_file_types`: every value has its field's type: an integer field takes a JSON/YAML integer
  (not `"1"`, not `1.0`, not `true`), a float field a number, a bool field true/false, a string field
  a string; null only where the field is optional. The command line converts its strings by the
  field's type, as before; a file says what type it means, so a mismatch is a mistake.
"""
from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["check_file_types", "read_config_file"]


class _Duplicate(Exception):
    def __init__(self, key: str, where: str = ""):
        super().__init__(key)
        self.key, self.where = key, where


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _yaml_loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses duplicate keys and reads 1e-3 as a float (YAML 1.2, as JSON does)."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    mark = key_node.start_mark
                    raise _Duplicate(str(key), f"{mark.line + 1}:{mark.column + 1}")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))
    return StrictLoader


def read_config_file(path: Path) -> Any:
    """The parsed content of a `.json` (else YAML) config file; ConfigError in one line on any problem."""
    import yaml
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    is_json = path.suffix == ".json"
    try:
        return json.loads(text, object_pairs_hook=_json_pairs) if is_json else yaml.load(text, _yaml_loader())
    except _Duplicate as dup:
        at = f":{dup.where}" if dup.where else ""
        raise ConfigError(f"{path}{at}: key {dup.key!r} is given twice in one mapping; keep one") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{at}: not valid YAML: {problem}") from None


_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _allowed(hint) -> tuple[set, bool]:
    """(the types a field takes, whether null is allowed)."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    return {a for a in args if a is not type(None)}, type(None) in args


def _fits(value: Any, kinds: set) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int):
        return int in kinds or float in kinds
    if isinstance(value, float):
        return float in kinds
    return any(k not in (int, float, bool) and isinstance(value, k) for k in kinds)


def _json_type(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)


def check_file_types(data: dict, path: Path | str, sections: dict[str, type]) -> None:
    """ConfigError naming the file (or source) and `section.key` for a value whose type differs from its field's."""
    for section, schema in sections.items():
        values = data.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping of settings, got {_json_type(values)}")
        hints = typing.get_type_hints(schema)
        for key, value in values.items():
            if key not in hints:
                continue                                          # unknown keys: refused by the merge, by name
            kinds, optional = _allowed(hints[key])
            if value is None and optional:
                continue
            if value is None or not _fits(value, kinds):
                want = " or ".join(_NAMES.get(k, k.__name__) for k in sorted(kinds, key=str))
                want += " (or null)" if optional else ""
                raise ConfigError(f"{path}: {section}.{key} must be {want}, got {value!r} ({_json_type(value)})")
