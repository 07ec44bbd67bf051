"""What a run leaves on disk, and reading it back.

May import: :mod:`lit_treegrpo.common`, :mod:`lit_treegrpo.models` (the export's formats), torch
and Lightning; never the module, the callbacks or the command line (the ``ExportOnTrainEnd``
callback and the CLI use it). Imports nothing on its own.
"""
