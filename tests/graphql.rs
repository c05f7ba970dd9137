//! `/v1/graphql` on the real daemon (`examples/minimal`): a query agrees with `/v1/status`, and
//! a subscription over WebSocket (0.13's `graphql-ws`) reports a new schedule made from an edit.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::util::*;

const SOON: Duration = Duration::from_secs(10);

#[test]
fn a_query_and_a_subscription_on_the_daemon() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let first = wait_for(SOON, || daemon.json("/v1/schedule")).expect("a schedule");
    let status = daemon.wait_json(SOON, "/v1/status", "the schedule in force", |s| {
        s["schedule_id"] == first["hash"]
    });

    let query = json!({"query": "{ status { id name election { isLeader } schedule { hash } \
        roles { number list { name state } } fetch { state } } }"});
    let (code, body) = http_post(
        daemon.port,
        "/v1/graphql",
        "application/json",
        query.to_string().as_bytes(),
    );
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let gql = &answer["data"]["status"];
    assert_eq!(gql["id"], status["id"]);
    assert_eq!(gql["name"], json!("alpha.test"));
    assert_eq!(gql["election"]["isLeader"], json!(true));
    assert_eq!(gql["schedule"]["hash"], first["hash"]);
    assert_eq!(gql["roles"]["number"], status["roles"]);
    assert_eq!(gql["fetch"]["state"], json!("STABLE_LEADER"));
    assert!(
        gql["roles"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "web"),
        "{answer}"
    );
    let (code, body) = http_post(
        daemon.port,
        "/v1/graphql",
        "application/json",
        br#"{"query": "{ status { "}"#,
    );
    assert_eq!(code, 400, "{body}");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut socket = open_socket(daemon.port, "graphql-ws", &[]).await.unwrap();
        for message in [
            json!({"type": "connection_init", "payload": {}}),
            json!({"type": "start", "id": "1",
                   "payload": {"query": "subscription { status { schedule { hash } } }"}}),
        ] {
            send(&mut socket, message).await;
        }
        assert_eq!(
            receive(&mut socket).await,
            json!({"type": "connection_ack"})
        );
        let now = receive(&mut socket).await;
        assert_eq!(now["type"], json!("data"), "{now}");
        assert_eq!(
            now["payload"]["data"]["status"]["schedule"]["hash"],
            first["hash"]
        );

        // A runtime edit makes a new schedule; the subscription reports it unasked.
        std::fs::write(
            config.join("runtime/web/v7.yaml"),
            "image: web.v7\ninstances: 1\n",
        )
        .unwrap();
        let target = wait_for(SOON, || {
            let s = daemon.json("/v1/schedule")?;
            (s["data"]["roles"]["web"]["version"] == "v7").then(|| s["hash"].clone())
        })
        .expect("the new schedule");
        loop {
            let update = receive(&mut socket).await;
            assert_eq!(update["type"], json!("data"), "{update}");
            let hash = &update["payload"]["data"]["status"]["schedule"]["hash"];
            assert_ne!(
                hash, &first["hash"],
                "an unchanged result is not sent: {update}"
            );
            if hash == &target {
                break;
            }
        }
    });
}

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket to the daemon's `/v1/graphql` speaking `protocol`, with extra request `headers`;
/// the upgrade's answer (e.g. an HTTP 503) as the error when it is refused.
pub async fn open_socket(
    port: u16,
    protocol: &str,
    headers: &[(&'static str, &str)],
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    let mut request = format!("ws://127.0.0.1:{port}/v1/graphql")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol.parse().unwrap());
    for (name, value) in headers {
        request.headers_mut().insert(*name, value.parse().unwrap());
    }
    let (socket, response) = tokio_tungstenite::connect_async(request).await?;
    assert_eq!(response.headers()["sec-websocket-protocol"], protocol);
    Ok(socket)
}

/// Sends `message` as a text message.
pub async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::Text(message.to_string().into()))
        .await
        .unwrap();
}

/// The next text message, as JSON (10 s at most).
pub async fn receive(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(SOON, socket.next())
            .await
            .expect("a message within 10 s")
            .expect("the socket is open")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).unwrap();
        }
    }
}
