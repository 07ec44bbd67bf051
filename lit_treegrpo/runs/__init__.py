"""What a run leaves on disk, and reading it back.

- :mod:`.run_folder`: one folder per run under ``--trainer.default_root_dir``: the fit lock, a new
  fit refused over an earlier run, numbered config records, the TensorBoard logger.
- :mod:`.checkpoint`: atomic checkpoint writes, and checkpoint reads that are safe (torch's
  ``weights_only`` unpickler, a corrupt or hostile file reported in one line).
- :mod:`.export`: a checkpoint's trained weights in the model family's own format, with a card.

May import: :mod:`lit_treegrpo.common`, :mod:`lit_treegrpo.models` (the export's formats), torch
and Lightning; never the module, the callbacks or the command line (the ``ExportOnTrainEnd``
callback and the CLI use it). Imports nothing on its own.
"""
