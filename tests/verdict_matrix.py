"""The verdict matrix (issue 30): pipeline x family x entry point, each verdict against a ground truth
computed here without packsim.

Every pipeline is a real trainer built from a tiny config on CPU (``make(name)``; the gate loads the
same factories by name, ``tests/verdict_matrix.py:<name>``). The tokens say where they belong: content
token ``t >= 8`` belongs to example ``(t - 8) % 8`` and is a prompt token when ``(t - 8) // 8`` is even,
a response token when odd; ids 0..7 are the special tokens of the family's convention. So the ground
truth needs neither packsim nor the batch's own fields:

- **leak**: each example's content tokens are replaced by others of the same example and role
  (``t -> t ± 16``), through the forward the trainer's ``compute_loss`` makes (its batch fields, eval
  mode); the largest logit change at another example's content token;
- **labels**: the counted labels (``labels != -100``) are exactly the response tokens and each
  example's closing EOS, each label the token at its position (transformers shifts inside the model).

Entry points: ``audit_trainer``, the ``packsim audit --trainer`` gate (its exit code, in process),
``AuditCallback`` (one training step: stopped or trained), ``assert_isolated`` on the trainer's first
batch, ``audit_logprobs`` on that batch (isolation only). ``python tests/verdict_matrix.py`` prints
the table the issue's note gives (``--out FILE`` writes it as markdown too).
"""

from __future__ import annotations

import copy
import tempfile
import warnings

import torch

V, N_EX = 8 + 8 * 2 * 8, 8  # vocab (8 specials + 8 examples x 2 roles x 8 tokens), examples per batch
PAD, BOS, EOS, EOT = 0, 1, 2, 3
IGNORE = -100
# family -> (config class, config kwargs, special ids, whether examples start with BOS, EOS id closing them)
_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, vocab_size=V)
FAMILIES = {
    "llama (BOS + pad)": ("LlamaConfig", {}, dict(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD), True, EOS),
    "qwen3 (eos == pad, no BOS)": ("Qwen3Config", {"head_dim": 8},
                                   dict(bos_token_id=None, eos_token_id=EOS, pad_token_id=EOS), False, EOS),
    "llama-3 style (BOS, eos list, own pad)": ("LlamaConfig", {},
                                               dict(bos_token_id=BOS, eos_token_id=[EOS, EOT], pad_token_id=4), True, EOT),
    "gemma2 (BOS + pad, eager)": ("Gemma2Config", {"head_dim": 8, "sliding_window": 8},
                                  dict(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD), True, EOS),
}
SHORT = {"llama": "llama (BOS + pad)", "qwen3": "qwen3 (eos == pad, no BOS)",
         "llama3": "llama-3 style (BOS, eos list, own pad)", "gemma2": "gemma2 (BOS + pad, eager)"}


def features(family: str, n: int = N_EX, seed: int = 0) -> list[dict]:
    """``n`` examples: [BOS] prompt response EOS, each token tagged with its example and role."""
    _, _, _, bos, eos = FAMILIES[family]
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        lp, lr = (int(x) for x in torch.randint(3, 7, (2,), generator=gen))
        prompt = (8 + k + 8 * 2 * torch.randint(0, 8, (lp,), generator=gen)).tolist()
        response = (8 + k + 8 + 8 * 2 * torch.randint(0, 8, (lr,), generator=gen)).tolist()
        ids = ([BOS] if bos else []) + prompt + response + [eos]
        n_prompt = len(ids) - lr - 1
        out.append({"input_ids": ids, "completion_mask": [0] * n_prompt + [1] * (lr + 1)})
    return out


def tiny_model(family: str, attn: str = "sdpa"):
    import transformers

    cls, extra, ids, _, _ = FAMILIES[family]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = getattr(transformers, cls)(**_TINY, **extra, **ids, use_cache=False)
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)


_OUT = tempfile.TemporaryDirectory(prefix="verdict_")  # one for every trainer (save_strategy "no"), removed at exit


