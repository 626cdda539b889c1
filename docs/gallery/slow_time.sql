-- slow_time: the numbers of the figure (sweep gallery_slow_time)
WITH ends AS (
    SELECT run_id, arg_max(transversal_grad_sq, step) AS v_end, max(time) AS t_final
    FROM trajectories WHERE sweep = 'gallery_slow_time' GROUP BY run_id
),
curve AS (
    SELECT t.run_id, t.time,
           abs(t.transversal_grad_sq - e.v_end) / e.v_end AS gap,
           lead(t.time) OVER w AS next_time,
           lead(abs(t.transversal_grad_sq - e.v_end) / e.v_end) OVER w AS next_gap
    FROM trajectories t JOIN ends e USING (run_id)
    WHERE t.sweep = 'gallery_slow_time' AND t.time > 0
    WINDOW w AS (PARTITION BY t.run_id ORDER BY t.step)
),
settle AS (
    SELECT run_id,
           exp(max(CASE WHEN gap > 0.3 AND next_gap <= 0.3 THEN ln(time)
               + (gap - 0.3) / (gap - next_gap) * (ln(next_time) - ln(time)) END)) AS t_1,
           exp(max(CASE WHEN gap > 0.03 AND next_gap <= 0.03 THEN ln(time)
               + (gap - 0.03) / (gap - next_gap) * (ln(next_time) - ln(time)) END)) AS t_2
    FROM curve GROUP BY run_id
)
SELECT r.depth, r.noise_sigma, r.seed, s.t_1, s.t_2, s.t_2 - s.t_1 AS t_decade, e.t_final,
       e.v_end
FROM runs r JOIN settle s USING (run_id) JOIN ends e USING (run_id)
WHERE r.sweep = 'gallery_slow_time' AND r.status = 'completed' AND r.activation = 'linear'
  AND r.noise_sigma > 0 AND s.t_1 IS NOT NULL AND s.t_2 IS NOT NULL
ORDER BY r.depth, r.noise_sigma, r.seed;
