"""The method comparison, one job per file (``benchmarks/compare_methods.py`` is the entry):

- :mod:`.methods`: the method table -- which presets (``configs/methods/*.yaml``) are compared, their
  learning-rate grids, and how one run's configuration is built from the task config, the preset
  and the run's learning rate and seed, through the same command-line parser ``fit`` uses;
- :mod:`.plan`: the fixed designs (budget, seeds, grids), the sweep's rule, the targets and the
  order of work;
- :mod:`.runs`: one run trained to its compute budget, its held-out curve recorded, cached on disk
  with its checkpoint (a longer budget extends it); the job queue that several processes share;
- :mod:`.stats`: bootstrap confidence intervals, paired differences, interpolation on the compute
  axis, area under the curve, compute to a target with censoring (pure Python);
- :mod:`.report`: ``results.json`` and the Markdown tables;
- :mod:`.plots`: reward against compute and against sampling NFE, with CI bands.
"""
