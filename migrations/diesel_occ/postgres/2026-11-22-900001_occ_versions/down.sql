DROP TABLE occ_versions;
