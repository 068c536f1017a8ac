//! etcd's HTTP/JSON gateway on the client port: `POST /v3/<service>/<call>` with a JSON body
//! is the gRPC call the protos' `google.api.http` options name (the table build.rs generates;
//! `/v3beta/` the same paths for older clients). The JSON is the proto3
//! mapping etcd's gateway uses: the protos' own field names, 64-bit integers as strings, bytes
//! as base64, enums by name, fields at their default left out (pbjson, generated from etcd's
//! protos).
//!
//! A call goes through this member's own gRPC router in-process, with its layers (the learner
//! gate, metrics) and the caller's identity: the `Authorization` header is the token (as
//! etcd's), a TLS client certificate's name rides along, and `Grpc-Metadata-<name>` headers
//! become metadata. Errors are etcd 3.5's gateway's: the HTTP status of the gRPC code and
//! `{"error": ..., "code": ..., "message": ...}`. Streaming calls (`/v3/watch`,
//! `/v3/lease/keepalive`, `/v3/maintenance/snapshot`, `/v3/election/observe`) read requests as
//! JSON values one after another in the body and answer `{"result": ...}` per message, one per
//! line, over one response (an error ends it as `{"error": {...}}`).

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method as HttpMethod, Request, Response, StatusCode};
use axum::routing::any;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tonic::Code;
use tower::ServiceExt;

/// etcd's messages with serde, generated from its protos (build.rs).
#[allow(clippy::all, missing_debug_implementations)]
pub mod pb {
    /// One package's messages and their serde (`OUT_DIR/gateway/<package>{,.serde}.rs`).
    macro_rules! package {
        ($name:ident) => {
            pub mod $name {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/gateway/",
                    stringify!($name),
                    ".rs"
                ));
                include!(concat!(
                    env!("OUT_DIR"),
                    "/gateway/",
                    stringify!($name),
                    ".serde.rs"
                ));
            }
        };
    }
    package!(etcdserverpb);
    package!(mvccpb);
    package!(authpb);
    package!(v3lockpb);
    package!(v3electionpb);
}

/// One gateway path: the gRPC call it is, and its messages' JSON codecs.
#[derive(Debug)]
pub(super) struct Method {
    path: &'static str,
    grpc: &'static str,
    client_streaming: bool,
    server_streaming: bool,
    /// JSON in, protobuf out (or what is wrong with the JSON).
    request: fn(&[u8]) -> Result<Vec<u8>, Transcode>,
    /// Protobuf in, JSON out.
    response: fn(&[u8]) -> Result<String, Transcode>,
}

/// A message that could not be carried between JSON and protobuf.
#[derive(Debug, thiserror::Error)]
pub(super) enum Transcode {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Protobuf(#[from] prost::DecodeError),
}

include!(concat!(env!("OUT_DIR"), "/gateway/methods.rs"));

fn json_to_proto<T: prost::Message + serde::de::DeserializeOwned>(
    json: &[u8],
) -> Result<Vec<u8>, Transcode> {
    let message: T = serde_json::from_slice(json)?;
    Ok(message.encode_to_vec())
}

fn proto_to_json<T: prost::Message + Default + serde::Serialize>(
    bytes: &[u8],
) -> Result<String, Transcode> {
    let message = T::decode(bytes)?;
    Ok(serde_json::to_string(&message)?)
}

/// The prefixes under which etcd's gateway serves the same paths (3.4 and 3.6 alike: not
/// `/v3alpha/`, which they answer 404).
const PREFIXES: [&str; 2] = ["/v3/", "/v3beta/"];

fn method_of(path: &str) -> Option<&'static Method> {
    let rest = PREFIXES.iter().find_map(|p| path.strip_prefix(p))?;
    METHODS
        .iter()
        .find(|m| m.path.strip_prefix("/v3/") == Some(rest))
}

/// `router` (the gRPC services and their layers) with the gateway's paths added; a body larger
/// than `max_body` bytes is refused.
pub fn add(router: axum::Router, max_body: usize) -> axum::Router {
    let grpc = router.clone();
    let handler = move |request: Request<Body>| {
        let grpc = grpc.clone();
        async move { Ok::<_, Infallible>(serve(grpc, request, max_body).await) }
    };
    let mut router = router;
    for prefix in PREFIXES {
        router = router.route(&format!("{prefix}{{*call}}"), any(handler.clone()));
    }
    router
}

