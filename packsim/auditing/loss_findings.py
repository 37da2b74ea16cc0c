"""The loss settings' findings of a Trainer: which tokens its loss counts, and how ranks normalise it.

:func:`completion_only_loss` holds TRL's ``completion_only_loss`` / ``assistant_only_loss`` (or a
plain Trainer's labels) against the counted labels of an audited batch (input_ids (B, T), labels
(B, T), -100 not counted) and the ``loss_coverage`` probe; :func:`sft_language_modelling` says when
TRL trains an SFTTrainer as language modelling (every token a target); :func:`loss_across_devices`
reads ``average_tokens_across_devices`` and whether ``num_items_in_batch`` reaches the model. Each
returns a :class:`~packsim.auditing.report.Finding`; what one process cannot measure is
``skipped``. Used by :func:`packsim.audit_trainer`.

Lessons: none directly.
"""

from __future__ import annotations

from packsim.auditing.findings import is_sft
from packsim.auditing.report import Finding

__all__ = ["UNSET_FIX", "UNSET_WHY", "completion_only_loss", "loss_across_devices", "sft_language_modelling"]


def sft_language_modelling(trainer) -> str:
    """Why TRL trains this SFTTrainer as language modelling (every token a target), or '' (not, or unknown).

    TRL (``SFTTrainer.__init__``) sets ``completion_only_loss`` from the data when the config leaves it
    unset: True for prompt/completion data, False otherwise, tokenized data with a completion_mask
    included. The prepared dataset tells the data apart only before packing (its text / messages
    column is still there); a packed one holds input_ids and labels only, so it is not called
    language modelling from the config alone (:data:`UNSET_WHY`).
    """
    if not is_sft(trainer):
        return ""
    args = trainer.args
    if getattr(trainer, "completion_only_loss", False) or getattr(args, "assistant_only_loss", False):
        return ""
    columns = set(getattr(getattr(trainer, "train_dataset", None), "column_names", None) or [])
    text = getattr(args, "dataset_text_field", None) or "text"
    if {text, "messages"} & columns and not {"prompt", "completion"} & columns:
        setting = ("completion_only_loss unset" if getattr(args, "completion_only_loss", None) is None
                   else "completion_only_loss=False")
        return (f"{setting} on language-modelling data (the dataset has "
                f"{sorted({text, 'messages'} & columns)[0]!r}, no prompt and completion fields)")
    return ""  # packed or tokenized: nothing left says the data is language modelling (see UNSET_FIX)


# TRL's SFTTrainer (trl/trainer/sft_trainer.py; the TRL version read: docs/audit.md, "A Trainer or
# SFTTrainer as built"): SFTTrainer.__init__ sets completion_only_loss from the raw data's columns when it
# is unset (True only for "prompt" + "completion"), and _prepare_dataset folds a tokenized completion_mask
# into the labels only when it is True; packing then keeps input_ids, labels, seq_lengths.
UNSET_WHY = ("completion_only_loss is unset, and TRL sets it True only for data with prompt and completion "
             "fields (SFTTrainer.__init__); tokenized data with a completion_mask gets every token in the loss "
             "(the mask is applied only when it is True), and after packing nothing says whether this is "
             "language modelling")
UNSET_FIX = ("prompt/response data: SFTConfig(completion_only_loss=True); language modelling (every token a "
             "target): audit with objective='lm' (AuditCallback(objective='lm'), packsim audit --objective lm)")


