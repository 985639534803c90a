-- diesel-occ: locks and leases. One row per (lock_name, resource), kept on release so that
-- the fencing token keeps rising. Names are bytes (exact comparison); times come from the
-- database's clock (UTC, microseconds).
CREATE TABLE occ_locks (
    lock_name VARBINARY(764) NOT NULL,
    resource VARBINARY(764) NOT NULL,
    holder VARBINARY(64),
    label VARCHAR(191) CHARACTER SET utf8mb4,
    fence BIGINT NOT NULL DEFAULT 0,
    holder_changes BIGINT NOT NULL DEFAULT 0,
    acquired_at DATETIME(6),
    renewed_at DATETIME(6),
    expires_at DATETIME(6),
    PRIMARY KEY (lock_name, resource)
);
