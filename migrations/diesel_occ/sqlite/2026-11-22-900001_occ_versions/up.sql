-- diesel-occ: one version row per (lock_name, resource), bumped under a guard at the end
-- of each business operation it protects. Names compare exactly (BINARY collation).
CREATE TABLE occ_versions (
    lock_name TEXT NOT NULL,
    resource TEXT NOT NULL,
    version BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (lock_name, resource)
);
