"""The grid: axes, points, run ids, chunks and the cost model; the reach of a grid in
gradient-flow time. Imports neither torch nor Ray.

Private: the modules here are re-exported where they are public.
"""
