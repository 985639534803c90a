DROP TABLE counters;
DROP TABLE order_lines;
DROP TABLE orders;
