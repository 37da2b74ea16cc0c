"""The 2025-26 museum pieces: each bug caught on the tiny model, each fix passing, with the ground
truth of each bug computed here independently of the piece's probe."""

import torch

from packsim.exhibits.museum_beyond_sft import LENGTHS, PUBLIC_BUGS, _row, museum_beyond_sft_table


def test_every_piece_is_caught_and_its_fix_passes():
    table = museum_beyond_sft_table()
    assert [r[0] for r in table.rows] == list(PUBLIC_BUGS)
    for name, _title, link, caught_by, fixed_ok in table.rows:
        assert caught_by != "NOT CAUGHT" and fixed_ok, name
        assert link.startswith("https://github.com/")
    assert "verl-project/verl/issues/6475" in table.to_markdown()


def test_the_bugs_are_real():
    ids, cu = _row()
    rolled = torch.roll(ids, shifts=-1, dims=0)  # verl's labels: each sequence's last label is foreign
    assert all(int(rolled[e - 1]) == int(ids[e % len(ids)]) for e in cu[1:].tolist())

    from transformers.modeling_flash_attention_utils import _is_packed_sequence
    T = sum(LENGTHS)
    assert _is_packed_sequence(torch.arange(T)[None, None].expand(3, 1, T), 1)  # the installed function
    assert not _is_packed_sequence(torch.arange(T)[None], 1)

    from transformers import DataCollatorWithFlattening
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings
    own = RobertaEmbeddings.create_position_ids_from_input_ids(ids[None, :7], padding_idx=1)
    assert int(own[0, 0]) == 2 and int(DataCollatorWithFlattening()([{"input_ids": ids[:7].tolist()}])["position_ids"][0, 0]) == 0

    import random

    from packsim.core.packing import pack
    rng = random.Random(0)  # the piece's draws: rows per step, each step drops rows % 4 without the fix
    rows = [len(pack([rng.randrange(20, 200) for _ in range(24)], 512)) for _ in range(3)]
    caught, evidence = PUBLIC_BUGS["packed_rows_dropped_at_world_size"].run(True)
    assert caught and evidence.startswith(f"{sum(n % 4 for n in rows)} of {sum(rows)} packed rows never trained")


def test_the_dpo_fallback_is_real():
    """Ground truth from the trainer itself: asked for padding_free, it keeps one sequence per row."""
    from packsim.exhibits.museum_beyond_sft import _dpo_trainer

    trainer = _dpo_trainer(padding_free=True)
    assert trainer.args.padding_free is True and trainer.padding_free is False
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert "position_ids" not in batch and batch["input_ids"].shape[0] == 4  # 2 chosen + 2 rejected rows
    assert bool((batch["attention_mask"] == 0).any())  # padded, not packed
    caught, evidence = PUBLIC_BUGS["dpo_padding_free_fallback"].run(True)
    assert caught and "fell back to padding" in evidence and "isolated" in evidence
    fixed_caught, evidence = PUBLIC_BUGS["dpo_padding_free_fallback"].run(False)
    assert not fixed_caught and evidence.startswith("pass")
