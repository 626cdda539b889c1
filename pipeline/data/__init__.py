"""The datasets of a sweep: built-in kinds, user-supplied arrays, and the seeds
that make them reproducible.

Private: the modules here are re-exported where they are public.
"""
