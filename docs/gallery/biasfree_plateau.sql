-- biasfree_plateau: the numbers of the figure (sweep gallery_biasfree_plateau)
WITH relu AS (
    SELECT r.run_id, r.seed, r.init_scale,
           CAST(json_extract(r.config, '$.data.delta') AS DOUBLE) AS delta,
           r.initial_train_loss AS l0, lin.final_train_loss AS level
    FROM runs r JOIN runs lin
      ON lin.sweep = r.sweep AND lin.seed = r.seed AND lin.init_scale = r.init_scale
         AND lin.data_kind = r.data_kind AND lin.leaky_slope = 1.0
         AND json_extract(lin.config, '$.data.delta') = json_extract(r.config, '$.data.delta')
    WHERE r.sweep = 'gallery_biasfree_plateau' AND r.data_kind = 'perturbed_symmetric' AND r.leaky_slope = 0.0
      AND r.status = 'completed' AND lin.status = 'completed'
),
curve AS (
    SELECT relu.*, t.time, t.train_loss AS loss,
           lag(t.time) OVER w AS prev_time, lag(t.train_loss) OVER w AS prev_loss,
           level + 0.1 * (l0 - level) AS reach_at, level - 0.1 * (l0 - level) AS leave_at
    FROM relu JOIN trajectories t USING (run_id)
    WHERE t.sweep = 'gallery_biasfree_plateau'
    WINDOW w AS (PARTITION BY t.run_id ORDER BY t.step)
),
crossing AS (
    SELECT seed, init_scale, delta, l0, level,
           min(CASE WHEN prev_loss > reach_at AND loss <= reach_at THEN prev_time
                    + (prev_loss - reach_at) / (prev_loss - loss) * (time - prev_time) END)
               AS t_reach,
           min(CASE WHEN prev_loss > leave_at AND loss <= leave_at THEN prev_time
                    + (prev_loss - leave_at) / (prev_loss - loss) * (time - prev_time) END)
               AS t_leave
    FROM curve
    GROUP BY seed, init_scale, delta, l0, level
)
SELECT seed, init_scale, delta, l0, level, t_reach, t_leave, t_leave - t_reach AS plateau
FROM crossing
ORDER BY init_scale, seed, delta;
