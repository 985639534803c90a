//! The example orders service (`examples/orders_service`), served on loopback and driven
//! over real HTTP, on every backend: preconditions, problems, races, concurrent patches.

#![cfg(all(
    feature = "axum",
    feature = "locks",
    feature = "sqlite",
    feature = "postgres",
    feature = "async-mysql",
    feature = "bb8"
))]

#[allow(dead_code)]
#[path = "../../examples/orders_service/app.rs"]
mod app;
use crate::common;

use std::sync::Barrier;
use std::time::Duration;

use diesel::prelude::*;
use diesel_occ::asynchronous::AsyncCandidate;
use diesel_occ::{occ_locks, ElectionTiming, Error, Leadership};
use reqwest::blocking::{Client, Response};
use reqwest::header::{CONTENT_TYPE, ETAG, IF_MATCH, IF_NONE_MATCH};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// The pool the service takes its connections from: every scenario runs on both.
#[derive(Debug, Clone, Copy)]
enum PoolKind {
    Bb8,
    Deadpool,
}

const POOLS: [PoolKind; 2] = [PoolKind::Bb8, PoolKind::Deadpool];

/// Starts a campaign of an instance of the service, on its pool.
type Campaign = Box<dyn Fn(&str, ElectionTiming) -> Result<AsyncCandidate, Error> + Send + Sync>;

/// The service of the backend whose blocking connection is `Self`.
trait Api: diesel::r2d2::R2D2Connection + 'static {
    /// The routes on a pool of `kind` to `url` (the tables set up through it), and the
    /// campaign of an instance on that pool.
    fn serve(
        url: &str,
        kind: PoolKind,
        runtime: &tokio::runtime::Runtime,
    ) -> (axum::Router, Campaign);
}

macro_rules! api {
    ($($conn:ty => $module:ident),*) => {$(
        impl Api for $conn {
            fn serve(url: &str, kind: PoolKind, runtime: &tokio::runtime::Runtime) -> (axum::Router, Campaign) {
                use app::$module::{bb8_pool, campaign, deadpool_pool, router, setup};
                match kind {
                    PoolKind::Bb8 => {
                        let pool = runtime.block_on(bb8_pool(url)).unwrap();
                        runtime.block_on(setup(&pool)).unwrap();
                        let elect = pool.clone();
                        (router(pool), Box::new(move |label: &str, timing| campaign(elect.clone(), label, timing)))
                    }
                    PoolKind::Deadpool => {
                        let pool = deadpool_pool(url).unwrap();
                        runtime.block_on(setup(&pool)).unwrap();
                        let elect = pool.clone();
                        (router(pool), Box::new(move |label: &str, timing| campaign(elect.clone(), label, timing)))
                    }
                }
            }
        }
    )*};
}

api!(diesel::SqliteConnection => sqlite, diesel::PgConnection => postgres, diesel::MysqlConnection => mysql);

/// The service on a loopback port for as long as this lives.
struct Server {
    base: String,
    client: Client,
    kind: PoolKind,
    campaign: Campaign,
    runtime: tokio::runtime::Runtime,
}

impl Server {
    fn start<C: Api>(url: &str, kind: PoolKind) -> Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (router, campaign) = C::serve(url, kind, &runtime);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, router).await.unwrap();
        });
        Server {
            base,
            client: Client::new(),
            kind,
            campaign,
            runtime,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn create(&self, id: i64) -> String {
        let response = self
            .client
            .post(self.url(&format!("/orders/{id}")))
            .send()
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        etag(&response)
    }

    fn get(&self, id: i64) -> (String, Value) {
        let response = self
            .client
            .get(self.url(&format!("/orders/{id}")))
            .send()
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let tag = etag(&response);
        (tag, response.json().unwrap())
    }

    fn patch(&self, id: i64, kind: &str, body: Value, if_match: Option<&str>) -> Response {
        let mut request = self
            .client
            .patch(self.url(&format!("/orders/{id}")))
            .header(CONTENT_TYPE, kind)
            .body(body.to_string());
        if let Some(tag) = if_match {
            request = request.header(IF_MATCH, tag);
        }
        request.send().unwrap()
    }
}

impl Server {
    fn put(&self, id: i64, body: Value, if_match: Option<&str>) -> Response {
        let mut request = self
            .client
            .put(self.url(&format!("/orders/{id}")))
            .json(&body);
        if let Some(tag) = if_match {
            request = request.header(IF_MATCH, tag);
        }
        request.send().unwrap()
    }
}

