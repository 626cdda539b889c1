-- biasfree_time: the numbers of the figure (sweep gallery_biasfree_time)
SELECT r.init_scale, r.seed, r.leaky_slope,
       r.t_cross_090 AS t_leaky, lin.t_cross_090 AS t_linear,
       r.t_cross_090 / lin.t_cross_090 AS time_ratio
FROM runs r JOIN runs lin
  ON lin.sweep = r.sweep AND lin.init_scale = r.init_scale AND lin.seed = r.seed
     AND lin.data_kind = r.data_kind AND lin.leaky_slope = 1.0
WHERE r.sweep = 'gallery_biasfree_time' AND r.data_kind = 'symmetric' AND r.leaky_slope < 1.0
  AND r.status = 'completed' AND lin.status = 'completed'
ORDER BY r.init_scale, r.seed, r.leaky_slope;
