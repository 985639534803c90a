-- The tables of the examples and tests: an order with a BIGINT version, its lines with a
-- composite key and an INTEGER version, and a counter whose SMALLINT version has another name.
CREATE TABLE orders (
    id BIGINT PRIMARY KEY NOT NULL,
    customer TEXT NOT NULL,
    note TEXT NOT NULL,
    status VARCHAR(32) NOT NULL,
    quantity INTEGER NOT NULL,
    gift_message TEXT,
    version BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE order_lines (
    order_id BIGINT NOT NULL REFERENCES orders (id),
    line_no INTEGER NOT NULL,
    sku TEXT NOT NULL,
    quantity INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (order_id, line_no)
);

CREATE TABLE counters (
    name VARCHAR(64) PRIMARY KEY NOT NULL,
    value BIGINT NOT NULL,
    revision SMALLINT NOT NULL DEFAULT 0
);
