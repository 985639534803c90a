-- diesel-occ: locks and leases. One row per (lock_name, resource), kept on release so that
-- the fencing token keeps rising. Times come from the database's clock (UTC, microseconds).
CREATE TABLE occ_locks (
    lock_name VARCHAR(191) NOT NULL,
    resource VARCHAR(191) NOT NULL,
    holder VARCHAR(64),
    label VARCHAR(191),
    fence BIGINT NOT NULL DEFAULT 0,
    holder_changes BIGINT NOT NULL DEFAULT 0,
    acquired_at TIMESTAMP,
    renewed_at TIMESTAMP,
    expires_at TIMESTAMP,
    PRIMARY KEY (lock_name, resource)
);
