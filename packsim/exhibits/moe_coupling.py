"""A packed mixture-of-experts decoder: the forward isolates, the load-balancing loss couples the gradients.

A token-choice MoE layer routes each token to its top-k experts by that token's own hidden state.
transformers' Mixtral (and Qwen3-MoE) experts are **dropless**: every routed token is computed, no
expert has a capacity (``MixtralExperts.forward``, the ``eager`` experts implementation this module
runs; the default, ``grouped_mm`` in ``transformers/integrations/moe.py``, computes all of them too). So a
correctly packed forward isolates the examples exactly: the perturbation probe reads 0. (A router
with a capacity, as in the Switch Transformer, arXiv 2101.03961, drops the tokens past it, and which
tokens those are depends on the whole batch: there the forward couples too.)

The router's **load-balancing loss** does not isolate. ``load_balancing_loss_func``
(``transformers/models/mixtral/modeling_mixtral.py``) multiplies, per expert, the share of the
batch's tokens routed to it by the mean router probability over the batch's tokens, summed over the
layers and scaled by the number of experts; the forward adds ``router_aux_loss_coef`` times it to the
loss when ``output_router_logits=True`` (TRL's SFTTrainer turns that on for a MoE model). A batch
statistic: the gradient that reaches example i's tokens depends on every other example of the batch,
packed or padded alike (a padded batch shares the same batch-wide shares; a mask only drops pads).

Measured here on a tiny ``MixtralForCausalLM`` (``sdpa``, 4 experts, top-2, dropless; random seeded
weights), examples packed in one row by ``DataCollatorWithFlattening`` (input_ids, labels,
position_ids (1, T)), or padded one per row ((S, L) with an attention_mask):

- ``forward``: max |change of another example's logits| when one example's tokens change;
- ``gradient_ratio`` (the audit's gradient probe, with the aux loss in each example's loss):
  max over i != j of max |d(CE_j + coef * aux) / d emb_i| / max |d(CE_j + coef * aux) / d emb_j|;
- ``coupling``: the training loss L = mean CE + coef * aux; max over j, i != j of
  max |change of dL / d emb_i when example j's tokens change| / max |dL / d emb_i|.

Each without the aux loss (exactly 0 when isolated) and with it, at Mixtral's default coefficient
(0.001) and OLMoE's (0.01); plus :func:`packsim.audit` on the packed batch, whose probes read the
logits, not the aux loss. Shapes: input_ids (B, T), embeddings (B, T, d), example index (B, T).

Lessons: A8.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from packsim.core.text_table import text_table

__all__ = ["COEFS", "MoeRow", "moe_batches", "moe_model", "moe_rows", "perturbed"]

COEFS = (0.0, 0.001, 0.01)  # no aux loss; Mixtral's default router_aux_loss_coef; OLMoE's


def moe_model(seed: int = 0, vocab_size: int | None = None, experts: str = "eager"):
    """A tiny seeded ``MixtralForCausalLM`` (hidden 32, 2 layers, 4 experts, top-2, sdpa), eval mode.

    ``experts``: the experts implementation; ``"eager"`` is ``MixtralExperts.forward``'s own loop over
    the experts hit. transformers' default, ``"grouped_mm"``, is dropless too and about 30x slower on a
    CPU for this size (the tests check it reads the same)."""
    from transformers import MixtralConfig

    from packsim.core.model import model_from_config

    if vocab_size is None:
        from packsim.core.tokenizer import build_tokenizer

        vocab_size = len(build_tokenizer())
    config = MixtralConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           use_cache=False)
    model = model_from_config(config, attn_implementation="sdpa", seed=seed, quiet=True)
    model.set_experts_implementation(experts)
    return model


def moe_batches(examples) -> dict[str, tuple[dict, torch.Tensor]]:
    """``{"packed": (batch, seq), "padded": (batch, seq)}``: batch dicts for ``model(**batch)`` with
    completion-only labels, and the example index (B, T) of every token (-1 on padding)."""
    from transformers import DataCollatorWithFlattening

    feats = [{"input_ids": ex.tokens, "labels": [-100] * ex.n_prompt + ex.tokens[ex.n_prompt:]} for ex in examples]
    lengths = [len(ex.tokens) for ex in examples]
    packed = dict(DataCollatorWithFlattening()(feats))  # (1, T) each
    seq = torch.repeat_interleave(torch.arange(len(examples)), torch.tensor(lengths))[None]  # (1, T)
    L = max(lengths)
    ids = torch.zeros(len(examples), L, dtype=torch.long)
    labels = torch.full((len(examples), L), -100)
    mask = torch.zeros(len(examples), L, dtype=torch.long)
    pseq = torch.full((len(examples), L), -1)
    for i, f in enumerate(feats):
        n = lengths[i]
        ids[i, :n], labels[i, :n], mask[i, :n], pseq[i, :n] = (torch.tensor(f["input_ids"]), torch.tensor(f["labels"]),
                                                               1, i)
    padded = {"input_ids": ids, "labels": labels, "attention_mask": mask}
    return {"packed": (packed, seq), "padded": (padded, pseq)}


def perturbed(ids: torch.Tensor, seq: torch.Tensor, j: int, vocab_size: int) -> torch.Tensor:
    """``ids`` with example j's tokens replaced by other text tokens (ids 3.., same places)."""
    out = ids.clone()
    where = seq == j
    out[where] = (out[where] - 3 + 7) % (vocab_size - 3) + 3
    return out


