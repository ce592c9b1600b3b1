//! The OpenAPI 3.0 description of the admin API, written by hand (`GET /api/v5/openapi.json`).
//!
//! It describes exactly [`crate::ROUTES`] (a test checks both ways).

use serde_json::{json, Map, Value};

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_body(schema: Value) -> Value {
    json!({ "content": { "application/json": { "schema": schema } } })
}

fn ok(description: &str, schema: Value) -> Value {
    let mut v = json_body(schema);
    v["description"] = Value::String(description.to_string());
    v
}

/// An error response with the codes it may carry.
fn err(description: &str, codes: &[&str]) -> Value {
    ok(
        &format!("{description} (code: {})", codes.join(", ")),
        json!({
            "allOf": [
                schema_ref("Error"),
                { "type": "object", "properties": { "code": { "type": "string", "enum": codes } } }
            ]
        }),
    )
}

/// Responses every operation may return.
fn common_errors(responses: &mut Map<String, Value>) {
    responses.insert(
        "401".into(),
        err(
            "Missing or wrong bearer token; the response carries `WWW-Authenticate: Bearer`",
            &["BAD_TOKEN"],
        ),
    );
    responses.insert(
        "503".into(),
        err(
            "Streams are disabled, or the request took longer than the request timeout (10 s)",
            &["SERVICE_UNAVAILABLE"],
        ),
    );
    responses.insert(
        "500".into(),
        err("Storage or internal failure", &["INTERNAL_ERROR"]),
    );
}

fn body_errors(responses: &mut Map<String, Value>) {
    responses.entry("400").or_insert_with(|| {
        err(
            "Malformed JSON, missing `Content-Type: application/json`, unknown fields, wrong \
             types, or validation failures (every failing field listed as `field: reason`)",
            &["BAD_REQUEST"],
        )
    });
    responses.insert(
        "413".into(),
        err("Request body larger than 1 MiB", &["PAYLOAD_TOO_LARGE"]),
    );
}

fn op(
    id: &str,
    summary: &str,
    description: &str,
    params: Value,
    request: Option<Value>,
    success: (&str, Value),
    extra: &[(&str, Value)],
) -> Value {
    let mut responses = Map::new();
    responses.insert(success.0.to_string(), success.1);
    for (code, v) in extra {
        responses.insert((*code).to_string(), v.clone());
    }
    if request.is_some() {
        body_errors(&mut responses);
    }
    common_errors(&mut responses);
    let mut o = json!({
        "operationId": id,
        "summary": summary,
        "description": description,
        "tags": [if id.contains("tream") || id.contains("etting") { "streams" } else { "broker" }],
        "parameters": params,
        "responses": responses,
    });
    if let Some(r) = request {
        let mut b = json_body(r);
        b["required"] = Value::Bool(true);
        o["requestBody"] = b;
    }
    o
}

fn name_param() -> Value {
    json!([{
        "name": "name", "in": "path", "required": true,
        "description": "Stream name (`^[0-9a-zA-Z][-.0-9a-zA-Z_]*$`)",
        "schema": { "type": "string" }
    }])
}

fn streams_item(alias: bool) -> Value {
    let sfx = if alias { "_alias" } else { "" };
    let list_params = json!([
        { "name": "limit", "in": "query", "required": false,
          "description": "Page size, 1–10000 (default 100); out of range: 400",
          "schema": { "type": "integer", "minimum": 1, "maximum": 10000, "default": 100 } },
        { "name": "cursor", "in": "query", "required": false,
          "description": "`meta.cursor` of the previous page: the page starts strictly after \
                          this stream name",
          "schema": { "type": "string" } }
    ]);
    json!({
        "get": op(
            &format!("listStreams{sfx}"),
            "List streams",
            "Streams sorted by name, paginated with a cursor.",
            list_params,
            None,
            ("200", ok("A page of streams", schema_ref("StreamList"))),
            &[("400", err("Invalid `limit` or query string", &["BAD_REQUEST"]))],
        ),
        "post": op(
            &format!("createStream{sfx}"),
            "Create a stream",
            "Creates a stream; answers 200 with the new stream (as EMQX).",
            json!([]),
            Some(schema_ref("StreamDef")),
            ("200", ok("The created stream", schema_ref("StreamInfo"))),
            &[
                ("400", err("Malformed JSON, missing `Content-Type: application/json`, unknown fields, wrong types, validation failures (`field: reason`, all of them), or the stream limit reached", &["BAD_REQUEST", "MAX_STREAM_COUNT_REACHED"])),
                ("409", err("A stream of that name exists (EMQX answers 400)", &["ALREADY_EXISTS"])),
            ],
        ),
    })
}

