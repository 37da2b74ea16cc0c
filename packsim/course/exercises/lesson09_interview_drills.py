"""Checks for notebook 09_interview_drills: a code review, interview question 1, symptoms to bugs.

Four exercises (three checked, one self-checked):

- ``review``: the set of bug ids (from :data:`BUGS`) hiding in :data:`REVIEW_SNIPPET`;
- ``q1_answer``: the learner's own answer to "how does FlashAttention do block-diagonal masking
  without a dense mask?", laid beside :data:`Q1_RUBRIC`'s model answer by :func:`assess_q1_answer`
  (``lesson09_rubric``: its four ingredients, the red flags of a junior answer, the depth an
  interviewer asks for next): a self-check with **no verdict**, since a reader of words cannot
  tell a right claim from a wrong one in the same words (issue 40);
- ``diagnosis``: for each symptom in :data:`SYMPTOMS`, which bug causes it: ``"attention"``
  (cross-example attention), ``"loss"`` (loss on the wrong tokens) or ``"neither"``;
- ``followups``: one option per follow-up drill of :data:`FOLLOWUPS` (varlen backward, sliding
  window, GQA, cu_seqlens in the collator, RoPE positions, max_seqlen, FLOPs, ranks).

The answer keys are written out by hand below with the reason for each entry; a check says which
items were missed and why each false alarm is not a bug, never just "wrong".
"""

from __future__ import annotations

from packsim.course.cases.lesson09_rubric import Q1_RUBRIC, SelfCheck, read
from packsim.course.exercises import Feedback, _announce, check, fail, ok

__all__ = [
    "BUGS",
    "REVIEW_SNIPPET",
    "SYMPTOMS",
    "CAUSES",
    "check_review",
    "assess_q1_answer",
    "check_diagnosis",
    "FOLLOWUPS",
    "check_followups",
]

# ----------------------------------------------------------------------------- code review

BUGS = {
    "labels_copy_inputs": "labels = input_ids: the loss covers prompt, padding and boundary tokens",
    "boundary_label_kept": "the first token of each example is a target, predicted from the previous example",
    "eos_masked": "the EOS token's label is -100, so the model never learns to stop",
    "positions_continue": "position ids keep counting across the pack",
    "cu_seqlens_no_zero": "cu_seqlens lacks the leading 0",
    "cu_seqlens_int64": "cu_seqlens is int64; varlen kernels need int32",
    "cu_seqlens_on_cpu": "cu_seqlens is a CPU tensor handed to a CUDA kernel",
    "max_seqlen_too_small": "max_seqlen is smaller than the longest example",
    "max_seqlen_total": "max_seqlen is the total number of tokens (too large: extra blocks, no wrong output)",
    "not_causal": "causal=False in a decoder",
    "mean_of_means": "per-pack mean losses averaged over packs (a mean of means)",
    "use_cache_on": "use_cache=True in a hand-written training loop",
    "attention_mask_given": "a 2D attention_mask (even all ones) next to packed position ids",
}

REVIEW_SNIPPET = '''\
def collate(examples):
    ids, labels, starts = [], [], [0]
    for ex in examples:
        ids += ex.prompt + ex.response + [EOS]
        labels += [-100] * len(ex.prompt) + ex.response + [-100]
        starts.append(len(ids))
    cu_seqlens = torch.tensor(starts)
    max_seqlen = len(ids) // len(examples)  # the mean example length
    return torch.tensor(ids), torch.tensor(labels), cu_seqlens, max_seqlen

ids, labels, cu, max_len = collate(batch)
h = flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True)
n = (labels[1:] != -100).sum()
loss = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum") / n
'''

