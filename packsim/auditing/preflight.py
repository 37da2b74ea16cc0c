"""Pre-flight audit of a local checkpoint and the user's data: ``packsim audit --model DIR --data FILE``.

Builds the training pipeline a practitioner is about to launch, from

- ``DIR``: any local ``from_pretrained`` directory (config, weights, tokenizer files);
- ``FILE``: JSON Lines, one ``{"prompt": ..., "completion": ...}`` object per line;
- a collator NAME: ``packsim`` (:class:`packsim.PackingCollator`), ``flattening`` (transformers'
  ``DataCollatorWithFlattening``), each under a transformers ``Trainer``; ``trl-bfd``,
  ``trl-wrapped``, ``trl-padding-free`` (TRL's ``SFTTrainer`` with packing_strategy ``bfd``,
  ``wrapped``, or ``padding_free=True`` without packing);
- an attention implementation (``--attn``),

and runs :func:`packsim.audit_trainer` on it. An implementation that needs what this machine
lacks (flash attention without CUDA or the package) is audited under ``sdpa``, with the flash
checks that can be read from the batch and a ``skipped`` finding saying what was not measured;
``flash_attention_2`` runs transformers' own flash path on packsim's reference kernel, and a hybrid
checkpoint (stateful layers) whose ``causal_conv1d`` / ``mamba_ssm`` / ``fla`` is missing is audited
inside :func:`packsim.reference.hybrid_emulation.emulate_hybrid_kernels` (undone after), each with a
notice naming the reference kernel.
Tokens: input_ids (B, T) per batch, as the chosen collator makes them. Lesson 07.

Lessons: none directly.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import torch

from packsim.auditing.records import load_records, record_bound
from packsim.core.errors import PacksimError
from packsim.core.special_tokens import token_ids

COLLATORS = ("packsim", "flattening", "trl-bfd", "trl-wrapped", "trl-padding-free")
KNOWN_ATTN = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")


def available_attn() -> list[str]:
    """The attention implementations this machine can run (checked, not assumed)."""
    from transformers.utils import (
        is_flash_attn_2_available,
        is_flash_attn_3_available,
        is_torch_flex_attn_available,
    )

    out = ["eager", "sdpa"]
    if is_torch_flex_attn_available():
        out.append("flex_attention")
    if torch.cuda.is_available() and is_flash_attn_2_available():
        out.append("flash_attention_2")
    if torch.cuda.is_available() and is_flash_attn_3_available():
        out.append("flash_attention_3")
    return out


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.tiktoken")


_SAVE_TOKENIZER = "save the model's own tokenizer files next to it (tokenizer.save_pretrained(DIR))"


# what transformers raises when an architecture does not support the requested attention implementation
REFUSES_ATTN = "does not support an attention implementation"


def load_checkpoint(model_dir: str | Path, attn: str, fallback: str | None = None):
    """(model, tokenizer, loading_info) from a local from_pretrained directory, with ``attn`` attention; when the
    architecture refuses ``attn`` and ``fallback`` is given (the gate's default sdpa -> eager, as
    transformers itself falls back when no implementation is asked for), with ``fallback``; ``loading_info``:
    from_pretrained's missing / unexpected / mismatched keys (:mod:`packsim.auditing.checkpoint_checks`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_dir)
    if not path.is_dir():
        raise PacksimError(f"--model {path}: no such directory: pass a local from_pretrained directory "
                           "(config.json, the weights and the tokenizer files).")
    if not (path / "config.json").is_file():
        raise PacksimError(f"--model {path} has no config.json: pass the directory save_pretrained wrote "
                           "(model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)).")
    no_files = "" if any((path / name).is_file() for name in TOKENIZER_FILES) else (
        f"it has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}): save the tokenizer the model was "
        "trained with next to it (tokenizer.save_pretrained(DIR))")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 -- any load failure is bad input: one line, exit 2
        raise PacksimError(f"--model {path}: the tokenizer could not be loaded ({type(err).__name__}: "
                           f"{(str(err).splitlines() or [''])[0][:160]}); "
                           f"{no_files or 'check the tokenizer files'}.") from None
    if len(tokenizer) < 2:  # transformers' fallback from config.json alone: a vocabulary of 1
        raise PacksimError(f"--model {path}: its tokenizer has a vocabulary of {len(tokenizer)}, so every record "
                           f"would be 0 tokens; {no_files or _SAVE_TOKENIZER}.")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, output_loading_info=True)
    except Exception as err:  # noqa: BLE001
        first = (str(err).splitlines() or [''])[0]
        if REFUSES_ATTN in first:  # e.g. Gemma2 refuses sdpa: transformers' own default is then eager
            if fallback is not None:
                return load_checkpoint(path, fallback)
            raise PacksimError(f"--model {path}: {first.split('. ')[0]}: pass --attn eager (or an "
                               "implementation this architecture supports).") from None
        raise PacksimError(f"--model {path}: the model could not be loaded ({type(err).__name__}: "
                           f"{first[:200]}): it needs config.json and the weights save_pretrained wrote.") from None
    return model, tokenizer, info


