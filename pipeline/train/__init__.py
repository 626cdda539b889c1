"""The vectorized ensemble trainer and its math: models, initialization, the training
loop, the linear step and the runs rows. Imports neither Ray nor fsspec.

Private: the modules here are re-exported where they are public.
"""
