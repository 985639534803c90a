//! The recorded history: one JSON line per invocation and per completion, written in the
//! order they happened (one lock orders the lines and their stamps, taken before a call
//! is sent and after its answer came), so that the file alone says which calls
//! overlapped. The one exception: each row a claim handed out is recorded when the claim
//! answered, stamped with the claim's start.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::model::{Op, Ret};

/// One line of the history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Microseconds since the run began (monotonic clock).
    pub at: u64,
    /// The caller: a worker, and its generation (a worker whose call never answered goes
    /// on as a new caller, since the old call may still land).
    pub caller: u64,
    /// The row the call addressed.
    pub key: i64,
    #[serde(flatten)]
    pub what: What,
}

/// An invocation, or how it ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum What {
    /// The call started, on the driver named (`blocking` or `async`).
    Invoke {
        #[serde(flatten)]
        op: Op,
        driver: String,
    },
    /// It answered: `outcome` is the kind of answer (`ok`, `conflict`, an error's name).
    Return {
        #[serde(flatten)]
        ret: Ret,
        outcome: String,
        /// The error's own text, for an error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// It never answered for certain: the connection died, the future was dropped, or
    /// the library said the write may or may not have landed. `outcome` says which.
    Unknown {
        outcome: String,
        /// The error's own text, when an error said so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// Appends events to a file, and keeps what a stalled run must say: the calls that have
/// not answered, and when the last event came.
pub struct Recorder {
    start: Instant,
    out: Mutex<Written>,
}

struct Written {
    file: BufWriter<File>,
    /// Per caller and key, its call that has not answered: its stamp and its line.
    open: BTreeMap<(u64, i64), (u64, String)>,
    last: u64,
}

impl Recorder {
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Recorder {
            start: Instant::now(),
            out: Mutex::new(Written {
                file: BufWriter::new(File::create(path)?),
                open: BTreeMap::new(),
                last: 0,
            }),
        })
    }

    /// How long ago the last event was recorded (or the run began).
    pub fn quiet_for(&self) -> std::time::Duration {
        let last = self.out.lock().unwrap_or_else(|p| p.into_inner()).last;
        self.start.elapsed() - std::time::Duration::from_micros(last)
    }

    /// The calls that have not answered, oldest first: each one's line.
    pub fn unanswered(&self) -> Vec<String> {
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let mut open: Vec<_> = out.open.values().cloned().collect();
        open.sort();
        open.into_iter().map(|(_, line)| line).collect()
    }

    /// Writes `what` for `caller` on `key`, stamped now; the stamp.
    pub fn record(&self, caller: u64, key: i64, what: What) -> u64 {
        self.record_at(None, caller, key, what)
    }

    /// Writes `what`, stamped `at` (an earlier stamp: the start of the claim that handed
    /// out a row, known only once the claim answered) or now; the stamp.
    pub fn record_at(&self, at: Option<u64>, caller: u64, key: i64, what: What) -> u64 {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.start.elapsed().as_micros() as u64;
        let at = at.unwrap_or(now);
        let invoked = matches!(what, What::Invoke { .. });
        let line = serde_json::to_string(&Event {
            at,
            caller,
            key,
            what,
        })
        .expect("an event serializes");
        writeln!(out.file, "{line}").expect("the history file takes a line");
        if invoked {
            out.open.insert((caller, key), (at, line));
        } else {
            out.open.remove(&(caller, key));
        }
        out.last = now;
        at
    }

    pub fn flush(&self) -> std::io::Result<()> {
        self.out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .file
            .flush()
    }
}

/// Every event of a history file, in order.
pub fn read(path: &Path) -> Result<Vec<Event>, Box<dyn std::error::Error>> {
    let mut events = Vec::new();
    for (n, line) in BufReader::new(File::open(path)?).lines().enumerate() {
        let line = line?;
        let event = serde_json::from_str(&line)
            .map_err(|e| format!("{}:{}: {e}: {line}", path.display(), n + 1))?;
        events.push(event);
    }
    Ok(events)
}
