"""Reference solutions to the exercises of notebook 01_why_pack (checks: packsim.course.exercises.lesson01_why_pack)."""

from __future__ import annotations

import math


def lower_bound(lengths, capacity: int) -> int:
    """Fewest rows of ``capacity`` tokens that can hold ``lengths`` (n,): ceil(total / capacity)."""
    total = sum(int(n) for n in lengths)
    return math.ceil(total / capacity)  # or -(-total // capacity), exact for huge totals


def padding_waste(lengths, batch_size: int) -> float:
    """Fraction of token slots that are padding when consecutive batches of ``batch_size``
    examples (data order, the last batch may be smaller) are each padded to their longest."""
    lengths = [int(n) for n in lengths]
    slots = real = 0
    for i in range(0, len(lengths), batch_size):
        batch = lengths[i : i + batch_size]
        slots += len(batch) * max(batch)  # every row padded to the batch's longest
        real += sum(batch)
    return (slots - real) / slots


def ffd_pack(lengths, capacity: int) -> list[list[int]]:
    """First-fit decreasing: longest first, each into the first pack with room, else a new pack.

    Returns a list of packs, each a list of example indices into ``lengths`` (n,).
    """
    order = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))  # stable: ties keep data order
    packs: list[list[int]] = []
    room: list[int] = []  # free tokens left in each pack
    for i in order:
        size = int(lengths[i])
        for p, free in enumerate(room):
            if size <= free:
                packs[p].append(i)
                room[p] -= size
                break
        else:  # no open pack has room: open a new one
            packs.append([i])
            room.append(capacity - size)
    return packs
