//! What an entity tells the executor about itself: its table, key and guard.
//!
//! `#[derive(Guarded)]` writes the implementation from the struct and the attributes
//! diesel already reads (`table_name`, `primary_key`, `column_name`), so the schema stays
//! the user's own `table!` and nothing is named twice.
//!
//! A guarded write is a compare-and-set: a predicate that proves the row still holds the
//! token the caller saw, and assignments that move it to the next token. A [`GuardKind`]
//! is one such pair (a version column, a timestamp, ...); the entity names its kind and
//! hands out its token, and the one executor does the rest for every kind.

pub(crate) mod by_key;
pub(crate) mod pre_image;
pub(crate) mod row_version;
pub(crate) mod seed;
#[cfg(feature = "chrono")]
pub(crate) mod server_clock;
pub(crate) mod status;
pub(crate) mod stored_precision;
#[cfg(feature = "chrono")]
pub(crate) mod timestamp;
pub(crate) mod version;
#[cfg(feature = "postgres")]
pub(crate) mod xmin;

use std::fmt::Debug;

use diesel::associations::HasTable;
use diesel::query_builder::AsChangeset;

use crate::error::Token;

/// An entity whose updates are guarded.
///
/// Implement it with `#[derive(Guarded)]`; the write methods come from
/// [`GuardedWrite`](crate::GuardedWrite), implemented for every `Guarded` type.
/// The row must be `Debug + Send + Sync + 'static` so that a
/// [`Conflict`](crate::Conflict) can carry the current row inside [`Error`](crate::Error).
pub trait Guarded: HasTable + Debug + Send + Sync + Sized + 'static {
    /// The primary key's value: the field's type, or a tuple for composite keys. Compared
    /// to match rows read back to the keys a batch asked for.
    type Key: Clone + Debug + PartialEq + Send + Sync + 'static;

    /// `key_column = key` (joined with `AND` for composite keys).
    type KeyPredicate;

    /// How this entity's writes prove and advance their token.
    type Guard: GuardKind;

    /// The columns that hold the token, by SQL name (one for a version or timestamp, the
    /// compared ones for a pre-image), for messages about unreadable tokens.
    const GUARD_COLUMNS: &'static [&'static str];

    /// The columns of `#[occ(exclude)]` fields, by SQL name: their writes neither check
    /// nor advance the token, and [`guarded_save`](crate::GuardedWrite::guarded_save)
    /// leaves them alone.
    const EXCLUDED_COLUMNS: &'static [&'static str] = &[];

    /// The `#[occ(status)]` column by SQL name, if the entity has one: only transitions
    /// write it, and every other write that would change it is refused
    /// ([`Error::StatusNotWritable`](crate::Error::StatusNotWritable)).
    const STATUS_COLUMN: Option<&'static str> = None;

    /// `<status column> = <this copy's state>`, or nothing for an entity without a status:
    /// a save never writes the state, so it must find the row in the state the copy holds,
    /// and a copy whose state was changed in memory is refused rather than half saved.
    type StatusKept: Send + 'static;

    /// The condition that the row is in this copy's state.
    fn status_kept(&self) -> Self::StatusKept;

    /// This copy's state as stored, for an entity with a status; for messages.
    fn status_name(&self) -> Option<&'static str> {
        None
    }

    /// Every updatable column set from the entity's fields (key, guard, status and
    /// excluded columns left out). Values are cloned out of the entity: a borrowed changeset would need a
    /// lifetime in every bound that names it, and a clone costs far less than the round
    /// trip.
    type Changes: AsChangeset<Target = Self::Table> + Send + 'static;

    /// This row's key.
    fn key(&self) -> Self::Key;

    /// The predicate that selects the row with `key`.
    fn key_predicate(key: &Self::Key) -> Self::KeyPredicate;

    /// The predicate that selects the rows of many keys: `key IN (...)` for a key of one
    /// column (`key = ANY(?)` on PostgreSQL, one bound array, so the statement is
    /// prepared once whatever the count), the keys' own predicates joined by `OR` for a
    /// key of several.
    type KeysPredicate;

    /// The predicate that selects the rows with `keys` (not empty).
    fn keys_predicate(keys: &[Self::Key]) -> Self::KeysPredicate;

    /// The token this copy was read with.
    fn token(&self) -> TokenOf<Self>;

    /// Records the token the row holds after a successful write. A pre-image entity
    /// records nothing: its fields are its token.
    fn set_token(&mut self, token: TokenOf<Self>);

    /// All updatable fields as a changeset, used by
    /// [`guarded_save`](crate::GuardedWrite::guarded_save).
    fn changes(&self) -> Self::Changes;

    /// What every guarded write sets besides the guard's own assignments: the
    /// `#[occ(updated_at)]` column, or [`Unguarded`](crate::sql::statement::Unguarded) (nothing).
    type Stamp: Clone + Send + Sync + 'static;

    /// The stamp of a write made now.
    fn stamp() -> Self::Stamp;

    /// Records in this copy the stamp its write set.
    fn set_stamp(&mut self, stamp: &Self::Stamp);

    /// The first `#[occ(json)]` field of this copy that must not be written, by column
    /// name, and why: every JSON edit of the row needs a JSON object there, so a save,
    /// insert or upsert of anything else is refused before it is sent. Generated by the
    /// derive; `None` for an entity without such a field.
    #[doc(hidden)]
    fn unwritable_document(&self) -> Option<(&'static str, String)> {
        None
    }
}

