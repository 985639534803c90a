// The schema of the example tables (migrations/*/..._create_example_tables).

diesel::table! {
    orders (id) {
        id -> BigInt,
        customer -> Text,
        note -> Text,
        status -> Text,
        quantity -> Integer,
        gift_message -> Nullable<Text>,
        version -> BigInt,
        views -> BigInt,
    }
}

diesel::table! {
    order_lines (order_id, line_no) {
        order_id -> BigInt,
        line_no -> Integer,
        sku -> Text,
        quantity -> Integer,
        version -> Integer,
    }
}

diesel::table! {
    counters (name) {
        name -> Text,
        value -> BigInt,
        revision -> SmallInt,
    }
}

diesel::table! {
    documents (id) {
        id -> BigInt,
        body -> Text,
        hits -> BigInt,
        last_modified -> Timestamp,
    }
}

diesel::joinable!(order_lines -> orders (order_id));
diesel::allow_tables_to_appear_in_same_query!(orders, order_lines, counters, documents);