# bug id -> (a nudge towards it, why it is wrong)
_REVIEW_KEY = {
    "eos_masked": (
        "line 5: what is the last label of each example?",
        "line 5 gives the EOS token the label -100. Keep EOS as a target (labels += ... + [EOS]): "
        "it is how the model learns to stop.",
    ),
    "cu_seqlens_int64": (
        "line 7: what dtype does torch.tensor give a list of Python ints?",
        "line 7: torch.tensor(starts) is int64; flash_attn_varlen_func checks for int32. Use "
        "torch.tensor(starts, dtype=torch.int32).",
    ),
    "cu_seqlens_on_cpu": (
        "lines 7 and 12: on which device does torch.tensor(starts) live, and where are q, k, v?",
        "line 7 builds cu_seqlens on the CPU and line 12 hands it, unmoved, to a CUDA kernel: flash-attn's "
        "mha_varlen_fwd checks it (\"cu_seqlens_q must be on CUDA\", right after the int32 check). Move it "
        "with the batch: cu.to(q.device) (labels too, before the loss).",
    ),
    "max_seqlen_too_small": (
        "line 8: which length does the kernel want, and is the mean ever enough?",
        "line 8: the mean example length is below the longest example's whenever the lengths differ. "
        "max_seqlen sizes the kernel's grid (ceil(max_seqlen / tile) query tiles per example), so the "
        "tiles of the longest example past it are never launched: their outputs stay uninitialised "
        "memory (flash-attn allocates the output with torch::empty_like) and, in the backward, the "
        "dK/dV of its later key tiles too. Nothing raises. Use the longest example, "
        "max(b - a for a, b in zip(starts, starts[1:])).",
    ),
}

# ids a reviewer might flag that are fine *in this snippet*, and why
_REVIEW_FINE = {
    "cu_seqlens_no_zero": "starts begins as [0], so cu_seqlens does start at 0.",
    "not_causal": "the call passes causal=True.",
    "labels_copy_inputs": "labels are built separately, with -100 on every prompt token.",
    "boundary_label_kept": (
        "each example's first token is a prompt token, and prompt labels are -100, so no label "
        "asks the model to predict an example's start from the previous example."
    ),
    "mean_of_means": (
        "the loss is a sum over the counted tokens divided once by their number n: one "
        "per-token mean over the whole batch, not a mean of means."
    ),
    "positions_continue": (
        "no position ids are built here; with cu_seqlens the kernel isolates the examples itself "
        "(and RoPE positions could then be reset by the model code)."
    ),
    "use_cache_on": "there is no transformers model call here, so no cache flag is involved.",
    "max_seqlen_total": (
        "max_seqlen is the mean example length here, not the total; and a total (too large) would only "
        "launch extra blocks that exit at once: slower, never wrong."
    ),
    "attention_mask_given": "no attention_mask is passed; cu_seqlens marks the examples.",
}


def _as_id_set(answer, name: str) -> set[str] | Feedback:
    if isinstance(answer, str):
        answer = {answer}
    try:
        items = {str(a).strip().lower() for a in answer}  # "EOS_masked" names the same bug
    except TypeError:
        return fail(
            f"{name} should be a set of strings, got {type(answer).__name__}.",
            'write it like {"bug_id_one", "bug_id_two"}.',
        )
    return items


@check("code review: the varlen collator")
def check_review(review) -> Feedback:
    """``review``: a set of ids from :data:`BUGS` naming every bug in :data:`REVIEW_SNIPPET`."""
    found = _as_id_set(review, "review")
    if isinstance(found, Feedback):
        return found
    unknown = sorted(found - set(BUGS))
    if unknown:
        return fail(
            f"{unknown} {'is' if len(unknown) == 1 else 'are'} not bug ids of this drill.",
            f"choose from: {', '.join(sorted(BUGS))}.",
        )
    missed = [b for b in _REVIEW_KEY if b not in found]
    false = sorted(found - set(_REVIEW_KEY))
    if not missed and not false:
        return ok(
            f"all {len(_REVIEW_KEY)} bugs found, no false alarms: "
            + " ".join(why for _, why in _REVIEW_KEY.values())
        )
    parts = []
    if missed:
        parts.append(
            f"You missed {len(missed)} of {len(_REVIEW_KEY)} bugs. Look again at "
            + " ".join(_REVIEW_KEY[b][0] for b in missed)
        )
    if false:
        parts.append(
            "False alarm"
            + ("s" if len(false) > 1 else "")
            + ": "
            + " ".join(f"{b}: {_REVIEW_FINE[b]}" for b in false)
        )
    return fail(
        " ".join(parts),
        "read the snippet line by line and ask of each value: what shape, what dtype, which device, what does "
        "the kernel or the loss expect here?",
    )