/// The token type of entity `T`'s guard (the version number, for a version guard).
pub type TokenOf<T> = <<T as Guarded>::Guard as GuardKind>::Token;

/// What entity `T`'s writes advance: the guard's assignments and the entity's stamp.
pub(crate) type AdvanceOf<T> = crate::sql::statement::AlsoSet<
    <<T as Guarded>::Guard as GuardKind>::Advance,
    <T as Guarded>::Stamp,
>;

/// How entity `T`'s writes learn their new token (see [`GuardKind::Completion`]).
pub(crate) type CompletionOf<T> = <<T as Guarded>::Guard as GuardKind>::Completion;

/// One kind of guard: the predicate that proves a row still holds a token and the
/// assignments that advance it. Both are diesel query fragments over the user's schema,
/// so every kind runs through the same statement and executor.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a guard kind diesel-occ can run",
    note = "for a version guard, the field must be `i16`, `i32` or `i64` (`u16`, `u32`, `u64` on MySQL) and its column NOT NULL of the matching SQL type"
)]
pub trait GuardKind {
    /// What a copy holds and a write compares: a version number, a timestamp, ...
    type Token: Clone + Debug + PartialEq + Send + Sync + 'static;

    /// `WHERE ... AND <predicate>`: the row still holds the token.
    type Predicate;

    /// `SET ..., <advance>`: the row moves to the next token.
    type Advance;

    /// How the writer learns the next token: the rows are counted when
    /// [`advance`](Self::advance) computes it; the statement returns the token's column
    /// when only the database knows it.
    type Completion;

    /// The predicate for a copy that holds `token`.
    fn predicate(token: &Self::Token) -> Self::Predicate;

    /// The assignments that move a row past `token`, and the token it then holds, known
    /// without reading the row back. `None` when the token cannot advance (a version at
    /// its type's maximum): the write is refused before anything is sent.
    fn advance(token: &Self::Token) -> Option<(Self::Advance, Self::Token)>;

    /// The token as conflicts and messages show it.
    fn describe(token: &Self::Token) -> Token;

    /// Whether a row holding `found` is older than a copy holding `expected`: for tokens
    /// that only ever grow (versions, timestamps), a server that shows such a row has not
    /// applied a write the copy came from. `false` for tokens without an order
    /// (pre-images, PostgreSQL's `xmin`, values the database maintains).
    fn precedes(found: &Self::Token, expected: &Self::Token) -> bool {
        let _ = (found, expected);
        false
    }

