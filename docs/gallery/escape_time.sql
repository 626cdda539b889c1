-- escape_time: the numbers of the figure (sweep gallery_escape_time)
SELECT depth, init_scale, seed, t_cross_050
FROM runs
WHERE sweep = 'gallery_escape_time' AND status = 'completed' AND t_cross_050 IS NOT NULL
ORDER BY depth, seed, init_scale;
