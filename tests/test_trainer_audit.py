"""packsim.audit_trainer on real TRL SFTTrainers and transformers Trainers built here (tiny Llama, CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")  # a dev dependency: CI installs it, so these tests run there

import datasets  # noqa: E402
import transformers  # noqa: E402
from pipelines import PAIRS, one_thread, save_tiny_checkpoint  # noqa: E402, F401
from test_upstream_trl_trainers import TRL, chunks_here, collated_boundary_fields, trl_prompt_length  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import packsim  # noqa: E402
from packsim import PackingCollator  # noqa: E402
from packsim.auditing.report import Finding  # noqa: E402
from packsim.core.errors import PacksimError  # noqa: E402
from packsim.core.tokenizer import BOS_ID, EOS_ID, encode  # noqa: E402

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama and the local tokenizer, saved as any from_pretrained directory."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


def _model(path, attn="sdpa"):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn)


def sft(path, tmp_path, **config):
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in PAIRS], "completion": [c for _, c in PAIRS]})
    attn = config.pop("attn", "sdpa")
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=config.pop("max_length", 48),
                     per_device_train_batch_size=config.pop("batch_size", 4), max_steps=1,
                     report_to="none", save_strategy="no", bf16=False, use_cpu=True, seed=0, **config)
    return SFTTrainer(model=_model(path, attn), args=args, train_dataset=data,
                      processing_class=AutoTokenizer.from_pretrained(path))


def plain(path, tmp_path, collator, use_cache=False, **args):
    features = [{"prompt_ids": [BOS_ID] + encode(p), "response_ids": encode(c) + [EOS_ID]} for p, c in PAIRS]
    targs = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=args.pop("batch_size", 4),
                              max_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                              remove_unused_columns=False, use_cache=use_cache, seed=0, **args)
    return Trainer(model=_model(path), args=targs, train_dataset=datasets.Dataset.from_list(features),
                   data_collator=collator)


def independent_leak(trainer) -> float:
    """Largest logit change of one example when another's tokens change, computed here without packsim.

    Examples start at each BOS (the local tokenizer puts one at the start of every example); the
    forward is the one compute_loss makes (SFTTrainer adds use_cache=False), without labels.
    """
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    ids = batch["input_ids"]
    rest = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    if isinstance(trainer, SFTTrainer):
        rest["use_cache"] = False
    starts = ids == BOS_ID
    starts[:, 0] = True
    seq = starts.reshape(-1).cumsum(0).reshape(ids.shape) - 1  # (B, T): example index per token
    real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(starts)
    model = trainer.model.eval()
    with torch.no_grad():
        base = model(input_ids=ids, **rest).logits
        worst = 0.0
        for k in range(int(seq.max()) + 1):
            changed = torch.where(seq == k, (ids + 5) % model.config.vocab_size, ids)
            diff = (model(input_ids=changed, **rest).logits - base).abs().amax(-1)  # (B, T)
            others = (seq != k) & real
            worst = max(worst, float(diff[others].max()) if bool(others.any()) else 0.0)
    return worst


def agrees(report, trainer) -> bool:
    return report.probes["perturbation"].failed == (independent_leak(trainer) > 1e-5)


# ----------------------------------------------------------------------------- TRL


def test_trl_bfd_packing_on_sdpa_passes(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True)  # packing_strategy="bfd": padding-free rows
    report = packsim.audit_trainer(trainer)
    assert report.ok, report.table()
    # the examples come from TRL's packed dataset rows (split by seq_lengths), located in the batch
    assert report.boundaries.startswith("the trainer's dataset examples") and len(report.example_ids) == 8
    fields = next(f for f in report.findings if f.name == "boundary_fields")
    marked = ", ".join(collated_boundary_fields(trainer))  # every field the batch carries is checked
    assert fields.status == "pass" and f"; {marked} mark exactly these 8" in fields.evidence, fields.evidence
    assert {f.name: f.status for f in report.findings} == {
        "wrapped_packing": "pass", "padding_free_attention": "pass", "attention_mask": "pass",
        "flash_rows": "pass", "cache": "pass", "completion_only_loss": "pass",
        "loss_over_accumulation": "pass", "loss_across_devices": "skipped", "truncated_examples": "pass",
        "boundary_fields": "pass", "special_tokens": "pass",
        **({"flash_fields": "pass"} if "cu_seq_lens_q" in collated_boundary_fields(trainer) else {})}
    assert "use_cache=False" in report.forward and "attn_implementation='sdpa'" in report.forward
    assert agrees(report, trainer)


class _LateRestart:
    """Wraps a padding-free collator: position_ids restart one token after each example's first token."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, features):
        batch = self.collate(features)
        pos = batch["position_ids"].clone()  # (1, N)
        starts = (pos[0] == 0).nonzero().flatten()[1:]
        for s in starts.tolist():
            end = s + 1
            while end < pos.shape[1] and pos[0, end] != 0:
                end += 1
            pos[0, s] = pos[0, s - 1] + 1
            pos[0, s + 1:end] = torch.arange(end - s - 1)
        batch["position_ids"] = pos
        for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"):
            batch.pop(key, None)  # only position_ids mark the examples, as DataCollatorWithFlattening's default
        return batch


