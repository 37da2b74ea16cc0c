"""Checks for the exercise of notebook 04_transformers_traps.

- :func:`check_position_ids_from_lengths`: example lengths -> position ids (sum(lengths),) long
  that restart at 0 in every example, the form transformers needs to detect a pack (step 1);
- :func:`check_forward_kwargs_for`: (rows of example lengths, attn_implementation) -> the dict of
  fields for ``model(input_ids=ids, **fields)`` that keeps every example isolated on that backend
  (step 2). It RUNS them: the trap table's tiny Llama, packed vs each example alone, on nine
  (backend, rows) cases (``lesson04_backend_cases``: the cases, the runs, the traps it names).

Appendix A3 (A3_flash_path_and_hybrids) has two more, below the line ``appendix A3``:

- :func:`check_seq_idx_from_position_ids`: position_ids (1, T) -> the seq_idx (1, T) int32 a Mamba2
  hybrid's kernels read, judged against DataCollatorWithFlattening(return_seq_idx=True), then the
  tiny Bamba on packsim's reference kernels, each example packed vs alone;
- :func:`check_mrope_position_ids`: position_ids (1, T) -> the (4, 1, T) rows Qwen2-VL's text stack
  needs for a packed row (text row, then t, h, w), then the tiny Qwen2-VL, packed vs alone.

The check runs the learner's function on small hand-made packs and compares it with answers
computed here by a plain Python loop.
"""

from __future__ import annotations

import functools
import warnings

import torch

from packsim.course.exercises import Feedback, check, fail, ok

__all__ = ["check_forward_kwargs_for", "check_position_ids_from_lengths", "LENGTH_CASES"]

# Packs the check tries, as example lengths: several examples, one example, many length-1
# examples (the same packs as lesson 03's checks).
LENGTH_CASES: tuple[tuple[int, ...], ...] = ((3, 2, 4), (5,), (1, 1, 1), (2, 6, 1, 3))


def _as_list(x) -> list | None:
    """A tensor, list or tuple as a flat Python list (None if it is none of those)."""
    if isinstance(x, torch.Tensor):
        return x.reshape(-1).tolist()
    if isinstance(x, (list, tuple)):
        return list(x)
    return None


@check("position ids from lengths")
def check_position_ids_from_lengths(fn) -> Feedback:
    """``fn(lengths: list[int]) -> torch.Tensor`` (sum(lengths),) long: 0..L-1 for each example."""
    for lengths in LENGTH_CASES:
        got = fn(list(lengths))
        want = [p for n in lengths for p in range(n)]
        where = f"for lengths {list(lengths)}"
        values = _as_list(got)
        if values is None:
            return fail(f"{where} you returned a {type(got).__name__}, not a tensor.",
                        "return torch.cat([torch.arange(n) for n in lengths]) or similar.")
        if values == want:
            if not isinstance(got, torch.Tensor) or got.dtype != torch.long:
                dtype = got.dtype if isinstance(got, torch.Tensor) else type(got).__name__
                return fail(f"{where} the values are right but you returned {dtype}; position "
                            "ids are a torch.long tensor.",
                            "the model indexes its rotary tables with them: use torch.arange, "
                            "which gives int64.")
            continue
        total = sum(lengths)
        if values == list(range(total)):
            return fail(
                f"{where} you returned 0..{total - 1} across the whole pack: positions continue "
                "instead of restarting, so transformers sees one long sequence and builds no "
                "block-diagonal mask.",
                "restart at 0 at the start of every example.",
            )
        if values == [p + 1 for p in want]:
            return fail(f"{where} your positions start at 1; they start at 0 in every example.",
                        "use torch.arange(n), which counts 0..n-1.")
        if len(values) != total:
            return fail(f"{where} you returned {len(values)} positions for {total} tokens.",
                        "one position per token: the total length is sum(lengths).")
        return fail(f"{where} you returned {values}, expected {want}.",
                    "concatenate 0..L-1 for each example length L.")
    return ok(f"right on {len(LENGTH_CASES)} packs: positions restart at 0 in every example.")