# ----------------------------------------------------------------------------- interview Q1

Q1_EXERCISE = "interview question 1 in your words"


def assess_q1_answer(q1_answer=...) -> SelfCheck | Feedback:
    """``q1_answer``: your answer to question 1, a string (or a list of sentences), laid beside
    :data:`Q1_RUBRIC`'s model answer part by part, with its red flags: a :class:`SelfCheck`, no
    verdict (a word reader cannot tell a right claim from a wrong one in the same words). Not
    text yet: a :class:`Feedback` that says so."""
    if q1_answer is ... or q1_answer is None:
        result = Feedback(False, "replace the `...` with your answer, run the cell, then run this one.",
                          exercise=Q1_EXERCISE, attempted=False)
    elif isinstance(q1_answer, (list, tuple)) and q1_answer and all(isinstance(s, str) for s in q1_answer):
        result = SelfCheck.of(Q1_EXERCISE, read("\n\n".join(q1_answer), Q1_RUBRIC), Q1_RUBRIC)
    elif not isinstance(q1_answer, str) or not q1_answer.strip():
        result = Feedback(False, f"q1_answer should be your answer as text, got {type(q1_answer).__name__}"
                          + (" (empty)" if isinstance(q1_answer, str) else "") + ".",
                          'write it as a string: q1_answer = """The kernel works in tiles ..."""',
                          exercise=Q1_EXERCISE)
    else:
        result = SelfCheck.of(Q1_EXERCISE, read(q1_answer, Q1_RUBRIC), Q1_RUBRIC)
    _announce(result)
    return result


# ----------------------------------------------------------------------------- symptoms

CAUSES = ("attention", "loss", "neither")

SYMPTOMS = {
    "s1": "Held-out examples run alone get far lower exact match than with the padded baseline, "
    "while the training loss curve looks healthy.",
    "s2": "The model answers held-out examples alone as well as the padded baseline, yet the "
    "loss the trainer reports stays high for the whole run.",
    "s3": "Changing the tokens of the first example in a pack changes the logits of the third.",
    "s4": "A large share of each query's attention lands on tokens of other examples in the pack.",
    "s5": "The labels of a packed row count prompt tokens, padding, and the first token of each "
    "example.",
    "s6": "Packed training processes more real tokens per second than one example per row.",
    "s7": "Generated answers never end: the model keeps writing past the answer.",
}
_SYMPTOM_KEY = {
    "s1": (
        "attention",
        "in this course's 2x2 ablation the low isolated exact match follows the mask: it is low "
        "for buggy and loss-fix-only, and back at the padded level as soon as the mask is fixed. "
        "Why the mask costs accuracy alone (the model relying on neighbours it does not have alone) "
        "is a hypothesis the ablation does not test; lesson 07's forensics measures a related habit "
        "in the weights.",
    ),
    "s2": (
        "loss",
        "that is the mask-fix-only setup: isolation is right, so answers are good, but the "
        "reported loss still averages over prompt and padding tokens the model cannot predict.",
    ),
    "s3": ("attention", "that is the perturbation probe failing: information flows across examples."),
    "s4": ("attention", "attention mass outside the own example is the leak itself."),
    "s5": ("loss", "those labels are the loss-on-everything bug; a completion-only loss masks them."),
    "s6": ("neither", "that is what packing is for; it says nothing about correctness."),
    "s7": (
        "loss",
        "the EOS label was masked (-100): a loss-target bug. Keep EOS as a target.",
    ),
}


