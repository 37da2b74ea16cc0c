"""Each example alone vs packed: the isolation check whose cost does not grow with the batch.

A pipeline isolates its examples when the logits of every example in the packed batch equal the
logits of that example run alone. :func:`alone_change` runs every example of the batch alone, in
right-padded rows sorted by length (about the tokens of one packed forward; causal attention
means a row's padding never reaches its real tokens, so no mask is needed for isolation), each
at the positions the packed forward gives its first token onwards, and compares per token.
Both forwards run in eval mode (dropout draws differ between shapes). Examples come from the
pipeline's ``seq``: the independent boundaries (:mod:`packsim.auditing.evidence`) when there are
any, so a boundary field that is wrong shows up as the leak it causes.

Shapes: alone rows (R, L); result (S,) max |logit change| per example and (S,) first token
offset inside the example where the change exceeds ``tol`` (-1 where none).

:func:`compare_alone` is the same comparison against given packed logits, whatever mode they ran
in: the shared pass (:mod:`packsim.auditing.shared_pass`) compares the train-mode baseline of
``audit_trainer`` with the examples alone in eval mode, and reruns the packed side in eval mode
(:func:`alone_change`) only where they differ.

Lessons: none directly (the perturbation probe of packsim.audit calls it).
"""

from __future__ import annotations

import torch

from packsim.auditing.pipeline import Pipeline, same_randomness

__all__ = ["alone_change", "compare_alone"]


def _eval(model):
    class _Mode:
        def __enter__(self):
            self.was = model.training
            model.eval()

        def __exit__(self, *exc):
            model.train(self.was)

    return _Mode()


def _groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Examples sorted by length, cut into groups of at most ``budget`` padded tokens each."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    groups, cur = [], []
    for k in order:
        if cur and (len(cur) + 1) * lengths[k] > budget:
            groups.append(cur)
            cur = []
        cur.append(k)
    return groups + ([cur] if cur else [])


def alone_change(p: Pipeline, tol: float, seed: int,
                 base: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(S,) max |packed - alone| logit change per example and (S,) first offset over ``tol``; None if it cannot run.

    ``base`` (B, T, V): the pipeline's baseline logits, reused as the packed side when the model
    is in eval mode (else the packed forward is rerun in eval mode, like the alone side).
    """
    if p.run_alone is None:
        return None
    # in train mode the baseline may carry dropout that no config field shows (a module's own
    # attention_dropout attribute): rerun the packed side in eval mode then, as the alone side runs
    if base is None or p.model.training:
        with _eval(p.model), torch.no_grad(), same_randomness(seed, p.input_ids.device):
            base = p.run().logits.float()  # (B, T, V)
    change, offset, _ = compare_alone(p, base, tol, seed)
    return change, offset


def compare_alone(p: Pipeline, packed: torch.Tensor, tol: float, seed: int,
                  shifted: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor, float | None]:
    """Every example alone (eval mode) vs ``packed`` (B, T, V) logits: (S,) change, (S,) first offset over
    ``tol``, and the shift test's effect.

    ``shifted`` = (example j, shift): one more row, example j alone at its positions + shift; the
    third result is then max |logit change| between j alone and j shifted (the positions probe's
    shift test), else None. Needs ``p.run_alone``.
    """
    S = len(p.example_ids)
    ids, seq = p.input_ids, p.seq
    B, T = ids.shape
    cols = torch.arange(T, device=ids.device).expand(B, T)
    pos = cols if p.positions is None else p.positions.to(ids.device)
    tokens = [ids[seq == k] for k in range(S)]  # row-major: each example's tokens in order
    first = [int(pos[seq == k][0]) for k in range(S)]
    if shifted is not None:  # row S: example j at its positions + shift
        tokens.append(tokens[shifted[0]])
        first.append(first[shifted[0]] + shifted[1])
    lengths = [len(t) for t in tokens]
    device = ids.device
    change = torch.zeros(S)
    offset = torch.full((S,), -1, dtype=torch.long)
    kept = {}  # the shift test's two rows' logits (n, V)
    with _eval(p.model), torch.no_grad(), same_randomness(seed, device):
        for group in _groups(lengths, max(B * T, max(lengths))):
            L = max(lengths[k] for k in group)
            x = torch.zeros(len(group), L, dtype=ids.dtype, device=device)  # (R, L)
            where = torch.zeros(len(group), L, dtype=torch.long, device=device)
            mask = torch.zeros(len(group), L, dtype=torch.long, device=device)
            for r, k in enumerate(group):
                n = lengths[k]
                x[r, :n], mask[r, :n] = tokens[k], 1
                where[r] = first[k] + torch.arange(L, device=device)
            alone = p.run_alone(x, where, mask).float()  # (R, L, V)
            for r, k in enumerate(group):
                n = lengths[k]
                if shifted is not None and k in (shifted[0], S):
                    kept[k] = alone[r, :n]
                if k == S:
                    continue
                diff = (packed[seq == k] - alone[r, :n]).abs().amax(-1).cpu()  # (n,)
                change[k] = float(diff.max())
                over = (diff > tol).nonzero()
                if over.numel():
                    offset[k] = int(over[0])
    effect = None if shifted is None else float((kept[shifted[0]] - kept[S]).abs().max())
    return change, offset, effect