@check("forward kwargs for a backend")
def check_forward_kwargs_for(fn) -> Feedback:
    """``fn(rows: list[list[int]], attn_implementation: str) -> dict`` of forward fields; passes when
    every example of every case matches its run alone within ``TOL``, whichever fields did it."""
    from packsim.course.cases import lesson04_backend_cases as bc

    runs, by_impl = [], {}
    for impl, rows in bc.KWARGS_CASES:
        fields = fn([list(r) for r in rows], impl)
        problem = bc.fields_problem(fields)
        if problem:
            return fail(f"{bc.where(impl, rows)}: {problem[0]}", problem[1])
        try:
            diffs, error = bc.isolation(fields, impl, rows), None
        except Exception as err:  # noqa: BLE001 - a forward your fields break is a verdict, not a crash
            diffs, error = None, err
        worst = max(diffs, key=lambda d: d if d == d else float("inf")) if diffs else float("nan")
        runs.append((impl, rows, fields, worst <= bc.TOL, error))  # nan (or an error): not isolated
        shown = f"{type(error).__name__} raised" if error else f"{worst:.1e}"
        by_impl.setdefault(impl, []).append(f"{shown} ({len(rows)} row{'s' * (len(rows) > 1)})")
    measured = ("Measured, max |packed - alone| per case: " + "; ".join(f"{i} {', '.join(v)}" for i, v in by_impl.items())
                + f" (tolerance {bc.TOL:.0e}).")
    leaking = [run for run in runs if not run[3]]
    if leaking:
        impl, rows, fields, _, error = leaking[0]
        message, hint = bc.trap_in(fields, impl, rows, error)
        more = f" ({len(leaking) - 1} more case{'s' * (len(leaking) > 2)} not isolated.)" if len(leaking) > 1 else ""
        return fail(message + more + " " + measured, hint)
    ignored = list(dict.fromkeys(impl for impl, _, fields, _, _ in runs if bc.ignored_fields(fields, impl)))
    note = (f" Your `cu_seq_lens_*` / `max_length_*` also went to {', '.join(ignored)}, which never read them "
            "(only the flash path does): your other fields isolated those cases.") if ignored else ""
    return ok(f"every example of all {len(runs)} cases matches its run alone. " + measured + note)


# ---- appendix A3: the fields a packed row needs beyond attention ------------------------------
# Two checks for A3_flash_path_and_hybrids (an appendix to this lesson): the ``seq_idx`` a Mamba2
# hybrid's kernels read, and the 4-row position ids of Qwen2-VL's text stack. Each judges the
# answer's structure on small packs against what transformers itself gives, then runs a tiny model
# packed vs each example alone (packsim.exhibits.hybrid_traps builds both; no download).

# Packs the A3 checks try, as example lengths. The first is the tiny models' pack (ROWS[0] of
# packsim.exhibits.trap_cases, 32 tokens), the one the isolation runs use; (1, 1, 1): consecutive
# one-token examples, whose position ids read 0, 0, 0.
HYBRID_CASES: tuple[tuple[int, ...], ...] = ((10, 13, 9), (5,), (1, 1, 1), (2, 6, 1, 3))
_CONV_CPP = "https://github.com/Dao-AILab/causal-conv1d/blob/main/csrc/causal_conv1d.cpp"
_STATE_PASSING = "https://github.com/state-spaces/mamba/blob/main/mamba_ssm/ops/triton/ssd_state_passing.py"
_ONE_TOKEN = (" (a one-token example: the position does not go down after it, 0 then 0; a new example "
              "begins wherever the position is 0, not only where it drops)")


def _restarting_positions(lengths) -> torch.Tensor:
    """(1, T) long position ids 0..L-1 per example, as DataCollatorWithFlattening gives them."""
    return torch.tensor([[p for n in lengths for p in range(n)]], dtype=torch.long)


def _collator_seq_idx(lengths) -> torch.Tensor:
    """(1, T) int32: transformers' own DataCollatorWithFlattening(return_seq_idx=True) on the pack."""
    from transformers import DataCollatorWithFlattening

    features = [{"input_ids": [3] * n} for n in lengths]
    return DataCollatorWithFlattening(return_seq_idx=True)(features)["seq_idx"]


@functools.cache
def _tiny(family: str):
    """The tiny seeded model of ``family`` (packsim.exhibits.hybrid_traps.build_frontier), built once."""
    from packsim.exhibits.hybrid_traps import build_frontier

    return build_frontier(family)


def _packed_vs_alone(model, lengths, **fields) -> list[float]:
    """Max |packed logits - logits of the example run alone| per example: the pack of ``lengths``
    (the tiny models' seeded tokens) with ``fields``, each example alone with its input_ids only
    (:func:`packsim.exhibits.traps.alone_change`)."""
    from packsim.exhibits.hybrid_traps import frontier_batch
    from packsim.exhibits.traps import alone_change

    ids = frontier_batch("positions")[0]["input_ids"][:, : sum(lengths)]  # (1, T)
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]  # (1, T)
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return alone_change(model, {"input_ids": ids, **fields}, {"use_cache": False}, seq)


