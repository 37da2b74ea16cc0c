"""packsim.auditing.pipeline: how the report names the forward it ran."""

import torch

from packsim.auditing.pipeline import _kwargs_text


def test_forward_keywords_name_a_tensor_by_shape_and_dtype_not_its_values():
    mask = torch.ones(2, 300, dtype=torch.long)
    text = _kwargs_text({"use_cache": False, "attention_mask": mask})
    assert text == ", use_cache=False, attention_mask=<tensor (2, 300) int64>"
    assert repr(mask) not in text and len(text) < 80
