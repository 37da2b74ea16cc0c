"""Reference answers for notebook 09_interview_drills (checks: packsim.course.exercises.lesson09_interview_drills)."""

# The four bugs of REVIEW_SNIPPET: EOS label -100 (line 5), int64 cu_seqlens (line 7), cu_seqlens
# left on the CPU and handed to the CUDA kernel (lines 7 and 12), max_seqlen = the mean example
# length, smaller than the longest example (line 8): the longest example's later query tiles are
# never computed. (A too-large max_seqlen only wastes blocks.)
review = {"eos_masked", "cu_seqlens_int64", "cu_seqlens_on_cpu", "max_seqlen_too_small"}

# Tiles + online softmax, cu_seqlens, skipped tiles, cost model; "I" is true but optional.
q1_answer = {"A", "B", "C", "D", "I"}

# Does the symptom need information to flow between examples (attention) or is it about
# which tokens are targets (loss)?
diagnosis = {
    "s1": "attention",
    "s2": "loss",
    "s3": "attention",
    "s4": "attention",
    "s5": "loss",
    "s6": "neither",
    "s7": "loss",
}

# One option per follow-up drill (reasons in FOLLOWUPS of the checks module).
followups = {
    "f1": "dQ",
    "f2": "no",
    "f3": "no",
    "f4": "max_seqlen = int(cu_seqlens.diff().max()) on a CUDA tensor",
    "f5": "no (up to float round-off)",
    "f6": "too small",
    "f9": "about 1%",
    "f10": "no",
}
