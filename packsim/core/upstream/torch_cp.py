"""torch's context parallelism (a prototype, its names private): what packsim reaches into, per release.

Read in torch 2.13.0, 2.14.0, 2.14.1 and 2.15.0 (``torch/distributed/tensor/experimental/
_context_parallel/``): the names in :data:`PRIVATE` exist in each, under the same modules; lesson 10
(:mod:`packsim.scaling.cp_attention`, which :mod:`packsim.auditing.context_parallel` audits) and
the ring exhibit (:mod:`packsim.exhibits.cp_ring`) call them where they teach them.

One of them changed what it does. ``_PerDocumentHeadTailLoadBalancer._generate_indices`` orders a
row of documents, ``(T,)``, before ``_context_parallel_shard`` cuts it into ``R`` contiguous shards
of ``T/R``:

- torch 2.13.0: every document's ``2R`` chunks in head-tail order (``0, 2R-1, 1, 2R-2, ...``),
  document after document (``"document-major"``): a shard boundary can fall inside a document, so a
  rank holds the chunks of a few whole documents;
- torch 2.14.0 and later (read in 2.14.0, 2.14.1, 2.15.0): rank ``r``'s head and tail chunks
  (``r`` and ``2R-1-r``) of every document, rank after rank (``"rank-major"``, the layout the
  balancer's own docstring draws, and :func:`packsim.scaling.context_parallel.zigzag_split`): every
  rank holds a piece of every document. Its comment gives the reason: a document-major order "would
  instead let the cut fall mid-document, imbalancing work for mixed-length docs".

Correctness does not depend on the order (the sharded ``BlockMask`` maps every index back); the work
per rank does. :func:`per_document_layout` measures which order the installed torch makes;
:func:`expected_layout` says which one a release was read to make. tests/test_upstream_torch_cp.py
pins both and the names, and ``.ci/window`` runs it on the oldest and the newest torch of the window.

Shapes: :func:`per_document_layout` orders a ``(T,)`` row of two documents, ``T = 12 R``.

Lessons: none directly (lesson 10 prints the order its torch makes).
"""

from __future__ import annotations

import importlib

from packaging.version import Version

__all__ = ["LAYOUTS", "PRIVATE", "RANK_MAJOR_SINCE", "expected_layout", "missing", "per_document_layout"]

LAYOUTS = ("document-major", "rank-major")
RANK_MAJOR_SINCE = "2.14.0"  # the first release read to order rank-major (2.13.0: document-major)
# module -> the private names packsim calls, and _create_cp_block_mask, whose whole-block rule
# cp_attention.BLOCK follows (each read in every release of the module docstring)
PRIVATE = {
    "torch.distributed.tensor.experimental._attention": (
        "_context_parallel_shard", "_ContextParallel", "_templated_ring_attention", "_HeadTailLoadBalancer",
        "_PerDocumentHeadTailLoadBalancer", "context_parallel_unshard"),
    "torch.distributed.tensor.experimental._context_parallel._attention": (
        "_templated_ring_attention_backward", "_SDPAMerger", "_create_cp_block_mask"),
    "torch.distributed.tensor.experimental._context_parallel": ("flex_cp_allgather",),
}


def missing() -> list[str]:
    """``module.name`` of every name in :data:`PRIVATE` the installed torch lacks ([] when all are there)."""
    out = []
    for module, names in PRIVATE.items():
        try:
            found = importlib.import_module(module)
        except ImportError:
            out += [f"{module}.{name}" for name in names]
            continue
        out += [f"{module}.{name}" for name in names if not hasattr(found, name)]
    return out


def expected_layout(version: str) -> str:
    """The order a torch release (``"2.15.0+cu132"``) was read to make: one of :data:`LAYOUTS`."""
    base = Version(Version(version).base_version)
    return LAYOUTS[1] if base >= Version(RANK_MAJOR_SINCE) else LAYOUTS[0]


def per_document_layout(cp_size: int = 2) -> str:
    """The order the installed torch's per-document balancer makes, measured on two documents."""
    from torch.distributed.tensor.experimental._attention import _PerDocumentHeadTailLoadBalancer

    R = cp_size
    lengths = [4 * R, 8 * R]  # (T,) = 12 R positions; chunks of 2 and 4
    index = _PerDocumentHeadTailLoadBalancer([lengths], R, "cpu")._generate_indices()[0].tolist()  # (T,)
    shards = [index[r * 12 : (r + 1) * 12] for r in range(R)]  # (R, 12): what each rank holds
    if all({p < lengths[0] for p in shard} == {True, False} for shard in shards):
        return LAYOUTS[1]  # every rank holds a piece of both documents
    return LAYOUTS[0]
