//! The statement building blocks, as diesel query fragments over the user's `table!`
//! schema: the compare-and-set `UPDATE` and `DELETE` and their parts, several updates as
//! one statement, how a write learns a token only the database knows, and table names.
//! Crate-private: users meet them only as the types in the write methods' bounds.

pub(crate) mod key_list;
pub(crate) mod names;
pub(crate) mod new_token;
pub(crate) mod statement;
pub(crate) mod values_update;
