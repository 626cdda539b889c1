-- lazy_training: the numbers of the figure (sweep gallery_lazy_training)
WITH last AS (
    SELECT run_id,
           arg_max(param_rel_change, step) AS param_rel_change,
           arg_max(kernel_rel_change, step) AS kernel_rel_change
    FROM trajectories WHERE sweep = 'gallery_lazy_training' GROUP BY run_id
)
SELECT r.depth, r.width, r.init_scale, r.seed, l.param_rel_change, l.kernel_rel_change,
       r.final_train_loss / r.initial_train_loss AS loss_ratio
FROM runs r JOIN last l USING (run_id)
WHERE r.sweep = 'gallery_lazy_training' AND r.status = 'completed'
ORDER BY r.depth, r.width, r.init_scale, r.seed;