/// The HTTP status etcd's gateway answers for a gRPC code (grpc-gateway's table).
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A response with etcd's gateway headers: JSON, and the CORS headers etcd sends (browsers may
/// call it from any origin).
fn json_response(status: StatusCode, body: impl Into<Body>) -> Response<Body> {
    use axum::http::header;
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    let headers = r.headers_mut();
    let mut set = |name, value| headers.insert(name, HeaderValue::from_static(value));
    set(header::CONTENT_TYPE, "application/json");
    set(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*");
    set(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        "POST, GET, OPTIONS, PUT, DELETE",
    );
    set(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        "accept, content-type, authorization",
    );
    r
}

/// etcd's gateway error of a unary call.
fn error(status: &tonic::Status) -> Response<Body> {
    let body = serde_json::json!({
        "error": status.message(),
        "code": status.code() as i32,
        "message": status.message(),
    });
    json_response(http_status(status.code()), body.to_string())
}

/// etcd's gateway error inside a stream (one line).
fn stream_error(status: &tonic::Status) -> String {
    let http = http_status(status.code());
    let body = serde_json::json!({"error": {
        "grpc_code": status.code() as i32,
        "http_code": http.as_u16(),
        "message": status.message(),
        "http_status": http.canonical_reason().unwrap_or(""),
    }});
    format!("{body}\n")
}

/// A gRPC frame of `message` (uncompressed).
fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(message);
    out.freeze()
}

/// The next whole gRPC message in `buf`, if one has arrived.
fn deframe(buf: &mut BytesMut) -> Option<Bytes> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    buf.advance(5);
    Some(buf.split_to(len).freeze())
}

/// Headers that gRPC itself sets (a `Grpc-Metadata-` header does not replace them, as gRPC's
/// own clients refuse to send them as metadata).
fn reserved(name: &str) -> bool {
    matches!(name, "content-type" | "te" | "user-agent") || name.starts_with("grpc-")
}

/// The gRPC request for `method`, with the HTTP request's identity and metadata.
fn grpc_request(method: &Method, http: &Request<Body>, body: Body) -> Request<Body> {
    let mut out = Request::new(body);
    *out.method_mut() = HttpMethod::POST;
    *out.uri_mut() = method.grpc.parse().expect("a gRPC path");
    let headers = out.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    for (name, value) in http.headers() {
        let name = name.as_str();
        if name == "authorization" {
            headers.insert("authorization", value.clone());
        } else if let Some(meta) = name.strip_prefix("grpc-metadata-")
            && !reserved(meta)
            && let Ok(meta) = axum::http::HeaderName::from_bytes(meta.as_bytes())
        {
            headers.insert(meta, value.clone());
        }
    }
    if let Some(conn) = http.extensions().get::<crate::tls::ConnInfo>() {
        out.extensions_mut().insert(conn.clone());
    }
    out
}

/// The status a gRPC response ends with (in its headers when it failed at once, else in its
/// trailers).
fn status_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> tonic::Status {
    tonic::Status::from_header_map(headers)
        .or_else(|| trailers.and_then(tonic::Status::from_header_map))
        .unwrap_or_else(|| tonic::Status::unknown("the call ended without a status"))
}

async fn serve(grpc: axum::Router, request: Request<Body>, max_body: usize) -> Response<Body> {
    let Some(method) = method_of(request.uri().path()) else {
        return error(&tonic::Status::not_found("Not Found"));
    };
    if request.method() == HttpMethod::OPTIONS {
        // (a browser's preflight: the CORS headers are the answer)
        return json_response(StatusCode::OK, Body::empty());
    }
    if request.method() != HttpMethod::POST {
        // (etcd 3.6's answer; 3.4 and 3.5 said 405 in plain text)
        return error(&tonic::Status::unimplemented("Method Not Allowed"));
    }
    let (parts, body) = request.into_parts();
    let head = Request::from_parts(parts, Body::empty());
    let messages = if method.client_streaming {
        stream_requests(method, body, max_body)
    } else {
        match one_request(method, body, max_body).await {
            Ok(message) => Body::from(frame(&message)),
            Err(status) => return error(&status),
        }
    };
    let call = grpc_request(method, &head, messages);
    let Ok(response) = grpc.oneshot(call).await;
    if method.server_streaming {
        stream_responses(method, response)
    } else {
        one_response(method, response).await
    }
}

fn too_large(limit: usize) -> tonic::Status {
    tonic::Status::resource_exhausted(format!(
        "the request body is larger than {limit} bytes (--max-request-bytes)"
    ))
}

