"""Why a hybrid family keeps its examples apart or not, read from the installed transformers source.

A stateful layer (a Mamba2 mixer, a short convolution, a gated DeltaNet) isolates packed examples
only when ``seq_idx`` (1, T) int32 or ``cu_seq_lens_q`` (S+1,) reaches it. :func:`dropped_seq_idx`
reads, with ``ast``, each call on the way from a family's model to its mixers and says which ones
pass neither ``seq_idx`` nor ``**kwargs`` (file:line); :func:`family_why` says why a family needs
more than ``seq_idx`` (GraniteMoeHybrid's mask, Qwen3-Next's delta rule) or why no field reaches
its state. Which transformers versions drop it is in the README's "Tested versions"; the trap cells
of :mod:`packsim.exhibits.hybrid_traps` measure it, and tests/test_hybrid_traps.py holds the reading
against the measurement.

Lessons: none directly.
"""

from __future__ import annotations

import inspect

__all__ = ["dropped_seq_idx", "family_why", "mamba2_drops_seq_idx"]


def _where(obj, marker: str) -> str:
    """'transformers/models/.../modeling_x.py:LINE' of the first line of ``obj``'s source holding ``marker``."""
    obj = inspect.unwrap(obj)  # the modeling function, not its decorators'
    try:
        lines, first = inspect.getsourcelines(obj)
        path = inspect.getsourcefile(obj) or "?"
    except (OSError, TypeError):
        return "(source not readable)"
    hit = next((first + k for k, line in enumerate(lines) if marker in line), None)
    short = path[path.rfind("transformers/"):] if "transformers/" in path else path
    return f"{short}:{hit}" if hit else f"{short} (no {marker!r}: transformers moved)"


# the calls that carry seq_idx (in **kwargs) from the model down to a family's stateful layer, outermost
# first: (class in the family's modeling module, the callee inside its forward): the calls some transformers
# versions write without it (which ones: the README's "Tested versions"), read from the installed source
_CARRIERS = {"mamba2": (("Mamba2ForCausalLM", "self.backbone"), ("Mamba2Block", "self.mixer")),
             "falcon_h1": (("FalconH1DecoderLayer", "self.mamba"),)}


def dropped_seq_idx(family: str) -> list[str]:
    """'<Class>.forward calls <callee> without seq_idx or **kwargs (file:line)' for each call on the way
    to ``family``'s stateful layers that drops it in the installed transformers (read from the source
    with ``ast``), outermost first; [] where seq_idx reaches them."""
    import ast
    import importlib
    import textwrap

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    drops = []
    for cls, callee in _CARRIERS.get(family, ()):
        forward = inspect.unwrap(getattr(module, cls).forward)
        calls = [node for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(forward))))
                 if isinstance(node, ast.Call) and ast.unparse(node.func) == callee]
        if calls and not any(k.arg in (None, "seq_idx") for k in calls[0].keywords):
            drops.append(f"{cls}.forward calls {callee} without seq_idx or **kwargs ({_where(forward, callee + '(')})")
    return drops


def mamba2_drops_seq_idx() -> bool:
    """Whether ``Mamba2ForCausalLM.forward`` itself drops seq_idx at its backbone, in the installed transformers."""
    return any(d.startswith("Mamba2ForCausalLM.") for d in dropped_seq_idx("mamba2"))


def family_why(family: str) -> str:
    """Why a family needs more than seq_idx, or why no field isolates it through its own forward
    (file:line in the installed transformers); '' for the others."""
    import transformers

    dropped = dropped_seq_idx(family)
    if dropped:
        backbone = family == "mamba2" and len(dropped) == 1 and dropped[0].startswith("Mamba2ForCausalLM.")
        return (f"{' and '.join(dropped)}, so no packing field reaches its state, on any kernel"
                + ("; its backbone (Mamba2Model) isolates with seq_idx" if backbone else ""))
    if family == "granitemoehybrid":
        at = _where(transformers.GraniteMoeHybridModel.forward, "mask_kwargs = {")
        return (f"GraniteMoeHybridModel.forward builds its attention mask without position_ids ({at}), so restarting "
                "positions leave its attention causal over the row")
    if family == "qwen3_next":
        from transformers.models.qwen3_next import modeling_qwen3_next

        at = _where(modeling_qwen3_next.Qwen3NextGatedDeltaNet.forward, "cu_seqlens=")
        return (f"Qwen3NextGatedDeltaNet hands cu_seq_lens_q to its gated delta rule as cu_seqlens ({at}); seq_idx "
                "reaches only its conv")
    return ""
