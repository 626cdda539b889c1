"""The gallery's results, one module each: a :class:`~phasesweep._gallery._result.Result`
named ``RESULT`` (the paper and its equation, the sweep at both sizes, the SQL, the fit and
its criterion, the figure). :data:`phasesweep._gallery._gallery.RESULTS` lists them."""