@check("symptoms to bugs")
def check_diagnosis(diagnosis) -> Feedback:
    """``diagnosis``: a dict symptom id -> one of :data:`CAUSES`, for every id in :data:`SYMPTOMS`."""
    if not isinstance(diagnosis, dict):
        return fail(
            f"diagnosis should be a dict like {{'s1': 'attention', ...}}, got {type(diagnosis).__name__}.",
            f"map every symptom id {sorted(SYMPTOMS)} to one of {list(CAUSES)}.",
        )
    answer = {str(k).strip().lower(): str(v).strip().lower() for k, v in diagnosis.items()}
    missing = [s for s in SYMPTOMS if s not in answer or answer[s] in ("", "...", "none")]
    if missing:
        return fail(
            f"no cause given for {missing}.",
            f"map every symptom id to one of {list(CAUSES)}.",
        )
    bad = sorted({v for v in answer.values()} - set(CAUSES))
    if bad:
        return fail(f"{bad} is not a cause.", f"use one of {list(CAUSES)}.")
    wrong = [s for s in SYMPTOMS if answer[s] != _SYMPTOM_KEY[s][0]]
    if not wrong:
        return ok(f"all {len(SYMPTOMS)} symptoms traced to the right bug.")
    return fail(  # every wrong symptom explained, not only the first
        f"{len(wrong)} of {len(SYMPTOMS)} wrong ({', '.join(wrong)}). "
        + " ".join(f"{s}: you said {answer[s]!r}, it is {_SYMPTOM_KEY[s][0]!r}: {_SYMPTOM_KEY[s][1]}"
                   for s in wrong),
        "ask of each symptom: does it need information to flow between examples (attention), or "
        "is it about which tokens are counted as targets (loss)?",
    )


# ----------------------------------------------------------------------------- follow-up drills

