-- escape_rank: the numbers of the figure (sweep gallery_escape_rank)
WITH lay AS (
    SELECT r.run_id, r.depth, r.init_scale, r.seed, r.t_cross_050, l.layer, l.step,
           t.time, l.rel_change, l.fro_norm, l.stable_rank, l.delta_top_sv
    FROM layers l JOIN trajectories t USING (run_id, step) JOIN runs r USING (run_id)
    WHERE r.sweep = 'gallery_escape_rank' AND r.status = 'completed' AND r.t_cross_050 IS NOT NULL
      AND r.depth >= 3 AND r.init_scale <= 0.001 * (1 + 1e-9) AND l.layer < r.depth
),
escape AS (
    SELECT *, row_number() OVER (PARTITION BY run_id, layer ORDER BY step) AS k
    FROM lay
    WHERE time >= t_cross_050 AND delta_top_sv IS NOT NULL
)
SELECT e.depth, e.init_scale, e.seed, e.layer, e.step, e.time, e.t_cross_050,
       (e.rel_change * i.fro_norm) ^ 2 / e.delta_top_sv[1] ^ 2 AS delta_srank,
       i.stable_rank AS init_srank
FROM escape e JOIN lay i ON i.run_id = e.run_id AND i.layer = e.layer AND i.step = 0
WHERE e.k = 1
ORDER BY e.depth, e.layer, e.init_scale, e.seed;