def _fields(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}


def _forward_change(model, batch: dict, seq: torch.Tensor) -> float:
    V = model.config.vocab_size
    with torch.no_grad():
        base = model(**batch).logits  # (B, T, V)
        worst = 0.0
        for j in range(int(seq.max()) + 1):
            out = model(**{**batch, "input_ids": perturbed(batch["input_ids"], seq, j, V)}).logits
            others = (seq >= 0) & (seq != j)
            worst = max(worst, float((out - base).abs().amax(-1)[others].max()))
    return worst


def _losses(model, batch: dict, emb: torch.Tensor, seq: torch.Tensor, coef: float):
    """(per-example summed CE (S,), the aux loss or 0, the training loss: mean CE + coef * aux; with
    ``coef=None`` the aux loss alone)."""
    if coef is None:
        out = model(inputs_embeds=emb, **_fields(batch), output_router_logits=True)
        return None, out.aux_loss, out.aux_loss
    out = model(inputs_embeds=emb, **_fields(batch), output_router_logits=coef > 0)
    labels = batch["labels"]
    nll = F.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), reduction="none")
    owner = seq[:, 1:].flatten()  # the example each target belongs to
    counted = labels[:, 1:].flatten() != -100
    S = int(seq.max()) + 1
    per = torch.zeros(S, dtype=nll.dtype).index_add(0, owner[counted], nll[counted])  # (S,)
    aux = out.aux_loss if coef > 0 else nll.new_zeros(())
    return per, aux, per.sum() / counted.sum() + coef * aux


def _gradient_ratio(model, batch: dict, seq: torch.Tensor, coef: float) -> float:
    """The gradient probe with the aux loss in each example's loss (see the module docstring)."""
    emb = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)  # (B, T, d)
    per, aux, _ = _losses(model, batch, emb, seq, coef)
    worst = 0.0
    for j in range(per.shape[0]):
        (g,) = torch.autograd.grad(per[j] + coef * aux, emb, retain_graph=True)
        mag = g.abs().amax(-1)  # (B, T)
        own = float(mag[seq == j].max())
        others = (seq >= 0) & (seq != j)
        worst = max(worst, float(mag[others].max()) / own)
    return worst


def _grad(model, batch: dict, ids: torch.Tensor, seq: torch.Tensor, coef: float) -> torch.Tensor:
    emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    _, _, loss = _losses(model, {**batch, "input_ids": ids}, emb, seq, coef)
    (g,) = torch.autograd.grad(loss, emb)
    return g  # (B, T, d)


def _coupling(model, batch: dict, seq: torch.Tensor, coef: float | None) -> float:
    """How much example i's gradient of the training loss (``coef=None``: of the aux loss alone) moves
    when another example's tokens change, relative to that gradient."""
    V = model.config.vocab_size
    base = _grad(model, batch, batch["input_ids"], seq, coef)
    S = int(seq.max()) + 1
    scale = [float(base.abs().amax(-1)[seq == i].max()) for i in range(S)]
    worst = 0.0
    for j in range(S):
        moved = (_grad(model, batch, perturbed(batch["input_ids"], seq, j, V), seq, coef) - base).abs().amax(-1)
        for i in range(S):
            if i != j:
                worst = max(worst, float(moved[seq == i].max()) / scale[i])
    return worst


@dataclass(frozen=True)
class MoeRow:
    """One layout x aux coefficient: the three measurements of the module docstring."""

    layout: str
    coef: float
    forward: float
    gradient_ratio: float
    coupling: float
    aux_coupling: float  # the same for the aux loss alone: the share of its gradient the others set


def moe_rows(model=None, examples=None, coefs=COEFS) -> tuple[list[MoeRow], object]:
    """Measure the packed batch at every coefficient and the padded one at Mixtral's (the others scale
    the same way); return the rows and :func:`packsim.audit`'s report on the packed batch."""
    import packsim

    if model is None:
        model = moe_model()
    if examples is None:
        from packsim.core.data import make_dataset

        examples = make_dataset(6, 0, seed=0)[0]
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for layout, (batch, seq) in moe_batches(examples).items():
            forward = _forward_change(model, batch, seq)
            aux_only = _coupling(model, batch, seq, None)
            for coef in coefs if layout == "packed" else (coefs[1],):
                rows.append(MoeRow(layout, coef, forward, _gradient_ratio(model, batch, seq, coef),
                                   _coupling(model, batch, seq, coef), aux_only))
        packed, _ = moe_batches(examples)["packed"]
        report = packsim.audit(model, packed, examples=[ex.tokens for ex in examples], use_cache=False)
    return rows, report


def moe_text(rows: list[MoeRow]) -> str:
    """The rows as a table (numbers in the module docstring's definitions)."""
    table = [("layout", "router_aux_loss_coef", "forward probe", "gradient probe (aux in loss_j)",
              "grad of i moves when j changes", "aux loss alone: the same")]
    for r in rows:
        table.append((r.layout, f"{r.coef:g}" + (" (no aux)" if r.coef == 0 else ""), f"{r.forward:.1e}",
                      f"{r.gradient_ratio:.1e}", f"{r.coupling:.1e}", f"{r.aux_coupling:.1%}"))
    return "\n".join(text_table(table))


__all__ += ["moe_text"]
