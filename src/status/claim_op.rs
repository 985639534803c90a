//! Task claims as operations ([`crate::op`]): one attempt each (the extension methods
//! retry them), owning what they need.

use std::marker::PhantomData;

use crate::error::Error;
use crate::flow::finish_claims::report::FinishedClaims;
use crate::guard::status::HasStatus;
use crate::operation::{Operation, Run};
use crate::status::claim::{ClaimRequest, ClaimRows, FinishClaim};
use crate::status::claim_attempts::{AttemptLimit, ClaimCounted, Claimed};
use crate::status::claim_filter::ClaimFilter;
use crate::status::claim_heartbeat::ExtendClaim;
use crate::status::finish_claims::FinishClaims;

/// The columns an operation names only by type.
type Columns<Cols> = PhantomData<fn() -> Cols>;

/// A claim request that owns its owner id.
struct OwnedRequest<S> {
    owner: String,
    request: ClaimRequest<'static, S>,
}

impl<S: Copy> OwnedRequest<S> {
    #[cfg(feature = "async")]
    fn of(request: &ClaimRequest<'_, S>) -> Self {
        Self {
            owner: request.owner.to_owned(),
            request: ClaimRequest {
                owner: "",
                ..*request
            },
        }
    }

    /// The request as the claim takes it.
    fn get(&self) -> ClaimRequest<'_, S> {
        ClaimRequest {
            owner: &self.owner,
            ..self.request
        }
    }
}

/// Claims up to `request.limit` waiting (or abandoned) rows of `T` for `request.owner`,
/// with owner column `OwnerCol` and claim-time column `AtCol`. Answers the rows claimed.
pub struct Claim<T: HasStatus, OwnerCol, AtCol> {
    request: OwnedRequest<T::Status>,
    filter: Option<ClaimFilter>,
    columns: Columns<(OwnerCol, AtCol)>,
}

impl<T: HasStatus, OwnerCol, AtCol> Claim<T, OwnerCol, AtCol> {
    /// The claim `request` asks for, of the rows that match `filter`.
    #[cfg(feature = "async")]
    pub(crate) fn new(request: &ClaimRequest<'_, T::Status>, filter: Option<ClaimFilter>) -> Self {
        Self {
            request: OwnedRequest::of(request),
            filter,
            columns: PhantomData,
        }
    }

    /// The request, as the claim takes it.
    pub(crate) fn request(&self) -> ClaimRequest<'_, T::Status> {
        self.request.get()
    }

    /// The caller's condition on the rows, if any.
    pub(crate) fn filter(&self) -> Option<&ClaimFilter> {
        self.filter.as_ref()
    }
}

impl<T: HasStatus, OwnerCol, AtCol> Operation for Claim<T, OwnerCol, AtCol> {
    type Output = Vec<T>;
    type Error = Error;
}

impl<T, C, OwnerCol, AtCol> Run<C> for Claim<T, OwnerCol, AtCol>
where
    T: ClaimRows<C, OwnerCol, AtCol>,
{
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::claim_rows(conn, &self.request(), self.filter())
    }
}

/// [`Claim`], counting attempts in `AttemptsCol` and parking the rows that used up
/// `limit`. Answers the rows claimed and the rows parked.
pub struct CountedClaim<T: HasStatus, OwnerCol, AtCol, AttemptsCol> {
    request: OwnedRequest<T::Status>,
    pub(crate) limit: AttemptLimit<T::Status>,
    filter: Option<ClaimFilter>,
    columns: Columns<(OwnerCol, AtCol, AttemptsCol)>,
}

impl<T: HasStatus, OwnerCol, AtCol, AttemptsCol> CountedClaim<T, OwnerCol, AtCol, AttemptsCol> {
    /// The claim `request` asks for, under `limit`, of the rows that match `filter`.
    #[cfg(feature = "async")]
    pub(crate) fn new(
        request: &ClaimRequest<'_, T::Status>,
        limit: &AttemptLimit<T::Status>,
        filter: Option<ClaimFilter>,
    ) -> Self {
        Self {
            request: OwnedRequest::of(request),
            limit: *limit,
            filter,
            columns: PhantomData,
        }
    }

    /// The request, as the claim takes it.
    pub(crate) fn request(&self) -> ClaimRequest<'_, T::Status> {
        self.request.get()
    }

    /// The caller's condition on the rows, if any.
    pub(crate) fn filter(&self) -> Option<&ClaimFilter> {
        self.filter.as_ref()
    }
}

impl<T: HasStatus, OwnerCol, AtCol, AttemptsCol> Operation
    for CountedClaim<T, OwnerCol, AtCol, AttemptsCol>
{
    type Output = Claimed<T>;
    type Error = Error;
}

impl<T, C, OwnerCol, AtCol, AttemptsCol> Run<C> for CountedClaim<T, OwnerCol, AtCol, AttemptsCol>
where
    T: ClaimCounted<C, OwnerCol, AtCol, AttemptsCol>,
{
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::claim_counted_rows(conn, &self.request(), &self.limit, self.filter())
    }
}

