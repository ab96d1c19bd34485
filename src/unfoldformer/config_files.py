"""Strict reading of training config files (JSON, YAML) and the plain merge of settings onto the schema.

Configs are data: no value is ever interpolated or resolved (`${oc.env:VAR}`, `${a.b}` and `$HOME` stay
the characters they are, in files, saved configs and on the command line).

- `read_config_file`: a key given twice in one mapping is refused (JSON and YAML), naming it; a
  syntax error is one line, `FILE:LINE:COLUMN: not valid JSON|YAML: PROBLEM`. YAML floats written
  without a dot (`3e-4`, which YAML 1.1 reads as a string) are read as floats, as in JSON.
- `check_file_types`: every value has its field's type: an integer field takes a JSON/YAML integer
  (not `"1"`, not `1.0`, not `true`), a float field a number, a bool field true/false, a string field
  a string; null only where the field is optional. The command line converts its strings by the
  field's type, as before; a file says what type it means, so a mismatch is a mistake.
- Bounds: a file over `MAX_CONFIG_BYTES`, nested deeper than `MAX_DEPTH`, or (YAML) using an anchor or
  alias (`&a` / `*a`: the "billion laughs" expansion) is refused in one line, before anything is built.
- `merge_sections`: settings (mappings from files, or `section.key` strings from the command line)
  applied in order onto a schema's defaults; an unknown key is refused by its full name, a command-line
  string is converted by the field's type (`null` unsets an optional field; a string field takes the
  text exactly as given).
"""
from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["MAX_CONFIG_BYTES", "MAX_DEPTH", "check_file_types", "merge_sections", "read_config_file"]

#: Largest config file read (a run's saved config.json is a few kB).
MAX_CONFIG_BYTES = 1 << 20
#: Deepest nesting of mappings / lists in a config file (the schema has two levels).
MAX_DEPTH = 16


class _Refused(Exception):
    """A bound of the reader (alias, depth): `message`, `where` = LINE:COLUMN or ''."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(message)
        self.message, self.where = message, where


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

        def compose_node(self, parent, index):
            event = self.peek_event()
            mark = event.start_mark
            where = f"{mark.line + 1}:{mark.column + 1}"
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise _Refused("YAML anchors and aliases (&name, *name) are not accepted in a config file; "
                               "write each value out", where)
            self._depth = getattr(self, "_depth", 0) + 1
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels; a config has sections of settings", where)
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

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
    if len(text.encode("utf-8")) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file larger than {MAX_CONFIG_BYTES:,} bytes; is it a config?")
    is_json = path.suffix == ".json"
    try:
        if is_json:
            _check_json_depth(text)
            return json.loads(text, object_pairs_hook=_json_pairs)
        return yaml.load(text, _yaml_loader())
    except _Refused as refused:
        at = f":{refused.where}" if refused.where else ""
        raise ConfigError(f"{path}{at}: {refused.message}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply; a config has sections of settings") from None
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


def _check_json_depth(text: str) -> None:
    """_Refused when JSON brackets (outside strings) nest deeper than MAX_DEPTH."""
    depth, in_string, escaped, line = 0, False, False, 1
    for char in text:
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels; a config has sections of settings",
                               f"{line}")
        elif char in "]}":
            depth -= 1
        line += char == "\n"


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


_INTEGER = re.compile(r"[-+]?[0-9]+")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_KIND_NAMES = {int: "Integer", float: "Float", bool: "Boolean", str: "String"}


def _from_text(text: str, hint, key: str) -> Any:
    """A command-line value converted by its field's type; nothing in it is interpreted beyond that."""
    kinds, optional = _allowed(hint)
    if optional and text == "null":
        return None
    if int in kinds and _INTEGER.fullmatch(text.strip()):
        return int(text)
    if str in kinds:
        return text
    if float in kinds:
        try:
            return float(text)
        except ValueError:
            pass
    if bool in kinds and text.strip().lower() in _TRUE + _FALSE:
        return text.strip().lower() in _TRUE
    want = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in sorted(kinds, key=str))
    raise ConfigError(f"{key}: Value {text!r} of type 'str' could not be converted to {want}")


def _from_value(value: Any, hint, key: str) -> Any:
    """A Python value (from a file or a dict) of its field's type; an integer becomes a float field's float."""
    kinds, optional = _allowed(hint)
    if value is None and optional:
        return None
    if value is None or not _fits(value, kinds):
        raise ConfigError(f"{key}: {value!r} ({_json_type(value)}) is not of the field's type "
                          f"({' or '.join(_NAMES.get(k, k.__name__) for k in sorted(kinds, key=str))})")
    if isinstance(value, str) and int in kinds and _INTEGER.fullmatch(value):     # eval_every: "5" is 5 steps
        return int(value)
    return float(value) if float in kinds and int not in kinds and not isinstance(value, bool) else value


def merge_sections(schema: type, *sources: dict | list[tuple[str, str]]) -> dict[str, dict]:
    """The sections of dataclass `schema` (each a dataclass of settings), as plain dicts: its defaults,
    then each source in order: a mapping {section: {key: value}} of typed values, or a list of
    ("section.key", TEXT) pairs from the command line (TEXT converted by the field's type)."""
    hints = typing.get_type_hints(schema)
    merged: dict[str, dict] = {}
    for name in hints:
        merged[name] = {f: getattr(hints[name](), f) for f in typing.get_type_hints(hints[name])}
    for source in sources:
        pairs = ([(key.split("."), text, True) for key, text in source] if isinstance(source, list) else
                 [([section, key], value, False) for section, values in source.items()
                  for key, value in _section_items(section, values, schema)])
        for parts, value, is_text in pairs:
            key = ".".join(parts)
            if parts[0] not in hints:
                raise ConfigError(f"{key}: Key {parts[0]!r} not in {schema.__name__!r}")
            section = hints[parts[0]]
            fields = typing.get_type_hints(section)
            if len(parts) != 2 or parts[1] not in fields:
                raise ConfigError(f"{key}: Key {'.'.join(parts[1:])!r} not in {section.__name__!r}")
            convert = _from_text if is_text else _from_value
            merged[parts[0]][parts[1]] = convert(value, fields[parts[1]], key)
    return merged


def _section_items(section: str, values: Any, schema: type) -> list[tuple[str, Any]]:
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: section {section!r} of {schema.__name__} must be a mapping of settings, "
                          f"got {_json_type(values)}")
    return list(values.items())