def completion_only_loss(trainer, mask_note: str | None, counted: tuple[int, int], loss_probe) -> Finding:
    """Prompt/completion data trained with the prompts in the loss (or, under objective='lm', a trainer
    that leaves tokens out).

    counted: (counted, total) labels inside the examples of the audited batch (boundaries left
    out); loss_probe: that batch's ``loss_coverage`` ProbeResult (its details name the objective).
    """
    c, n = counted
    lm = loss_probe.details.get("objective") == "lm"
    if not is_sft(trainer):
        if lm:
            return Finding("completion_only_loss", "fail" if c < n else "pass",
                           f"objective='lm': every real token should be a target; {c} of the {n} tokens inside "
                           "the examples of the audited batch are counted",
                           "count every token's label (labels = input_ids, -100 on padding and each example's "
                           "first token only), or audit with objective='sft' if the prompts are masked on purpose")
        if mask_note:
            prompts = {"prompt", "every"} & set(loss_probe.details.get("problems", []))
            counts = loss_probe.details.get("counts", {})
            pc, pn = counts.get("prompt", (0, 0))
            status = "fail" if prompts else "pass"
            return Finding("completion_only_loss", status,
                           f"the loss_coverage probe checked each label against {mask_note}: {pc} of {pn} "
                           "prompt tokens counted",
                           "set the labels of prompt tokens to -100 (e.g. PackingCollator(setup='correct'))")
        return Finding("completion_only_loss", "skipped",
                       "the collated features carry no prompt/completion split, so prompt labels cannot be "
                       "told from response labels; pass features with completion_mask or "
                       "prompt_ids + response_ids (TrainingArguments(remove_unused_columns=False)), or, for "
                       "language modelling (every token a target), audit with objective='lm'")
    args = trainer.args
    masks = getattr(trainer, "completion_only_loss", False) or getattr(args, "assistant_only_loss", False)
    which = "completion_only_loss" if getattr(trainer, "completion_only_loss", False) else "assistant_only_loss"
    lm_data = sft_language_modelling(trainer)
    if lm_data:
        return Finding("completion_only_loss", "pass", f"{lm_data}: every token is a target")
    if lm:
        if masks:
            return Finding("completion_only_loss", "fail",
                           f"objective='lm' makes every real token a target, but SFTTrainer.{which}=True sets "
                           f"the prompts' labels to -100: {c} of {n} tokens inside the examples of the audited "
                           "batch are counted",
                           "SFTConfig(completion_only_loss=False) to train on every token, or audit with "
                           "objective='sft' (the default) for completion-only fine-tuning")
        return Finding("completion_only_loss", "pass",
                       f"objective='lm' and TRL counts every token (SFTTrainer.completion_only_loss=False): {c} "
                       f"of {n} tokens inside the examples of the audited batch counted")
    if masks:
        form = loss_probe.details.get("measured")
        return Finding("completion_only_loss", "pass",
                       f"SFTTrainer.{which}=True (the configuration, read): TRL set the labels of each prompt to "
                       f"-100 while it prepared the dataset; in the audited batch {c} of {n} tokens inside the "
                       "examples are counted" + (f" ({form})" if form else "")
                       + ("; whether the -100 run is exactly each prompt is not measured (see loss_coverage)"
                          if "not_measured" in loss_probe.details else ""))
    if getattr(args, "completion_only_loss", None) is None:
        return Finding("completion_only_loss", "fail",
                       f"{UNSET_WHY}: {c} of {n} tokens inside the examples of the audited batch are counted",
                       UNSET_FIX)
    columns = getattr(getattr(trainer, "train_dataset", None), "column_names", None) or []
    why = ("the prepared dataset still holds completion_mask (prompt/completion data)"
           if "completion_mask" in columns else "TRL's default for prompt/completion data is True")
    return Finding("completion_only_loss", "fail",
                   f"SFTConfig(completion_only_loss=False) trains on the prompts too: {c} of {n} tokens "
                   f"inside the examples of the audited batch are counted; {why}",
                   "leave completion_only_loss unset (TRL then masks the prompts of prompt/completion "
                   "data) or set it to True; if this is language-modelling data (every token a target), "
                   "audit with objective='lm'")


def loss_across_devices(trainer, counts_items: bool) -> Finding:
    """average_tokens_across_devices: each rank normalises by the global label count, or by its own."""
    args = trainer.args
    world = int(getattr(args, "world_size", 1) or 1)
    avg = bool(getattr(args, "average_tokens_across_devices", False))
    fix = ("TrainingArguments(average_tokens_across_devices=True) (the default), with a model whose "
           "forward takes num_items_in_batch (**kwargs)")
    config = (f"average_tokens_across_devices={avg}, num_items_in_batch "
              f"{'counted' if counts_items else 'not counted (the model forward takes no loss kwargs)'}")
    right = avg and counts_items
    if world > 1:
        if right:
            return Finding("loss_across_devices", "pass",
                           f"{world} processes, {config}: Trainer._get_num_items_in_batch gathers the label "
                           "count of every rank, so each token weighs the same")
        return Finding("loss_across_devices", "fail",
                       f"{world} processes, {config}: each rank divides by its own label count, then DDP "
                       "averages the ranks: a mean of per-device means", fix)
    outcome = ("each rank would divide by the global label count" if right else
               "each rank would divide by its own label count (a mean of per-device means)")
    return Finding("loss_across_devices", "skipped",
                   f"one process here, so normalisation across devices cannot be measured; {config}: on "
                   f"N > 1 devices {outcome}")
