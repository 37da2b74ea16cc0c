"""transformers' own flash-attention path, run on the reference kernel: :func:`emulate_flash`.

``emulate_flash()`` returns a :class:`FlashEmulation` whose ``name`` is the
``attn_implementation`` to load models with. Where no real flash-attn can run (no CUDA, or no
``flash_attn`` package) that is :data:`REFERENCE_NAME` (``"packsim_reference_flash"``): a model
loaded with it runs transformers' unmodified ``flash_attention_forward`` ->
``_flash_attention_forward`` on the two kernels of :mod:`packsim.reference.flash` (reference
kernel (packsim, pure torch), not flash-attn). Where a real flash-attn and CUDA are there, the
real kernel wins: nothing is installed and the name is ``"flash_attention_2"``
(``force_reference=True`` installs the reference anyway, to compare the two on a GPU).

What is ours: only the two kernel functions. How they get in (on every transformers of the tested window;
every reach into transformers' private flash machinery is in :mod:`packsim.core.upstream.flash_utils`,
which says per version what was read):

1. ``modeling_flash_attention_utils._lazy_imports(implementation)`` picks a flash implementation's
   kernels (``lazy_import_flash_attention`` calls it at model load and, on a cache miss, from every
   ``_flash_attention_forward``); it is wrapped so that for :data:`REFERENCE_NAME` only it returns
   (reference ``flash_attn_func``, reference ``flash_attn_varlen_func``, no kv-cache kernel,
   transformers' own ``_pad_input`` / ``_unpad_input``); every other name goes to the original;
2. :data:`REFERENCE_NAME` is registered with ``AttentionInterface`` as transformers' own
   ``integrations.flash_attention.flash_attention_forward`` and with ``AttentionMaskInterface``
   as transformers' own flash mask (``masking_utils.flash_attention_mask``, the one
   ``"flash_attention_2"`` uses: None, or the 2D padding mask).

Everything else stays transformers': the name holds "flash", so ``is_flash_attention_requested``
is True for it everywhere; ``_flash_attention_forward`` unpads by the 2D mask (``_upad_input``),
takes ``cu_seq_lens_*`` / ``max_length_*``, infers segments from ``position_ids`` when
``_is_packed_sequence`` says so (batch size 1 only) via ``_prepare_from_posids``, and turns
``sliding_window`` / ``softcap`` into ``window_size`` / ``softcap`` (``_process_flash_attention_kwargs``,
which reads the reference's signature like a real kernel's). The kernel reads q/k/v as
(B, T, H, D) or, unpadded, (total, H, D) with ``cu_seqlens`` (S+1,) int32. The window's transformers
versions write ``_flash_attention_forward``'s branches differently and take the same decisions on these
inputs (:mod:`packsim.core.upstream.flash_utils` has both forms).

``emulate_flash()`` is also a context manager: ``with emulate_flash() as flash:`` installs as the
plain call does and, on leaving, undoes what that call installed (the ``_lazy_imports`` wrapper, the
two registry entries); what was installed before it stays. :func:`reference_for_flash_requests`
serves code that asks for ``"flash_attention_2"`` by name (a user's trainer factory, ``packsim audit
--trainer``): inside it, where no real flash-attn can run, a model that asks for that name at load
gets :data:`REFERENCE_NAME` instead (only a model transformers would let use flash attention), with
the emulation installed at the first such request and undone on leaving.

Why a name of its own and not ``"flash_attention_2"``: for that name transformers checks
flash-attn itself at load (``_flash_attn_can_dispatch``: the package, CUDA, fp16/bf16) and
imports ``flash_attn`` in ``_lazy_imports``; passing those would take a fake ``flash_attn``
package, which could shadow a real one. A registered name skips ``_flash_attn_can_dispatch``
(so fp32 on CPU runs, exact to ~1e-6; and the model's ``_supports_flash_attn`` is not checked)
and never imports ``flash_attn``. tests/test_upstream_flash.py fails, naming what moved, when a
transformers release changes any of this.

Lessons: A3.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch

from packsim.core.upstream import flash_utils
from packsim.reference import flash as reference_flash
from packsim.reference.flash import REFERENCE_KERNEL

__all__ = ["REAL_NAME", "REFERENCE_NAME", "FlashEmulation", "FlashRequests", "emulate_flash", "real_flash_attn",
           "reference_for_flash_requests"]

REFERENCE_NAME = "packsim_reference_flash"
REAL_NAME = "flash_attention_2"


@dataclass(frozen=True)
class FlashEmulation:
    """What :func:`emulate_flash` did: ``name`` to pass as ``attn_implementation``, the ``kernel``
    it runs (:data:`~packsim.reference.flash.REFERENCE_KERNEL`, or "flash-attn <version>"),
    ``reference`` (True: the reference kernel (packsim, pure torch), not flash-attn) and
    ``installed`` (True when this call changed transformers' registries, False when all was there).

    A context manager too: ``with emulate_flash() as flash:`` gives itself, and leaving undoes what
    this call installed (nothing, if all was there), once."""

    name: str
    kernel: str
    reference: bool
    installed: bool
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)

    def __str__(self) -> str:
        done = "installed now" if self.installed else ("already installed" if self.reference else "nothing installed")
        return f"attn_implementation={self.name!r} runs transformers' flash path on the {self.kernel} ({done})"

    def __enter__(self) -> FlashEmulation:
        return self

    def __exit__(self, *exc_info) -> None:
        while self._undo:  # last installed first; a second exit finds nothing left
            self._undo.pop()()


@dataclass
class FlashRequests:
    """What :func:`reference_for_flash_requests` did: ``models``, the model classes that asked for
    ``"flash_attention_2"`` at load and got :data:`REFERENCE_NAME` (the reference kernel (packsim,
    pure torch), not flash-attn) in its place, in load order; ``emulation``, what the first of them
    installed (None while none asked, or where a real flash-attn runs what was asked)."""

    models: list[str] = field(default_factory=list)
    emulation: FlashEmulation | None = None


def real_flash_attn() -> str | None:
    """"flash-attn <version>" where a real ``flash_attn`` is importable and CUDA is available, else None.

    Not imported here: found by ``importlib.util.find_spec`` (or already in ``sys.modules``).
    """
    if not torch.cuda.is_available():
        return None
    try:
        found = importlib.util.find_spec("flash_attn") is not None
    except (ValueError, ImportError):  # in sys.modules without a __spec__
        found = sys.modules.get("flash_attn") is not None
    if not found:
        return None
    try:
        version = importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(sys.modules.get("flash_attn"), "__version__", "(version unknown)")
    return f"flash-attn {version}"


def emulate_flash(*, force_reference: bool = False) -> FlashEmulation:
    """Make transformers' flash path runnable here; idempotent. See the module docstring.

    As ``with emulate_flash() as flash:``, leaving undoes what this call installed (the ``_lazy_imports``
    wrapper, the two registry entries), and nothing that was installed before it.

    Returns the name to load models with (``model_from_config(config, attn_implementation=
    emulate_flash().name)``) and the kernel behind it: the real flash-attn where it and CUDA are
    there (unless ``force_reference``), else the reference kernel (packsim, pure torch), not
    flash-attn, installed behind :data:`REFERENCE_NAME`.

    Example::

        >>> import packsim
        >>> with packsim.emulate_flash() as flash:  # undone on leaving
        ...     model = packsim.build_model("tiny", attn_implementation=flash.name)
        ...     print(model.config._attn_implementation == flash.name)
        True
    """
    real = real_flash_attn()
    if real is not None and not force_reference:
        return FlashEmulation(REAL_NAME, real, reference=False, installed=False)
    undo = _install()
    return FlashEmulation(REFERENCE_NAME, REFERENCE_KERNEL, reference=True, installed=bool(undo), _undo=undo)


@contextmanager
def reference_for_flash_requests() -> Iterator[FlashRequests]:
    """Inside: a model that asks for ``"flash_attention_2"`` at load runs the reference kernel
    (packsim, pure torch), not flash-attn, where no real flash-attn can run here. See the module docstring.

    Every way a model gets its attention implementation (``from_pretrained``, ``from_config``, its
    config, ``set_attn_implementation``) goes through ``PreTrainedModel._check_and_adjust_attn_implementation``
    (on every transformers of the tested window: :func:`packsim.core.upstream.flash_utils.answering_attn_requests`
    names the versions read): wrapped inside, it answers ``"flash_attention_2"`` as :data:`REFERENCE_NAME`
    for a model whose class supports flash attention (one that does not is refused by transformers
    as on a GPU), installing :func:`emulate_flash` at the first such request. On leaving, the method is
    transformers' again and the emulation is undone. Where a real flash-attn runs, nothing changes.
    Yields the :class:`FlashRequests` it fills (which models asked, what was installed).
    """
    requests = FlashRequests()
    if real_flash_attn() is not None:
        yield requests
        return
    with ExitStack() as stack:

        def reference(model) -> str:
            if requests.emulation is None:
                requests.emulation = stack.enter_context(emulate_flash())
            requests.models.append(type(model).__name__)
            return requests.emulation.name

        stack.enter_context(flash_utils.answering_attn_requests(REAL_NAME, reference))
        yield requests


def _install() -> list[Callable[[], None]]:
    """Install the reference kernel behind REFERENCE_NAME; the undo of each piece installed now
    (empty: everything was there already)."""
    undo: list[Callable[[], None]] = []
    before = flash_utils.lazy_imports()
    if flash_utils.wrap_lazy_imports(REFERENCE_NAME, _reference_kernels, doc=(
            f"transformers' _lazy_imports, with {REFERENCE_NAME!r} answered by the {REFERENCE_KERNEL} "
            "(packsim.reference.flash_emulation).")):
        undo.append(functools.partial(flash_utils.unwrap_lazy_imports, flash_utils.lazy_imports(), before))
    mappings = flash_utils.registries()
    saved = [mapping.get(REFERENCE_NAME, flash_utils.ABSENT) for mapping in mappings]
    if flash_utils.register(REFERENCE_NAME):
        undo += [functools.partial(flash_utils.restore_entry, mapping, REFERENCE_NAME, old, mapping[REFERENCE_NAME])
                 for mapping, old in zip(mappings, saved, strict=True) if mapping[REFERENCE_NAME] is not old]
    return undo


def _reference_kernels():
    """(flash_attn_func, flash_attn_varlen_func) of the reference, read at each call (a spy replaces them)."""
    return reference_flash.flash_attn_func, reference_flash.flash_attn_varlen_func
