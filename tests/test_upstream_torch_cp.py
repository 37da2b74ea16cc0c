"""packsim.core.upstream.torch_cp: torch's private context-parallel names packsim calls, and the order
its per-document balancer makes, on the installed torch (read in 2.13.0, 2.14.0, 2.14.1, 2.15.0)."""

from __future__ import annotations

import pytest
import torch

from packsim.core.upstream.torch_cp import (
    LAYOUTS,
    expected_layout,
    missing,
    per_document_layout,
)

MOVED = (f"torch {torch.__version__} moved its context-parallel prototype (read in 2.13.0 to 2.15.0, "
         "torch/distributed/tensor/experimental/_context_parallel/): read the new source, update "
         "packsim.core.upstream.torch_cp and this pin")


def _order(lengths, cp, rank_major):
    """Independently: the balancer's (T,) order; each document's chunk pairs (r, 2cp-1-r) either
    document after document, or rank after rank (rank r's pairs of every document together)."""
    pairs, start = {}, 0  # (document, rank) -> the positions of chunks r and 2cp-1-r
    for d, length in enumerate(lengths):
        c = length // (2 * cp)
        for r in range(cp):
            pairs[d, r] = (list(range(start + r * c, start + (r + 1) * c))
                           + list(range(start + (2 * cp - 1 - r) * c, start + (2 * cp - r) * c)))
        start += length
    keys = sorted(pairs, key=(lambda k: (k[1], k[0])) if rank_major else (lambda k: k))
    return [p for k in keys for p in pairs[k]]


def test_every_private_name_packsim_calls_is_in_the_installed_torch():
    assert missing() == [], MOVED


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_the_per_document_balancer_orders_as_the_installed_release_was_read_to(cp):
    from torch.distributed.tensor.experimental._attention import _PerDocumentHeadTailLoadBalancer

    lengths = [4 * cp, 12 * cp, 2 * cp, 6 * cp]
    got = _PerDocumentHeadTailLoadBalancer([lengths], cp, "cpu")._generate_indices()[0].tolist()
    layout = expected_layout(torch.__version__)
    assert got == _order(lengths, cp, rank_major=layout == "rank-major"), MOVED
    assert got != _order(lengths, cp, rank_major=layout != "rank-major")  # the two orders differ here
    assert per_document_layout(cp) == layout


@pytest.mark.parametrize("version, layout", [("2.13.0", "document-major"), ("2.13.0+cpu", "document-major"),
                                             ("2.14.0", "rank-major"), ("2.15.0+cu132", "rank-major"),
                                             ("2.16.0.dev20270101", "rank-major")])
def test_expected_layout_reads_the_release(version, layout):
    assert expected_layout(version) == layout and layout in LAYOUTS


def test_a_moved_name_is_reported_by_module_and_name(monkeypatch):
    from packsim.core.upstream import torch_cp

    monkeypatch.setitem(torch_cp.PRIVATE, "torch.distributed.tensor.experimental._attention", ("_no_such",))
    monkeypatch.setitem(torch_cp.PRIVATE, "torch.no_such_module", ("x",))
    assert set(missing()) >= {"torch.distributed.tensor.experimental._attention._no_such", "torch.no_such_module.x"}
