"""The packs, tiny models and trap diagnosis behind lesson 04's ``forward_kwargs_for`` check (the
check itself: ``lesson04_transformers_traps.check_forward_kwargs_for``).

- :data:`KWARGS_CASES`: the (attn_implementation, rows) the check asks about; ``rows`` holds each
  packed row's example lengths, every row :data:`T` = 32 tokens, one or two rows per batch;
- :func:`case_batch`: seeded input_ids (B, 32) and the example index (B, 32) of a case;
- :func:`isolation`: each example's max |packed logits - logits of the example run alone| when the
  learner's fields go into ``model(input_ids=ids, **fields)`` on the trap table's tiny Llama
  (:func:`packsim.exhibits.trap_cases.build_family`), whose config keeps LlamaConfig's default
  ``use_cache=True``, as a hand-written loop gets it; flash_attention_2 is transformers' own flash
  path on the reference kernel (packsim, pure torch), not flash-attn, in fp32
  (``packsim.emulate_flash(force_reference=True)``), so every case is judged by :data:`TOL`;
- :func:`fields_problem`: what is wrong with the returned object before anything runs (not a dict,
  ``input_ids`` in it, a name no backend reads: transformers passes unknown keywords on through
  ``**kwargs`` where nothing reads them, so a typo changes nothing and raises nothing);
- :func:`trap_in`: (message, hint) naming the trap a leaking (or failing) case fell into, read from
  its fields and the lesson's rules per backend (first: a field that flattens the rows into one
  while input_ids stays (B, T), which raises a tensor-size error);
- :func:`ignored_fields`: the fields of a case that its backend never reads.

No check lives here, so no solution mirrors this module.

Lessons: none directly (through its lesson's checks).
"""

from __future__ import annotations

import functools
import itertools
import warnings

import torch
from transformers import LlamaForCausalLM

from packsim.core.upstream.outputs import cache_kwargs

__all__ = ["ALLOWED", "CACHE_KWARGS", "FLASH", "KWARGS_CASES", "T", "TOL", "case_batch",
           "fields_problem", "ignored_fields", "isolation", "trap_in", "where"]

T = 32  # tokens per packed row (the trap table's)
TOL = 1e-5  # fp32: "isolated" (every case runs in fp32, flash on the reference kernel too)
FLASH = "flash_attention_2"
# (attn_implementation, rows): one and two rows per backend, lengths varied (a one-token example too)
KWARGS_CASES: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = (
    ("sdpa", ((10, 13, 9),)),
    ("sdpa", ((12, 8, 12), (5, 1, 14, 12))),
    ("eager", ((7, 25),)),
    ("eager", ((10, 13, 9), (12, 8, 12))),
    ("flex_attention", ((3, 20, 9),)),
    ("flex_attention", ((10, 13, 9), (7, 25))),
    (FLASH, ((10, 13, 9),)),
    (FLASH, ((10, 13, 9), (12, 8, 12))),
    (FLASH, ((5, 1, 14, 12), (3, 20, 9))),
)
VARLEN = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")

# the keywords the installed Llama's forward reads a cache from (read from its signature: the name
# changed across the supported window; tests/test_exercises_lesson04_transformers_traps.py pins each)
CACHE_KWARGS = cache_kwargs(LlamaForCausalLM)
ALLOWED = ("position_ids", "attention_mask", "use_cache", *CACHE_KWARGS, *VARLEN)
_FLASH_SRC = "`_flash_attention_forward` in transformers/modeling_flash_attention_utils.py"
_MASK_SRC = "`_preprocess_mask_arguments` in transformers/masking_utils.py"


def case_batch(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids (B, T) long, seeded tokens 3..95; example index (B, T) long) of ``rows``."""
    gen = torch.Generator().manual_seed(sum(len(r) for r in rows))
    ids = torch.randint(3, 96, (len(rows), T), generator=gen)
    seq = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in rows])
    return ids, seq


@functools.cache
def _model(impl: str):
    """The trap table's tiny Llama on ``impl`` (config use_cache=True, the default), built once."""
    from packsim.exhibits.trap_cases import build_family
    from packsim.reference.flash_emulation import emulate_flash

    model = build_family("llama", "eager")
    model.set_attn_implementation(emulate_flash(force_reference=True).name if impl == FLASH else impl)
    return model