fn etag(response: &Response) -> String {
    response.headers()[ETAG].to_str().unwrap().to_string()
}

const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

for_each_backend! {
    /// Runs `body` on the service served from each kind of pool, on a fresh database.
    fn on_each_pool(body: impl Fn(&Server, &common::TestDb<Conn>)) {
        for kind in POOLS {
            let Some(db) = db() else { return };
            body(&Server::start::<Conn>(&db.url, kind), &db);
        }
    }

    /// A write with the tag of an older version is refused with 412 and the current tag,
    /// and changes nothing; the current tag then works.
    #[test]
    fn a_stale_if_match_gets_412_and_nothing_changes() {
        on_each_pool(|server, _db| {
        let first = server.create(1);
        let updated = server.patch(1, MERGE, json!({"gift": true}), Some(&first));
        assert_eq!(updated.status(), StatusCode::OK);
        let second = etag(&updated);
        assert_ne!(first, second);

        let stale = server.patch(1, MERGE, json!({"gift": false, "note": "late"}), Some(&first));
        assert_eq!(stale.status(), StatusCode::PRECONDITION_FAILED);
        assert_eq!(etag(&stale), second, "the answer names the current version");
        assert_eq!(stale.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(stale.json::<Value>().unwrap()["status"], json!(412));
        let (tag, order) = server.get(1);
        assert_eq!((tag.as_str(), &order["ext"]), (second.as_str(), &json!({"gift": true})));

        let same = server.client.get(server.url("/orders/1")).header(IF_NONE_MATCH, &second).send().unwrap();
        assert_eq!(same.status(), StatusCode::NOT_MODIFIED);
        });
    }

    /// A PUT needs the tag of the version it replaces: 428 without one, 412 with a stale
    /// one, 422 for a document that is not an object (the library refuses to save it);
    /// none of them changes the order. With the current tag it replaces the document.
    #[test]
    fn a_put_replaces_the_document_of_the_tagged_version_only() {
        on_each_pool(|server, _db| {
            let first = server.create(1);
            assert_eq!(server.put(1, json!({"ext": {"a": 1}}), None).status(), StatusCode::PRECONDITION_REQUIRED, "{:?}", server.kind);
            let replaced = server.put(1, json!({"ext": {"a": 1}}), Some(&first));
            assert_eq!(replaced.status(), StatusCode::OK);
            let second = etag(&replaced);
            assert_eq!(replaced.json::<Value>().unwrap()["ext"], json!({"a": 1}));
            let stale = server.put(1, json!({"ext": {"b": 2}}), Some(&first));
            assert_eq!((stale.status(), etag(&stale)), (StatusCode::PRECONDITION_FAILED, second.clone()));
            let not_an_object = server.put(1, json!({"ext": [1]}), Some(&second));
            assert_eq!(not_an_object.status(), StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(not_an_object.json::<Value>().unwrap()["code"], json!("invalid-patch"));
            let (tag, order) = server.get(1);
            assert_eq!((tag, &order["ext"]), (second, &json!({"a": 1})), "{:?}", server.kind);
        });
    }

    /// A missing order is a 404 problem naming the table and key, with or without a
    /// precondition (a PATCH does not create it); a second create of one id is 409.
    #[test]
    fn a_missing_order_is_404_and_a_taken_id_409() {
        on_each_pool(|server, _db| {
            let missing = server.client.get(server.url("/orders/42")).send().unwrap();
            assert_eq!(missing.status(), StatusCode::NOT_FOUND);
            assert_eq!(missing.headers()[CONTENT_TYPE], "application/problem+json");
            let detail = missing.json::<Value>().unwrap()["detail"].as_str().unwrap().to_string();
            assert!(detail.contains("service_orders") && detail.contains("42"), "{detail}");
            assert_eq!(server.patch(42, MERGE, json!({"a": 1}), Some("*")).status(), StatusCode::NOT_FOUND);
            assert_eq!(server.patch(42, MERGE, json!({"a": 1}), None).status(), StatusCode::NOT_FOUND);
            let tag = server.create(42);
            let again = server.client.post(server.url("/orders/42")).send().unwrap();
            assert_eq!(again.status(), StatusCode::CONFLICT);
            assert_eq!(again.json::<Value>().unwrap()["code"], json!("already-exists"));
            assert_eq!(server.get(42).0, tag, "the second create wrote nothing");
        });
    }

    /// PATCH bodies of another media type (or none) get 415 naming the two it takes, a body
    /// that is not JSON or operations that do not parse 400, a merge patch that is not an
    /// object 422; none reaches the order.
    #[test]
    fn patch_bodies_of_the_wrong_type_or_shape_are_refused() {
        on_each_pool(|server, _db| {
            let tag = server.create(1);
            let send = |kind: &str, body: &str| {
                server.client.patch(server.url("/orders/1")).header(CONTENT_TYPE, kind).header(IF_MATCH, &tag).body(body.to_string()).send().unwrap()
            };
            let other_type = send("text/plain", "{}");
            assert_eq!(other_type.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert_eq!(other_type.headers()["accept-patch"], format!("{MERGE}, {JSON_PATCH}").as_str());
            assert!(other_type.json::<Value>().unwrap()["accept_patch"].as_str().unwrap().contains(JSON_PATCH));
            assert_eq!(send(MERGE, "{not json").status(), StatusCode::BAD_REQUEST);
            assert_eq!(send(MERGE, "[1]").status(), StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(send(JSON_PATCH, r#"{"op": "add"}"#).status(), StatusCode::BAD_REQUEST);
            let no_type = server.client.patch(server.url("/orders/1")).header(IF_MATCH, &tag).body("{}").send().unwrap();
            assert_eq!(no_type.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert_eq!(send("application/merge-patch+json; charset=utf-8", r#"{"a": 1}"#).status(), StatusCode::OK);
            assert_eq!(server.get(1).1["ext"], json!({"a": 1}));
        });
    }

    /// A JSON Patch is made for one version of the document: without If-Match, 428.
    #[test]
    fn a_json_patch_without_if_match_gets_428() {
        on_each_pool(|server, _db| {
        let tag = server.create(1);
        let operations = json!([{"op": "add", "path": "/tags", "value": ["vip"]}]);
        let refused = server.patch(1, JSON_PATCH, operations.clone(), None);
        assert_eq!(refused.status(), StatusCode::PRECONDITION_REQUIRED);
        assert_eq!(server.get(1).1["ext"], json!({}));

        let applied = server.patch(1, JSON_PATCH, operations, Some(&tag));
        assert_eq!(applied.status(), StatusCode::OK);
        assert_eq!(server.get(1).1["ext"], json!({"tags": ["vip"]}));
        let failing_test = json!([{"op": "test", "path": "/tags/0", "value": "other"}]);
        let tag = server.get(1).0;
        assert_eq!(server.patch(1, JSON_PATCH, failing_test, Some(&tag)).status(), StatusCode::UNPROCESSABLE_ENTITY);
        });
    }

    #[test]
    fn a_malformed_if_match_gets_400() {
        on_each_pool(|server, _db| {
        server.create(1);
        for bad in ["not-a-tag", "\"unclosed", "*, \"a\"", "W/x"] {
            let response = server.patch(1, MERGE, json!({"a": 1}), Some(bad));
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
        assert_eq!(server.get(1).1["ext"], json!({}));
        });
    }

    /// Two clients ship and cancel each order at the same moment: one 200 and one 409
    /// whose problem names the winner's state.
    #[test]
    fn cancel_and_ship_racing_over_http_have_one_winner() {
        const ORDERS: i64 = 20;
        on_each_pool(|server, _db| {
        for id in 1..=ORDERS {
            server.create(id);
        }
        let start = Barrier::new(2);
        let results: Vec<Vec<(StatusCode, Value)>> = std::thread::scope(|s| {
            let racers: Vec<_> = ["ship", "cancel"]
                .into_iter()
                .map(|action| {
                    let (server, start) = (&server, &start);
                    s.spawn(move || {
                        (1..=ORDERS)
                            .map(|id| {
                                start.wait();
                                let response = server.client.post(server.url(&format!("/orders/{id}/{action}"))).send().unwrap();
                                (response.status(), response.json::<Value>().unwrap())
                            })
                            .collect()
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for (i, (ship, cancel)) in results[0].iter().zip(&results[1]).enumerate() {
            let stored = server.get(i as i64 + 1).1["status"].as_str().unwrap().to_string();
            let (winner, loser) = match (ship.0, cancel.0) {
                (StatusCode::OK, StatusCode::CONFLICT) => (ship, cancel),
                (StatusCode::CONFLICT, StatusCode::OK) => (cancel, ship),
                other => panic!("order {}: {other:?}", i + 1),
            };
            assert_eq!(winner.1["status"].as_str(), Some(stored.as_str()));
            assert_eq!(loser.1["current_state"].as_str(), Some(stored.as_str()), "{}", loser.1);
        }
        });
    }

    /// 16 clients merge their own key into one order at once, without If-Match: the
    /// service merges each into the latest version, so every key lands.
    #[test]
    fn sixteen_concurrent_merge_patches_of_different_keys_all_land() {
        on_each_pool(|server, _db| {
        server.create(1);
        let start = Barrier::new(16);
        std::thread::scope(|s| {
            for i in 0..16 {
                let (server, start) = (&server, &start);
                s.spawn(move || {
                    start.wait();
                    let response = server.patch(1, MERGE, json!({ format!("k{i}"): i }), None);
                    assert_eq!(response.status(), StatusCode::OK);
                });
            }
        });
        let ext = server.get(1).1["ext"].clone();
        for i in 0..16 {
            assert_eq!(ext[format!("k{i}")], json!(i), "{ext}");
        }
        });
    }

    /// 8 clients send a PATCH with the same If-Match at once: exactly one is applied
    /// (200, a new tag); the other 7 get 412 naming the winner's version, and the stored
    /// document is the winner's.
    #[test]
    fn concurrent_patches_with_one_if_match_have_one_winner() {
        on_each_pool(|server, _db| {
        let tag = server.create(1);
        let start = Barrier::new(8);
        let answers: Vec<(StatusCode, String, usize)> = std::thread::scope(|s| {
            let clients: Vec<_> = (0..8)
                .map(|i| {
                    let (server, start, tag) = (&server, &start, &tag);
                    s.spawn(move || {
                        start.wait();
                        let response = server.patch(1, MERGE, json!({ "writer": i }), Some(tag));
                        (response.status(), etag(&response), i)
                    })
                })
                .collect();
            clients.into_iter().map(|c| c.join().unwrap()).collect()
        });
        let winners: Vec<_> = answers.iter().filter(|(status, _, _)| *status == StatusCode::OK).collect();
        assert_eq!(winners.len(), 1, "{answers:?}");
        let (_, winning_tag, writer) = winners[0];
        for (status, current, _) in answers.iter().filter(|(status, _, _)| *status != StatusCode::OK) {
            assert_eq!(*status, StatusCode::PRECONDITION_FAILED);
            assert_eq!(current, winning_tag, "a 412 names the current version");
        }
        let (stored_tag, order) = server.get(1);
        assert_eq!((&stored_tag, &order["ext"]), (winning_tag, &json!({ "writer": writer })));
        });
    }

    /// Two instances of the service campaign for its background job: exactly one leads,
    /// and the lock row names it; when it shuts down (its job cancelled first) the other
    /// takes over with a larger fence.
    #[test]
    fn the_background_job_runs_on_one_instance_and_fails_over() {
        on_each_pool(|server, db| {
        let timing = ElectionTiming {
            lease: Duration::from_millis(900),
            renew_deadline: Duration::from_millis(600),
            retry_period: Duration::from_millis(150),
        };
        let (first, second) = {
            let _inside = server.runtime.enter();
            (
                (server.campaign)("instance 1", timing).unwrap(),
                (server.campaign)("instance 2", timing).unwrap(),
            )
        };
        let leading = |candidate: &AsyncCandidate| server.runtime.block_on(async {
            let mut leadership = candidate.leadership();
            let elected = tokio::time::timeout(Duration::from_secs(10), leadership.wait_for(|l| *l != Leadership::Following)).await;
            matches!(elected, Ok(Ok(_)))
        });
        let leader_row = || -> (Option<String>, i64) {
            occ_locks::table
                .filter(occ_locks::lock_name.eq("orders-service"))
                .select((occ_locks::label, occ_locks::fence))
                .first(&mut db.conn())
                .unwrap()
        };
        // Whichever wins, exactly one leads.
        server.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), async {
                while !first.is_leader() && !second.is_leader() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("an instance leads within 10 s");
        });
        assert!(first.is_leader() != second.is_leader(), "exactly one instance leads");
        let (leader, follower, label) = if first.is_leader() { (first, second, "instance 1") } else { (second, first, "instance 2") };
        let (row_label, fence) = leader_row();
        assert_eq!((row_label.as_deref(), fence), (Some(label), leader.fence()));

        server.runtime.block_on(leader.stop());
        assert!(leading(&follower), "the other instance takes over");
        assert!(follower.fence() > fence);
        assert_eq!(leader_row().1, follower.fence());
        server.runtime.block_on(follower.stop());
        });
    }
}
