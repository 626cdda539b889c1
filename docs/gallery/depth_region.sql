-- depth_region: the numbers of the figure (sweep gallery_depth_region)
WITH norms AS (
    SELECT run_id, step, exp(sum(ln(fro_norm))) AS w_norm
    FROM layers WHERE sweep = 'gallery_depth_region' GROUP BY run_id, step
),
ends AS (
    SELECT t.run_id, max(t.time) AS t_final,
           arg_min(t.transversal_grad_sq, t.step) AS wy_sq_0,
           arg_max(t.transversal_grad_sq, t.step) AS wy_sq_t,
           arg_min(n.w_norm, t.step) AS w_norm_0,
           arg_max(n.w_norm, t.step) AS w_norm_t
    FROM trajectories t JOIN norms n USING (run_id, step)
    WHERE t.sweep = 'gallery_depth_region' GROUP BY t.run_id
)
SELECT r.depth, r.init_scale, r.seed, r.lr, e.t_final, e.wy_sq_0, e.wy_sq_t, e.w_norm_0,
       e.w_norm_t,
       0.5 * ln(e.wy_sq_t / e.wy_sq_0) AS dlog_wy,
       ln(e.w_norm_t / e.w_norm_0) AS dlog_w,
       json_extract(r.config, '$.model') AS model_config,
       json_extract(r.config, '$.data') AS data_config
FROM runs r JOIN ends e USING (run_id)
WHERE r.sweep = 'gallery_depth_region' AND r.status = 'completed' AND r.activation = 'linear'
  AND NOT r.bias AND r.noise_sigma = 0 AND r.parameterization = 'standard'
  AND json_extract_string(r.config, '$.model.init') IN ('balanced', 'balanced_rank_one')
ORDER BY r.depth, r.init_scale, r.seed;
