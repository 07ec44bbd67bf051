"""Lightning callbacks of lit_treegrpo, installed as ``lit_treegrpo.callbacks``.

The folder sits at the repository top level (the user's design card) and pyproject's
``package-dir`` maps it into the package; always import it as ``lit_treegrpo.callbacks``.
The callbacks themselves (PruningSchedule, EMA, SampleGridLogger, RewardMetrics) arrive with the
Lightning training layer.
"""
