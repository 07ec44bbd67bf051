"""Reward models behind one base class, :class:`RewardModel`."""
