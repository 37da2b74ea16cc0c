"""packsim.core.upstream.loggers: the message transformers logs for output_attentions=True on sdpa and
flash is the one the filter drops (read from transformers 5.16.1 and 5.25.0), and only that one."""

import logging
from pathlib import Path

import transformers

from packsim.core.upstream.loggers import NO_WEIGHTS, quiet_no_attention_weights


def test_pin_each_logger_logs_the_text_the_filter_drops():
    root = Path(transformers.__file__).parent
    for logger, text in NO_WEIGHTS.items():
        path = root / (logger.removeprefix("transformers.").replace(".", "/") + ".py")
        assert path.exists(), f"transformers {transformers.__version__} moved: no {path.name}"
        assert text in path.read_text(), f"transformers {transformers.__version__} moved: {path.name} no longer logs {text!r}"


def test_the_filter_drops_that_message_only_and_only_inside_the_block(caplog):
    logger = logging.getLogger("transformers.integrations.sdpa_attention")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        with quiet_no_attention_weights():
            logger.warning(NO_WEIGHTS[logger.name] + ".")
            logger.warning("something else")
        logger.warning(NO_WEIGHTS[logger.name] + ".")
    assert [r.getMessage() for r in caplog.records] == ["something else", NO_WEIGHTS[logger.name] + "."]
