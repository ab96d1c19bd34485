"""The names of the certified models since version 0.3.0, and how older names are read.

Version 0.3.0 made `certified` mean the joint layer everywhere (THEORY §3.7):

| what                    | before 0.3.0                          | from 0.3.0                                      |
|-------------------------|---------------------------------------|-------------------------------------------------|
| preset, joint layer     | `certified-joint`                     | `certified`                                     |
| preset, alternating     | `certified`                           | `certified-alternating`                         |
| kinds, joint layer      | `certified-joint`, `-joint-untied`    | `certified`, `certified-untied`                 |
| kinds, alternating      | `certified-tied`, `certified-untied`  | `certified-alternating`, `-alternating-untied`  |

Saved configs name a preset or kind and fill the fields they leave out from it, so a renamed name would
silently change what an old folder rebuilds. Saved configs of earlier versions are therefore read with the
names of their time: a `TrainConfig` dict saved before 0.3.0 (no `version` key, or an older one, and
complete: `written_before_0_3`) gets `KINDS_BEFORE_0_3`; a complete `ModelConfig` dict whose preset is an
old name gets the preset it meant (`legacy_preset`). Names given now: the old joint names are accepted with
a `DeprecationWarning` (they name the same model); `certified-tied` is refused in one line naming
`certified-alternating`, since it named the alternating layer, which `certified` no longer is.
"""
from __future__ import annotations

import warnings

from .errors import ConfigError

__all__ = ["CONFIG_VERSION", "DEPRECATED_KINDS", "DEPRECATED_PRESETS", "KINDS_BEFORE_0_3", "NAMES_VERSION",
           "RENAMED_KINDS", "current_kind", "current_preset", "legacy_preset", "written_before_0_3"]

NAMES_VERSION = (0, 3, 0)
#: The version written into every saved training config (`TrainConfig.to_dict`).
CONFIG_VERSION = ".".join(map(str, NAMES_VERSION))

DEPRECATED_PRESETS = {"certified-joint": "certified"}
_PRESETS_BEFORE_0_3 = {"certified": "certified-alternating", "certified-joint": "certified"}
#: Fields every complete `ModelConfig.to_dict()` output has listed since version 0.1.0.
_FIELDS_0_1 = ("d_model", "n_heads", "depth", "tied", "rho", "attention", "ffn", "anchor_weight", "alpha_attention",
               "learn_basis", "ffn_hidden", "alpha_ffn", "relu", "spectrum_bound", "spectrum_method", "certified")

#: Kinds of versions before 0.3.0 -> the kind that builds the same model now (`certified-untied` changed meaning).
KINDS_BEFORE_0_3 = {"certified-tied": "certified-alternating", "certified-untied": "certified-alternating-untied",
                    "certified-joint": "certified", "certified-joint-untied": "certified-untied"}
#: Old joint kinds given now: accepted with a DeprecationWarning (the same model under its new name).
DEPRECATED_KINDS = {"certified-joint": "certified", "certified-joint-untied": "certified-untied"}
#: Old kinds given now and refused: mapping `certified-tied` to either layer would guess what the user meant.
RENAMED_KINDS = {"certified-tied": "certified-alternating"}
#: Keys every `TrainConfig.to_dict()` output has listed since version 0.1.0: a dict holding them all was saved.
_SAVED_KEYS = {"optim": ("lr", "weight_decay", "warmup", "min_lr_ratio", "epochs", "batch_size", "seed", "grad_clip",
                         "chunk_batches"),
               "run": ("out_dir", "eval_every", "checkpoint_every", "eval_batch_size", "eval_examples", "threads",
                       "device", "deterministic", "progress", "overwrite")}


def current_preset(name: str | None, stacklevel: int = 4) -> str | None:
    """The preset `name` given now stands for: a deprecated name warns and maps to its new name."""
    if name in DEPRECATED_PRESETS:
        warnings.warn(f"preset {name!r} is now called {DEPRECATED_PRESETS[name]!r} (since 0.3.0, 'certified' is "
                      "the joint layer); the old name will be removed", DeprecationWarning, stacklevel=stacklevel)
        return DEPRECATED_PRESETS[name]
    return name


def current_kind(kind: str, stacklevel: int = 4) -> str:
    """The `model.kind` given now stands for: the old joint kinds warn and map; `certified-tied` is refused."""
    if kind in DEPRECATED_KINDS:
        warnings.warn(f"model.kind {kind!r} is now called {DEPRECATED_KINDS[kind]!r} (since 0.3.0, 'certified' is "
                      "the joint layer); the old name will be removed", DeprecationWarning, stacklevel=stacklevel)
        return DEPRECATED_KINDS[kind]
    if kind in RENAMED_KINDS:
        raise ConfigError(f"model.kind {kind!r} was renamed {RENAMED_KINDS[kind]!r} (the alternating layer); since "
                          "0.3.0 'certified' is the joint layer, the recommended one")
    return kind


def legacy_preset(data: dict) -> dict:
    """A complete `ModelConfig.to_dict()` output (it lists every field of version 0.1.0) whose `preset_name` is an
    old name gets the preset that name meant before 0.3.0: `certified` was the alternating layer (unless the dict
    says `layer: joint`, which only a 0.3.0 `certified` dict does), `certified-joint` the joint one. A saved dict
    lists every field its model uses, so only fields added since it was written come from the preset: the rebuilt
    model is the one that was saved. Partial dicts are left as they are (current names)."""
    if not set(_FIELDS_0_1) <= set(data):
        return data
    name = data.get("preset_name") or "certified-alternating"      # 0.1.0 wrote null for the default
    if name == "certified" and data.get("layer") == "joint":        # the joint preset's own (current) output
        return {**data, "preset_name": name}
    return {**data, "preset_name": _PRESETS_BEFORE_0_3.get(name, name)}


def written_before_0_3(data: dict, version) -> bool:
    """Whether a `TrainConfig` dict was saved by a version before 0.3.0: its `version` says so, or it has none and
    is a complete `to_dict()` output (it lists every optim and run key of version 0.1.0, as no hand-written file
    or dict does; a config saved by 0.3.0 on carries its `version`)."""
    if version is None:
        return all(isinstance(data.get(section), dict) and set(keys) <= set(data[section])
                   for section, keys in _SAVED_KEYS.items())
    try:
        parts = [int(part) for part in str(version).split(".")[:3]]
    except ValueError:
        raise ConfigError(f"config version {version!r} is not a version number like {CONFIG_VERSION}") from None
    return tuple(parts + [0] * (3 - len(parts))) < NAMES_VERSION        # "0.3" (a YAML float) is 0.3.0