def test_trl_bfd_with_positions_restarting_late_fails_with_the_field_named(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True)
    trainer.data_collator = _LateRestart(trainer.data_collator)
    report = packsim.audit_trainer(trainer)
    assert {"perturbation", "gradient", "boundary_fields"} <= set(report.failed), report.table()
    fields = next(f for f in report.findings if f.name == "boundary_fields")
    assert "position_ids restart at token" in fields.evidence and ", the example starts at token" in fields.evidence
    eos = next(f for f in report.findings if f.name == "special_tokens")
    assert "8 of 8 examples end with EOS" in eos.evidence  # the symptom the fields hid ("EOS 1/1")
    assert agrees(report, trainer)  # the test's own perturbation, boundaries from BOS


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_packsim_audit_of_an_sft_batch_with_its_labels_measures_the_models_logits(checkpoint, tmp_path, strategy):
    """packsim.audit(trainer.model, batch) on an SFTTrainer's batch, labels in it (what the loss_coverage skip
    advises). TRL 1.9 (SFTConfig's default loss_type='chunked_nll': _patch_chunked_ce_lm_head) makes that call
    return a _ChunkedCELMHeadOutput without logits; TRL 1.16 returns logits. On both the audit measures, and it
    agrees with the perturbation computed here: BFD isolates, wrapped packing leaks."""
    config = {"packing_strategy": "wrapped", "max_length": 16} if strategy == "wrapped" else {}
    trainer = sft(checkpoint, tmp_path, packing=True, **config)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    with torch.no_grad():
        arises = trainer.model(**batch, use_cache=False).logits is None  # the user's case, measured
    assert chunks_here() in (None, arises), f"TRL {TRL}: no logits given labels: {arises}"  # 1.9 yes, 1.16 no
    report = packsim.audit(trainer.model, batch, use_cache=False)
    leaks = independent_leak(trainer) > 1e-5
    assert leaks == (strategy == "wrapped") and report.probes["perturbation"].failed == leaks, report.table()
    assert ("labels left out: TRL's chunked-CE forward" in report.forward) == arises, report.forward


def test_trl_wrapped_packing_fails_on_perturbation(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True, packing_strategy="wrapped", max_length=16)
    report = packsim.audit_trainer(trainer)
    assert {"perturbation", "gradient", "wrapped_packing"} <= set(report.failed), report.table()
    assert report.boundaries.startswith("the tokens")  # the batch itself marks no boundary
    wrapped = next(f for f in report.findings if f.name == "wrapped_packing")
    assert "packing_strategy='wrapped'" in wrapped.evidence and "start in the middle" in wrapped.evidence
    assert report.causes[0].startswith("wrapped_packing: use packing_strategy='bfd'")
    assert agrees(report, trainer)
    text, page = report.table(), report.to_html()  # the report explains its numbers and its skips
    assert ".;" not in report.verdict and "Not measured (skipped: attention_mass" in report.verdict
    assert "skipped attention_mass: not measured, so it is neither a pass nor a fail" in text
    assert "attn_implementation='eager'" in text
    assert "reading the numbers" in text and "gradient ratio" in text.split("worst pair:")[1]
    assert "findings (configuration checks):" in text and "<code>wrapped_packing</code>" in page


def test_trl_completion_only_loss_off_fails_on_loss_coverage(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True, completion_only_loss=False)
    report = packsim.audit_trainer(trainer)
    assert set(report.failed) == {"loss_coverage", "completion_only_loss"}, report.table()
    assert "every" in report.probes["loss_coverage"].details["problems"]
    assert agrees(report, trainer)


