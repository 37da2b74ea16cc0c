"""packsim.exhibits.moe_coupling: a packed dropless MoE isolates in the forward, its load-balancing loss couples
the gradients. Ground truth: the test's own perturbation loop, its own Switch-Transformer aux loss from the
router logits, and its own gradients."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from packsim.exhibits import moe_coupling as mc


@functools.cache
def _examples():
    from packsim.core.data import make_dataset

    return make_dataset(6, 0, seed=0)[0]


@functools.cache
def _measured():
    return mc.moe_rows(mc.moe_model(), _examples())


def _own_forward_change(model, batch, seq) -> float:
    with torch.no_grad():
        base = model(**batch).logits
        worst = 0.0
        for j in range(len(_examples())):
            ids = batch["input_ids"].clone()
            ids[seq == j] = torch.randint(3, model.config.vocab_size, (int((seq == j).sum()),),
                                          generator=torch.Generator().manual_seed(j))
            moved = (model(**{**batch, "input_ids": ids}).logits - base).abs().amax(-1)
            worst = max(worst, float(moved[(seq >= 0) & (seq != j)].max()))
    return worst


def test_the_packed_forward_isolates_exactly_on_both_experts_implementations():
    batch, seq = mc.moe_batches(_examples())["packed"]
    for experts in ("eager", "grouped_mm"):  # MixtralExperts' own loop; transformers' default
        model = mc.moe_model(experts=experts)
        assert model.config._experts_implementation == experts
        assert _own_forward_change(model, batch, seq) == 0.0, experts
    rows, _ = _measured()
    assert all(r.forward == 0.0 for r in rows)


def _switch_aux(router_logits, top_k: int, n_experts: int) -> torch.Tensor:
    """Switch Transformer's load-balancing loss over every token (eq. 4-6): E * sum_e f_e * P_e per layer's
    tokens pooled over the layers, f_e the share of top-k assignments, P_e the mean router probability."""
    probs = torch.cat([F.softmax(r.float(), -1) for r in router_logits])  # (layers * T, E)
    chosen = probs.topk(top_k, -1).indices  # (layers * T, k)
    share = F.one_hot(chosen, n_experts).sum(1).float().mean(0)  # (E,) assignments per token
    return n_experts * (share * probs.mean(0)).sum()


def test_the_aux_loss_is_the_switch_formula_and_depends_on_every_example():
    model = mc.moe_model()
    batch, seq = mc.moe_batches(_examples())["packed"]
    out = model(**{k: v for k, v in batch.items() if k != "labels"}, output_router_logits=True)
    ours = _switch_aux(out.router_logits, model.config.num_experts_per_tok, model.config.num_local_experts)
    assert torch.allclose(out.aux_loss, ours, atol=1e-6), (out.aux_loss, ours)
    # the gradient the aux loss sends to example 0's tokens moves when only example 3's tokens change
    emb = model.get_input_embeddings()(batch["input_ids"]).detach()

    def aux_grad(e):
        e = e.clone().requires_grad_(True)
        o = model(inputs_embeds=e, position_ids=batch["position_ids"], output_router_logits=True)
        (g,) = torch.autograd.grad(_switch_aux(o.router_logits, 2, 4), e)
        return g[seq == 0]

    other = batch["input_ids"].clone()
    other[seq == 3] = (other[seq == 3] + 5 - 3) % (model.config.vocab_size - 3) + 3
    moved = (aux_grad(model.get_input_embeddings()(other).detach()) - aux_grad(emb)).abs().max()
    assert float(moved) > 1e-3 * float(aux_grad(emb).abs().max())


def _own_ce_grad(model, batch, ids, seq, coef):
    """d(mean CE over the labels + coef * aux) / d embeddings, the test's own loss."""
    emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    out = model(inputs_embeds=emb, **{k: v for k, v in batch.items() if k not in ("input_ids", "labels")},
                output_router_logits=True)
    labels = batch["labels"][:, 1:].flatten()
    loss = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), labels, ignore_index=-100)
    loss = loss + coef * _switch_aux(out.router_logits, 2, 4)
    (g,) = torch.autograd.grad(loss, emb)
    return g


def test_without_the_aux_loss_no_gradient_moves_and_with_it_they_do_in_proportion():
    model = mc.moe_model()
    for layout in ("packed", "padded"):
        batch, seq = mc.moe_batches(_examples())[layout]
        other = batch["input_ids"].clone()
        other[seq == 3] = (other[seq == 3] + 5 - 3) % (model.config.vocab_size - 3) + 3
        for coef, moves in ((0.0, False), (0.01, True)):
            a = _own_ce_grad(model, batch, batch["input_ids"], seq, coef)[seq == 0]
            b = _own_ce_grad(model, batch, other, seq, coef)[seq == 0]
            assert bool((a != b).any()) is moves, (layout, coef)
    rows, _ = _measured()
    by = {(r.layout, r.coef): r for r in rows}
    assert by["packed", 0.0].coupling == 0.0 and by["packed", 0.0].gradient_ratio == 0.0
    assert by["packed", 0.001].coupling > 0 and by["padded", 0.001].coupling > 0  # not a packing bug
    ratio = by["packed", 0.01].coupling / by["packed", 0.001].coupling
    assert 8 < ratio < 12, ratio  # linear in the coefficient
    assert 0.05 < by["packed", 0.001].aux_coupling < 1.0  # the others set a large share of the aux gradient


def test_the_audit_passes_the_packed_batch_its_probes_read_the_logits():
    rows, report = _measured()
    assert report.status == "pass", report.table()
    assert report.probes["gradient"].value == 0.0
    text = mc.moe_text(rows)
    assert text.splitlines()[0].startswith("layout") and len(text.splitlines()) == 1 + len(rows)
