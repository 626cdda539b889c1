-- lazy_phase: the numbers of the figure (sweep gallery_lazy_phase)
SELECT r.depth, r.width, r.init_scale, r.seed, s.regime, s.order_parameter,
       s.order_value, s.lazy_threshold
FROM runs r JOIN summaries s USING (sweep, run_id)
WHERE r.sweep = 'gallery_lazy_phase' AND r.status = 'completed'
ORDER BY r.depth, r.width, r.seed, r.init_scale;
