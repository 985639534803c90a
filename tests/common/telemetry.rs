//! What the library reported: every `diesel_occ` event since the test binary started,
//! with its fields and the fields of the spans it happened in, taken by a subscriber
//! installed for the whole process (a candidate's thread and a tokio task report too),
//! and the library's metrics as a Prometheus scrape shows them. Tests running beside
//! each other report into the same record: a test picks its own by the keys and lock
//! names it alone uses.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One event as reported.
#[derive(Debug, Clone)]
pub struct Reported {
    /// Its name (`diesel_occ.conflict`, ...).
    pub name: String,
    pub level: tracing::Level,
    /// Its own fields, `message` included, each formatted.
    pub fields: BTreeMap<String, String>,
    /// The fields of the spans it happened in, the innermost last.
    pub spans: Vec<BTreeMap<String, String>>,
}

impl Reported {
    /// The value of the event's field `name`.
    pub fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{} has no field {name}: {self:?}", self.name))
    }

    /// The value of `name` in the innermost span that has it.
    pub fn span_field(&self, name: &str) -> Option<&str> {
        self.spans
            .iter()
            .rev()
            .find_map(|span| span.get(name))
            .map(String::as_str)
    }
}

static EVENTS: Mutex<Vec<Reported>> = Mutex::new(Vec::new());

/// Starts recording, once per process: the events, and the metrics.
pub fn record() -> &'static PrometheusHandle {
    static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();
    METRICS.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(Capture);
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
        PrometheusBuilder::new()
            .install_recorder()
            .expect("no other metrics recorder")
    })
}

/// The events reported so far that `mine` picks, in the order they were reported.
pub fn reported(mine: impl Fn(&Reported) -> bool) -> Vec<Reported> {
    EVENTS
        .lock()
        .unwrap()
        .iter()
        .filter(|e| mine(e))
        .cloned()
        .collect()
}

/// The value of the metric whose Prometheus line starts with `series` (name and labels
/// as rendered, e.g. `diesel_occ_lock_grants_total{occ_lock="x"}`), or 0 if absent.
pub fn metric(series: &str) -> f64 {
    let text = record().render();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().unwrap())
        })
        .unwrap_or(0.0)
}

/// Takes every `diesel_occ` event.
struct Capture;

/// A span's fields, kept in its extensions.
struct SpanFields(BTreeMap<String, String>);

/// Formats each field it visits into a map.
struct Fields<'m>(&'m mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    /// Only the library's spans and events: the other tests of the binary pay for no
    /// one else's.
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if metadata.target().starts_with("diesel_occ") {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        ctx.span(id)
            .expect("a new span")
            .extensions_mut()
            .insert(SpanFields(fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(SpanFields(fields)) = span.extensions_mut().get_mut::<SpanFields>() {
                values.record(&mut Fields(fields));
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if event.metadata().target() != "diesel_occ" {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .filter_map(|span| span.extensions().get::<SpanFields>().map(|f| f.0.clone()))
                    .collect()
            })
            .unwrap_or_default();
        EVENTS.lock().unwrap().push(Reported {
            name: event.metadata().name().to_owned(),
            level: *event.metadata().level(),
            fields,
            spans,
        });
    }
}