def check_tokenizer(model, tokenizer, records: list[dict], where: str = "the checkpoint") -> None:
    """Refuse (PacksimError) a tokenizer that does not fit the model's input embedding.

    Three ways: an empty vocabulary (fewer than 2 tokens: transformers' fallback without files),
    more tokens than the embedding has rows (len(tokenizer) > rows: ids past the table), or a
    record whose token ids reach past the table.
    """
    rows = model.get_input_embeddings().weight.shape[0]
    n = len(tokenizer)
    if n < 2:
        raise PacksimError(f"the tokenizer of {where} has a vocabulary of {n}: it is empty, so every record "
                           "would be 0 tokens; save the model's own tokenizer files (tokenizer.save_pretrained).")
    if n > rows:
        raise PacksimError(f"the tokenizer of {where} has {n} tokens but the model's embedding has {rows} rows: "
                           f"ids {rows}..{n - 1} cannot be looked up; use the tokenizer the model was trained "
                           "with, or model.resize_token_embeddings(len(tokenizer)) and save again.")
    for name in ("eos", "pad", "bos"):
        past = sorted(v for v in token_ids(name, tokenizer) if v >= rows)
        if past:
            raise PacksimError(f"the tokenizer of {where} has {name}_token_id {past[0]}, past the model's {rows} "
                               "embedding rows: use the tokenizer the model was trained with.")
    for k, r in enumerate(records):
        ids = tokenizer(r["prompt"] + r["completion"])["input_ids"]
        if not ids:
            raise PacksimError(f"the tokenizer of {where} turns record {k + 1} into 0 tokens: use the tokenizer "
                               "the model was trained with.")
        if max(ids) >= rows:
            raise PacksimError(f"record {k + 1} holds token id {max(ids)}, past the model's {rows} embedding rows: "
                               "the tokenizer does not belong to this model.")


def _split(tokenizer, record: dict) -> tuple[list[int], list[int]]:
    """prompt_ids, completion_ids (+ EOS), split where the tokenized prompt and prompt+completion diverge."""
    prompt = tokenizer(record["prompt"])["input_ids"]
    full = tokenizer(record["prompt"] + record["completion"])["input_ids"]
    eos = tokenizer.eos_token_id
    if eos is not None and (not full or full[-1] != eos):
        full = full + [eos]
    k = 0
    while k < min(len(prompt), len(full)) and prompt[k] == full[k]:
        k += 1
    if k == len(full):
        raise PacksimError(f"record {record!r} has no completion tokens after tokenization: give each "
                           "record a non-empty completion.")
    return full[:k], full[k:]


def _plain_trainer(model, tokenizer, records, collator: str, out: str, batch_size: int, objective: str = "sft"):
    from packsim.core.collator import PackingCollator
    from packsim.core.trainer_import import import_trainer

    import_trainer()  # without datasets (pyarrow, pandas): the features below are a plain list
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    features = []
    for r in records:
        prompt, completion = _split(tokenizer, r)
        if collator == "packsim":
            features.append({"prompt_ids": prompt, "response_ids": completion})
        elif objective == "lm":  # language modelling: every token's label counted
            features.append({"input_ids": prompt + completion, "labels": prompt + completion})
        else:
            features.append({"input_ids": prompt + completion,
                             "labels": [-100] * len(prompt) + completion,
                             "completion_mask": [0] * len(prompt) + [1] * len(completion)})
    setup = "mask_fix" if objective == "lm" else "correct"  # mask_fix: block-diagonal, every token counted
    collate = (PackingCollator(setup, vocab_size=len(tokenizer)) if collator == "packsim"
               else DataCollatorWithFlattening())
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch_size, max_steps=1,
                             report_to="none", save_strategy="no", remove_unused_columns=False,
                             use_cpu=not torch.cuda.is_available(), seed=0)
    # a plain list: the Trainer reads it as is (never a datasets.Dataset)
    return Trainer(model=model, args=args, train_dataset=features, data_collator=collate)


