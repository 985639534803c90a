-- diesel-occ: where fencing tokens come from (MariaDB 10.3+ sequence). A sequence is not
-- touched when lock rows are deleted or the lock table truncated, and never goes back
-- across a restart (values cached before a crash are skipped, not reused), so a lock's
-- fence keeps rising whatever happens to its row. It starts above every fence handed
-- out before it existed.
SELECT COALESCE(MAX(fence), 0) + 1 INTO @diesel_occ_fence_start FROM occ_locks;
EXECUTE IMMEDIATE CONCAT('CREATE SEQUENCE occ_fence_source START WITH ', @diesel_occ_fence_start);