def test_trl_language_modelling_data_counts_every_token(checkpoint, tmp_path):
    data = datasets.Dataset.from_dict({"text": [p + c for p, c in PAIRS]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=48, per_device_train_batch_size=4,
                     max_steps=1, report_to="none", save_strategy="no", bf16=False, use_cpu=True, packing=True)
    trainer = SFTTrainer(model=_model(checkpoint), args=args, train_dataset=data,
                         processing_class=AutoTokenizer.from_pretrained(checkpoint))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    ids, labels = batch["input_ids"], batch["labels"]
    counted = labels != -100  # ground truth: every token counted but each example's first (its BOS)
    assert bool((labels[counted] == ids[counted]).all()) and bool((counted | (ids == BOS_ID)).all())
    # packed, the prepared dataset holds input_ids and labels only: nothing says language modelling (tokenized
    # prompt/completion data with a completion_mask looks the same: tests/verdict_matrix.py's sft_unset), so the
    # completion-only default fails, naming both fixes; objective='lm' is the user saying it
    default = packsim.audit_trainer(trainer)
    finding = next(f for f in default.findings if f.name == "completion_only_loss")
    assert finding.status == "fail" and "completion_only_loss is unset" in finding.evidence, default.table()
    assert "completion_only_loss=True" in finding.fix and "objective='lm'" in finding.fix
    report = packsim.audit_trainer(trainer, objective="lm")
    assert report.ok, report.table()
    assert "every real token" in report.verdict


# ----------------------------------------------------------------------------- transformers Trainer


def test_plain_trainer_with_packing_collator_passes(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator())
    report = packsim.audit_trainer(trainer)
    assert report.ok, report.table()
    counts = report.probes["loss_coverage"].details["counts"]
    assert counts["prompt"][0] == 0 and counts["response"][0] == counts["response"][1] > 0
    assert "features' prompt/completion split" in report.probes["loss_coverage"].summary
    assert agrees(report, trainer)


def test_plain_trainer_with_a_cache_fails(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator(), use_cache=True)
    report = packsim.audit_trainer(trainer)
    assert {"perturbation", "cache"} <= set(report.failed), report.table()
    cache = next(f for f in report.findings if f.name == "cache")
    assert "DynamicCache" in cache.evidence and "use_cache=False" in cache.fix
    assert agrees(report, trainer)


def test_plain_trainer_prompt_labels_fail_the_completion_check(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator(setup="mask_fix"))  # loss "all"
    report = packsim.audit_trainer(trainer)
    assert set(report.failed) == {"loss_coverage", "completion_only_loss"}, report.table()


def test_mean_of_micro_batch_means_fails_loss_over_accumulation(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator(), gradient_accumulation_steps=2, batch_size=3)
    trainer.model_accepts_loss_kwargs = False  # as for a model whose forward takes no loss kwargs
    report = packsim.audit_trainer(trainer)
    finding = next(f for f in report.findings if f.name == "loss_over_accumulation")
    assert finding.status == "fail" and "then divided by 2" in finding.evidence, report.table()
    assert report.failed == ["loss_over_accumulation"]


def test_several_batches_and_the_model_mode_is_restored(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator(), batch_size=2)
    trainer.model.eval()
    report = packsim.audit_trainer(trainer, batches=3)
    batches = next(f for f in report.findings if f.name == "batches")
    assert batches.status == "pass" and batches.evidence.startswith("3 batches audited, 0 failed")
    assert not trainer.model.training


# ----------------------------------------------------------------------------- report and input


def test_bad_input():
    with pytest.raises(PacksimError, match="Trainer or trl.SFTTrainer"):
        packsim.audit_trainer(object())
    with pytest.raises(ValueError, match="status"):
        Finding("x", "ok", "evidence")


def _raises_key_error(features):
    raise KeyError("prompt_ids")


class _ListCollator:
    def __call__(self, features):
        return [1, 2, 3]


@pytest.mark.parametrize("case, words", [
    ("no dataset", r"raised ValueError: Trainer: training requires a train_dataset"),
    ("empty dataset", r"raised ValueError: num_samples should be a positive integer"),
    ("collator raises", r"raised KeyError: 'prompt_ids' \(its train_dataset, sampler or data collator\)"),
    ("collator returns a list", r"the trainer's batch 0 is a list, not a dict of fields"),
    ("batch= without input_ids", r"batch= holds no input_ids \(keys \['x'\]\): pass one collated training batch"),
    ("batch= a list", r"batch= is a list"),
    ("strict a string", r"strict='yes': pass True or False"),
    ("trust_boundaries 1", r"trust_boundaries=1: pass True or False"),
])
def test_a_trainer_that_cannot_train_is_refused_in_one_line(checkpoint, tmp_path, case, words):
    """Each crashed inside audit_trainer with the exception of the dataset, the sampler, the collator or
    packsim's own reading of the batch (strict='yes' was taken as True); the trainer's own training
    step fails the same way for the first five."""
    features = datasets.Dataset.from_list(
        [{"prompt_ids": [BOS_ID] + encode(p), "response_ids": encode(c) + [EOS_ID]} for p, c in PAIRS])
    collator = {"collator raises": _raises_key_error, "collator returns a list": _ListCollator()}.get(
        case, PackingCollator())
    trainer = plain(checkpoint, tmp_path, collator)
    if case == "no dataset":
        trainer.train_dataset = None
    elif case == "empty dataset":
        trainer.train_dataset = features.select([])
    options = {"batch= without input_ids": {"batch": {"x": 1}}, "batch= a list": {"batch": [1, 2]},
               "strict a string": {"strict": "yes"}, "trust_boundaries 1": {"trust_boundaries": 1}}.get(case, {})
    with pytest.raises(PacksimError, match=words) as caught:
        packsim.audit_trainer(trainer, **options)
    assert "\n" not in str(caught.value)


def test_a_packsim_fault_while_drawing_batches_still_crashes(checkpoint, tmp_path, monkeypatch):
    """Only the trainer's own code becomes one line: an exception raised in packsim's code is a bug."""
    from packsim.auditing import trainer_batch
    from packsim.core.errors import raised_outside_packsim

    # a packsim function called wrongly: AttributeError raised in packsim/core/errors.py
    monkeypatch.setattr(trainer_batch, "batch_fields", lambda batch, what: raised_outside_packsim(batch))
    with pytest.raises(AttributeError):
        packsim.audit_trainer(plain(checkpoint, tmp_path, PackingCollator()))


# ----------------------------------------------------------------------------- what the texts say (issue 30)


def lm_trainer(path, tmp_path):
    """A pretraining-style transformers Trainer: token rows without BOS (the model's config still names
    one), each ending with EOS, DataCollatorWithFlattening (labels = input_ids)."""
    from transformers import DataCollatorWithFlattening

    rows = [encode(p + c) + [EOS_ID] for p, c in PAIRS]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, seed=0)
    return Trainer(model=_model(path), args=args, train_dataset=datasets.Dataset.from_dict({"input_ids": rows}),
                   data_collator=DataCollatorWithFlattening()), rows


