-- ntk_gram: the numbers of the figure (sweep gallery_ntk_gram)
SELECT r.width, r.seed, t.ntk_eig_min, t.ntk_eig_max,
       json_extract(r.config, '$.data') AS data_config,
       CAST(json_extract(r.config, '$.metrics.probe_size') AS INTEGER) AS probe_size
FROM runs r JOIN trajectories t USING (run_id)
WHERE r.sweep = 'gallery_ntk_gram' AND r.status = 'completed' AND t.step = 0
ORDER BY r.width, r.seed;
