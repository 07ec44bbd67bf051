"""lit_treegrpo: tree-structured GRPO (TreeGRPO, BranchGRPO) for diffusion and flow models.

Importing the package is cheap: the pure-torch engine lives in :mod:`lit_treegrpo.core`, which
imports neither Lightning nor diffusers; the Lightning and model layers import those on use.
"""

__version__ = "0.1.0"
