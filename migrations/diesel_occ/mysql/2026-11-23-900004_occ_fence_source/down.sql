DROP SEQUENCE occ_fence_source;
