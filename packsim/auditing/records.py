"""The gate's data file: JSON Lines records read with one clear line per bad input, and the bound on
a record's length checked before anything is tokenized (``packsim audit --model DIR --data FILE``).

A record is one ``{"prompt": ..., "completion": ...}`` object per line, UTF-8 (a byte-order mark
before the first line is skipped); a string with half of a surrogate pair escaped is refused.
:func:`record_bound` is the longest text (in characters) the model could hold: no token is longer
than the tokenizer's longest vocabulary entry, so a text longer than that times the model's
positions has more tokens than it holds; :func:`load_records` refuses such a record naming its
line, its size and the limit.

Lessons: none directly (packsim.auditing.preflight reads the gate's data with it).
"""

from __future__ import annotations

import json
from pathlib import Path

from packsim.core.errors import PacksimError

__all__ = ["POSITION_KEYS", "load_records", "record_bound"]


# JSON writes a character in at most 12 bytes (an escaped surrogate pair: \ud83d\ude00 for one emoji),
# plus the keys and quotes of a record: a line longer than this holds more characters than the bound
_BYTES_PER_CHAR, _RECORD_OVERHEAD = 12, 4096


def _lines(path: Path, max_chars: int | None):
    """(line number, text) of each line, read one line at a time: a line of more bytes than a record of
    ``max_chars`` characters can take is refused after reading that many bytes, never the whole line or
    file (memory bounded by the longest record the model holds, not by the file)."""
    cap = None if max_chars is None else _BYTES_PER_CHAR * max_chars + _RECORD_OVERHEAD
    try:
        with path.open("rb") as f:
            for n, raw in enumerate(iter(lambda: f.readline(-1 if cap is None else cap + 1), b""), start=1):
                if cap is not None and len(raw) > cap:
                    yield n, None  # longer than any record within the bound: not decoded, not parsed
                    return
                if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark (Windows editors write one)
                    raw = raw[3:]
                try:
                    yield n, raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise PacksimError(f"--data {path} is not UTF-8 text (byte 0x{raw[err.start]:02x} on line {n}): "
                                       "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8).") from None
    except OSError as err:
        raise PacksimError(f"--data {path}: cannot read it ({err.strerror or type(err).__name__}): pass a "
                           "readable JSON Lines file.") from None


def load_records(path: str | Path, max_chars: int | None = None, limit: str = "") -> list[dict]:
    """The prompt/completion records of a JSONL file; a bad line or bad bytes raise PacksimError naming it.

    ``max_chars`` (:func:`record_bound`): a record whose prompt + completion is longer is refused
    before anything tokenizes it, naming its line, its size and ``limit`` (why the bound). The file is
    read a line at a time and a line is read at most as far as such a record could reach, so a 50 MB
    line costs no more memory than the longest record the model holds."""
    path = Path(path)
    if not path.is_file():
        raise PacksimError(f"--data {path}: no such file: pass a JSON Lines file with one "
                           '{"prompt": ..., "completion": ...} object per line.')
    records = []
    for n, line in _lines(path, max_chars):
        if line is None:
            raise PacksimError(f"line {n} of {path} holds more than {_BYTES_PER_CHAR * max_chars + _RECORD_OVERHEAD:,} "
                               f"bytes, so a record of more than the {max_chars:,} {limit}: split it into shorter "
                               "records or drop it.")
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
            try:
                record[key].encode("utf-8")
            except UnicodeEncodeError as err:  # JSON's \ud800 escapes decode to half a character
                raise PacksimError(f"line {n} of {path} has half a character in {key!r} (a lone surrogate, "
                                   f"{record[key][err.start]!r} at character {err.start}): write the character "
                                   "itself, or both halves of its escape (\\ud83d\\ude00).") from None
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