/// The heartbeat of the claim `owner` holds on the row with `key` in state `held`.
/// Answers the row as kept.
pub struct ClaimHeartbeat<T: HasStatus, OwnerCol, AtCol> {
    pub(crate) key: T::Key,
    pub(crate) owner: String,
    pub(crate) held: T::Status,
    columns: Columns<(OwnerCol, AtCol)>,
}

impl<T: HasStatus, OwnerCol, AtCol> ClaimHeartbeat<T, OwnerCol, AtCol> {
    /// The heartbeat of `owner`'s claim on the row with `key`.
    #[cfg(feature = "async")]
    pub(crate) fn new(key: &T::Key, owner: &str, held: T::Status) -> Self {
        Self {
            key: key.clone(),
            owner: owner.to_owned(),
            held,
            columns: PhantomData,
        }
    }
}

impl<T: HasStatus, OwnerCol, AtCol> Operation for ClaimHeartbeat<T, OwnerCol, AtCol> {
    type Output = T;
    type Error = Error;
}

impl<T, C, OwnerCol, AtCol> Run<C> for ClaimHeartbeat<T, OwnerCol, AtCol>
where
    T: ExtendClaim<C, OwnerCol, AtCol>,
{
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::extend_claim_row(conn, &self.key, &self.owner, self.held)
    }
}

/// How claims end: `owner`'s claim in state `held` moves to `to`, handed to `next_owner`
/// or to no one.
pub(crate) struct Ending<S> {
    pub(crate) owner: String,
    pub(crate) held: S,
    pub(crate) to: S,
    pub(crate) next_owner: Option<String>,
}

impl<S: Copy> Ending<S> {
    /// The ending as the drivers take it.
    #[cfg(feature = "async")]
    pub(crate) fn as_ending(&self) -> (&str, S, S, Option<&str>) {
        (&self.owner, self.held, self.to, self.next_owner.as_deref())
    }

    #[cfg(feature = "async")]
    fn new(owner: &str, held: S, to: S, next_owner: Option<&str>) -> Self {
        Self {
            owner: owner.to_owned(),
            held,
            to,
            next_owner: next_owner.map(str::to_owned),
        }
    }
}

/// Ends the claim `owner` holds on the row with `key`, owner-checked: the row moves from
/// `held` to `to`, handed to `next_owner` or to no one. A lost claim is an error.
pub struct EndClaim<T: HasStatus, OwnerCol> {
    pub(crate) key: T::Key,
    pub(crate) ending: Ending<T::Status>,
    column: Columns<OwnerCol>,
}

impl<T: HasStatus, OwnerCol> EndClaim<T, OwnerCol> {
    /// The end of `owner`'s claim on the row with `key`.
    #[cfg(feature = "async")]
    pub(crate) fn new(
        key: &T::Key,
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Self {
        Self {
            key: key.clone(),
            ending: Ending::new(owner, held, to, next_owner),
            column: PhantomData,
        }
    }
}

impl<T: HasStatus, OwnerCol> Operation for EndClaim<T, OwnerCol> {
    type Output = ();
    type Error = Error;
}

impl<T, C, OwnerCol> Run<C> for EndClaim<T, OwnerCol>
where
    T: FinishClaim<C, OwnerCol>,
{
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let Ending {
            owner,
            held,
            to,
            next_owner,
        } = self.ending;
        T::finish_claim_row(conn, &self.key, &owner, held, to, next_owner.as_deref())
    }
}

/// [`EndClaim`] on the rows of many `keys` at once. Answers the keys ended and the claims
/// lost.
pub struct EndClaims<T: HasStatus, OwnerCol> {
    pub(crate) keys: Vec<T::Key>,
    pub(crate) ending: Ending<T::Status>,
    column: Columns<OwnerCol>,
}

impl<T: HasStatus, OwnerCol> EndClaims<T, OwnerCol> {
    /// The end of `owner`'s claims on the rows with `keys`.
    #[cfg(feature = "async")]
    pub(crate) fn new(
        keys: &[T::Key],
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Self {
        Self {
            keys: keys.to_vec(),
            ending: Ending::new(owner, held, to, next_owner),
            column: PhantomData,
        }
    }
}

impl<T: HasStatus, OwnerCol> Operation for EndClaims<T, OwnerCol> {
    type Output = FinishedClaims<T::Key>;
    type Error = Error;
}

impl<T, C, OwnerCol> Run<C> for EndClaims<T, OwnerCol>
where
    T: FinishClaims<C, OwnerCol>,
{
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let Ending {
            owner,
            held,
            to,
            next_owner,
        } = self.ending;
        T::finish_claims_rows(conn, &self.keys, &owner, held, to, next_owner.as_deref())
    }
}