fn stream_item(alias: bool) -> Value {
    let sfx = if alias { "_alias" } else { "" };
    json!({
        "get": op(
            &format!("getStream{sfx}"),
            "Show a stream",
            "The stream's definition, creation time and figures.",
            name_param(),
            None,
            ("200", ok("The stream", schema_ref("StreamInfo"))),
            &[("404", err("No stream of that name", &["NOT_FOUND"]))],
        ),
        "put": op(
            &format!("updateStream{sfx}"),
            "Update a stream",
            "Replaces the whole definition. `name` in the body may be omitted (the path name \
             is used) and otherwise must equal the path name; `topic_filter` and \
             `is_lastvalue` cannot change (400).",
            name_param(),
            Some(schema_ref("StreamUpdate")),
            ("200", ok("The updated stream", schema_ref("StreamInfo"))),
            &[("404", err("No stream of that name", &["NOT_FOUND"]))],
        ),
        "delete": op(
            &format!("deleteStream{sfx}"),
            "Delete a stream",
            "Deletes the stream and its index.",
            name_param(),
            None,
            ("204", json!({ "description": "Deleted (no body)" })),
            &[("404", err("No stream of that name", &["NOT_FOUND"]))],
        ),
    })
}

fn config_item(alias: bool) -> Value {
    let sfx = if alias { "_alias" } else { "" };
    json!({
        "get": op(
            &format!("getStreamSettings{sfx}"),
            "Show the global stream settings",
            "The settings in force.",
            json!([]),
            None,
            ("200", ok("The settings", schema_ref("GlobalSettings"))),
            &[],
        ),
        "put": op(
            &format!("putStreamSettings{sfx}"),
            "Replace the global stream settings",
            "Replaces the settings (missing fields take their defaults). Answers 200 with the \
             settings now in force (EMQX answers 204 without a body).",
            json!([]),
            Some(schema_ref("GlobalSettings")),
            ("200", ok("The new settings", schema_ref("GlobalSettings"))),
            &[],
        ),
    })
}

fn schemas() -> Value {
    let duration = json!({
        "oneOf": [
            { "type": "string", "example": "7d", "description": "number and unit: ms, s, m, h, d, w" },
            { "type": "integer", "minimum": 0, "description": "milliseconds" }
        ]
    });
    let limit = json!({
        "oneOf": [
            { "type": "string", "example": "infinity", "description": "\"infinity\", or bytes with KB/MB/GB" },
            { "type": "integer", "minimum": 1 }
        ],
        "default": "infinity"
    });
    let def_props = json!({
        "name": { "type": "string", "pattern": "^[0-9a-zA-Z][-.0-9a-zA-Z_]*$", "maxLength": 255 },
        "topic_filter": { "type": "string", "description": "MQTT topic filter (fixed after creation)" },
        "is_lastvalue": { "type": "boolean", "default": false, "description": "fixed after creation" },
        "key_expression": { "type": "string", "default": "message.from" },
        "data_retention_period": duration.clone(),
        "limits": {
            "type": "object", "additionalProperties": false,
            "properties": { "max_message_count": limit.clone(), "max_message_bytes": limit }
        },
        "read_max_unacked": { "type": "integer", "minimum": 1, "maximum": 65535, "default": 1000 }
    });
    let mut info_props = def_props.clone();
    info_props["created_at_us"] = json!({ "type": "integer", "description": "Unix µs" });
    info_props["stats"] = schema_ref("StreamStats");
    json!({
        "Error": {
            "type": "object", "required": ["code", "message"],
            "properties": { "code": { "type": "string" }, "message": { "type": "string" } }
        },
        "StreamDef": {
            "type": "object", "additionalProperties": false,
            "required": ["name", "topic_filter"], "properties": def_props.clone()
        },
        "StreamUpdate": {
            "type": "object", "additionalProperties": false,
            "required": ["topic_filter"], "properties": def_props
        },
        "StreamStats": {
            "type": "object",
            "properties": {
                "message_count": { "type": "integer" },
                "message_bytes": { "type": "integer" },
                "oldest_timestamp_us": { "type": "integer", "nullable": true },
                "newest_timestamp_us": { "type": "integer", "nullable": true },
                "subscribers": { "type": "integer" },
                "keyless_messages": { "type": "integer" }
            }
        },
        "StreamInfo": { "type": "object", "properties": info_props },
        "StreamList": {
            "type": "object",
            "properties": {
                "data": { "type": "array", "items": schema_ref("StreamInfo") },
                "meta": {
                    "type": "object", "required": ["hasnext", "limit"],
                    "properties": {
                        "hasnext": { "type": "boolean" },
                        "cursor": { "type": "string", "description": "present when hasnext: pass as `cursor` for the next page" },
                        "limit": { "type": "integer" },
                        "count": { "type": "integer", "description": "streams in this page" }
                    }
                }
            }
        },
        "GlobalSettings": {
            "type": "object", "additionalProperties": false,
            "properties": {
                "enable": { "type": "boolean", "default": true },
                "max_stream_count": { "type": "integer", "minimum": 1, "default": 1000 },
                "gc_interval": duration.clone(),
                "regular_stream_retention_period": duration.clone(),
                "check_stream_status_interval": duration,
                "auto_create": {
                    "type": "object", "additionalProperties": false,
                    "properties": {
                        "regular": { "type": "boolean", "default": false },
                        "lastvalue": {
                            "oneOf": [
                                { "type": "boolean" },
                                { "type": "object", "additionalProperties": false,
                                  "properties": { "key_expression": { "type": "string" } } }
                            ]
                        }
                    }
                }
            }
        }
    })
}

