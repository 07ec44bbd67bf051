"""Small helpers every layer may use.

- :mod:`.errors`: an exception's first line, and ``OSError`` explained with its fix (a full disk, a
  permission, a missing folder) for the one-line messages.
- :mod:`.hub`: :func:`~.hub.local_or_hub_id`, the one rule telling a local path from a hub id, and
  Hugging Face hub look-ups that fail in seconds without a network (the local cache
  first, then one bounded connection probe).
- :mod:`.files`: the one place the package removes, renames or replaces a file (only what it wrote,
  never through a link), a fresh folder per command, and reads bounded in size.
- :mod:`.config_yaml`: YAML without duplicate keys, its aliases' expansion and size bounded.
- :mod:`.values`: values checked against their declared type and range (``Range``).
- :mod:`.text`: prompts as printable text, cut by characters before anything tokenises them.
- :mod:`.env`: environment flags read as booleans by one rule.

These carry the six rules of docs/failure_modes.md.

May import: the standard library and PyYAML (``huggingface_hub`` inside functions); nothing of the package.
Imports nothing on its own.
"""