def seq_idx_isolation(seq_idx: torch.Tensor | None, lengths=HYBRID_CASES[0]) -> list[float]:
    """Each example's max |packed - alone| on the tiny Bamba (a Mamba2 mixer, then attention),
    packed with restarting position_ids (1, T) and ``seq_idx`` (1, T) (None: positions only), inside
    :func:`packsim.reference.hybrid_emulation.emulate_hybrid_kernels`: packsim's reference conv / scan
    kernels (pure torch) where transformers looks for causal_conv1d and mamba_ssm (a real package wins)."""
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    fields = {"position_ids": _restarting_positions(lengths)}
    if seq_idx is not None:
        fields["seq_idx"] = seq_idx
    with emulate_hybrid_kernels():
        return _packed_vs_alone(_tiny("bamba"), lengths, **fields)


def mrope_isolation(position_ids: torch.Tensor, lengths=HYBRID_CASES[0]) -> list[float]:
    """Each example's max |packed - alone| on the tiny Qwen2-VL (its text stack, sdpa), packed with
    ``position_ids`` and nothing else; each example alone gets no positions (the model makes them)."""
    return _packed_vs_alone(_tiny("qwen2_vl"), lengths, position_ids=position_ids)


def _run_words(changes: list[float], tol: float, model: str) -> str:
    worst = max(changes)
    verdict = "isolated" if worst <= tol else f"LEAKS (example {changes.index(worst)} moves most)"
    return f"{model}, packed vs each example alone: max {worst:.1e} (tolerance {tol:.0e}), {verdict}"


def _boundaries(values: list) -> list[int]:
    """The tokens where an index changes from the token before."""
    return [i for i in range(1, len(values)) if values[i] != values[i - 1]]


def _seq_idx_mistake(got, lengths) -> tuple[str, str] | None:
    """(message, hint) naming what is wrong with ``got`` as the seq_idx of the pack ``lengths``; None if right."""
    pos = _restarting_positions(lengths)[0].tolist()
    collated = _collator_seq_idx(lengths)  # (1, T): what transformers' collator gives
    want = collated[0].tolist()
    T = len(want)
    where = f"for lengths {list(lengths)} (position_ids {pos})"
    if not isinstance(got, torch.Tensor):
        return (f"{where} you returned a {type(got).__name__}, not a tensor.",
                "return a torch tensor shaped like position_ids.")
    if tuple(got.shape) != (1, T):
        return (f"{where} you returned shape {tuple(got.shape)}; seq_idx is (batch, tokens) = {(1, T)}, "
                "shaped like position_ids (causal_conv1d's CUDA kernel checks `CHECK_SHAPE(seq_idx, "
                f"batch_size, seqlen)` in causal_conv1d_fwd, [csrc/causal_conv1d.cpp]({_CONV_CPP})).",
                "keep the batch dimension: work along the last dimension of position_ids.")
    values = got[0].tolist()
    if values == want:
        if got.dtype != torch.int32:
            return (f"{where} the values are right but the dtype is {got.dtype}. causal_conv1d's CUDA kernel "
                    "refuses anything but int32 (`TORCH_CHECK(seq_idx.scalar_type() == torch::kInt32)` in "
                    f"causal_conv1d_fwd, [csrc/causal_conv1d.cpp]({_CONV_CPP})), and "
                    f"DataCollatorWithFlattening(return_seq_idx=True) gives {collated.dtype}. packsim's reference kernels "
                    "read any integer dtype, so a CPU run alone would not tell you.",
                    "end with `.to(torch.int32)`.")
        return None
    if values == [w + 1 for w in want]:
        return (f"{where} your ids start at 1: the example index counts from 0, as "
                "DataCollatorWithFlattening(return_seq_idx=True) gives it (it enumerates the examples). "
                "The kernels compare neighbouring tokens' ids, so this pack still isolates, but mamba_ssm's "
                "state passing starts its running index at 0 (`_state_passing_fwd_kernel` in "
                f"[ssd_state_passing.py]({_STATE_PASSING})): an initial_states would belong to no example.",
                "subtract 1 (the first example's first token is the first restart).")
    if values == pos and len(set(pos)) > 1:  # (all zeros: one-token examples, judged below)
        return (f"{where} you returned the position ids themselves: seq_idx is the example index of every "
                f"token ({want}), constant inside an example.",
                "count the restarts: a new example begins wherever the position is 0.")
    if values == list(range(T)):
        return (f"{where} your ids count every token ({values[:6]}...): each token is its own example, so "
                "the conv and the scan restart at every token.",
                "the id goes up only where an example begins, where the position is 0.")
    if len(set(values)) == 1:
        ones = [b for b in _boundaries(want) if pos[b - 1] == 0]  # restarts right after a restart
        return (f"{where} every token has id {values[0]}: one example for the whole row, so the conv "
                "and the scan carry their state across every boundary"
                + (_ONE_TOKEN if ones and len(ones) == len(_boundaries(want)) else "") + ".",
                "the id goes up by 1 wherever the position restarts at 0.")
    if values[0] != 0:
        return (f"{where} the first token has id {values[0]}; the first example is 0.",
                "the first token of the row is example 0.")
    steps = {b - a for a, b in zip(values, values[1:], strict=False)}
    if not steps <= {0, 1}:
        return (f"{where} you returned {values}: from one token to the next the id must stay or go up "
                f"by exactly 1 (your steps include {sorted(steps - {0, 1})}).",
                "add 1 at each restart and nothing else.")
    got_b, want_b = set(_boundaries(values)), set(_boundaries(want))
    late = sorted(b for b in want_b - got_b if b + 1 in got_b)
    early = sorted(b for b in want_b - got_b if b - 1 in got_b)
    if late or early:
        which = (f"one token late at token {late[0]}" if late else f"one token early at token {early[0]}")
        return (f"{where} your ids change {which}: example k begins at the token whose position is 0, "
                "and that token must already carry id k" + (" (its state would come from the example before)"
                                                            if late else "") + ".",
                "compare each token's position with 0 at that same token, not its neighbour.")
    missed, extra = sorted(want_b - got_b), sorted(got_b - want_b)
    if missed:
        b = missed[0]
        why = _ONE_TOKEN if pos[b - 1] == 0 else ""
        return (f"{where} no new example at token {b} (positions {pos[max(0, b - 2) : b + 2]}){why}.",
                "start a new example at every token whose position is 0.")
    if extra:
        return (f"{where} a new example at token {extra[0]}, where the position goes on "
                f"({pos[max(0, extra[0] - 2) : extra[0] + 2]}).",
                "a new example begins only where the position is 0.")
    return (f"{where} you returned {values}, expected {want}.", "add 1 at each restart of the position ids.")


