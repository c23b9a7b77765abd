"""The semantic vocabulary (docs/design.md §2): raw values, names, vocabularies, the palette, and the text-table ids.

Every other module asks this one what a `sem_ids` value means; nothing else hard-codes class numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

UNKNOWN = 255
NULL_PROMPT = "NULL_PROMPT"

STATIC_NAMES = {0: "ground", 1: "path", 2: "vegetation", 3: "water", 4: "building", 5: "prop", 6: "sky"}
PLAYER_NAMES = {
    10: "player_head",
    11: "player_torso",
    12: "player_arms",
    13: "player_legs",
    14: "player_cape",
    15: "player_weapon",
}
BOSS_NAMES = {16: "boss_head", 17: "boss_torso", 18: "boss_arms", 19: "boss_legs", 20: "boss_tail", 21: "boss_weapon"}
STATIC_MAX = 6  # "static" = raw value <= 6
PLAYER_ID, BOSS_ID = 10, 11  # the `ids` vocabulary's character values

VOCABS = ("parts", "ids")
# Values each vocabulary may hold, UNKNOWN last. The channel of a value in the class-fraction input of
# gc_sem_cond is its position in this tuple.
VOCAB_VALUES: dict[str, tuple[int, ...]] = {
    "parts": tuple(STATIC_NAMES) + tuple(PLAYER_NAMES) + tuple(BOSS_NAMES) + (UNKNOWN,),
    "ids": tuple(STATIC_NAMES) + (PLAYER_ID, BOSS_ID, UNKNOWN),
}
VALUE_NAMES: dict[str, dict[int, str]] = {
    "parts": {**STATIC_NAMES, **PLAYER_NAMES, **BOSS_NAMES, UNKNOWN: "unknown"},
    "ids": {**STATIC_NAMES, PLAYER_ID: "player", BOSS_ID: "boss", UNKNOWN: "unknown"},
}


def check_vocab(vocab: str) -> str:
    if vocab not in VOCABS:
        raise ValueError(f"vocab must be one of {VOCABS}, got {vocab!r}")
    return vocab


def num_classes(vocab: str) -> int:
    """V of docs/design.md §7: the vocabulary's classes plus UNKNOWN."""
    return len(VOCAB_VALUES[check_vocab(vocab)])


def _lut(mapping: dict[int, int], default: int) -> np.ndarray:
    lut = np.full(256, default, dtype=np.int64)
    for k, v in mapping.items():
        lut[k] = v
    return lut


# raw parts value -> ids value (identity for statics and UNKNOWN); invalid values map to themselves
_COLLAPSE = np.arange(256, dtype=np.uint8)
_COLLAPSE[list(PLAYER_NAMES)] = PLAYER_ID
_COLLAPSE[list(BOSS_NAMES)] = BOSS_ID

CHANNEL_LUT: dict[str, np.ndarray] = {
    v: _lut({val: i for i, val in enumerate(vals)}, -1) for v, vals in VOCAB_VALUES.items()
}


def collapse_parts(ids):
    """parts -> ids: 10..15 -> 10 (player), 16..21 -> 11 (boss); numpy or torch uint8 in, same type out."""
    if isinstance(ids, np.ndarray):
        return _COLLAPSE[ids]
    import torch  # heavy (~1.3 s): gcc-synth and the mask code use vocab without torch

    lut = torch.from_numpy(_COLLAPSE).to(ids.device)
    return lut[ids.long()]


def invalid_values(ids: np.ndarray, vocab: str = "parts") -> list[int]:
    """Sorted distinct values of `ids` that the vocabulary does not define (empty list = valid)."""
    present = np.flatnonzero(np.bincount(np.asarray(ids, dtype=np.uint8).ravel(), minlength=256))
    return [int(v) for v in present if CHANNEL_LUT[check_vocab(vocab)][v] < 0]


