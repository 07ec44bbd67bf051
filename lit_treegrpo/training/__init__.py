"""The training step and the Lightning module that holds it.

May import: :mod:`lit_treegrpo.core`, :mod:`~lit_treegrpo.models`, :mod:`~lit_treegrpo.rewards`,
:mod:`~lit_treegrpo.data`, :mod:`~lit_treegrpo.common`, torch and Lightning; never the callbacks,
the run folders or the command line, which use it. Imports nothing on its own.
"""