def _args(cls=None, **kw):
    from transformers import TrainingArguments

    base = dict(output_dir=_OUT.name, per_device_train_batch_size=N_EX, max_steps=1,
                report_to="none", save_strategy="no", use_cpu=True, seed=0, remove_unused_columns=False)
    return (cls or TrainingArguments)(**{**base, **kw})


class Concat:
    """A hand-written packing collator with one documented fault: ``"continuous"`` (position_ids
    0..T-1 over the row, nothing marks a boundary) or ``"late"`` (positions restart one token after
    each example's first token, which continues the previous example's count) or ``"split_first"``
    (positions restart at the first token and again at the second: the BOS is cut off alone); ``"all_labels"`` counts every token (prompt included)."""

    def __init__(self, fault: str):
        self.fault = fault

    def __call__(self, feats):
        ids, labels, pos = [], [], []
        for f in feats:
            x = list(f["input_ids"])
            ids += x
            labels += x if self.fault == "all_labels" else masked(f)
            late = self.fault == "late" and pos  # the first token still counts on the last example
            pos += ([pos[-1] + 1] + list(range(len(x) - 1)) if late else
                    [0] + list(range(len(x) - 1)) if self.fault == "split_first" else list(range(len(x))))
        if self.fault == "continuous":
            pos = list(range(len(ids)))
        return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]), "position_ids": torch.tensor([pos])}


def masked(f: dict) -> list[int]:
    """The feature's labels: its tokens, -100 where completion_mask is 0 (the prompt)."""
    return [t if m else IGNORE for t, m in zip(f["input_ids"], f["completion_mask"], strict=True)]


def _flattening_labels(feats):
    return [{**f, "labels": masked(f)} for f in feats]


def trainer_pipeline(family: str, collator: str = "flattening", attn: str | None = None):
    """transformers ``Trainer``: ``DataCollatorWithFlattening`` (``"flattening"``; ``"flash"`` adds
    its flash kwargs on transformers' flash path) or a :class:`Concat` fault."""
    import datasets
    from transformers import DataCollatorWithFlattening, Trainer

    feats = _flattening_labels(features(family))
    attn = attn or ("eager" if family.startswith("gemma2") else "sdpa")
    if collator == "flash":
        from packsim.reference.flash_emulation import emulate_flash

        attn, collate = emulate_flash().name, DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    elif collator == "flattening":
        collate = DataCollatorWithFlattening()
    else:
        collate = Concat(collator)
    return Trainer(model=tiny_model(family, attn), args=_args(), train_dataset=datasets.Dataset.from_list(feats),
                   data_collator=collate)


