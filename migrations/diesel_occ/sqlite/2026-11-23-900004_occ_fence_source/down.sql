DROP TABLE occ_fence_source;
