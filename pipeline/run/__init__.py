"""Launching a sweep: the plan against the store, the Ray Tune driver, the embedded
and standing Ray, token authentication, progress and resources.

Private: the modules here are re-exported where they are public.
"""