def _first_mistake(fn, mistake) -> tuple | None:
    """(lengths, answer, message, hint) for the first pack of HYBRID_CASES on which ``mistake`` finds
    ``fn``'s answer wrong; None when it is right on all of them."""
    for lengths in HYBRID_CASES:
        got = fn(_restarting_positions(lengths))
        found = mistake(got, lengths)
        if found is not None:
            return (lengths, got, *found)
    return None


@check("seq_idx from position ids")
def check_seq_idx_from_position_ids(fn) -> Feedback:
    """``fn(position_ids (1, T) long, restarting at 0) -> seq_idx (1, T) int32``, the example index
    the Mamba2 kernels read; then the tiny Bamba with it, each example packed vs alone."""
    from packsim.exhibits.hybrid_traps import FRONTIER_TOL

    tol = FRONTIER_TOL["hybrid"]
    found = _first_mistake(fn, _seq_idx_mistake)
    if found is not None:
        lengths, got, message, hint = found
        if lengths == HYBRID_CASES[0] and isinstance(got, torch.Tensor) and tuple(got.shape) == (1, sum(lengths)) \
                and not got.is_floating_point():
            message += " Measured: " + _run_words(seq_idx_isolation(got), tol, "the tiny Bamba with your seq_idx") + "."
        return fail(message, hint)
    ours = seq_idx_isolation(fn(_restarting_positions(HYBRID_CASES[0])))
    if max(ours) > tol:  # the values match the collator's, so this would be the kernel's fault: say so
        return fail(_run_words(ours, tol, "the tiny Bamba with your seq_idx") + ", although it equals the "
                    "collator's.", "this is not your code: report it with the numbers.")
    without = seq_idx_isolation(None)
    return ok(f"right on {len(HYBRID_CASES)} packs, int32 (1, T), the same as "
              "DataCollatorWithFlattening(return_seq_idx=True) gives; "
              + _run_words(ours, tol, "the tiny Bamba (Mamba2 mixer, then attention) on packsim's reference "
                           "kernels with your seq_idx") + "; with restarting positions and no seq_idx: "
              + f"max {max(without):.1e} ({'isolated' if max(without) <= tol else 'leaks'}).")


