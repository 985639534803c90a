DROP TABLE occ_locks;