def _sft_trainer(model, tokenizer, records, collator: str, out: str, batch_size: int, max_length: int,
                 objective: str = "sft"):
    from packsim.core.extras import require

    require(f"--collator {collator}", "trl", "trl")  # one line naming pip install "packsim[trl]"
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    packing = {"trl-bfd": dict(packing=True, packing_strategy="bfd", max_length=max_length),
               "trl-wrapped": dict(packing=True, packing_strategy="wrapped", max_length=max_length),
               "trl-padding-free": dict(padding_free=True, max_length=None)}[collator]
    args = SFTConfig(output_dir=out, per_device_train_batch_size=batch_size, max_steps=1, report_to="none",
                     save_strategy="no", bf16=False, use_cpu=not torch.cuda.is_available(), seed=0, **packing)
    if objective == "lm":  # language-modelling data: TRL counts every token
        records = [{"text": r["prompt"] + r["completion"]} for r in records]
    return SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(records),
                      processing_class=tokenizer)


def build_trainer(model, tokenizer, records, collator: str, out: str, batch_size: int = 4,
                  max_length: int = 256, objective: str = "sft"):
    """The Trainer / SFTTrainer the collator NAME stands for (see the module doc); ``objective="lm"``:
    each record's prompt + completion is one text, every token a target."""
    if collator not in COLLATORS:
        raise PacksimError(f"unknown collator {collator!r}: use one of {', '.join(COLLATORS)}.")
    if collator.startswith("trl-"):
        return _sft_trainer(model, tokenizer, records, collator, out, batch_size, max_length, objective)
    return _plain_trainer(model, tokenizer, records, collator, out, batch_size, objective)


def _hybrid_kernels(model):
    """(emulate_hybrid_kernels() wired now, '') when ``model`` has stateful layers and one of its conv /
    scan / delta-rule kernels is transformers' torch fallback (its package missing), or none of its
    kernel wrappers can be read; (None, '') when nothing needs wiring (no stateful layer, or the real
    packages are bound); (None, why) when the installed transformers cannot be wired (the version
    named: the audit then measures what transformers runs, and says why it could not do more)."""
    from packsim.auditing.hybrid_findings import boundary_kernels, stateful_layers

    if not stateful_layers(model):
        return None, ""
    kernels = boundary_kernels(model)
    if kernels and not any(v.startswith("transformers'") for v in kernels.values()):
        return None, ""
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    try:
        return emulate_hybrid_kernels(), ""
    except PacksimError as err:
        return None, str(err)


def _hybrid_notice(model):
    from packsim.auditing.hybrid_findings import boundary_kernels, kernel_words, stateful_layers
    from packsim.auditing.report import Finding

    return Finding("hybrid_kernels", "notice", f"{', '.join(stateful_layers(model))} ran on {kernel_words(boundary_kernels(model))} "
                   "behind transformers' own kernel wrappers (causal_conv1d / mamba_ssm / fla are not installed here): "
                   "which fields reach the kernels, what decides isolation, is measured; the real kernels' numerics "
                   "and speed are not", "on a GPU with causal-conv1d and mamba-ssm (flash-linear-attention for gated "
                   "DeltaNet) installed the real kernels run instead")


