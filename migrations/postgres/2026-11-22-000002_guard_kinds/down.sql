DROP TABLE documents;
ALTER TABLE orders DROP COLUMN views;
