"""The Lightning module and its policies: one training step and everything it decides on the way.

- :mod:`.module`: :class:`TreeGRPOModule`, one training step = roll out -> score -> advantages ->
  prune -> update, with validation / test / predict sampling and the checkpoint hooks.
- :mod:`.growth`: the first half of a step, :meth:`~.growth.TreeGrowth.grow` (roll out, score,
  back up through the public ``advantages`` hook, prune), which ``TreeView`` draws too.
- :mod:`.update`: the clipped policy-gradient updates over the kept edges (micro-batches, gradient
  accumulation, the memory guard's split, non-finite losses and gradients refused).
- :mod:`.checkpoint_state`: what the module writes into a checkpoint and does with one it resumes.
- :mod:`.evaluation`: validation / test / predict, deterministic samples of fixed prompts.
- :mod:`.settings`: :class:`AdvantageSettings` and the checks of the module's options that need no
  model; :mod:`.sharding`: the data-parallel mesh FSDP2 shards over.
- :mod:`.faults`: :class:`FaultPolicy` and the fault ledger (NaN rewards, failing reward calls,
  non-finite losses or gradients: stop, or skip and count, alike on every rank).
- :mod:`.memory_guard`: :class:`MemoryGuard`, the rollout and training-pass memory checks;
  :mod:`.memory_probe`: what they measure (the memory available on CUDA or in ``/proc/meminfo``,
  one parent's saved tensors, the optimizer state).
- :mod:`.step_log`: phase timings, the step's metrics and the outputs the callbacks receive.
- :mod:`.resume`: what a checkpoint records of its run, and the checks that refuse resuming it
  with another configuration.
- :mod:`.predictions`: the PNGs (GIFs for videos) ``predict`` writes.

May import: :mod:`lit_treegrpo.core`, :mod:`~lit_treegrpo.models`, :mod:`~lit_treegrpo.rewards`,
:mod:`~lit_treegrpo.data`, :mod:`~lit_treegrpo.common`, torch and Lightning; never the callbacks,
the run folders or the command line, which use it. Imports nothing on its own: import
:class:`TreeGRPOModule` from :mod:`.module` (or as ``lit_treegrpo.TreeGRPOModule``).
"""