def sft_pipeline(setup: str = "bfd", family: str = SHORT["llama"]):
    """TRL ``SFTTrainer`` on the tokenized features (input_ids + completion_mask), packing, and
    completion_only_loss=True (TRL applies a tokenized completion_mask only then: trl/trainer/
    sft_trainer.py, ``SFTTrainer.__init__`` sets it from prompt/completion columns when unset, and
    ``_prepare_dataset`` folds completion_mask into the labels only when it is True): ``"bfd"``
    (padding-free), ``"bf16"`` (the same in bf16 autocast), ``"wrapped"`` (packing_strategy="wrapped"),
    ``"no_completion_only"`` (completion_only_loss=False), ``"unset"`` (left unset: the mask is dropped)."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    from packsim.core.tokenizer import build_tokenizer

    tok = copy.deepcopy(build_tokenizer())
    config = dict(packing=True, max_length=48, per_device_train_batch_size=4, bf16=setup == "bf16",
                  completion_only_loss={"no_completion_only": False, "unset": None}.get(setup, True))
    if setup == "wrapped":
        config["packing_strategy"] = "wrapped"
    return SFTTrainer(model=tiny_model(family), args=_args(SFTConfig, **config), processing_class=tok,
                      train_dataset=datasets.Dataset.from_list(features(family)))


PIPELINES = {  # gate name -> (builder, kwargs, family, what it is)
    **{f"flat_{s}": (trainer_pipeline, {"family": f}, f, "Trainer + DataCollatorWithFlattening")
       for s, f in SHORT.items()},
    **{f"flash_{s}": (trainer_pipeline, {"family": f, "collator": "flash"}, f,
                      "Trainer + flattening on transformers' flash path") for s, f in SHORT.items() if s != "gemma2"},
    **{f"continuous_{s}": (trainer_pipeline, {"family": f, "collator": "continuous"}, f,
                           "Trainer + concat, positions 0..T-1") for s, f in SHORT.items()},
    **{f"late_{s}": (trainer_pipeline, {"family": f, "collator": "late"}, f,
                     "Trainer + concat, positions restart one late") for s, f in SHORT.items()},
    "split_first_llama": (trainer_pipeline, {"family": SHORT["llama"], "collator": "split_first"}, SHORT["llama"],
                          "Trainer + concat, positions restart at tokens 0 and 1"),
    **{f"all_labels_{s}": (trainer_pipeline, {"family": f, "collator": "all_labels"}, f,
                           "Trainer + concat, loss on the prompt") for s, f in SHORT.items()},
    **{f"sft_{s}": (sft_pipeline, {"setup": s}, SHORT["llama"], f"SFTTrainer packing {s}")
       for s in ("bfd", "bf16", "wrapped", "no_completion_only", "unset")},
}


def make(name: str):
    builder, kwargs, _, _ = PIPELINES[name]
    import transformers

    transformers.logging.set_verbosity_error()
    return builder(**kwargs)


def __getattr__(name: str):  # the gate's factories: tests/verdict_matrix.py:<pipeline name>
    if name in PIPELINES:
        return lambda: make(name)
    raise AttributeError(name)


DPO_FACTORY_DATA = {"prompt": ["hello there", "how are you"], "chosen": [" fine thanks", " good"],
                    "rejected": [" no", " bad day"]}


def dpo_pipeline(padding_free: bool = True):
    """TRL ``DPOTrainer`` (padding_free asked; TRL 1.16 falls back to padded rows) on packsim's tokenizer."""
    import datasets
    import trl

    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    tok = copy.deepcopy(build_tokenizer())
    model = build_model("tiny", vocab_size=len(tok), attn_implementation="sdpa")
    args = _args(trl.DPOConfig, padding_free=padding_free, per_device_train_batch_size=2, bf16=False,
                 remove_unused_columns=True)
    return trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args,
                          train_dataset=datasets.Dataset.from_dict(DPO_FACTORY_DATA), processing_class=tok)


PIPELINES["dpo_padding_free"] = (dpo_pipeline, {}, "packsim tiny llama (BOS + pad)", "DPOTrainer padding_free=True")
PIPELINES["dpo_padded"] = (dpo_pipeline, {"padding_free": False}, "packsim tiny llama (BOS + pad)",
                           "DPOTrainer padded")
NON_MODEL = ("labels", "completion_mask", "assistant_masks")
ALONE_TOL = 1e-4  # fp32 packed vs alone: different lengths reorder the reductions (seen <= 1e-6 here)


def first_batch(trainer) -> dict:
    """The trainer's first training batch, on the trainer's device (the sampler seeded)."""
    torch.manual_seed(0)
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


