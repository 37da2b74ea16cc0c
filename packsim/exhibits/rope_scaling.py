"""Do positions that keep counting across a pack change anything? Default RoPE vs scaled RoPE, measured.

Under a correct block-diagonal mask, default RoPE scores depend on the distance between two tokens
only, so positions that keep counting across a pack (0..N-1) give the same logits as positions that
restart, up to round-off. That holds for ``rope_type`` ``"default"`` (and ``"linear"``: a fixed
rescale), not for the types that recompute the frequencies from the largest position in the batch
(``dynamic_rope_update`` in ``transformers/modeling_rope_utils.py``; its test pins what it read):

- ``"dynamic"`` (NTK): ``seq_len = max(position_ids) + 1``; past ``max_position_embeddings`` the base
  becomes ``base * (factor * seq_len / max_pos - (factor - 1)) ** (dim / (dim - 2))``
  (``_compute_dynamic_ntk_parameters``): every token of the batch, the first example's too, is
  rotated at new frequencies. It is stateful too: a call whose ``seq_len`` lies between
  ``max_position_embeddings`` and the longest call so far keeps that call's frequencies
  (``dynamic_frequency_update``), so this module runs its forwards in increasing length;
- ``"longrope"`` (Phi-3): past ``original_max_position_embeddings`` the ``long_factor`` set replaces
  ``short_factor`` for every position of the batch (``longrope_frequency_update``).

Both read the **batch's** largest position, so an example's logits also depend on the longest
sequence beside it: restarting positions do not help when one example of the pack (or of a padded
batch) is longer than the original context (condition ``long_neighbour``).

The model: a tiny ``LlamaForCausalLM`` (the course's ``tiny`` size, ``sdpa``) whose config names the
rope type, with weights passed in (lesson A8 passes the committed trained ``correct`` model, whose
attention is sharp: random weights at the default init attend almost uniformly and hide position
effects) or seeded random ones. ``ORIGINAL_CONTEXT`` = 64 is the context the scaled types treat as
pretrained (dynamic: ``max_position_embeddings``; longrope: ``original_max_position_embeddings``,
``max_position_embeddings = FACTOR * ORIGINAL_CONTEXT``). The batch: ``examples`` (lists of token ids) in
one row, input_ids (1, N), an additive float block-diagonal mask (1, 1, N, N) (isolates on every
backend), position_ids (1, N) per condition:

- ``restart``: 0..L-1 per example; ``continuous``: 0..N-1 across the row;
- ``long_neighbour``: restart, with one extra example of ``ORIGINAL_CONTEXT + 16`` tokens at the end (only
  the other examples are reported).

Each cell: per example, max |packed logits - the example run alone| (alone: input_ids (1, L),
positions 0..L-1, no mask), judged against the audit's tolerance for the dtype
(:data:`packsim.auditing.auditor.TOLERANCE`: fp32 1e-5, bf16 3e-2).

Lessons: A8.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from packsim.auditing.auditor import TOLERANCE
from packsim.core.errors import PacksimError
from packsim.core.masks import block_diagonal_mask, to_additive_4d
from packsim.core.text_table import text_table

__all__ = ["COMPARISONS", "FACTOR", "ORIGINAL_CONTEXT", "ROPE_TYPES", "THETA", "RopeCell", "RopeTable", "long_factor",
           "rope_changes", "rope_config", "rope_model", "rope_table"]

ROPE_TYPES = ("default", "dynamic", "longrope")
COMPARISONS = ("continuous_vs_restart", "restart_vs_alone", "long_neighbour_vs_alone")
ORIGINAL_CONTEXT = 64  # the context the scaled types treat as pretrained
FACTOR = 4.0  # how far they stretch it
THETA = 10000.0


def long_factor(dim: int, factor: float = FACTOR) -> list[float]:
    """A LongRoPE-shaped ``long_factor`` for ``dim // 2`` frequency pairs: 1 for the fastest pair,
    rising geometrically to ``factor`` for the slowest (Phi-3's own are searched per model)."""
    half = dim // 2
    return [factor ** (i / (half - 1)) for i in range(half)]


def rope_config(rope_type: str, vocab_size: int | None = None):
    """The tiny Llama config with ``rope_type``'s parameters (see the module docstring)."""
    from transformers import LlamaConfig

    from packsim.core.model import MODEL_SIZES

    if rope_type not in ROPE_TYPES:
        raise PacksimError(f"unknown rope_type {rope_type!r}: this exhibit runs {list(ROPE_TYPES)}.")
    if vocab_size is None:
        from packsim.core.tokenizer import build_tokenizer

        vocab_size = len(build_tokenizer())
    size = MODEL_SIZES["tiny"]
    dim = size["hidden_size"] // size["num_attention_heads"]
    rope = {"rope_type": rope_type, "rope_theta": THETA}
    max_pos = 4096
    if rope_type == "dynamic":
        rope["factor"], max_pos = FACTOR, ORIGINAL_CONTEXT
    elif rope_type == "longrope":
        rope.update(short_factor=[1.0] * (dim // 2), long_factor=long_factor(dim), factor=FACTOR,
                    original_max_position_embeddings=ORIGINAL_CONTEXT)
        max_pos = int(FACTOR * ORIGINAL_CONTEXT)
    return LlamaConfig(vocab_size=vocab_size, max_position_embeddings=max_pos, tie_word_embeddings=True,
                       use_cache=False, pad_token_id=0, rope_parameters=rope, **size)


def rope_model(rope_type: str, state_dict: dict | None = None, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A tiny Llama with ``rope_type`` on ``sdpa`` in eval mode: ``state_dict``'s weights (a trained
    tiny model's) or seeded random ones, cast to ``dtype``."""
    from packsim.core.model import model_from_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # longrope's note on original_max_position_embeddings vs factor
        model = model_from_config(rope_config(rope_type), attn_implementation="sdpa", seed=seed, quiet=True)
    if state_dict is not None:
        model.load_state_dict(state_dict, strict=False)  # the tied lm_head may be stored once
    return model.to(dtype).eval()


def _long_example(vocab_size: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(n)
    return torch.randint(3, vocab_size, (n,), generator=gen).tolist()


def _packed(model, exs: list[list[int]], continuous: bool) -> list[torch.Tensor]:
    """Each example's logits (L, V) float, packed in one row under a block-diagonal float mask."""
    lengths = [len(e) for e in exs]
    N = sum(lengths)
    top = N if continuous else max(lengths)  # the largest position + 1
    if model.config.rope_parameters["rope_type"] == "longrope" and top > model.config.max_position_embeddings:
        raise PacksimError(f"positions up to {top - 1} are past this longrope config's "
                           f"{model.config.max_position_embeddings}: pass fewer examples.")
    dtype = next(model.parameters()).dtype
    ids = torch.tensor([t for e in exs for t in e])[None]  # (1, N)
    seq = torch.repeat_interleave(torch.arange(len(exs)), torch.tensor(lengths))  # (N,)
    mask = to_additive_4d(block_diagonal_mask(seq)[None, None], dtype)  # (1, 1, N, N)
    pos = torch.arange(N)[None] if continuous else torch.cat([torch.arange(n) for n in lengths])[None]  # (1, N)
    logits = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits[0].float()  # (N, V)
    return list(logits.split(lengths))


def rope_changes(model, examples: list[list[int]]) -> dict[str, list[float]]:
    """Per example of ``examples``, max |logit change| for each of :data:`COMPARISONS`."""
    exs = [list(e) for e in examples]
    long = _long_example(model.config.vocab_size, ORIGINAL_CONTEXT + 16)
    with torch.no_grad():
        # increasing largest position: dynamic RoPE's cache then gives every call its own frequencies
        order = sorted(range(len(exs)), key=lambda k: len(exs[k]))
        alone = {i: model(input_ids=torch.tensor([exs[i]])).logits[0].float() for i in order}  # (L, V) each
        restart = _packed(model, exs, continuous=False)
        beside_long = _packed(model, exs + [long], continuous=False)[:-1]  # the long one not reported
        continuous = _packed(model, exs, continuous=True)
    diff = lambda a, b: [float((x - y).abs().max()) for x, y in zip(a, b, strict=True)]  # noqa: E731
    ref = [alone[i] for i in range(len(exs))]
    return {"continuous_vs_restart": diff(continuous, restart), "restart_vs_alone": diff(restart, ref),
            "long_neighbour_vs_alone": diff(beside_long, ref)}


@dataclass(frozen=True)
class RopeCell:
    """One (rope type, dtype, comparison): per-example changes and the tolerance that judges them."""

    rope_type: str
    dtype: str
    comparison: str
    changes: tuple[float, ...]
    tol: float

    @property
    def worst(self) -> float:
        return max(self.changes)

    @property
    def first(self) -> float:
        """The first example's change: its positions are 0..L-1 in every layout."""
        return self.changes[0]

    @property
    def status(self) -> str:
        return "unchanged" if self.worst <= self.tol else "CHANGES"


@dataclass(frozen=True)
class RopeTable:
    """The measured cells; :meth:`cell` finds one, :meth:`text` prints one line per (rope type, dtype)."""

    cells: tuple[RopeCell, ...]
    n_tokens: int

    def cell(self, rope_type: str, comparison: str, dtype: str = "float32") -> RopeCell:
        return next(c for c in self.cells if (c.rope_type, c.comparison, c.dtype) == (rope_type, comparison, dtype))

    def text(self) -> str:
        heads = {"continuous_vs_restart": "continuous vs restart (first ex.)", "restart_vs_alone": "restart vs alone",
                 "long_neighbour_vs_alone": "beside a long example vs alone"}
        rows = [("rope_type", "dtype", "tolerance", *heads.values())]
        for key in dict.fromkeys((c.rope_type, c.dtype) for c in self.cells):
            cells = [c for c in self.cells if (c.rope_type, c.dtype) == key]
            shown = []
            for c in cells:
                extra = f" ({c.first:.1e})" if c.comparison == "continuous_vs_restart" else ""
                shown.append(f"{c.worst:.1e}{extra} {'=' if c.status == 'unchanged' else 'CHANGES'}")
            rows.append((*key, f"{cells[0].tol:.0e}", *shown))
        return "\n".join(text_table(rows))


def rope_table(state_dict: dict | None = None, examples: list[list[int]] | None = None,
               rope_types=ROPE_TYPES, dtypes=(torch.float32, torch.bfloat16)) -> RopeTable:
    """Measure every (rope type, dtype, comparison) on one packed row of ``examples`` (default: the
    first 12 training examples of ``make_dataset(seed=0)``, 195 tokens, about 3x ``ORIGINAL_CONTEXT``)."""
    if examples is None:
        from packsim.core.data import make_dataset

        examples = [ex.tokens for ex in make_dataset(12, 0, seed=0)[0]]
    cells = []
    for rope_type in rope_types:
        for dtype in dtypes:
            changes = rope_changes(rope_model(rope_type, state_dict, dtype), examples)
            cells += [RopeCell(rope_type, str(dtype).replace("torch.", ""), name, tuple(v), TOLERANCE.get(dtype, 1e-5))
                      for name, v in changes.items()]
    return RopeTable(tuple(cells), sum(len(e) for e in examples))
