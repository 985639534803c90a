-- diesel-occ: the lock table's times as instants. They were UTC without a zone, which any
-- SQL comparing them with now() read through the session's time zone (an operator's
-- query in another zone saw every lease moved by the offset). The library writes and
-- compares them with clock_timestamp() from this migration on.
ALTER TABLE occ_locks
    ALTER COLUMN acquired_at TYPE timestamptz USING acquired_at AT TIME ZONE 'UTC',
    ALTER COLUMN renewed_at TYPE timestamptz USING renewed_at AT TIME ZONE 'UTC',
    ALTER COLUMN expires_at TYPE timestamptz USING expires_at AT TIME ZONE 'UTC';
