"""The gate's data file: JSON Lines records read with one clear line per bad input, and the bound on
a record's length checked before anything is tokenized (``packsim audit --model DIR --data FILE``).

A record is one ``{"prompt": ..., "completion": ...}`` object per line. :func:`record_bound` is the
longest text (in characters) the model could hold: no token is longer than the tokenizer's longest
vocabulary entry, so a text longer than that times the model's positions has more tokens than it
holds; :func:`load_records` refuses such a record naming its line, its size and the limit.

Lessons: none directly (packsim.auditing.preflight reads the gate's data with it).
"""

from __future__ import annotations

import json
from pathlib import Path

from packsim.core.errors import PacksimError

__all__ = ["POSITION_KEYS", "load_records", "record_bound"]


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; unreadable or non-UTF-8 bytes raise PacksimError naming the place."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise PacksimError(f"--data {path}: cannot read it ({err.strerror or type(err).__name__}): pass a "
                           "readable JSON Lines file.") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise PacksimError(f"--data {path} is not UTF-8 text (byte 0x{raw[err.start]:02x} on line {line}): "
                           "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8).") from None


def load_records(path: str | Path, max_chars: int | None = None, limit: str = "") -> list[dict]:
    """The prompt/completion records of a JSONL file; a bad line or bad bytes raise PacksimError naming it.

    ``max_chars`` (:func:`record_bound`): a record whose prompt + completion is longer is refused
    before anything tokenizes it, naming its line, its size and ``limit`` (why the bound)."""
    path = Path(path)
    if not path.is_file():
        raise PacksimError(f"--data {path}: no such file: pass a JSON Lines file with one "
                           '{"prompt": ..., "completion": ...} object per line.')
    records = []
    for n, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise PacksimError(f"line {n} of {path} is not JSON ({err.msg}): write one JSON object "
                               "per line.") from None
        if not isinstance(record, dict):
            raise PacksimError(f"line {n} of {path} is a {type(record).__name__}, not an object: write "
                               '{"prompt": ..., "completion": ...}.')
        for key in ("prompt", "completion"):
            if not isinstance(record.get(key), str):
                what = "has no" if key not in record else "has a non-string"
                raise PacksimError(f"line {n} of {path} {what} {key!r}: each line needs 'prompt' and "
                                   "'completion' strings.")
        size = len(record["prompt"]) + len(record["completion"])
        if max_chars is not None and size > max_chars:
            raise PacksimError(f"line {n} of {path} holds a record of {size:,} characters, more than the "
                               f"{max_chars:,} {limit}: split it into shorter records or drop it.")
        records.append({"prompt": record["prompt"], "completion": record["completion"]})
    if len(records) < 2:
        raise PacksimError(f"{path} holds {len(records)} record(s): the audit needs at least 2 examples "
                           "to check that they stay apart.")
    return records


# where configs keep the number of positions the model holds (GPT-2: n_positions)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def record_bound(model, tokenizer, max_length: int) -> tuple[int, str]:
    """(max_chars, why) for :func:`load_records`: records longer are refused before tokenizing.

    No token of the tokenizer stands for more characters than its longest vocabulary entry has
    (``longest``: byte-level BPE writes one character per byte, SentencePiece one per character,
    WordPiece adds ``##``), so a text of more than ``longest * positions`` characters is more than
    ``positions`` tokens, longer than the model holds (``max_position_embeddings``; the gate's
    ``--max-length`` where the config names none), whatever the collator: tokenizing it and running
    it would only cost the machine (a 50 MB line got the gate OOM-killed). TRL's packing would cut
    such a record to --max-length; the gate refuses it instead, so what it tokenizes is bounded."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    positions = next((v for v in (getattr(config, k, None) for k in POSITION_KEYS) if isinstance(v, int) and v > 0),
                     None)
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
    held = f"{positions:,} positions the model holds (max_position_embeddings)" if positions else (
        f"{max_length:,} tokens of --max-length (the config names no max_position_embeddings)")
    return longest * (positions or max_length), (f"characters a record can have within the {held}: no token of "
                                                 f"this tokenizer is longer than {longest} characters")


# Files from which AutoTokenizer builds a real vocabulary (any one is enough).
