-- transversal: the numbers of the figure (sweep gallery_transversal)
WITH last AS (
    SELECT run_id, arg_max(transversal_grad_sq, step) AS transversal_grad_sq
    FROM trajectories WHERE sweep = 'gallery_transversal' GROUP BY run_id
)
SELECT r.activation, r.depth, r.noise_sigma, r.n_train, r.input_dim, r.seed,
       l.transversal_grad_sq
FROM runs r JOIN last l USING (run_id)
WHERE r.sweep = 'gallery_transversal' AND r.status = 'completed' AND r.noise_sigma > 0
ORDER BY r.activation, r.depth, r.n_train, r.noise_sigma, r.seed;