/// The one request of a unary or server-streaming call (an empty body: the message with every
/// field at its default, as etcd's gateway).
async fn one_request(
    method: &Method,
    body: Body,
    max_body: usize,
) -> Result<Vec<u8>, tonic::Status> {
    let bytes = axum::body::to_bytes(body, max_body)
        .await
        .map_err(|_| too_large(max_body))?;
    let json: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    (method.request)(json).map_err(|e| tonic::Status::invalid_argument(e.to_string()))
}

/// The requests of a client-streaming call: JSON values one after another in the body, each
/// sent as a message when it is whole. A malformed one ends the requests and the call goes on
/// (as etcd's gateway: its watchers keep streaming); the error is logged.
fn stream_requests(method: &'static Method, body: Body, max_body: usize) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let mut body = body.into_data_stream();
        let mut buf = BytesMut::new();
        while let Some(Ok(chunk)) = tokio_stream::StreamExt::next(&mut body).await {
            buf.extend_from_slice(&chunk);
            loop {
                let mut values =
                    serde_json::Deserializer::from_slice(&buf).into_iter::<serde::de::IgnoredAny>();
                let end = match values.next() {
                    Some(Ok(_)) => values.byte_offset(),
                    Some(Err(e)) if e.is_eof() => break,
                    None => break,
                    Some(Err(e)) => return malformed(method, &e.to_string()),
                };
                let value = buf.split_to(end);
                let message = match (method.request)(&value) {
                    Ok(message) => message,
                    Err(e) => return malformed(method, &e.to_string()),
                };
                if tx.send(Ok(frame(&message))).await.is_err() {
                    return;
                }
            }
            if buf.len() > max_body {
                return malformed(method, too_large(max_body).message());
            }
        }
        // (the client closed its side: the call sees its requests end)
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn malformed(method: &Method, error: &str) {
    tracing::warn!(
        call = method.path,
        error,
        "the gateway stopped reading a stream's requests: one is not valid JSON for the call"
    );
}

async fn one_response(method: &Method, response: Response<Body>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        return error(&tonic::Status::unavailable("the call ended early"));
    };
    let trailers = collected.trailers().cloned();
    let status = status_of(&parts.headers, trailers.as_ref());
    if status.code() != Code::Ok {
        return error(&status);
    }
    let mut data = BytesMut::from(collected.to_bytes());
    let Some(message) = deframe(&mut data) else {
        return error(&tonic::Status::internal("the call answered no message"));
    };
    match (method.response)(&message) {
        Ok(json) => json_response(StatusCode::OK, json),
        Err(e) => error(&tonic::Status::internal(e.to_string())),
    }
}