    /// For a time token: the fractional digits of a second it carries, which the column
    /// must keep. With fewer the database rounds or cuts each new token: the writer's
    /// own next write conflicts with what was stored, and a write within one unit of the
    /// last may not move the token at all. `None` for tokens that are not times.
    const TOKEN_DIGITS: Option<u32> = None;
}

/// A guard kind whose token moves on with every write (a version, a timestamp), so a copy
/// can record the new token and be saved again. A pre-image guard's token is the values a
/// copy was read with; such a copy is saved with
/// [`guarded_save_from`](crate::GuardedWrite::guarded_save_from) instead.
#[diagnostic::on_unimplemented(
    message = "a pre-image guard compares the values a copy was read with, so a modified copy cannot prove itself",
    label = "save the modified copy with `guarded_save_from(conn, &original)`",
    note = "`guarded_save` and `guarded_touch` need a guard whose token advances: `#[occ(version)]` or `#[occ(last_modified)]`"
)]
pub trait Advancing: GuardKind {}

/// A guard kind that can move a row past whatever token it holds, in SQL, without the
/// writer knowing that token: what writes by filter or by key alone need (bulk updates,
/// task claims, one-statement JSON merges, key-only transitions). A version becomes
/// `version + 1`; a timestamp the later of now and one tick past the row's own;
/// PostgreSQL moves `xmin` itself. A pre-image has no token to advance.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot advance a row's token in SQL without knowing it",
    note = "writes by filter or by key alone (bulk updates, claims, `merge_json_in_place`, `transition_by_key`) need a guard whose token the database can advance: `#[occ(version)]`, `#[occ(last_modified)]` or `#[occ(xmin)]`; a pre-image guard has no token to advance"
)]
pub trait AdvanceInSql: GuardKind {
    /// `SET ..., <advance>`: the row moves past the token it holds.
    type AdvanceAny;

    /// `WHERE ... AND <condition>`: the row's token can still advance (a version below
    /// its type's maximum). A row it leaves out is not written.
    type CanAdvance;

    /// The column that holds the token, read back after the write (`RETURNING`).
    type TokenColumn;

    /// How such a write reads the new token back: the token column as the statement
    /// returns it for the kinds the library advances; as the row holds it after the
    /// triggers for a token other code maintains.
    type ReadBack;

    /// The assignments that advance any row.
    fn advance_any() -> Self::AdvanceAny;

    /// The condition for rows that can advance.
    fn can_advance() -> Self::CanAdvance;

    /// Whether a row holding `token` is one [`can_advance`](Self::can_advance) leaves out.
    fn at_end(token: &Self::Token) -> bool;
}

/// The assignments that advance any row of entity `T` in SQL, and its stamp.
pub(crate) type AdvanceAnyOf<T> = crate::sql::statement::AlsoSet<
    <<T as Guarded>::Guard as AdvanceInSql>::AdvanceAny,
    <T as Guarded>::Stamp,
>;

/// The condition for rows of entity `T` whose token can advance.
pub(crate) type CanAdvanceOf<T> = <<T as Guarded>::Guard as AdvanceInSql>::CanAdvance;

/// How a write that advances entity `T`'s token in SQL learns the new token.
pub(crate) type ReturnedTokenOf<T> = <<T as Guarded>::Guard as AdvanceInSql>::ReadBack;

/// The guard of the implementation the derive emits next to a compile error, so that the
/// error is the only one; it is never run.
#[doc(hidden)]
pub struct Unusable;

impl GuardKind for Unusable {
    type Token = ();
    type Predicate = crate::sql::statement::Unguarded;
    type Advance = crate::sql::statement::Unguarded;
    type Completion = crate::sql::new_token::Counted;

    fn predicate(_: &()) -> Self::Predicate {
        crate::sql::statement::Unguarded
    }

    fn advance(_: &()) -> Option<(Self::Advance, ())> {
        None
    }

    fn describe(_: &()) -> Token {
        Token::PreImage("the derive failed".into())
    }
}
