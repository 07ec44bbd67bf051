"""Small helpers every layer may use.

May import: the standard library and PyYAML (``huggingface_hub`` inside functions); nothing of the package.
Imports nothing on its own.
"""
