"""packsim.audit on batches broken at random (hypothesis): every input gets a verdict or one line.

A clean collated batch (transformers' DataCollatorWithFlattening over toy examples, with
``cu_seq_lens_*``, ``seq_idx`` and ``position_ids``) is broken by up to three random edits: a
field dropped, given another dtype, rank or length, filled with values out of range, turned into a
Python list or None, or an unknown field added (an all-ones ``attention_mask`` among them). The audit must return a report or raise
``PacksimError`` whose message is one line; any other exception is a bug of packsim's. The edits
that must be refused are checked apart, each against the reason the test gives.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toy import VOCAB, toy_examples
from transformers import DataCollatorWithFlattening

import packsim
from packsim import PacksimError
from packsim.auditing import AuditReport
from packsim.core.loss import IGNORE_INDEX
from packsim.core.model import build_model

SHAPES = [(4, 3), (6, 5), (2, 5), (5, 6)]
FIELDS = ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
          "max_length_k", "seq_idx")


def clean_batch() -> dict:
    examples = toy_examples(SHAPES, seed=3)
    feats = [{"input_ids": list(ex.tokens),
              "labels": [IGNORE_INDEX] * ex.n_prompt + list(ex.tokens[ex.n_prompt:])} for ex in examples]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(feats)
    return dict(batch)


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", vocab_size=VOCAB, attn_implementation="sdpa", seed=0)


def _edit(batch: dict, edit: tuple) -> None:
    """Apply one edit ``(kind, field, value)`` to ``batch`` in place."""
    kind, field, value = edit
    x = batch.get(field)
    if kind == "drop":
        batch.pop(field, None)
    elif kind == "extra":
        n = batch["input_ids"].shape[-1] if isinstance(batch.get("input_ids"), torch.Tensor) else 4
        name = ("unknown_field", "attention_mask", "token_type_ids")[value % 3]
        batch[name] = torch.ones(1, n, dtype=torch.long)
    elif x is None or not isinstance(x, torch.Tensor):
        return
    elif kind == "dtype":
        batch[field] = x.to((torch.float32, torch.bool, torch.int32, torch.float16)[value % 4])
    elif kind == "rank":
        batch[field] = x.reshape(-1) if value % 2 else x[None]  # one dim fewer (flattened) or one more
    elif kind == "length":
        cut = 1 + value % 5
        batch[field] = x[..., :-cut] if value % 2 and x.shape[-1] > cut else torch.cat([x, x[..., :cut]], -1)
    elif kind == "values":
        fill = (-5, VOCAB + 7, 0, 2**31 - 1, -100)[value % 5]
        y = x.clone()
        if y.numel():
            y.view(-1)[value % y.numel()] = fill
        batch[field] = y
    elif kind == "shuffle" and x.numel() > 1:
        batch[field] = x.flip(-1)
    elif kind == "list":
        batch[field] = x.tolist()
    elif kind == "none":
        batch[field] = None
    elif kind == "empty":
        batch[field] = x[..., :0]


_KINDS = ("drop", "extra", "rank", "length", "values", "shuffle", "list", "none", "empty")
# a cast is drawn as its own edit with its dtype's index (0-3), so bool is one draw in eight, not in a hundred
EDITS = (st.tuples(st.sampled_from(_KINDS), st.sampled_from(FIELDS), st.integers(0, 1000))
         | st.tuples(st.just("dtype"), st.sampled_from(FIELDS), st.integers(0, 3)))


def _verdict_or_one_line(model, batch, **kwargs):
    """The audit's answer: ("report", AuditReport) or ("refused", message); anything else fails the test."""
    try:
        report = packsim.audit(model, batch, max_examples=2, **kwargs)
    except PacksimError as err:
        message = str(err)
        assert message and "\n" not in message, f"a refusal must be one line, got {message!r}"
        return "refused", message
    assert isinstance(report, AuditReport)
    assert report.verdict
    return "report", report


def _leak_by_clean_boundaries(model, batch) -> float | None:
    """Independently: the largest change of an example's logits in ``batch``'s forward against the
    example run alone, the examples cut where the clean batch has them (None: no such forward)."""
    ids, seq = batch.get("input_ids"), clean_batch()["seq_idx"][0].long()  # (1, N), (N,)
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.shape != (1, len(seq)):
        return None
    fields = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    with torch.no_grad():
        try:
            packed = model(input_ids=ids, **fields, use_cache=False).logits[0]  # (N, V)
        except Exception:  # noqa: BLE001 - a forward the broken fields refuse has no truth here
            return None
        worst = 0.0
        for e in range(int(seq.max()) + 1):
            where = (seq == e).nonzero()[:, 0]  # (n,)
            alone = model(input_ids=ids[:, where], position_ids=torch.arange(len(where))[None], use_cache=False)
            worst = max(worst, float((packed[where] - alone.logits[0]).abs().max()))
    return worst


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(edits=st.lists(EDITS, min_size=1, max_size=3))
def test_a_broken_batch_gets_a_verdict_or_one_line(model, edits):
    batch = clean_batch()
    for edit in edits:
        _edit(batch, edit)
    kind, answer = _verdict_or_one_line(model, batch)
    if kind == "report" and answer.ok:  # a PASS: no example may move, by a truth computed here
        leak = _leak_by_clean_boundaries(model, batch)
        assert leak is None or leak <= 1e-4, f"PASS, but an example moves by {leak} against itself alone"


def test_the_clean_batch_passes(model):
    kind, report = _verdict_or_one_line(model, clean_batch(), trust_boundaries=True)
    assert kind == "report" and report.ok, report


@pytest.mark.parametrize("edit, why", [
    (("length", "labels", 1), "labels shorter than input_ids"),
    (("rank", "input_ids", 1), "input_ids without a batch dimension"),
    (("list", "input_ids", 0), "input_ids as a Python list"),
    (("empty", "input_ids", 0), "no tokens"),
    (("dtype", "input_ids", 1), "bool token ids (crashed in packsim's special-token reading)"),
    (("dtype", "position_ids", 1), "bool positions (crashed reading where examples start)"),
    (("dtype", "seq_idx", 1), "bool example ids (crashed reading where examples start)"),
    (("dtype", "labels", 0), "float labels"),
    (("dtype", "cu_seq_lens_q", 0), "float offsets"),
])
def test_what_cannot_be_audited_is_refused_in_one_line(model, edit, why):
    batch = clean_batch()
    _edit(batch, edit)
    kind, answer = _verdict_or_one_line(model, batch)
    assert kind == "refused", f"{why}: got a report {answer}"


def test_a_token_the_model_cannot_embed_is_not_measured_naming_the_forward(model):
    batch = clean_batch()
    _edit(batch, ("values", "input_ids", 1))  # one id = VOCAB + 7: the embedding raises IndexError
    kind, report = _verdict_or_one_line(model, batch)
    assert kind == "report" and not report.ok and report.verdict.startswith("NOT MEASURED"), report.verdict
    assert "IndexError" in str(report)


def test_the_truth_sees_a_leak_and_its_absence(model):
    assert _leak_by_clean_boundaries(model, clean_batch()) < 1e-5  # restarting positions isolate on sdpa
    causal = clean_batch()
    causal["position_ids"] = torch.arange(causal["input_ids"].shape[1])[None]  # one causal row: examples see back
    assert _leak_by_clean_boundaries(model, causal) > 1e-3