/// A streaming call's messages, `{"result": ...}` one per line, as they come.
fn stream_responses(method: &'static Method, response: Response<Body>) -> Response<Body> {
    let (parts, mut body) = response.into_parts();
    // (failed before its first message: the error's own HTTP status)
    if let Some(status) = tonic::Status::from_header_map(&parts.headers)
        && status.code() != Code::Ok
    {
        return json_response(http_status(status.code()), stream_error(&status));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let mut buf = BytesMut::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            match frame.into_data() {
                Ok(data) => buf.extend_from_slice(&data),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
            while let Some(message) = deframe(&mut buf) {
                let line = match (method.response)(&message) {
                    Ok(json) => format!("{{\"result\":{json}}}\n"),
                    Err(e) => stream_error(&tonic::Status::internal(e.to_string())),
                };
                if tx.send(Ok(Bytes::from(line))).await.is_err() {
                    return;
                }
            }
        }
        let status = status_of(&parts.headers, trailers.as_ref());
        if status.code() != Code::Ok {
            let _ = tx.send(Ok(Bytes::from(stream_error(&status)))).await;
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    json_response(StatusCode::OK, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_v3_and_v3beta_name_the_calls_of_etcds_protos() {
        let range = method_of("/v3/kv/range").expect("/v3/kv/range");
        assert_eq!(range.grpc, "/etcdserverpb.KV/Range");
        assert!(!range.client_streaming && !range.server_streaming);
        assert_eq!(
            method_of("/v3beta/kv/range").map(|m| m.grpc),
            Some(range.grpc)
        );
        assert!(method_of("/v3alpha/kv/range").is_none());
        assert!(method_of("/v3/kv/nothing").is_none());
        // (an additional binding of the protos)
        assert_eq!(
            method_of("/v3/kv/lease/revoke").map(|m| m.grpc),
            Some("/etcdserverpb.Lease/LeaseRevoke")
        );
        let watch = method_of("/v3/watch").expect("/v3/watch");
        assert!(watch.client_streaming && watch.server_streaming);
        let observe = method_of("/v3/election/observe").expect("observe");
        assert!(!observe.client_streaming && observe.server_streaming);
        assert_eq!(
            method_of("/v3/lock/lock").map(|m| m.grpc),
            Some("/v3lockpb.Lock/Lock")
        );
    }

    #[test]
    fn json_is_etcds_mapping_both_ways() {
        let range = method_of("/v3/kv/range").unwrap();
        let bytes = (range.request)(br#"{"key":"Zm9v","rangeEnd":"Zm9w","limit":"5"}"#).unwrap();
        let back = proto_to_json::<pb::etcdserverpb::RangeRequest>(&bytes).unwrap();
        assert_eq!(back, r#"{"key":"Zm9v","range_end":"Zm9w","limit":"5"}"#);
        assert!((range.request)(br#"{"key":1}"#).is_err());
        assert!((range.request)(br#"{"key":"Zm9v","unknown":1}"#).is_ok());
    }

    /// Bad input of any shape is an error, never a panic, for every call's codecs (seeded: the
    /// seed is printed, `GATEWAY_FUZZ_SEED` replays it).
    #[test]
    fn arbitrary_bodies_are_errors_never_panics() {
        use rand::{Rng, SeedableRng};
        let seed = std::env::var("GATEWAY_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random::<u64>);
        println!("GATEWAY_FUZZ_SEED={seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let shapes: [&[u8]; 12] = [
            b"",
            b"null",
            b"[]",
            b"\"key\"",
            br#"{"key":"not base64!"}"#,
            br#"{"key":"Zm9v","limit":"99999999999999999999999"}"#,
            br#"{"key":"Zm9v","limit":1e400}"#,
            br#"{"key":"Zm9v","sort_order":"SIDEWAYS"}"#,
            br#"{"compare":[{"target":7,"result":"NOPE"}]}"#,
            br#"{"success":[{"request_put":{"key":{"nested":true}}}]}"#,
            br#"{"create_request":{"key":"Zm9v","filters":["NOPUT",3,"X"]}}"#,
            &[b'['; 4096],
        ];
        for m in METHODS {
            for shape in shapes {
                let _ = (m.request)(shape);
                let _ = (m.response)(shape);
            }
            for _ in 0..200 {
                let len = rng.random_range(0..64);
                let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let _ = (m.request)(&bytes);
                let _ = (m.response)(&bytes);
                // (a valid body cut short)
                let valid = br#"{"key":"Zm9v","range_end":"Zm9w","limit":"3","serializable":true}"#;
                let _ = (m.request)(&valid[..rng.random_range(0..valid.len())]);
            }
        }
    }

    #[test]
    fn grpc_metadata_headers_become_metadata_but_never_grpcs_own() {
        let range = method_of("/v3/kv/range").unwrap();
        let http = Request::builder()
            .header("authorization", "tok")
            .header("grpc-metadata-hasleader", "true")
            .header("grpc-metadata-content-type", "text/plain")
            .header("grpc-metadata-grpc-timeout", "1n")
            .header("x-other", "no")
            .body(Body::empty())
            .unwrap();
        let out = grpc_request(range, &http, Body::empty());
        let h = out.headers();
        assert_eq!(out.uri().path(), "/etcdserverpb.KV/Range");
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["authorization"], "tok");
        assert_eq!(h["hasleader"], "true");
        assert!(h.get("grpc-timeout").is_none() && h.get("x-other").is_none());
    }

    #[test]
    fn frames_split_where_grpc_puts_them() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&frame(b"one"));
        buf.extend_from_slice(&frame(b""));
        let two = frame(b"two");
        buf.extend_from_slice(&two[..4]);
        assert_eq!(deframe(&mut buf).as_deref(), Some(&b"one"[..]));
        assert_eq!(deframe(&mut buf).as_deref(), Some(&b""[..]));
        assert_eq!(deframe(&mut buf), None);
        buf.extend_from_slice(&two[4..]);
        assert_eq!(deframe(&mut buf).as_deref(), Some(&b"two"[..]));
    }

    #[test]
    fn grpc_codes_get_grpc_gateways_http_statuses() {
        for (code, status) in [
            (Code::InvalidArgument, 400),
            (Code::Unauthenticated, 401),
            (Code::PermissionDenied, 403),
            (Code::NotFound, 404),
            (Code::ResourceExhausted, 429),
            (Code::Unknown, 500),
            (Code::Unimplemented, 501),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
        ] {
            assert_eq!(http_status(code).as_u16(), status, "{code:?}");
        }
    }
}