def _invalid_ranges(vocab: str) -> list[tuple[int, int]]:
    """The runs [lo, hi] of uint8 values that `vocab` does not define."""
    bad = np.flatnonzero(CHANNEL_LUT[vocab] < 0)
    starts = [int(v) for i, v in enumerate(bad) if i == 0 or bad[i - 1] != v - 1]
    ends = [int(v) for i, v in enumerate(bad) if i == len(bad) - 1 or bad[i + 1] != v + 1]
    return list(zip(starts, ends))


_INVALID_RANGES = {v: _invalid_ranges(v) for v in VOCABS}


def has_invalid(ids: np.ndarray, vocab: str = "parts") -> bool:
    """Whether uint8 `ids` [F, H, W] hold a value `vocab` does not define: a test per run of such values, frame
    by frame (a frame stays in the cache; ~5 ms for a v10 clip where `invalid_values` takes ~140 ms)."""
    ranges = _INVALID_RANGES[check_vocab(vocab)]
    for frame in ids.reshape(-1, *ids.shape[-2:]) if ids.ndim >= 2 else (ids,):
        for lo, hi in ranges:  # lo <= v <= hi  <=>  (v - lo) mod 256 <= hi - lo
            if ((frame - np.uint8(lo)) <= np.uint8(hi - lo)).any():
                return True
    return False


def is_static(ids: np.ndarray) -> np.ndarray:
    return ids <= STATIC_MAX


def key_to_id(keys: Iterable[str]) -> dict[str, int]:
    """The text table's id of each prompt key: its position in sorted order (docs/design.md §2)."""
    return {k: i for i, k in enumerate(sorted(keys))}


# ---- palette -------------------------------------------------------------------------------------------
# Statics earthy; player parts magenta/violet with a cyan weapon; boss parts red/orange with a blue weapon.
_PALETTE_PARTS = {
    0: (139, 115, 85),
    1: (194, 178, 128),
    2: (85, 130, 60),
    3: (70, 110, 150),
    4: (120, 100, 90),
    5: (160, 120, 60),
    6: (175, 200, 215),
    10: (230, 60, 230),
    11: (190, 40, 200),
    12: (150, 60, 210),
    13: (110, 40, 160),
    14: (240, 130, 240),
    15: (0, 230, 240),
    16: (230, 40, 30),
    17: (200, 60, 20),
    18: (245, 120, 30),
    19: (180, 30, 40),
    20: (250, 170, 60),
    21: (30, 70, 250),
}
_PALETTE_IDS = {**{k: _PALETTE_PARTS[k] for k in STATIC_NAMES}, PLAYER_ID: (230, 60, 230), BOSS_ID: (230, 40, 30)}
_HATCH = ((40, 40, 40), (210, 210, 210))  # UNKNOWN: dark/light diagonal stripes
_INVALID = (0, 0, 0)


def _palette_lut(colours: dict[int, tuple[int, int, int]]) -> np.ndarray:
    lut = np.zeros((256, 3), dtype=np.uint8)
    lut[:] = _INVALID
    for k, c in colours.items():
        lut[k] = c
    return lut


PALETTE: dict[str, np.ndarray] = {"parts": _palette_lut(_PALETTE_PARTS), "ids": _palette_lut(_PALETTE_IDS)}


def colorize(ids: np.ndarray, vocab: str = "parts", hatch_period: int = 8) -> np.ndarray:
    """ids [..., H, W] uint8 -> RGB [..., H, W, 3] uint8; UNKNOWN is drawn as diagonal hatching."""
    ids = np.asarray(ids, dtype=np.uint8)
    rgb = PALETTE[check_vocab(vocab)][ids]
    h, w = ids.shape[-2:]
    yy, xx = np.mgrid[0:h, 0:w]
    stripe = ((yy + xx) // max(1, hatch_period // 2)) % 2
    hatch = np.asarray(_HATCH, dtype=np.uint8)[stripe]  # [H, W, 3]
    unknown = ids == UNKNOWN
    rgb[unknown] = np.broadcast_to(hatch, rgb.shape)[unknown]
    return rgb
