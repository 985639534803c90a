-- diesel-occ: where fencing tokens come from. An AUTOINCREMENT key never reuses a value,
-- even after its row is deleted; each acquisition replaces the one row (slot 0) and takes
-- its new id, so a lock's fence keeps rising whatever happens to its row. It starts above
-- every fence handed out before it existed.
CREATE TABLE occ_fence_source (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slot INTEGER NOT NULL UNIQUE
);
INSERT INTO occ_fence_source (id, slot) SELECT COALESCE(MAX(fence), 0), 0 FROM occ_locks;