# drill id -> (question, options, right option, why)
FOLLOWUPS = {
    "f1": ("Varlen backward (FlashAttention-2): thread blocks own one key/value tile each and loop over "
           "the query tiles that see it. Which gradient is summed across thread blocks in global memory?",
           ("dQ", "dK", "dV"), "dQ",
           "each block finishes dK and dV of its own key tile in registers, but every key tile adds a "
           "piece to the same query rows' dQ, so dQ is accumulated across blocks (fp32 atomic adds)."),
    "f2": ("Sliding window inside varlen: the window of a token near the start of example 2 reaches back "
           "past the example's first token. Does it then see the end of example 1?",
           ("yes", "no"), "no",
           "the window is applied inside each example: a key is visible only if it is in the same "
           "example AND inside the window. cu_seqlens bounds the key loop before the window does."),
    "f3": ("GQA with varlen: q has 32 heads, k and v have 8. Must k and v be repeated to 32 heads before "
           "calling flash_attn_varlen_func?",
           ("yes", "no"), "no",
           "the kernel maps query head h to key/value head h // (32 // 8) itself; cu_seqlens are the "
           "same for q and k (same tokens), so nothing about packing changes."),
    "f4": ("In the collator, which of these makes a host-device sync in the training step?",
           ("max_seqlen = max(lengths) on the Python list",
            "max_seqlen = int(cu_seqlens.diff().max()) on a CUDA tensor",
            "torch.tensor(starts, dtype=torch.int32)"),
           "max_seqlen = int(cu_seqlens.diff().max()) on a CUDA tensor",
           "int() of a CUDA tensor waits for the GPU. Compute max_seqlen as a Python int from the "
           "lengths the collator already has, build cu_seqlens as int32 with a leading 0, and move it "
           "to the device with the batch."),
    "f5": ("Default RoPE (Llama's rope_type 'default'), a correct block-diagonal mask: do position ids that "
           "continue across the pack (instead of restarting at 0) change any logit?",
           ("yes", "no (up to float round-off)"), "no (up to float round-off)",
           "RoPE scores depend on relative positions only, and the mask already isolates examples "
           "(lesson 04 measures it at round-off). Not so for rope_type dynamic or longrope once positions "
           "pass the original context: they recompute the frequencies from the largest position (A8's "
           "drill). Restarts matter for transformers' packed detection and for absolute position embeddings."),
    "f6": ("Which max_seqlen is the dangerous mistake in flash_attn_varlen_func?",
           ("too large", "too small"), "too small",
           "the grid has ceil(max_seqlen / tile) query tiles per example: too small and the tiles past it "
           "are never launched, so those outputs are left as uninitialised memory (mha_varlen_fwd "
           "allocates them with torch::empty_like), silently; the backward's grid skips the key tiles "
           "past it too, so their dK/dV stay uninitialised. Too large only launches empty tiles that "
           "exit at once."),
    "f9": ("Hidden size d = 4096, examples of L = 512 tokens. Roughly what share of a layer's forward "
           "FLOPs is the causal attention (scores and weighted sum)?",
           ("about 1%", "about 10%", "about 50%"), "about 1%",
           "per token the linear layers cost about 24 d^2 FLOPs (QKV, output, a 4d MLP) and causal "
           "attention about 2 L d: a share of L / (12 d + L) = 512 / 49664, about 1%. For short "
           "examples removing padding matters more than the sum of squared lengths."),
    "f10": ("Two data-parallel ranks hold 100 and 900 response tokens. Each divides its summed loss by its "
            "own count, then DDP averages the gradients. Does every token weigh the same?",
            ("yes", "no"), "no",
            "each rank's mean weighs its tokens by 1/100 or 1/900, then the ranks count equally: a token "
            "on the sparse rank weighs 9x more. Divide by the global count (all-reduce the counts over "
            "ranks and micro-batches; transformers: average_tokens_across_devices, lesson 10)."),
}


def _option(answer, options: tuple[str, ...]):
    """The option ``answer`` names in any case and spacing, or by the start of just one ("no")."""
    said = " ".join(str(answer).split()).lower()
    found = [o for o in options if o.lower() == said] or [o for o in options if said and o.lower().startswith(said)]
    return found[0] if len(found) == 1 else answer


@check("follow-up drills")
def check_followups(followups) -> Feedback:
    """``followups``: a dict drill id -> one of that drill's options (see :data:`FOLLOWUPS`)."""
    if not isinstance(followups, dict):
        return fail(f"followups should be a dict, got {type(followups).__name__}.",
                    'write it like {"f1": "dQ", "f2": "no", ...}.')
    missing = [k for k in FOLLOWUPS if k not in followups]
    if missing:
        return fail(f"no answer for {missing}.", f"answer every drill: {list(FOLLOWUPS)}.")
    followups = {k: _option(v, FOLLOWUPS[k][1]) if k in FOLLOWUPS else v for k, v in followups.items()}
    for k, v in followups.items():
        if k in FOLLOWUPS and v not in FOLLOWUPS[k][1]:
            return fail(f"{k}: {v!r} is not one of its options.", f"choose one of {list(FOLLOWUPS[k][1])}.")
    wrong = [k for k, (_, _, right, _) in FOLLOWUPS.items() if followups[k] != right]
    if not wrong:
        return ok(f"all {len(FOLLOWUPS)} right. " + " ".join(f"{k}: {FOLLOWUPS[k][3]}" for k in list(FOLLOWUPS)[:2]))
    return fail(f"{len(wrong)} of {len(FOLLOWUPS)} wrong: " + " ".join(f"{k}: {FOLLOWUPS[k][3]}" for k in wrong),
                "reread the model answers of the drills above.")
