-- diesel-occ: locks and leases. One row per (lock_name, resource), kept on release so that
-- the fencing token keeps rising. Times come from the database's clock, as text of fixed
-- width ('YYYY-MM-DD HH:MM:SS.SSS', UTC), so that text order is time order.
CREATE TABLE occ_locks (
    lock_name TEXT NOT NULL,
    resource TEXT NOT NULL,
    holder TEXT,
    label TEXT,
    fence BIGINT NOT NULL DEFAULT 0,
    holder_changes BIGINT NOT NULL DEFAULT 0,
    acquired_at TEXT,
    renewed_at TEXT,
    expires_at TEXT,
    PRIMARY KEY (lock_name, resource)
);