def isolation(fields: dict, impl: str, rows) -> list[float]:
    """Max |packed - alone| per example (row 0's first) for ``model(input_ids=ids, **fields)``;
    each example alone gets its input_ids only (positions 0..L-1) and use_cache=False. Raises what
    the forward raises."""
    from packsim.exhibits.traps import alone_change

    ids, seq = case_batch(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return alone_change(_model(impl), {"input_ids": ids, **fields}, {}, seq, impl=impl)


def fields_problem(fields) -> tuple[str, str] | None:
    """(message, hint) if ``fields`` cannot be the keyword fields of a forward; None if it can."""
    if not isinstance(fields, dict):
        return (f"you returned a {type(fields).__name__}; return a dict of keyword fields, "
                "e.g. {'position_ids': ..., 'use_cache': False}.", "return a dict.")
    if "input_ids" in fields:
        return ("your dict holds input_ids: the check passes the tokens itself, as "
                "`model(input_ids=ids, **fields)`.", "return only the other fields.")
    unknown = sorted(k for k in fields if k not in ALLOWED)
    if unknown:
        return (f"no attention backend reads {unknown}. transformers passes unknown keywords on through "
                "`**kwargs` to the attention function, where nothing reads them: a misspelt field raises "
                "nothing and changes nothing.", f"the fields that matter here: {', '.join(ALLOWED)}.")
    given = next((k for k in CACHE_KWARGS if fields.get(k) is not None), None)
    if given is not None:
        return (f"you passed a {given}: a cache, and this is a training forward.",
                "leave it out and pass use_cache=False.")
    return None


def ignored_fields(fields: dict, impl: str) -> list[str]:
    """The fields of a case that ``impl`` never reads: cu_seq_lens_* / max_length_* off the flash
    path (sdpa, eager and flex take them into ``**kwargs`` and drop them)."""
    return [] if impl == FLASH else [k for k in VARLEN if k in fields]


def _positions(rows) -> torch.Tensor:
    return torch.tensor([[p for n in r for p in range(n)] for r in rows])  # (B, T): 0..L-1 per example


def _offsets(rows) -> list[int]:
    return [0, *itertools.accumulate(n for r in rows for n in r)]  # over the flattened batch


def _position_trap(pos, rows, where: str, impl: str) -> tuple[str, str] | None:
    """What is wrong with ``position_ids`` as the restarting positions of ``rows`` (None: right)."""
    want = _positions(rows)  # (B, T)
    B = len(rows)
    hint = "stack one restarting row per packed row (step 1): position_ids (B, T)."
    if pos is None:
        return (f"{where}: no position_ids, so the model counts 0..{T - 1} along each row and finds no "
                "example boundary.", hint)
    if not isinstance(pos, torch.Tensor):
        return (f"{where}: position_ids is a {type(pos).__name__}, not a tensor.", hint)
    if tuple(pos.shape) != (B, T):
        if tuple(pos.shape) == (1, T) and B > 1:
            return (f"{where}: position_ids is (1, {T}) for a batch of {B} rows; transformers expands it to "
                    f"every row ({_MASK_SRC}), so row 1 gets row 0's boundaries.", hint)
        return (f"{where}: position_ids has shape {tuple(pos.shape)}; the batch is ({B}, {T}).", hint)
    for b in range(B):
        if pos[b].tolist() != want[b].tolist():
            cont = pos[b].tolist() == list(range(T))
            return (f"{where}: row {b}'s position_ids "
                    + ("count 0..31 across the row: nothing restarts" if cont else
                       f"are {pos[b].tolist()[:16]}..., not the restarting {want[b].tolist()[:16]}...")
                    + ".", "0..L-1 inside each example, in every row.")
    return None


def _mask_4d_trap(mask, rows, where: str, impl: str) -> tuple[str, str]:
    from packsim.core.masks import block_diagonal_mask

    _, seq = case_batch(rows)
    want = block_diagonal_mask(seq)[:, None]  # (B, 1, T, T) True = attend
    if mask.dtype == torch.bool and impl != "sdpa":
        return (f"{where}: a bool 4D mask under {impl}, trap 3: {impl} adds the mask to the scores, so "
                "True/False become +1/+0 and nothing is masked, not even the future.",
                "pass it additive: 0 where a token may attend, a large negative number elsewhere "
                "(to_additive_4d), or pass no mask and let the positions do it.")
    allowed = mask if mask.dtype == torch.bool else mask == 0
    if tuple(allowed.shape) != tuple(want.shape):
        return (f"{where}: your 4D mask is {tuple(mask.shape)}; the batch needs ({len(rows)}, 1, {T}, {T}).",
                "one (T, T) block-diagonal causal mask per row.")
    if torch.equal(allowed, torch.ones(T, T, dtype=torch.bool).tril().expand_as(allowed)):
        return (f"{where}: your 4D mask is causal over the whole row, trap 4: every example reads the "
                "ones before it, whatever the positions say.", "allow a key only inside the query's own example.")
    return (f"{where}: your 4D mask is not the block-diagonal causal one (first difference at "
            f"{[int(i) for i in (allowed != want).nonzero()[0]]}).",
            "a token may attend to keys of its own example at or before it, nothing else.")


def _sdpa_trap(fields: dict, impl: str, rows, where: str) -> tuple[str, str]:
    mask = fields.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        return _mask_4d_trap(mask, rows, where, impl)
    if isinstance(mask, torch.Tensor):
        kind = "an all-ones 2D attention_mask, trap 2" if bool(mask.bool().all()) else "a 2D attention_mask"
        return (f"{where}: {kind}. On {impl} the pack is detected from position_ids only when "
                f"attention_mask is None (and no cache: {_MASK_SRC}); any 2D mask, even all ones, turns "
                "the detection off and the row gets one causal mask.",
                "leave attention_mask out (what TRL's padding-free collator does).")
    if fields.get("use_cache") is not False:
        said = ("you left use_cache out, so the config's default use_cache=True holds" if "use_cache" not in fields
                else f"use_cache={fields['use_cache']!r}")
        return (f"{where}: {said}, trap 1: a cache is made in the forward, and {_MASK_SRC} looks for a pack "
                "only when the cache is None.", "pass use_cache=False.")
    trap = _position_trap(fields.get("position_ids"), rows, where, impl)
    if trap is not None:
        if any(k in fields for k in VARLEN):
            trap = (trap[0] + f" {impl} never reads `cu_seq_lens_*` / `max_length_*`: only the flash path does.",
                    trap[1])
        return trap
    return (f"{where}: it leaks although the fields look right to this check.",
            "compare with the working call of the lesson: restarting positions, no mask, use_cache=False.")


def _flash_trap(fields: dict, rows, where: str) -> tuple[str, str]:
    B = len(rows)
    mask = fields.get("attention_mask")
    boundaries = ("pass cu_seq_lens_q/k and max_length_q/k over the flattened batch, as "
                  "DataCollatorWithFlattening(return_flash_attn_kwargs=True) gives them.")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        return (f"{where}: a 4D mask on the flash path, which takes none: {_FLASH_SRC} hands it to "
                "_upad_input, which reads it as (B, T) padding.", boundaries)
    if isinstance(mask, torch.Tensor) and not bool(mask.bool().all()):
        return (f"{where}: zeros in a 2D attention_mask mark padding: the flash path unpads by the mask "
                "(_upad_input) and reads neither position_ids nor `cu_seq_lens_*`.", boundaries)
    given = [k for k in VARLEN if fields.get(k) is not None]
    if given and len(given) < 4:
        missing = [k for k in VARLEN if k not in given]
        return (f"{where}: you gave {given} but not {missing}. {_FLASH_SRC} takes the varlen fields only "
                "when all four are given (is_fa_with_varlen_kwargs), else it falls back to position_ids.",
                boundaries)
    if given:
        want = _offsets(rows)
        longest = max(n for r in rows for n in r)
        for k in ("cu_seq_lens_q", "cu_seq_lens_k"):
            cu = fields[k]
            if not isinstance(cu, torch.Tensor):
                return (f"{where}: {k} is a {type(cu).__name__}; flash-attn takes a (S+1,) int32 tensor.", boundaries)
            if cu.dtype != torch.int32:
                return (f"{where}: {k} is {cu.dtype}; flash-attn takes int32 offsets (and "
                        "DataCollatorWithFlattening gives int32).", "build it with dtype=torch.int32.")
            if cu.tolist() != want:
                restarted = [0, *itertools.chain.from_iterable(itertools.accumulate(r) for r in rows)]
                yours = {str(_offsets(rows[:1])): " (Yours covers row 0 only.)",
                         str(restarted): " (Yours starts again in every row.)"}.get(str(cu.tolist()), "")
                flat = (f" The flash path flattens the batch to {B * T} tokens (q/k/v reshaped to "
                        f"`(B*T, H, D)` in {_FLASH_SRC}), so the offsets run over the rows in turn: row 1's "
                        f"examples start at {T}.{yours}") if B > 1 else ""
                return (f"{where}: {k} is {cu.tolist()}, the boundaries are {want}." + flat, boundaries)
        for k in ("max_length_q", "max_length_k"):
            if int(fields[k]) < longest:
                return (f"{where}: {k}={int(fields[k])} but the longest example holds {longest} tokens; the "
                        "kernel sizes its work by it.", "the longest example's length (or more).")
        return (f"{where}: it leaks although the offsets are right.", "compare your fields with the collator's.")
    if B > 1:
        return (f"{where}: positions only, on a {B}-row batch: the flash path reads a pack from position_ids "
                "only when batch_size == 1 (`_is_packed_sequence`), so each row runs plain causal attention.",
                boundaries)
    trap = _position_trap(fields.get("position_ids"), rows, where, FLASH)
    if trap is not None:
        return trap[0] + " (on one row the flash path finds a pack where the positions restart.)", trap[1]
    return (f"{where}: it leaks although the positions restart.", boundaries)


def where(impl: str, rows) -> str:
    """A case in words: "flash_attention_2, 2 rows [[10, 13, 9], [12, 8, 12]]"."""
    return f"{impl}, {len(rows)} row{'s' if len(rows) > 1 else ''} {[list(r) for r in rows]}"


def _flattened(fields: dict, rows, where: str) -> tuple[str, str] | None:
    """(message, hint) when a per-token field holds the rows flattened into one, (1, B*T) or (B*T,),
    while input_ids stays (B, T): the forward then fails on a tensor size (None: no such field)."""
    B = len(rows)
    for key in ("position_ids", "attention_mask"):
        value = fields.get(key)
        if B > 1 and isinstance(value, torch.Tensor) and value.dim() <= 2 and tuple(value.shape) in ((1, B * T), (B * T,)):
            return (f"{where}: your {key} is {tuple(value.shape)}, the {B} rows flattened into one, but the check "
                    f"passes input_ids as they are, ({B}, {T}), and every per-token field must match that shape: the "
                    "rows are not yours to reshape (DataCollatorWithFlattening flattens input_ids too).",
                    f"give {key} ({B}, {T}), one row per packed row; on the flash path the offsets over the "
                    "flattened batch go in cu_seq_lens_* (the kernel flattens the rows itself).")
    return None


def trap_in(fields: dict, impl: str, rows, error: BaseException | None = None) -> tuple[str, str]:
    """(message, hint) naming the trap of a case that leaked (or raised ``error``)."""
    where_ = where(impl, rows)
    flat = _flattened(fields, rows, where_)
    if flat is not None:
        message, hint = flat
    else:
        message, hint = _flash_trap(fields, rows, where_) if impl == FLASH else _sdpa_trap(fields, impl, rows, where_)
    if error is not None:
        first = (str(error).splitlines() or [""])[0][:140].rstrip(".")
        message += f" (The forward raised {type(error).__name__}: {first}.)"
    return message, hint
