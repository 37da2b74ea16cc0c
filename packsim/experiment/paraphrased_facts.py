"""Synthetic facts with paraphrased questions: the data design where the loss curve lies (notebook 06).

Each entity (a made-up 4-letter name) has three attributes (colour, birth year, room number). A
fact is asked with several paraphrased templates, e.g. ``color of tavo?`` / ``tavo color=`` /
``what color is tavo?`` -> ``red``. One template per attribute is held out of training.

The training stream puts **copies of each question side by side** (three in the course; real
data has this shape: duplicated or near-duplicated samples that a sequential packer keeps next
to each other). Packed with the default causal mask, the later copies can read the answer off
the first: the buggy
trainer's reported loss falls fast, below the correct trainer's, while the model learns less of
what works alone. :class:`FactsData` records which training example is a repeat, so the trainer
can report the in-pack loss of first and repeated copies separately (the copying made visible).

Lessons: none directly.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field

from packsim.core.data import Example
from packsim.core.errors import PacksimError

__all__ = ["ATTRIBUTES", "FactsData", "make_facts"]

# attribute -> (values, seen templates, held-out template); "{e}" is the entity name.
# Answers carry a few nats each (8 colours, 100 years, 900 rooms), so a fact the model has not
# memorised costs real loss; names are short (4 letters), so a prompt costs little to predict.
ATTRIBUTES: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "color": (
        ("red", "blue", "green", "black", "white", "pink", "gray", "gold"),
        ("color of {e}?", "{e} color=", "what color is {e}?"),
        "{e} has which color?",
    ),
    "year": (
        tuple(str(y) for y in range(1900, 2000)),
        ("year of {e}?", "{e} born in=", "when was {e} born?"),
        "{e} birth year?",
    ),
    "room": (
        tuple(str(r) for r in range(100, 1000)),
        ("room of {e}?", "{e} stays in room=", "which room is {e} in?"),
        "{e} room number?",
    ),
}
NAME_LENGTH = 4


@dataclass
class FactsData:
    """Training stream and test sets of the facts design.

    Attributes:
        train: the training stream, copies adjacent: with ``c`` copies, ``train[c*k : c*(k+1)]`` are the
            same question; the stream repeats shuffled epochs until it holds ``n_train`` examples.
        is_repeat: ``is_repeat[i]`` is True when ``train[i]`` is a second (or later) copy.
        test_seen: every (entity, attribute, seen template) once: questions seen in training.
        test_heldout: every (entity, attribute) with its held-out template: new wording.
        facts: ``{entity: {attribute: value}}``.
    """

    train: list[Example]
    is_repeat: list[bool]
    test_seen: list[Example]
    test_heldout: list[Example]
    facts: dict[str, dict[str, str]] = field(default_factory=dict)


def _entities(n: int, rng: random.Random) -> list[str]:
    names: set[str] = set()
    while len(names) < n:
        names.add("".join(rng.choices(string.ascii_lowercase, k=NAME_LENGTH)))
    return sorted(names)


def make_facts(n_entities: int = 225, n_train: int = 20_000, seed: int = 0, copies: int = 3) -> FactsData:
    """Facts about ``n_entities`` entities; a training stream of ``n_train`` examples.

    ``copies`` questions in a row are the same (3 in the course; 1 gives a shuffled stream with no
    duplicates, the control). The facts and test sets depend on ``seed``; so does the stream order.
    """
    if n_entities < 1 or n_train < 1 or copies < 1:
        raise PacksimError(
            f"need n_entities, n_train and copies >= 1 (got {n_entities}, {n_train}, {copies})."
        )
    rng = random.Random(f"packsim-facts-{seed}")
    entities = _entities(n_entities, rng)
    facts = {e: {a: rng.choice(spec[0]) for a, spec in ATTRIBUTES.items()} for e in entities}

    def example(e: str, a: str, template: str) -> Example:
        return Example.from_text(template.format(e=e), facts[e][a], task=a)

    seen = [(e, a, t) for e in entities for a, spec in ATTRIBUTES.items() for t in spec[1]]
    train, is_repeat = [], []
    while len(train) < n_train:
        rng.shuffle(seen)
        for e, a, t in seen:
            ex = example(e, a, t)
            train.extend([ex] * copies)
            is_repeat.extend([False] + [True] * (copies - 1))
    test_seen = [example(e, a, t) for e, a, t in sorted(seen)]
    test_heldout = [example(e, a, spec[2]) for e in entities for a, spec in ATTRIBUTES.items()]
    return FactsData(train[:n_train], is_repeat[:n_train], test_seen, test_heldout, facts)
