-- diesel-occ: one version row per (lock_name, resource), bumped under a guard at the end
-- of each business operation it protects. Names are bytes (VARBINARY, 191 characters of
-- up to 4 bytes), so that they compare exactly: MariaDB's default collation treats
-- 'A' = 'a' and 'e' = 'é' as equal, and even utf8mb4_bin ignores trailing spaces.
CREATE TABLE occ_versions (
    lock_name VARBINARY(764) NOT NULL,
    resource VARBINARY(764) NOT NULL,
    version BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (lock_name, resource)
);
