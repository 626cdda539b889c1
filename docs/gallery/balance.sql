-- balance: the numbers of the figure (sweep gallery_balance)
WITH defect AS (
    SELECT r.activation, r.depth, r.lr, r.seed, l.layer, t.time,
           abs(l.balance_defect) AS defect,
           lead(t.time) OVER w AS next_time,
           lead(abs(l.balance_defect)) OVER w AS next_defect
    FROM layers l JOIN trajectories t USING (run_id, step) JOIN runs r USING (run_id)
    WHERE r.sweep = 'gallery_balance' AND r.status = 'completed' AND l.layer < r.depth
    WINDOW w AS (PARTITION BY l.run_id, l.layer ORDER BY t.time)
)
SELECT activation, depth, lr, seed, layer,
       defect + (2.0 - time) / (next_time - time) * (next_defect - defect)
           AS defect_at_t
FROM defect
WHERE time <= 2.0 AND next_time > 2.0
ORDER BY activation, depth, layer, seed, lr;
