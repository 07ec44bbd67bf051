"""The Shapes world: a small text-to-image task where RL measurably improves prompt following.

Imports run one way (a test checks it):

1. :mod:`.world` (the bottom: scenes, prompts, rendering; imports only torch),
2. the model (:mod:`lit_treegrpo.models.shapes`) and the reward (:mod:`lit_treegrpo.rewards.shapes`),
   which import the world,
3. :mod:`.pretrain` (the top: pre-training the model, which needs the world, the model and the
   reward).

This package's ``__init__`` imports nothing, so that importing the world never pulls in the top.

May import: the world, torch only; :mod:`.pretrain` also :mod:`lit_treegrpo.core`,
:mod:`lit_treegrpo.common` (its YAML checks), the Shapes model and reward, and Lightning (pre-training has its own small LightningCLI); never the package's
Lightning layer (training, data, runs, cli).
"""