def truth(trainer) -> dict:
    """Ground truth on the first batch, without packsim: {"leak": float (perturbation), "alone": float
    (packed vs each example alone), "labels_ok": bool | None, "verdict": "PASS" | "FAIL"} (labels_ok
    None for DPO, whose loss is not a labels loss; its truth: one sequence per row, the mask's runs)."""
    batch = first_batch(trainer)
    if "chosen_input_ids" in batch or "prompt_input_ids" in batch or type(trainer).__name__ == "DPOTrainer":
        rows = [b for k, b in batch.items() if k.endswith("attention_mask")]
        one_run = all(bool(((m[:, 1:].bool() & ~m[:, :-1].bool()).sum(-1) + m[:, 0].long() <= 1).all()) for m in rows)
        return {"leak": 0.0 if one_run else float("nan"), "alone": 0.0 if one_run else float("nan"),
                "labels_ok": None, "verdict": "PASS" if one_run else "FAIL"}
    ids = batch["input_ids"]  # (B, T)
    fields = {k: v for k, v in batch.items() if k not in NON_MODEL and k != "input_ids"}
    real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(ids, dtype=torch.bool)
    content = (ids >= 8) & real
    example, role = (ids - 8) % 8, ((ids - 8) // 8) % 2  # (B, T) each
    model, was_training = trainer.model, trainer.model.training
    model.eval()
    worst = 0.0
    with torch.no_grad():
        base = model(input_ids=ids, use_cache=False, **fields).logits.float()
        for k in range(8):
            mine = content & (example == k)
            if not bool(mine.any()):
                continue
            changed = torch.where(mine, torch.where(ids + 16 < V, ids + 16, ids - 16), ids)
            diff = (model(input_ids=changed, use_cache=False, **fields).logits.float() - base).abs().amax(-1)
            others = content & (example != k)
            worst = max(worst, float(diff[others].max()) if bool(others.any()) else 0.0)
        alone = _alone_change(model, base, ids, content, example)
    model.train(was_training)
    labels = batch["labels"]
    eos = trainer.model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    closing = torch.zeros_like(real)
    for e in eos:  # an EOS that closes an example: the token after a response token
        closing[:, 1:] |= (ids[:, 1:] == e) & content[:, :-1] & (role[:, :-1] == 1)
    expected = (content & (role == 1)) | closing
    counted = (labels != IGNORE) & real
    labels_ok = bool((counted == expected).all()) and bool((labels[counted] == ids[counted]).all())
    isolated = worst <= 1e-5 and alone <= ALONE_TOL
    return {"leak": worst, "alone": alone, "labels_ok": labels_ok,
            "verdict": "PASS" if isolated and labels_ok else "FAIL"}


def _alone_change(model, base, ids, content, example) -> float:
    """Largest logit change of an example's tokens, packed (``base``, the trainer's forward) vs the
    example run alone (its tokens only, no fields: one causal sequence). An example is its tagged
    content tokens in one row, with the BOS just before it (families with one) and the token after
    (its EOS) where that is not content; a piece cut by the row's end is compared as the piece."""
    worst = 0.0
    for b in range(ids.shape[0]):
        for k in range(8):
            at = (content[b] & (example[b] == k)).nonzero()[:, 0]
            if at.numel() == 0:
                continue
            s, e = int(at.min()), int(at.max()) + 1
            s -= int(s > 0 and int(ids[b, s - 1]) == BOS)
            e += int(e < ids.shape[1] and not bool(content[b, e]))
            alone = model(input_ids=ids[b:b + 1, s:e], use_cache=False).logits[0].float()
            worst = max(worst, float((base[b, s:e] - alone).abs().max()))
    return worst


STATUS = {"pass": "PASS", "fail": "FAIL", "not measured": "NOT MEASURED", "unverified": "UNVERIFIED"}
EXIT = {0: "PASS", 1: "FAIL", 2: "BAD INPUT", 3: "NOT MEASURED", 4: "CRASH"}


def via_audit_trainer(name: str) -> str:
    import packsim

    return STATUS[packsim.audit_trainer(make(name)).status]


def via_gate(name: str) -> tuple[str, int]:
    import contextlib
    import io

    from packsim.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(["audit", "--trainer", f"{__file__}:{name}"])
        except SystemExit as exit_info:
            code = exit_info.code
    return EXIT.get(code, f"exit {code}"), code


def via_callback(name: str) -> str:
    """PASS: the run trained its step; FAIL: AuditFailed stopped it; NOT MEASURED / UNVERIFIED: trained,
    with the callback's warning."""
    import packsim
    from packsim.auditing.callback import AuditFailed

    trainer = make(name)
    callback = packsim.AuditCallback(trainer)
    trainer.add_callback(callback)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
    except AuditFailed:
        return "FAIL" if trainer.state.global_step == 0 else "FAIL (after a step)"
    return STATUS[callback.report.status] if trainer.state.global_step == 1 else "did not train"


def via_assert_isolated(name: str) -> str:
    from packsim.testing import assert_isolated

    trainer = make(name)
    batch = first_batch(trainer)
    try:
        assert_isolated(trainer.model, {k: v for k, v in batch.items() if k != "completion_mask"}, use_cache=False)
    except AssertionError as err:
        text = str(err)
        return ("UNVERIFIED" if "only as the batch's own boundary" in text
                else "NOT MEASURED" if "could not" in text else "FAIL")
    return "PASS"


def via_logprobs(name: str) -> str:
    from packsim.auditing.logprobs import audit_logprobs

    trainer = make(name)
    batch = first_batch(trainer)
    report = audit_logprobs(trainer.model, {k: v for k, v in batch.items() if k != "labels"},
                            completion_mask=batch["labels"] != IGNORE, use_cache=False)
    return {"isolated": "PASS", "leaks": "FAIL"}.get(report.status, report.status.upper())


ENTRY_POINTS = {"audit_trainer": via_audit_trainer, "gate": via_gate, "callback": via_callback,
                "assert_isolated": via_assert_isolated, "audit_logprobs": via_logprobs}
DPO_ENTRY_POINTS = ("audit_trainer", "gate", "callback")  # its batch is the trainer's own (chosen/rejected)


def cells(name: str) -> list[str]:
    return list(DPO_ENTRY_POINTS if name.startswith("dpo") else ENTRY_POINTS)


def expected(entry: str, t: dict) -> str:
    """What the entry point must answer: the ground truth (audit_logprobs judges isolation only)."""
    if entry == "audit_logprobs":
        return "PASS" if t["leak"] <= 1e-5 and t["alone"] <= ALONE_TOL else "FAIL"
    return t["verdict"]


NO_VERDICT = ("NOT MEASURED", "UNVERIFIED")


def agreement(got: str, want: str) -> str:
    """"yes"; "no verdict" (NOT MEASURED / UNVERIFIED on a pipeline the truth FAILs: not a pass, it says
    why and how to get one); "NO" (a PASS on a fault, a FAIL on a correct pipeline, or no verdict on a
    correct one)."""
    if got == want:
        return "yes"
    return "no verdict" if got in NO_VERDICT and want == "FAIL" else "NO"


def main(argv=None) -> int:
    import argparse

    from packsim.core.text_table import text_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="pipeline names (default: all)")
    parser.add_argument("--out", help="also write the table as markdown here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows, bad = [], 0
    for name in args.only or PIPELINES:
        t = truth(make(name))
        _, _, family, what = PIPELINES[name]
        for entry in cells(name):
            got = ENTRY_POINTS[entry](name)
            code = got[1] if isinstance(got, tuple) else ""
            got = got[0] if isinstance(got, tuple) else got
            want = expected(entry, t)
            agree = agreement(got, want)
            bad += agree == "NO"
            rows.append([what, family, entry, got, f"exit {code}" if code != "" else "",
                         f"{want} (leak {t['leak']:.1e}, alone {t['alone']:.1e}, labels "
                         f"{ {True: 'ok', False: 'wrong', None: 'n/a'}[t['labels_ok']] })", agree])
            print(" | ".join(map(str, rows[-1])), flush=True)
    head = ["pipeline", "family", "entry point", "verdict", "gate exit", "ground truth", "agree"]
    print("\n".join(text_table([head, *rows])))
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
            fh.writelines("| " + " | ".join(map(str, r)) + " |\n" for r in rows)
    print(f"{sum(r[-1] == 'yes' for r in rows)} of {len(rows)} agree, "
          f"{sum(r[-1] == 'no verdict' for r in rows)} give no verdict on a fault, {bad} disagree")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
