"""The attention-mass probe on sdpa prints no transformers warning (issue 23: lessons 04, 07, 09).

transformers logs "`sdpa` attention does not support `output_attentions=True`" through
``logger.warning_once`` (transformers/integrations/sdpa_attention.py), which warnings filters do not
catch. The probe asks for the weights on purpose and reports "skipped" itself, so it drops that one
message for its own call. Ground truth: the same forward outside the probe does log it.
"""

from __future__ import annotations

import logging

import pytest
import torch
from toy import VOCAB, toy_examples

import packsim
from packsim.core.model import build_model

MESSAGE = "`sdpa` attention does not support `output_attentions=True`"


class _Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def caught():
    """Every record logged under transformers' sdpa logger (transformers' loggers don't propagate
    to the root logger, so caplog would miss them); warning_once's cache cleared first."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()  # another test may have set it to errors only
    hf_logging.set_verbosity_warning()
    logging.Logger.warning_once.cache_clear()
    handler, lg = _Catch(), logging.getLogger("transformers.integrations.sdpa_attention")
    lg.addHandler(handler)
    yield handler.messages
    lg.removeHandler(handler)
    logging.Logger.warning_once.cache_clear()
    hf_logging.set_verbosity(verbosity)


def _model_and_batch():
    model = build_model("tiny", vocab_size=VOCAB, attn_implementation="sdpa", seed=0)
    batch = packsim.PackedBatch.from_examples(toy_examples([(3, 4), (2, 5)], seed=0), capacity=32)
    return model, batch


def test_the_message_exists_without_the_probe(caught):
    model, batch = _model_and_batch()
    with torch.no_grad():
        model(input_ids=batch.input_ids, position_ids=batch.position_ids, output_attentions=True)
    assert any(m.startswith(MESSAGE) for m in caught), caught


def test_audit_on_sdpa_logs_no_output_attentions_warning(caught):
    model, batch = _model_and_batch()
    from transformers import DataCollatorWithFlattening

    feats = [{"input_ids": list(ex.tokens)} for ex in toy_examples([(3, 4), (2, 5)], seed=0)]
    collated = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(feats)
    report = packsim.audit(model, collated, use_cache=False)  # transformers' forward on sdpa
    assert report.probes["attention_mass"].status == "skipped"  # it says so itself
    assert not any(m.startswith(MESSAGE) for m in caught), caught
    # the filter is gone after the call: the user's own forward still warns (warning_once
    # remembers the probe's call, so its cache is cleared first)
    logging.Logger.warning_once.cache_clear()
    with torch.no_grad():
        model(input_ids=batch.input_ids, position_ids=batch.position_ids, output_attentions=True)
    assert any(m.startswith(MESSAGE) for m in caught)
