"""The metrics of a logged step: losses on the probe, the empirical NTK and its
spectrum, the layer spectra.

Private: the modules here are re-exported where they are public.
"""
