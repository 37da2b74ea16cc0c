"""The library core: from examples to a packed batch, its attention, its loss and the model.

Data flow: examples (``data``, ``tokenizer``) -> ``packing`` (which example goes in which row)
-> ``batch.PackedBatch`` (rows, labels, positions; ``setups`` picks mask x positions x loss)
-> ``segments`` / ``boundaries`` (where the examples are) -> ``masks`` / ``attention`` (the kernels;
``attention_backends`` says which can run and picks one) -> ``loss`` -> ``model``.
``attention_share`` measures the leak (attention on other examples); ``collator`` hands the same
rows to the transformers ``Trainer``; ``device`` and ``errors`` serve every layer.

Lessons: none directly.
"""