/// The document.
pub fn document() -> Value {
    let reload = op(
        "reloadAuthorization",
        "Reload the authorization rules",
        "Re-reads the ACL file and swaps the rules in; the old rules stay in force on error.",
        json!([]),
        None,
        (
            "200",
            ok(
                "Reloaded",
                json!({ "type": "object", "properties": { "message": { "type": "string", "description": "summary" } } }),
            ),
        ),
        &[(
            "400",
            err(
                "The rules do not parse; the message says where (file:line:col)",
                &["RELOAD_FAILED"],
            ),
        )],
    );
    let stats = op(
        "getStats",
        "Broker statistics",
        "Counters and gauges of the broker, as JSON.",
        json!([]),
        None,
        ("200", ok("Statistics", json!({ "type": "object" }))),
        &[],
    );
    let openapi = op(
        "getOpenApi",
        "This document",
        "The OpenAPI 3.0 description of the admin API.",
        json!([]),
        None,
        ("200", ok("OpenAPI document", json!({ "type": "object" }))),
        &[],
    );
    let mut paths = Map::new();
    paths.insert("/api/v5/streams".into(), streams_item(false));
    paths.insert("/api/v5/stream/{name}".into(), stream_item(false));
    paths.insert("/api/v5/streams/config".into(), config_item(false));
    paths.insert("/api/v5/message_streams/streams".into(), streams_item(true));
    paths.insert(
        "/api/v5/message_streams/streams/{name}".into(),
        stream_item(true),
    );
    paths.insert("/api/v5/message_streams/config".into(), config_item(true));
    paths.insert(
        "/api/v5/authorization/reload".into(),
        json!({ "post": reload }),
    );
    paths.insert("/api/v5/stats".into(), json!({ "get": stats }));
    paths.insert("/api/v5/openapi.json".into(), json!({ "get": openapi }));
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "lanemq admin API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Named streams (EMQX 6.1 compatible paths), global stream settings, \
                            authorization reload and statistics. Every request needs \
                            `Authorization: Bearer <token>`. Errors are JSON \
                            `{\"code\",\"message\"}`; an unknown path is 404 `NOT_FOUND`, a \
                            wrong method 405 `METHOD_NOT_ALLOWED`. The `/message_streams/...` \
                            paths are aliases of the `/streams`, `/stream/{name}` and \
                            `/streams/config` paths."
        },
        "servers": [{ "url": "/" }],
        "security": [{ "bearer": [] }],
        "tags": [{ "name": "streams" }, { "name": "broker" }],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": schemas(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_covers_exactly_the_routes() {
        let doc = document();
        let paths = doc["paths"].as_object().expect("paths");
        let mut documented = Vec::new();
        for (p, item) in paths {
            for m in item.as_object().expect("item").keys() {
                documented.push((m.to_ascii_uppercase(), p.clone()));
            }
        }
        documented.sort();
        let mut routes: Vec<(String, String)> = crate::ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        routes.sort();
        assert_eq!(documented, routes);
    }

    #[test]
    fn operation_ids_are_unique_and_refs_resolve() {
        let doc = document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for piece in text.split("#/components/schemas/").skip(1) {
            let name: String = piece.chars().take_while(|c| c.is_alphanumeric()).collect();
            assert!(schemas.contains_key(&name), "dangling $ref {name}");
        }
        let mut ids = Vec::new();
        for item in doc["paths"].as_object().expect("paths").values() {
            for o in item.as_object().expect("item").values() {
                ids.push(o["operationId"].as_str().expect("id").to_string());
            }
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }
}
