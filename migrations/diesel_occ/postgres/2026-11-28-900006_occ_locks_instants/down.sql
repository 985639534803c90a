ALTER TABLE occ_locks
    ALTER COLUMN acquired_at TYPE timestamp USING acquired_at AT TIME ZONE 'UTC',
    ALTER COLUMN renewed_at TYPE timestamp USING renewed_at AT TIME ZONE 'UTC',
    ALTER COLUMN expires_at TYPE timestamp USING expires_at AT TIME ZONE 'UTC';