def preflight(model_dir, data, collator: str, attn: str | None = None, batches: int = 1,
              batch_size: int = 4, max_length: int = 256, strict: bool = False, trust_boundaries: bool = False,
              objective: str = "sft"):
    """Audit the pipeline DIR + FILE + collator + attention would train; returns the AuditReport.

    ``objective``: as :func:`packsim.audit_trainer` ("lm": the records are trained as plain text,
    prompt + completion, every token a target)."""
    from packsim.auditing.checkpoint_checks import causal_lm_finding, loading_finding
    from packsim.auditing.findings import BatchView, flash_rows, is_flash
    from packsim.auditing.report import Finding
    from packsim.auditing.trainer import audit_trainer
    from packsim.auditing.truncation import truncated_records

    if collator not in COLLATORS:
        raise PacksimError(f"unknown collator {collator!r}: use one of {', '.join(COLLATORS)}.")
    available = available_attn()
    if attn is not None and attn not in KNOWN_ATTN:
        raise PacksimError(f"unknown attention implementation {attn!r}: use one of {', '.join(available)} "
                           "(available here).")
    planned = attn or "sdpa"
    run_attn = planned if planned in available else "sdpa"
    emulated = None
    if planned == "flash_attention_2" and run_attn != planned:  # transformers' own flash path, reference kernel
        from packsim.reference.flash_emulation import emulate_flash

        emulated = emulate_flash()
        run_attn = emulated.name
    model, tokenizer, info = load_checkpoint(model_dir, run_attn, fallback="eager" if attn is None else None)
    records = load_records(data, *record_bound(model, tokenizer, max_length))
    loaded = getattr(model.config, "_attn_implementation", run_attn)
    refused = loaded != run_attn  # the default sdpa refused (Gemma2): audited under what transformers picks
    if refused:
        planned = run_attn = loaded
    check_tokenizer(model, tokenizer, records, f"--model {model_dir}")
    hybrid, unwired = _hybrid_kernels(model)  # a hybrid checkpoint without its kernel packages: the reference kernels
    with tempfile.TemporaryDirectory(prefix="packsim-preflight-") as out, hybrid or contextlib.nullcontext():
        trainer = build_trainer(model, tokenizer, records, collator, out, batch_size, max_length, objective)
        report = audit_trainer(trainer, batches=batches, strict=strict, trust_boundaries=trust_boundaries,
                               objective=objective)
        where = f"--model {model_dir}"
        report.findings.extend(f for f in (loading_finding(info, where, strict), causal_lm_finding(model, where, strict))
                               if f is not None)
        if hybrid is not None:
            report.findings.append(_hybrid_notice(model))
        if unwired:  # the forward met transformers' refusal: NOT MEASURED, and this is why
            report.findings.append(Finding("hybrid_kernels", "skipped", f"packsim's reference kernels could not be "
                                           f"wired: {unwired}", "use a transformers inside the tested window "
                                           "(packsim doctor), or a GPU with the real kernel packages"))
        if refused:
            report.findings.append(Finding(
                "attention", "notice", f"{type(model).__name__} refuses sdpa in the installed transformers, so the "
                f"gate audited it under {loaded}, what transformers loads when no attn_implementation is given",
                f"pass --attn {loaded} (or the implementation you train with) to say so"))
        if collator == "trl-bfd":  # BFD truncates each example to max_length: say how many it cuts
            split = [_split(tokenizer, r) for r in records]
            found = truncated_records([(len(a), len(a) + len(b)) for a, b in split], max_length)
            report.findings.append(found)
            if found.failed:
                report.causes.insert(0, f"{found.name}: {found.fix}")
        if emulated is not None:
            report.findings.append(Finding(
                planned, "notice", f"{planned} ran through transformers' own flash-attention path (unpadding, "
                f"cu_seq_lens_*, packed-sequence detection from position_ids: transformers' code) on {emulated.kernel} "
                f"as attn_implementation={emulated.name!r}: what decides isolation is measured; the real kernel's "
                "bf16 numerics and speed are not", "on a GPU with flash-attn installed the real kernel runs instead"))
        elif run_attn != planned:
            fields = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
            from packsim.core.boundaries import find_boundaries

            seq = find_boundaries(fields, missing="rows").seq_ids
            view = BatchView(fields, seq, seq, "", False)
            why = (f"{planned} cannot run here (needs CUDA and its package; available: {', '.join(available)}), "
                   f"so the probes ran under {run_attn}")
            report.path_not_run = why
            report.findings.append(Finding(planned, "skipped", f"{why}; rerun this command on a GPU machine "
                                                               "with it installed"))
            if is_flash(planned):  # the flash rule read from the batch replaces the sdpa one
                report.findings[:] = [f for f in report.findings if f.name != "flash_rows"]
                report.findings.append(flash_rows(view, planned))
    return report
