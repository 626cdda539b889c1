"""Refinement of a phase boundary: the level set and the Optuna study that places it.

Private: the modules here are re-exported where they are public.
"""
