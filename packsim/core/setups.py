"""Setups: the three independent switches (mask x positions x loss) and the named presets.

A setup says *how* a batch of examples is turned into one training forward:

- ``mask``: ``"causal"`` over the whole pack (the default bug: later examples see earlier ones)
  or ``"block_diagonal"`` (causal inside each example only);
- ``positions``: ``"continuous"`` (0..T-1 across the pack) or ``"reset"`` (0..L-1 per example);
- ``loss``: ``"all"`` tokens (prompt, padding, boundary token too) or ``"completion"``
  (response tokens and EOS only, normalised per counted token);
- ``packed``: ``False`` for the one-example-per-row reference (``padded``).

Every batch, trainer and audit call takes a setup, by preset name or as a :class:`Setup`; the
lessons pass preset names (``"correct"``, ``"buggy"``) and import nothing from this module.

Lessons: none directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from packsim.core.errors import PacksimError

__all__ = ["Setup", "SETUPS", "get_setup"]

_CHOICES = {
    "mask": ("causal", "block_diagonal"),
    "positions": ("continuous", "reset"),
    "loss": ("all", "completion"),
}


@dataclass(frozen=True)
class Setup:
    """One combination of the switches. Build presets with :func:`get_setup`.

    Example::

        >>> import packsim
        >>> setup = packsim.Setup(mask="causal", positions="reset", loss="completion")
        >>> setup.name, setup == packsim.get_setup("causal+reset+completion")
        ('causal+reset+completion', True)
    """

    mask: str = "block_diagonal"
    positions: str = "reset"
    loss: str = "completion"
    packed: bool = True
    name: str = ""

    def __post_init__(self):
        for field, allowed in _CHOICES.items():
            value = getattr(self, field)
            if value not in allowed:
                raise PacksimError(
                    f"Setup.{field}={value!r} is not one of {list(allowed)}; "
                    f"pick one of those (e.g. Setup(mask='block_diagonal', positions='reset', loss='completion'))."
                )
        if not self.name:
            label = f"{self.mask}+{self.positions}+{self.loss}" + ("" if self.packed else "+padded")
            object.__setattr__(self, "name", label)

    @property
    def isolates_examples(self) -> bool:
        """True when no token can attend to another example (block-diagonal or unpacked)."""
        return self.mask == "block_diagonal" or not self.packed


SETUPS: dict[str, Setup] = {
    "buggy": Setup("causal", "continuous", "all", name="buggy"),
    "correct": Setup("block_diagonal", "reset", "completion", name="correct"),
    "padded": Setup("causal", "reset", "completion", packed=False, name="padded"),
    "mask_fix": Setup("block_diagonal", "reset", "all", name="mask_fix"),
    "loss_fix": Setup("causal", "continuous", "completion", name="loss_fix"),
    "positions_only": Setup("causal", "reset", "all", name="positions_only"),
}


def get_setup(setup: str | Setup) -> Setup:
    """A :class:`Setup` from a preset name (``"buggy"``), a combination written like its default
    name (``"causal+reset+completion"``, add ``+padded`` for one example per row), or a ``Setup``
    (returned unchanged). ``packsim compare --setups`` accepts the same strings.

    Example::

        >>> import packsim
        >>> packsim.get_setup("buggy").mask, packsim.get_setup("causal+reset+completion").positions
        ('causal', 'reset')
    """
    if isinstance(setup, Setup):
        return setup
    if isinstance(setup, str) and setup in SETUPS:
        return SETUPS[setup]
    if isinstance(setup, str) and setup.count("+") in (2, 3):
        mask, positions, loss, *rest = setup.split("+")
        if rest in ([], ["padded"]):
            return Setup(mask, positions, loss, packed=not rest)
    raise PacksimError(
        f"unknown setup {setup!r}: use one of {sorted(SETUPS)}, a combination such as "
        "'block_diagonal+continuous+completion' (mask+positions+loss), "
        "or build your own with packsim.Setup(mask=..., positions=..., loss=...)."
    )