def _mrope_mistake(got, lengths) -> tuple[str, str] | None:
    """(message, hint) naming what is wrong with ``got`` as the packed Qwen2-VL position ids; None if right."""
    pos = _restarting_positions(lengths)[0].tolist()
    T = len(pos)
    where = f"for lengths {list(lengths)}"
    if not isinstance(got, torch.Tensor):
        return (f"{where} you returned a {type(got).__name__}, not a tensor.", "return a torch tensor.")
    shape = tuple(got.shape)
    if shape == (1, T) or shape == (T,):
        return (f"{where} you returned shape {shape}: Qwen2VLTextModel.forward expands 2D positions to the "
                "three rope rows and then has no text row to find the pack in, so the mask stays causal "
                "over the whole row.",
                "the rope takes three rows (t, h, w); the packed mask needs one more.")
    if shape == (3, 1, T):
        return (f"{where} you returned three rows (t, h, w), the rope's own form (what get_rope_index "
                "returns): Qwen2VLTextModel.forward builds the packed mask only when position_ids has "
                "shape[0] == 4, reading the text positions from row 0; with three rows the mask stays "
                "causal over the whole row.",
                "put the text positions in front of the three rope rows: (4, 1, T).")
    if shape != (4, 1, T):
        return (f"{where} you returned shape {shape}; the packed form is (4, batch, tokens) = {(4, 1, T)}: "
                "the text row, then the t, h, w rope rows.",
                "stack four rows of shape (1, T) along a new first dimension.")
    if got.dtype != torch.long:
        return (f"{where} you returned {got.dtype}; position ids are torch.long, as the collator and "
                "get_rope_index give them.", "build them from position_ids (long) or cast with .long().")
    rows = [got[r, 0].tolist() for r in range(4)]
    if rows[0] != pos:
        cont = rows[0] == list(range(T))
        return (f"{where} the text row (row 0) is {rows[0][:14]}...: "
                + ("it continues across examples, so transformers finds no pack in it and the mask stays "
                   "causal over the whole row." if cont else f"not the restarting positions {pos}, so the "
                   "pack transformers finds in it is not this one."),
                "row 0 is the text positions, 0..L-1 in every example.")
    for r in (1, 2, 3):
        if rows[r] != pos:
            cont = rows[r] == list(range(T))
            return (f"{where} rope row {r} ({'t h w'.split()[r - 1]}) is "
                    + ("0..T-1 across the row (what get_rope_index gives when it reads the pack as one "
                       "sequence)" if cont else f"{rows[r][:14]}...")
                    + ": an example alone gets 0..L-1 on every rope row (text tokens get the text position "
                    "on all three, get_rope_index), so each later example is rotated from another start.",
                    "for text-only examples each rope row equals the text positions.")
    return None


@check("mRoPE position ids")
def check_mrope_position_ids(fn) -> Feedback:
    """``fn(position_ids (1, T) long, restarting) -> (4, 1, T) long``: the text row, then the t, h, w
    rope rows, for Qwen2-VL's text stack; then the tiny Qwen2-VL with them, packed vs alone."""
    from packsim.exhibits.hybrid_traps import FRONTIER_TOL

    tol = FRONTIER_TOL["mrope"]
    found = _first_mistake(fn, _mrope_mistake)
    if found is not None:
        lengths, got, message, hint = found
        if lengths == HYBRID_CASES[0] and isinstance(got, torch.Tensor) and got.dtype == torch.long \
                and tuple(got.shape) in ((1, sum(lengths)), (3, 1, sum(lengths)), (4, 1, sum(lengths))):
            changes = mrope_isolation(got)
            message += " Measured: " + _run_words(changes, tol, "the tiny Qwen2-VL with your position ids")
            if max(changes) <= tol:  # the rope rows shifted together: RoPE reads differences
                message += (" (RoPE scores depend on position differences and your rows shift together, so "
                            "the logits moved only by rounding here; the angle is position x inv_freq in "
                            "fp32, Qwen2VLRotaryEmbedding.forward, and its rounding grows with the position)")
            message += "."
        return fail(message, hint)
    ours = mrope_isolation(fn(_restarting_positions(HYBRID_CASES[0])))
    three = mrope_isolation(_restarting_positions(HYBRID_CASES[0])[None].expand(3, 1, -1))
    if max(ours) > tol:
        return fail(_run_words(ours, tol, "the tiny Qwen2-VL with your position ids") + ", although their "
                    "rows are right.", "this is not your code: report it with the numbers.")
    return ok(f"right on {len(HYBRID_CASES)} packs: (4, 1, T), the text row then the three rope rows, each "
              "restarting in every example; " + _run_words(ours, tol, "the tiny Qwen2-VL (sdpa)")
              + f"; the same positions as three rope rows only: max {max(three):.1e} "
              + f"({'isolated' if max(three) <= tol else 'leaks'}).")


__all__ += ["HYBRID_CASES", "check_mrope_position_ids", "check_seq_idx_from_position_ids", "mrope_isolation",
            "seq_idx_isolation"]
