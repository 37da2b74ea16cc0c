"""Reference answers for notebook 09_interview_drills (checks: packsim.course.exercises.lesson09_interview_drills)."""

# The four bugs of REVIEW_SNIPPET: EOS label -100 (line 5), int64 cu_seqlens (line 7), cu_seqlens
# left on the CPU and handed to the CUDA kernel (lines 7 and 12), max_seqlen = the mean example
# length, smaller than the longest example (line 8): the longest example's later query tiles are
# never computed. (A too-large max_seqlen only wastes blocks.)
review = {"eos_masked", "cu_seqlens_int64", "cu_seqlens_on_cpu", "max_seqlen_too_small"}

# How, with what, what is skipped, what it costs; then the depth (grid, imbalance, backward, GQA).
q1_answer = (
    "The kernel never materialises the N x N scores: each thread block holds one query tile on "
    "chip and streams key tiles past it with an online softmax. It gets the boundaries as "
    "cu_seqlens, int32 offsets [0, L0, L0+L1, ...], plus max_seqlen, which sizes the grid; each "
    "block reads its example's start and length from them. Tiles that would cross an example "
    "boundary are never formed, and causal tiles above the diagonal are skipped; only diagonal "
    "tiles mask per element, with an index test in registers. Work is the sum of squared example "
    "lengths, not N squared, and memory is O(N). The backward is tiled the same way. One long "
    "example among many short ones is a load imbalance: most blocks exit at once and the long "
    "one sets the finish time. With GQA, K and V have fewer heads: fewer bytes, the same scores."
)

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
