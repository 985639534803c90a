-- diesel-occ: one version row per (lock_name, resource), bumped under a guard at the end
-- of each business operation it protects.
CREATE TABLE occ_versions (
    lock_name VARCHAR(191) NOT NULL,
    resource VARCHAR(191) NOT NULL,
    version BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (lock_name, resource)
);