def test_pretraining_style_batches_pass_under_objective_lm_and_no_row_is_called_cut(checkpoint, tmp_path):
    trainer, rows = lm_trainer(checkpoint, tmp_path)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    ids = batch["input_ids"][0].tolist()
    assert trainer.model.config.bos_token_id == BOS_ID and BOS_ID not in ids  # a BOS id nobody puts in front
    at, whole = 0, 0  # ground truth: the row is whole examples back to back, the first starting it
    while at < len(ids):
        row = next(r for r in rows if ids[at:at + len(r)] == r)
        at, whole = at + len(row), whole + 1
    default = packsim.audit_trainer(trainer)  # the completion-only check: every token counted fails
    assert default.failed == ["loss_coverage"] and any("objective='lm'" in c for c in default.causes), \
        default.table()
    report = packsim.audit_trainer(trainer, objective="lm")
    assert report.ok and len(report.example_ids) == whole, report.table()
    wrapped = next(f for f in report.findings if f.name == "wrapped_packing")
    assert "middle of an example" not in wrapped.evidence, wrapped.evidence
    assert "every real token" in report.verdict
    assert next(f for f in report.findings if f.name == "completion_only_loss").evidence.startswith(
        "objective='lm': every real token should be a target")


def test_trl_default_pass_says_what_its_loss_check_measured_and_how_to_get_the_roles(checkpoint, tmp_path):
    """SFTTrainer, prompt/completion data, BFD: TRL folds the completion mask into the labels, so no split
    reaches the audit; the loss row and completion_only_loss say the same: config read, labels checked by
    value (a -100 prompt run then every token counted, the lengths computed here), roles not measured."""
    trainer = sft(checkpoint, tmp_path, packing=True)
    assert "completion_mask" not in trainer.train_dataset.column_names  # ground truth: nothing to read
    tok = trainer.processing_class  # -100 in the labels: BOS + prompt (TRL 1.16), + the EOS (TRL 1.9)
    prompts = [trl_prompt_length(tok, p, c + tok.eos_token) for p, c in PAIRS]
    report = packsim.audit_trainer(trainer)
    loss = report.probes["loss_coverage"]
    assert report.ok and loss.status == "skipped", report.table()
    form = f"{len(PAIRS)} of {len(PAIRS)} examples are -100 on their first {min(prompts)}..{max(prompts)} tokens"
    assert form in loss.summary and form in report.verdict, report.table()
    assert "which labels are prompt and which response was not measured" in report.verdict
    assert "counts only responses" not in report.verdict
    finding = next(f for f in report.findings if f.name == "completion_only_loss")
    assert "(the configuration, read)" in finding.evidence and "is not measured" in finding.evidence
    assert form in finding.evidence
    text = report.table()
    assert "packsim.audit(model, batch, response_mask=...)" in text
    assert "TRL's SFTTrainer folds completion_mask into the labels" in text


