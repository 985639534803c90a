//! Leader election: one runner per candidate campaigns for a lock, renews it
//! while it leads, steps down on shutdown or a lost renewal, and tells the application
//! when it gains or loses leadership.
//!
//! Safety: at most one candidate holds the lock at a time by the database's clock (the
//! acquisition is one compare-and-set against `expires_at`), and each term's fencing token
//! is larger than every earlier one. A leader stops considering itself leader once it
//! has not renewed for `renew_deadline` (< `lease`), so a leader cut off from the database
//! steps down before its lease can end and another can be elected; a leader paused longer
//! than that (a stopped process) can still act on stale belief when it wakes, which is
//! what the fence is for: storage that checks fences ([`fence`](crate::locks::fence)) refuses its
//! writes.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use diesel::r2d2::{ManageConnection, PooledConnection, R2D2Connection};

use crate::error::Error;
use crate::locks::lock::{LockConnection, Locks};

/// The timing of an election, as client-go's leader election has it.
#[derive(Debug, Clone, Copy)]
pub struct ElectionTiming {
    /// How long a term lasts without renewal: how long the others wait for a dead leader.
    pub lease: Duration,
    /// A leader that has not renewed for this long steps down (shorter than `lease`).
    pub renew_deadline: Duration,
    /// How often a candidate tries to be elected, and a leader renews.
    pub retry_period: Duration,
}

impl Default for ElectionTiming {
    /// 15 s, 10 s, 2 s: client-go's defaults.
    fn default() -> Self {
        ElectionTiming {
            lease: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl ElectionTiming {
    /// `lease > renew_deadline > retry_period * 1.2` and `retry_period <= lease / 3`, so
    /// that a leader gets several tries to renew before it must step down, steps down
    /// before its lease ends, and a waiting candidate tries several times per lease.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| {
            Err(Error::InvalidSetting {
                what: "election timing",
                reason,
            })
        };
        if self.retry_period.is_zero() {
            return invalid("the retry period must be above zero".into());
        }
        if self.lease <= self.renew_deadline {
            return invalid(format!(
                "the lease ({:?}) must be longer than the renew deadline ({:?})",
                self.lease, self.renew_deadline
            ));
        }
        if self.retry_period.as_secs_f64() * 3.0 > self.lease.as_secs_f64() {
            return invalid(format!(
                "the retry period ({:?}) must be at most a third of the lease ({:?}), so that a \
                 waiting candidate tries several times within one lease",
                self.retry_period, self.lease
            ));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * 1.2 {
            return invalid(format!(
                "the renew deadline ({:?}) must be longer than 1.2 x the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }
}

/// A change of leadership, as the runner reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// This candidate leads now; the term's fencing token.
    Elected {
        /// Larger than every earlier term's.
        fence: i64,
    },
    /// This candidate lost the lead: a renewal failed or came too late. Stop leading.
    Lost {
        /// Why.
        reason: String,
    },
    /// This candidate stepped down on request and freed the lock.
    SteppedDown,
}

/// A candidate running for leadership on its own thread.
pub struct Candidate {
    leading: Arc<AtomicBool>,
    fence: Arc<AtomicI64>,
    events: Receiver<LeaderEvent>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Candidate {
    /// Starts campaigning for lock `(name, resource)`; `label` names this candidate in the
    /// lock table. Events arrive on [`events`](Self::events).
    pub fn start<M>(
        locks: Locks<M>,
        name: &str,
        resource: &str,
        label: &str,
        timing: ElectionTiming,
    ) -> Result<Candidate, Error>
    where
        M: ManageConnection,
        M::Connection: R2D2Connection + Send + 'static,
        PooledConnection<M>: LockConnection,
    {
        timing.validate()?;
        crate::sql::names::check_name("lock name", name)?;
        crate::sql::names::check_name("resource", resource)?;
        crate::sql::names::check_name("label", label)?;
        let (leading, fence) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicI64::new(0)),
        );
        let (events_in, events) = channel();
        let (stop, stopped) = channel::<()>();
        let (name, resource, label) = (name.to_string(), resource.to_string(), label.to_string());
        let (lead, term) = (Arc::clone(&leading), Arc::clone(&fence));
        let thread = std::thread::spawn(move || {
            let report = |event: LeaderEvent| {
                let _ = events_in.send(event);
            };
            loop {
                // Campaign: try now, then every retry period.
                let Ok(mut guard) = locks.try_lock(&name, &resource, timing.lease, Some(&label))
                else {
                    match stopped.recv_timeout(timing.retry_period) {
                        Err(RecvTimeoutError::Timeout) => continue,
                        _ => return,
                    }
                };
                let mut renewed = Instant::now();
                term.store(guard.fence(), Ordering::SeqCst);
                lead.store(true, Ordering::SeqCst);
                report(LeaderEvent::Elected {
                    fence: guard.fence(),
                });
                // Lead: renew every retry period until stopped or too late.
                loop {
                    match stopped.recv_timeout(timing.retry_period) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => {
                            lead.store(false, Ordering::SeqCst);
                            let _ = guard.release();
                            report(LeaderEvent::SteppedDown);
                            return;
                        }
                    }
                    match guard.renew() {
                        Ok(()) => renewed = Instant::now(),
                        Err(e)
                            if renewed.elapsed() < timing.renew_deadline
                                && !matches!(e, Error::LockLost { .. }) =>
                        {
                            // A transient failure: try again next period, within the deadline.
                            continue;
                        }
                        Err(e) => {
                            lead.store(false, Ordering::SeqCst);
                            report(LeaderEvent::Lost {
                                reason: e.to_string(),
                            });
                            drop(guard);
                            break;
                        }
                    }
                    if renewed.elapsed() >= timing.renew_deadline {
                        lead.store(false, Ordering::SeqCst);
                        report(LeaderEvent::Lost {
                            reason: "no renewal within the renew deadline".into(),
                        });
                        break;
                    }
                }
            }
        });
        Ok(Candidate {
            leading,
            fence,
            events,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Whether this candidate leads now (as of its last renewal).
    pub fn is_leader(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// The fencing token of this candidate's current or last term.
    pub fn fence(&self) -> i64 {
        self.fence.load(Ordering::SeqCst)
    }

    /// Leadership changes, in order.
    pub fn events(&self) -> &Receiver<LeaderEvent> {
        &self.events
    }

    /// Steps down (freeing the lock if it leads) and ends the runner. Returns the events
    /// the runner sent that were not received yet, in order; when this candidate led, the
    /// last is [`LeaderEvent::SteppedDown`], sent after the lock was freed.
    pub fn stop(mut self) -> Vec<LeaderEvent> {
        self.shut_down();
        self.events.try_iter().collect()
    }

    fn shut_down(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("leading", &self.is_leader())
            .field("fence", &self.fence())
            .finish_non_exhaustive()
    }
}
