-- relu_transversal: the numbers of the figure (sweep gallery_relu_transversal)
WITH ends AS (
    SELECT run_id,
           arg_min(transversal_grad_sq, step) AS transversal_init,
           arg_max(transversal_grad_sq, step) AS transversal_final,
           max(time) AS t_final
    FROM trajectories WHERE sweep = 'gallery_relu_transversal' GROUP BY run_id
)
SELECT r.activation, r.depth, r.noise_sigma, r.n_train, r.seed,
       e.transversal_init, e.transversal_final, e.t_final
FROM runs r JOIN ends e USING (run_id)
WHERE r.sweep = 'gallery_relu_transversal' AND r.status = 'completed'
ORDER BY r.depth, r.noise_sigma, r.n_train, r.seed;