def test_trl_language_modelling_with_completion_only_loss_off_counts_every_token(checkpoint, tmp_path):
    data = datasets.Dataset.from_dict({"text": [p + c for p, c in PAIRS]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=48, per_device_train_batch_size=4, max_steps=1,
                     report_to="none", save_strategy="no", bf16=False, use_cpu=True, completion_only_loss=False)
    trainer = SFTTrainer(model=_model(checkpoint), args=args, train_dataset=data,
                         processing_class=AutoTokenizer.from_pretrained(checkpoint))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    real = batch["attention_mask"].bool()
    real[:, 0] = False
    assert bool((batch["labels"][real] == batch["input_ids"][real]).all())  # ground truth: every token counted
    report = packsim.audit_trainer(trainer)
    assert report.ok, report.table()
    finding = next(f for f in report.findings if f.name == "completion_only_loss")
    assert finding.status == "pass" and "completion_only_loss=False on language-modelling data" in finding.evidence
    assert "every real token" in report.verdict


def test_objective_lm_on_a_completion_only_trainer_fails_naming_the_setting(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True)  # TRL masks the prompts
    report = packsim.audit_trainer(trainer, objective="lm")
    assert {"loss_coverage", "completion_only_loss"} <= set(report.failed), report.table()
    assert "response" in report.probes["loss_coverage"].details["problems"]
    finding = next(f for f in report.findings if f.name == "completion_only_loss")
    assert "SFTTrainer.completion_only_loss=True" in finding.evidence and "completion_only_loss=False" in finding.fix
    with pytest.raises(PacksimError, match="objective='pretrain'"):
        packsim.audit_trainer(trainer, objective="pretrain")


class _DropEOS:
    """Wraps PackingCollator: the collator's bug drops each response's last token (its EOS)."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, features):
        return self.collate([{**f, "response_ids": f["response_ids"][:-1]} for f in features])


def test_an_eos_dropped_by_the_collator_gets_the_collator_fix_not_max_length(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, _DropEOS(PackingCollator()))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert EOS_ID not in batch["input_ids"].tolist()[0]  # ground truth: every example lost its EOS, with room
    report = packsim.audit_trainer(trainer)
    finding = next(f for f in report.findings if f.name == "truncated_examples")
    assert finding.failed, report.table()
    assert "4 of the 4 examples it was given are cut short" in finding.evidence
    assert "4 of them lose only their last token, the EOS, while they fit the rows" in finding.evidence
    assert finding.fix.startswith("fix the collator so it keeps every token") and "raise max_length" not in finding.fix


# ----------------------------------------------------------------------------- the flash path on the reference kernel


def test_trl_padding_free_on_the_flash_path_is_measured_on_the_reference_kernel(checkpoint, tmp_path):
    """SFTTrainer(padding_free=True) on transformers' flash path: without flash-attn the path runs on
    packsim's reference kernel (emulate_flash) and the audit's verdict agrees with the perturbation
    computed here; with per_device_train_batch_size 4, TRL's collator flattens the batch into one row."""
    from packsim.reference.flash_emulation import emulate_flash

    flash = emulate_flash()
    trainer = sft(checkpoint, tmp_path, padding_free=True, max_length=None, attn=flash.name)  # no packing
    assert trainer.model.config._attn_implementation == flash.name
    report = packsim.audit_trainer(trainer)
    assert independent_leak(trainer) < 1e-5 and agrees(report, trainer)  # the ground truth: isolated
    assert report.status == "pass", report.table()
    assert f"attn_implementation='{flash.name}'" in report.forward


def test_an_sft_trainer_on_a_moe_model_is_not_failed_for_its_router_aux_loss(tmp_path):
    """TRL's SFTTrainer on a MoE model turns the router load-balancing loss on (aux_loss_enabled) and adds it
    to the token mean in compute_loss: the loss over accumulation compares the token mean without it (it
    is not a per-token mean), says so, and passes a correct run; its value is the mean CE computed here.
    Also the pin of TRL's ``aux_loss_enabled`` (SFTTrainer.__init__, read from TRL 1.9.0 and 1.16.0), which
    packsim.core.upstream.trl_trainers.without_aux_loss switches off."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from packsim.core.tokenizer import build_tokenizer

    config = MixtralConfig(vocab_size=len(build_tokenizer()), hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    MixtralForCausalLM(config).save_pretrained(tmp_path / "moe")
    build_tokenizer().save_pretrained(tmp_path / "moe")
    trainer = sft(tmp_path / "moe", tmp_path, packing=True)
    assert getattr(trainer, "aux_loss_enabled", False)  # TRL adds the router aux loss to this trainer's loss
    report = packsim.audit_trainer(trainer, objective="lm")
    accumulation = next(f for f in report.findings if f.name == "loss_over_accumulation")
    assert accumulation.status == "pass", accumulation
    assert "MoE router aux loss" in accumulation.evidence and trainer.aux_loss_enabled  # put back
    assert trainer.model.config.output_router_logits  # put back
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))  # ground truth: the mean CE
    with torch.no_grad():
        logits = trainer.model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    labels = batch["labels"][..., 1:].reshape(-1)
    want = torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, logits.shape[-1]), labels,
                                             ignore_index=-100)
    assert f"the mean over all counted labels is {float(want):.6g}" in accumulation.evidence


def test_a_trainer_whose_forward_raises_in_a_backend_is_not_measured(tmp_path):
    """GPT-2 on transformers' flash path (reference kernel) under a Trainer: the forward raises in
    transformers' get_target_dtype (measured here through the trainer's own compute_loss); audit_trainer
    answers NOT MEASURED naming it, and does not run the loss check into the same exception."""
    from pipelines import flattening_trainer
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=64, bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(cfg)
    model.set_attn_implementation(packsim.emulate_flash().name)
    trainer, _ = flattening_trainer(model, tmp_path, high=60)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    try:
        trainer.compute_loss(model, batch)
        raised = None
    except Exception as err:  # noqa: BLE001 - the ground truth: the trainer's own step
        raised = type(err).__name__
    if raised is None:
        pytest.skip("this transformers runs GPT-2 on the flash path")
    report = packsim.audit_trainer(trainer, objective="lm")
    assert report.status == "not measured" and not report.ok, report.table()
    assert f"raised {raised}" in next(f for f in report.findings if f.name == "forward").evidence
    assert next(f for f in report.findings if f.name == "loss_over_accumulation").status == "skipped"


def test_a_collator_writing_a_stale_max_length_fails_the_trainer_audit(checkpoint, tmp_path):
    """A flattening collator whose max_length_q is one short of the longest example of its batch (the
    ground truth, computed here): the trainer's flash forward is refused by the reference kernel, and
    audit_trainer answers FAIL naming flash_fields instead of raising."""
    from pipelines import flattening_trainer
    from transformers import DataCollatorWithFlattening

    from packsim.reference.flash_emulation import emulate_flash

    flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    stale_batches = []

    def stale(features):
        batch = flat(features)
        batch["max_length_q"] = max(len(f["input_ids"]) for f in features) - 1
        stale_batches.append(batch)
        return batch

    model = _model(checkpoint, emulate_flash().name)
    trainer, _rows = flattening_trainer(model, tmp_path, high=model.config.vocab_size)
    assert packsim.audit_trainer(trainer, objective="lm").status == "pass"  # the collator's own fields
    trainer.data_collator = stale
    report = packsim.audit_trainer(trainer, objective="lm")
    assert stale_batches and report.status == "fail" and report.failed == ["flash_fields"], report.table()
    assert "max_seqlen_q" in next(f for f in report.findings if f.name == "forward").evidence
