"""Messages transformers logs that packsim's probes provoke on purpose, and a filter that drops them.

The attention-mass probe asks every forward for ``output_attentions=True``; the sdpa and flash
paths cannot return weights and log it with ``logger.warning_once`` (not ``warnings.warn``, so
warnings filters do not catch it): ``integrations/sdpa_attention.py`` and
``integrations/flash_attention.py``, the same text in transformers 5.16.1 and 5.25.0. The probe says
"skipped: ... use eager" itself, so :func:`quiet_no_attention_weights` drops that one message on
those two loggers for the block; everything else they log still shows. tests/test_upstream_loggers.py
pins the texts and the logger names.

Lessons: none directly (packsim.auditing.attention_probe and shared_pass use it).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

__all__ = ["NO_WEIGHTS", "quiet_no_attention_weights"]

# logger name -> the start of the message it logs when asked for weights it cannot return
NO_WEIGHTS = {
    "transformers.integrations.sdpa_attention": "`sdpa` attention does not support `output_attentions=True`",
    "transformers.integrations.flash_attention": "Flash Attention does not support `output_attentions=True`",
}


class _DropNoWeights(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(str(record.msg).startswith(m) for m in NO_WEIGHTS.values())


@contextmanager
def quiet_no_attention_weights():
    """Drop transformers' "does not support `output_attentions=True`" messages inside the block
    (that one message only, on its own loggers; everything else they log still shows)."""
    drop, loggers = _DropNoWeights(), [logging.getLogger(name) for name in NO_WEIGHTS]
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)
