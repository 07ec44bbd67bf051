"""Small helpers every layer may use.

- :mod:`.errors`: an exception's first line, and ``OSError`` explained with its fix (a full disk, a
  permission, a missing folder) for the one-line messages.
- :mod:`.hub`: :func:`~.hub.local_or_hub_id`, the one rule telling a local path from a hub id, and
  Hugging Face hub look-ups that fail in seconds without a network (the local cache
  first, then one bounded connection probe).

May import: the standard library (``huggingface_hub`` inside functions); nothing of the package.
Imports nothing on its own.
"""
