//! The OpenAPI 3.0 description of the admin API, written by hand (`GET /api/v5/openapi.json`).
//!
//! It describes exactly [`crate::ROUTES`] (a test checks both ways).

use serde_json::{json, Map, Value};

// What the server checks, as patterns (ECMA-262 with lookahead), so that a request the document
// allows is accepted and one it refuses is refused.

/// An MQTT topic name a publish may use: not empty, no `+`, `#` or NUL, not `$SYS` or under it.
const TOPIC_NAME: &str = r"^(?!\$SYS(/|$))[^+#\u0000]+$";
/// An MQTT topic filter: `#` last and alone in its level, `+` alone in its level, no NUL.
const FILTER: &str =
    r"^(#|([^/+#\u0000]+|\+)(/([^/+#\u0000]*|\+))*(/#)?|(/([^/+#\u0000]*|\+))+(/#)?)$";
/// A named stream's filter: an MQTT filter, not a shared subscription's or a `$stream` one.
const STREAM_FILTER: &str = r"^(?!\$share/|\$queue/|\$stream/|\$s/|\$stream$)(#|([^/+#\u0000]+|\+)(/([^/+#\u0000]*|\+))*(/#)?|(/([^/+#\u0000]*|\+))+(/#)?)$";
/// A lite parent's pattern: exactly one `{lane}` level, literal levels and `+` around it, a
/// trailing `#` after it, not starting with `$`.
const LITE_PATTERN: &str = r"^(?!\$)((\+|[^/+#{}\u0000]*)/)*\{lane\}(/(\+|[^/+#{}\u0000]*))*(/#)?$";
/// A stream read's `offset`: empty (earliest), `earliest`, `latest` (any case), a timestamp or
/// `@` and a position, up to 19 digits.
const OFFSET: &str =
    r"^(|[Ee][Aa][Rr][Ll][Ii][Ee][Ss][Tt]|[Ll][Aa][Tt][Ee][Ss][Tt]|@?[0-9]{1,19})$";
/// A duration as text: 1-10 digits and a unit (`ms`, `s`, `m`, `h`, `d`, `w`; none: seconds).
const DURATION: &str = r"^[0-9]{1,10}(ms|s|m|h|d|w)?$";
/// ... above zero.
const DURATION_POSITIVE: &str = r"^(?=[0-9]{1,10}(ms|s|m|h|d|w)?$)0*[1-9]";
/// ... at least one second.
const DURATION_1S: &str =
    r"^(?=[0-9]{1,10}(ms|s|m|h|d|w)?$)(0*[1-9][0-9]{3,}ms|0*[1-9][0-9]*(s|m|h|d|w)?)$";
/// A count or byte limit as text: `infinity` (any case) or 1-10 digits above zero with an
/// optional unit `B`, `KB`, `MB`, `GB` (any case).
const LIMIT: &str = r"^([Ii][Nn][Ff][Ii][Nn][Ii][Tt][Yy]|(?=[0-9]{1,10}([KkMmGg]?[Bb])?$)0*[1-9][0-9]*([KkMmGg]?[Bb])?)$";
/// Canonical, padded base64 (the bits past the last byte zero).
const BASE64: &str =
    r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=|[A-Za-z0-9+/][AQgw]==)?$";
/// A stream name.
const STREAM_NAME: &str = r"^[0-9a-zA-Z][-.0-9a-zA-Z_]*$";
/// A lite parent name.
const PARENT_NAME: &str = r"^[A-Za-z0-9_.-]{1,64}$";

/// A duration as the server writes it in answers.
fn duration_out() -> Value {
    json!({ "type": "string", "pattern": "^[0-9]+(ms|s|m|h|d)$", "example": "7d" })
}

/// A duration: text matching `text` or milliseconds from `min_ms`.
fn duration(text: &str, min_ms: u64) -> Value {
    json!({
        "oneOf": [
            { "type": "string", "pattern": text, "example": "7d",
              "description": "number (1-10 digits) and unit: ms, s, m, h, d, w (none: s)" },
            { "type": "integer", "minimum": min_ms, "maximum": u64::MAX, "description": "milliseconds" }
        ]
    })
}

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
        "tags": [tag_of(id)],
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

fn tag_of(id: &str) -> &'static str {
    if id.contains("Client")
        || id.contains("Subscription")
        || id.starts_with("publish")
        || id.contains("Retained")
    {
        "clients"
    } else if id.contains("tream") || id.contains("etting") {
        "streams"
    } else if ["Parent", "Lane", "Lite", "Group"]
        .iter()
        .any(|w| id.contains(w))
    {
        "lanes"
    } else {
        "broker"
    }
}

fn name_param() -> Value {
    json!([{
        "name": "name", "in": "path", "required": true,
        "description": "Stream name",
        "schema": { "type": "string", "pattern": STREAM_NAME, "maxLength": 255 }
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

fn stream_messages_item(alias: bool) -> Value {
    let sfx = if alias { "_alias" } else { "" };
    let mut params = name_param();
    if let Value::Array(a) = &mut params {
        a.push(query_param(
            "offset",
            "Where to start, as the MQTT `stream-offset` user property: `earliest` (default), \
             `latest`, a Unix timestamp in microseconds, or `@N` (after position `N`; a page's \
             `next` value)",
            json!({ "type": "string", "pattern": OFFSET }),
        ));
        a.push(query_param(
            "limit",
            "Largest number of messages (1-1000, default 100)",
            json!({ "type": "integer", "minimum": 1, "maximum": 1000 }),
        ));
    }
    json!({
        "get": op(
            &format!("readStream{sfx}"),
            "Read a stream's messages",
            "Up to `limit` messages of the stream from `offset`, oldest first, and `next`: the \
             `offset` that continues after them (polling with it follows the stream live). \
             A UTF-8 payload is returned as text, any other in base64 (`payload_encoding`).",
            params,
            None,
            ("200", ok("A page of messages", schema_ref("StreamMessages"))),
            &[
                ("400", err("Invalid `offset` or `limit`", &["BAD_REQUEST"])),
                ("404", err("No stream of that name", &["NOT_FOUND"])),
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
             `is_lastvalue` cannot change (409 CONFLICT).",
            name_param(),
            Some(schema_ref("StreamUpdate")),
            ("200", ok("The updated stream", schema_ref("StreamInfo"))),
            &[
                ("404", err("No stream of that name", &["NOT_FOUND"])),
                ("409", err("`topic_filter` or `is_lastvalue` differs from the stream's", &["CONFLICT"])),
            ],
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
            ("200", ok("The settings", schema_ref("GlobalSettingsInfo"))),
            &[],
        ),
        "put": op(
            &format!("putStreamSettings{sfx}"),
            "Replace the global stream settings",
            "Replaces the settings (missing fields take their defaults). Answers 200 with the \
             settings now in force (EMQX answers 204 without a body).",
            json!([]),
            Some(schema_ref("GlobalSettings")),
            ("200", ok("The new settings", schema_ref("GlobalSettingsInfo"))),
            &[],
        ),
    })
}

fn parent_param() -> Value {
    json!({
        "name": "name", "in": "path", "required": true,
        "description": "Lite parent name",
        "schema": { "type": "string", "pattern": PARENT_NAME }
    })
}

fn page_params() -> Vec<Value> {
    vec![
        json!({ "name": "limit", "in": "query", "required": false,
          "description": "Page size, 1–10000 (default 100); out of range: 400",
          "schema": { "type": "integer", "minimum": 1, "maximum": 10000, "default": 100 } }),
        json!({ "name": "after", "in": "query", "required": false,
          "description": "`meta.cursor` of the previous page (url-encoded): the page starts \
                          strictly after this lane key; `cursor` is an alias",
          "schema": { "type": "string" } }),
    ]
}

fn no_parent() -> (&'static str, Value) {
    ("404", err("No lite parent of that name", &["NOT_FOUND"]))
}

fn lanes_paths(paths: &mut Map<String, Value>) {
    let page_400 = (
        "400",
        err("Invalid `limit` or query string", &["BAD_REQUEST"]),
    );
    paths.insert(
        "/api/v5/lite/parents".into(),
        json!({
            "get": op(
                "listLiteParents",
                "List lite parents",
                "Every lite parent (configured or created over REST) in creation order, with its \
                 lane count.",
                json!([]),
                None,
                ("200", ok("The parents", schema_ref("LiteParentList"))),
                &[],
            ),
            "post": op(
                "createLiteParent",
                "Create a lite parent",
                "Creates a parent: publishes matching its pattern go into lanes from now on.",
                json!([]),
                Some(schema_ref("LiteParentDef")),
                ("200", ok("The created parent", schema_ref("LiteParentInfo"))),
                &[(
                    "409",
                    err(
                        "A parent of that name exists (ALREADY_EXISTS), or one with the same \
                         pattern (CONFLICT)",
                        &["ALREADY_EXISTS", "CONFLICT"],
                    ),
                )],
            ),
        }),
    );
    paths.insert(
        "/api/v5/lite/parents/{name}".into(),
        json!({
            "get": op(
                "getLiteParent",
                "Show a lite parent",
                "The parent's definition and lane count.",
                json!([parent_param()]),
                None,
                ("200", ok("The parent", schema_ref("LiteParentInfo"))),
                &[no_parent()],
            ),
            "put": op(
                "updateLiteParent",
                "Update a lite parent",
                "Replaces the whole definition (omitted fields take their defaults). `name` may \
                 be omitted (or empty) and otherwise must equal the path name. `pattern` and \
                 `key_levels` cannot change while the parent has lanes (409 CONFLICT).",
                json!([parent_param()]),
                Some(schema_ref("LiteParentUpdate")),
                ("200", ok("The updated parent", schema_ref("LiteParentInfo"))),
                &[
                    no_parent(),
                    ("409", err("The pattern or key_levels of a parent with lanes", &["CONFLICT"])),
                ],
            ),
            "delete": op(
                "deleteLiteParent",
                "Delete a lite parent",
                "Deletes the parent, its lanes (index, group offsets, in-flight state) and its \
                 groups. The messages stay in the log.",
                json!([parent_param()]),
                None,
                ("204", json!({ "description": "Deleted (no body)" })),
                &[no_parent()],
            ),
        }),
    );
    let mut lane_list_params = vec![parent_param()];
    lane_list_params.extend(page_params());
    paths.insert(
        "/api/v5/lite/parents/{name}/lanes".into(),
        json!({
            "get": op(
                "listLanes",
                "List the lanes of a parent",
                "Lanes sorted by key, paginated with a cursor.",
                Value::Array(lane_list_params),
                None,
                ("200", ok("A page of lanes", schema_ref("LaneList"))),
                &[no_parent(), page_400.clone()],
            ),
        }),
    );
    paths.insert(
        "/api/v5/lite/parents/{name}/lanes/{lane}".into(),
        json!({
            "get": op(
                "getLane",
                "Show a lane",
                "One lane with the figures of every group of its parent.",
                json!([parent_param(), {
                    "name": "lane", "in": "path", "required": true,
                    "description": "Lane key; a key of several levels is url-encoded \
                                    (`s%2F42`) or written as is (`s/42`)",
                    "schema": { "type": "string" }
                }]),
                None,
                ("200", ok("The lane", schema_ref("LaneDetail"))),
                &[("404", err("No lite parent of that name, or no such lane", &["NOT_FOUND"]))],
            ),
        }),
    );
    paths.insert(
        "/api/v5/lite/parents/{name}/groups".into(),
        json!({
            "get": op(
                "listLiteGroups",
                "List the groups of a parent",
                "The consumer groups (`$share/<group>/...` inside the parent) known to the \
                 dispatcher or stored, sorted by name.",
                json!([parent_param()]),
                None,
                ("200", ok("The groups", schema_ref("LiteGroupList"))),
                &[no_parent()],
            ),
        }),
    );
    let mut lag_params = vec![
        parent_param(),
        json!({ "name": "group", "in": "path", "required": true,
                "description": "Group name", "schema": { "type": "string" } }),
    ];
    lag_params.extend(page_params());
    paths.insert(
        "/api/v5/lite/parents/{name}/groups/{group}/lag".into(),
        json!({
            "get": op(
                "getGroupLag",
                "Lag of a group per lane",
                "The group's committed offset, in-flight messages and lag on each lane of the \
                 parent, lanes sorted by key, paginated with a cursor.",
                Value::Array(lag_params),
                None,
                ("200", ok("A page of lanes", schema_ref("GroupLagList"))),
                &[
                    ("404", err("No lite parent of that name, or no such group", &["NOT_FOUND"])),
                    page_400,
                ],
            ),
        }),
    );
    let mut metrics = op(
        "getLiteMetrics",
        "Lite-layer metrics",
        "Prometheus text exposition (format 0.0.4) of the lane gauges and counters. A request \
         whose `Accept` lists `application/json` and no text type (`text/plain`, `*/*`, \
         OpenMetrics) gets the same figures as one JSON object.",
        json!([]),
        None,
        ("200", ok("Metrics", json!({ "type": "object" }))),
        &[],
    );
    metrics["responses"]["200"]["content"]["text/plain"] =
        json!({ "schema": { "type": "string" } });
    paths.insert("/api/v5/lite/metrics".into(), json!({ "get": metrics }));
    for (path, id) in [
        ("/metrics", "getMetrics"),
        ("/api/v5/prometheus/stats", "getPrometheusStats"),
    ] {
        let mut whole = op(
            id,
            "Prometheus metrics of the whole broker",
            "Connections, sessions, messages and bytes per QoS, drops by reason, the log \
             (appends, fsync latency and group-commit histograms, segments), index lag, \
             every stream, lite parent and group, and the process (`docs/metrics.md`). \
             Prometheus text format 0.0.4; OpenMetrics 1.0 when `Accept` lists \
             `application/openmetrics-text`. Needs the token unless `[admin] \
             metrics_public = true`.",
            json!([]),
            None,
            ("200", json!({ "description": "Metrics" })),
            &[],
        );
        whole["responses"]["200"]["content"] = json!({
            "text/plain": { "schema": { "type": "string" } },
            "application/openmetrics-text": { "schema": { "type": "string" } }
        });
        paths.insert(path.into(), json!({ "get": whole }));
    }
}

fn lanes_schemas(s: &mut Value) {
    let def = json!({
        "name": { "type": "string", "pattern": PARENT_NAME },
        "pattern": { "type": "string", "example": "agents/{lane}/#", "pattern": LITE_PATTERN, "maxLength": 65535,
                     "description": "topic pattern with exactly one `{lane}` level; literal levels, `+`, a trailing `#`; not starting with `$`" },
        "key_levels": { "type": "integer", "minimum": 1, "maximum": 16, "default": 1,
                        "description": "topic levels the lane key spans, from `{lane}` (joined by `/`)" },
        "ttl_s": { "type": "integer", "minimum": 1, "maximum": 2592000, "default": 3600,
                   "description": "a lane expires after this many seconds without a publish" },
        "mode": { "type": "string", "enum": ["shared", "exclusive"], "default": "shared" },
        "max_attempts": { "type": "integer", "minimum": 1, "maximum": u32::MAX, "default": 16 },
        "max_lanes": { "type": "integer", "minimum": 1, "maximum": u64::MAX, "default": 10000000,
                       "description": "a publish creating one more lane is refused (PUBACK 0x97)" },
        "max_key_bytes": { "type": "integer", "minimum": 1, "maximum": 65535, "default": 64,
                           "description": "a longer key is refused (PUBACK 0x90)" },
        "batch": { "type": "integer", "minimum": 1, "maximum": 1024, "default": 32,
                   "description": "messages of one lane in flight to one member at once" },
        "ack_timeout_ms": { "type": "integer", "minimum": 0, "maximum": 86400000, "default": 10000,
                            "not": { "minimum": 1, "maximum": 49 },
                            "description": "a batch not fully acknowledged this long after it was handed to a member goes to another online member with DUP=1 (one attempt counted) and the holder gets no new batches until it sends a PUBACK or reconnects; 0 (off) or 50 to 86400000" }
    });
    let mut info = def.clone();
    info["lanes"] = json!({ "type": "integer", "description": "lanes the parent holds" });
    let lane = json!({
        "lane": { "type": "string", "description": "lane key" },
        "id": { "type": "integer", "description": "internal lane id" },
        "next_offset": { "type": "integer", "description": "offset the next publish gets" },
        "first_offset": { "type": "integer", "description": "oldest indexed offset (= next_offset when none)" },
        "last_publish_us": { "type": "integer" },
        "expires_at_us": { "type": "integer", "description": "last_publish_us + ttl_s" }
    });
    let group_lane = json!({
        "lane": { "type": "string" },
        "committed": { "type": "integer", "description": "the first unacknowledged offset" },
        "next_offset": { "type": "integer" },
        "lag": { "type": "integer", "description": "next_offset - committed" },
        "inflight": { "type": "integer", "description": "messages of the open batch not yet answered" },
        "paused_for_ms": { "type": "integer", "nullable": true, "description": "remaining suspend / retry pause" },
        "holder": { "type": "string", "nullable": true, "description": "client holding the open batch" }
    });
    let mut detail_group = group_lane.clone();
    detail_group["group"] = json!({ "type": "string" });
    let mut detail = lane.clone();
    detail["groups"] =
        json!({ "type": "array", "items": { "type": "object", "properties": detail_group } });
    let page_meta = json!({
        "type": "object", "required": ["hasnext", "limit"],
        "properties": {
            "hasnext": { "type": "boolean" },
            "cursor": { "type": "string", "description": "present when hasnext: pass as `after` (url-encoded) for the next page" },
            "limit": { "type": "integer" },
            "count": { "type": "integer", "description": "items in this page" }
        }
    });
    let list_meta = json!({ "type": "object", "properties": {
        "count": { "type": "integer" }, "hasnext": { "type": "boolean", "enum": [false] } } });
    let mut update = def.clone();
    update["name"] = json!({ "type": "string", "pattern": "^[A-Za-z0-9_.-]{0,64}$",
                             "description": "omitted or empty: the name in the path" });
    let add = [
        (
            "LiteParentDef",
            json!({ "type": "object", "additionalProperties": false,
                                  "required": ["name", "pattern"], "properties": def }),
        ),
        (
            "LiteParentUpdate",
            json!({ "type": "object", "additionalProperties": false,
                                  "required": ["pattern"], "properties": update }),
        ),
        (
            "LiteParentInfo",
            json!({ "type": "object", "properties": info }),
        ),
        (
            "LiteParentList",
            json!({ "type": "object", "properties": {
            "data": { "type": "array", "items": schema_ref("LiteParentInfo") }, "meta": list_meta.clone() } }),
        ),
        ("LaneInfo", json!({ "type": "object", "properties": lane })),
        (
            "LaneList",
            json!({ "type": "object", "properties": {
            "data": { "type": "array", "items": schema_ref("LaneInfo") }, "meta": page_meta.clone() } }),
        ),
        (
            "LaneDetail",
            json!({ "type": "object", "properties": detail }),
        ),
        (
            "LiteGroup",
            json!({ "type": "object", "properties": {
            "group": { "type": "string" },
            "members": { "type": "array", "items": { "type": "string" }, "description": "client ids" },
            "online_members": { "type": "integer" },
            "stuck_members": { "type": "array", "items": { "type": "string" },
                               "description": "client ids marked stuck: a batch not acknowledged within ack_timeout_ms, no PUBACK or new connection since" },
            "active_lanes": { "type": "integer", "description": "lanes with an open batch" },
            "inflight": { "type": "integer" } } }),
        ),
        (
            "LiteGroupList",
            json!({ "type": "object", "properties": {
            "data": { "type": "array", "items": schema_ref("LiteGroup") }, "meta": list_meta } }),
        ),
        (
            "GroupLane",
            json!({ "type": "object", "properties": group_lane }),
        ),
        (
            "GroupLagList",
            json!({ "type": "object", "properties": {
            "group": { "type": "string" },
            "data": { "type": "array", "items": schema_ref("GroupLane") }, "meta": page_meta } }),
        ),
    ];
    for (k, v) in add {
        s[k] = v;
    }
}

fn schemas() -> Value {
    let limit = json!({
        "oneOf": [
            { "type": "string", "example": "infinity", "pattern": LIMIT,
              "description": "\"infinity\", or a number (1-10 digits) with B, KB, MB or GB" },
            { "type": "integer", "minimum": 1, "maximum": u64::MAX }
        ],
        "default": "infinity"
    });
    let key_expression = json!({ "type": "string", "format": "key-expression", "default": "message.from",
        "description": "message.from, message.topic, message.username, message.qos, \
                        message.user_property.<name>, message.topic.<level>, \
                        payload.<JSON path from $> or json_value(message.payload,'a.b')" });
    let def_props = json!({
        "name": { "type": "string", "pattern": STREAM_NAME, "maxLength": 255 },
        "topic_filter": { "type": "string", "pattern": STREAM_FILTER, "description": "MQTT topic filter (fixed after creation)" },
        "is_lastvalue": { "type": "boolean", "default": false, "description": "fixed after creation" },
        "key_expression": key_expression.clone(),
        "data_retention_period": duration(DURATION_POSITIVE, 1),
        "limits": {
            "type": "object", "additionalProperties": false,
            "properties": { "max_message_count": limit.clone(), "max_message_bytes": limit }
        },
        "read_max_unacked": { "type": "integer", "minimum": 1, "maximum": 65535, "default": 1000 }
    });
    let mut info_props = def_props.clone();
    // What the server answers: any number of digits (an integer set in ms comes back as text).
    info_props["data_retention_period"] = duration_out();
    info_props["created_at_us"] = json!({ "type": "integer", "description": "Unix µs" });
    info_props["stats"] = schema_ref("StreamStats");
    let settings = json!({
        "type": "object", "additionalProperties": false,
        "properties": {
            "enable": { "type": "boolean", "default": true },
            "max_stream_count": { "type": "integer", "minimum": 1, "maximum": u32::MAX, "default": 1000 },
            "gc_interval": duration(DURATION_1S, 1000),
            "regular_stream_retention_period": duration(DURATION_POSITIVE, 1),
            "check_stream_status_interval": duration(DURATION, 0),
            "auto_create": {
                "type": "object", "additionalProperties": false,
                "properties": {
                    "regular": { "type": "boolean", "default": false },
                    "lastvalue": {
                        "oneOf": [
                            { "type": "boolean" },
                            { "type": "object", "additionalProperties": false,
                              "properties": { "key_expression": key_expression } }
                        ]
                    }
                }
            }
        }
    });
    let mut settings_out = settings.clone();
    for k in [
        "gc_interval",
        "regular_stream_retention_period",
        "check_stream_status_interval",
    ] {
        settings_out["properties"][k] = duration_out();
    }
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
        "GlobalSettings": settings.clone(),
        "GlobalSettingsInfo": settings_out,
        "StreamMessages": {
            "type": "object", "required": ["data", "next"],
            "properties": {
                "data": { "type": "array", "items": {
                    "type": "object",
                    "required": ["offset", "topic", "qos", "ts", "payload", "payload_encoding"],
                    "properties": {
                        "offset": { "type": "string", "example": "@42", "description": "the stream position" },
                        "topic": { "type": "string" },
                        "qos": { "type": "integer", "minimum": 0, "maximum": 2 },
                        "retain": { "type": "boolean" },
                        "ts": { "type": "integer", "description": "arrival, Unix ms" },
                        "key": { "type": "string", "nullable": true, "description": "last-value key" },
                        "from_clientid": { "type": "string" },
                        "payload": { "type": "string" },
                        "payload_encoding": { "type": "string", "enum": ["utf8", "base64"] },
                        "properties": { "type": "object", "description": "MQTT 5 message properties" }
                    }
                } },
                "next": { "type": "string", "description": "the `offset` that continues after this page" },
                "meta": { "type": "object" }
            }
        }
    })
}

fn clientid_param() -> Value {
    json!({
        "name": "clientid", "in": "path", "required": true,
        "description": "Client id (url-encoded)",
        "schema": { "type": "string" }
    })
}

fn paging_params() -> Vec<Value> {
    vec![
        json!({ "name": "page", "in": "query", "required": false,
                "description": "Page number, from 1", "schema": { "type": "integer", "minimum": 1, "maximum": usize::MAX, "default": 1 } }),
        json!({ "name": "limit", "in": "query", "required": false,
                "description": "Items per page", "schema": { "type": "integer", "minimum": 1, "maximum": 10000, "default": 100 } }),
    ]
}

fn query_param(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
}

fn clients_paths(paths: &mut Map<String, Value>) {
    let bad_query = (
        "400",
        err("Invalid `page`, `limit` or filter", &["BAD_REQUEST"]),
    );
    let no_client = (
        "404",
        err("No session with that client id", &["CLIENTID_NOT_FOUND"]),
    );
    let mut list_params = paging_params();
    list_params.extend([
        query_param(
            "username",
            "Only clients with this username",
            json!({ "type": "string" }),
        ),
        query_param(
            "like_clientid",
            "Only client ids that contain this text",
            json!({ "type": "string" }),
        ),
        query_param(
            "clientid_prefix",
            "Only client ids that begin with this text",
            json!({ "type": "string" }),
        ),
        query_param(
            "conn_state",
            "Only connected or only disconnected sessions",
            json!({ "type": "string", "enum": ["connected", "disconnected"] }),
        ),
    ]);
    paths.insert(
        "/api/v5/clients".into(),
        json!({ "get": op(
            "listClients",
            "List clients",
            "Every session, connected or not, sorted by client id, a page at a time.",
            Value::Array(list_params),
            None,
            ("200", ok("A page of clients", schema_ref("ClientList"))),
            std::slice::from_ref(&bad_query),
        ) }),
    );
    paths.insert(
        "/api/v5/clients/{clientid}".into(),
        json!({
            "get": op(
                "getClient",
                "Show a client",
                "One session, connected or not.",
                json!([clientid_param()]),
                None,
                ("200", ok("The client", schema_ref("ClientInfo"))),
                std::slice::from_ref(&no_client),
            ),
            "delete": op(
                "kickClient",
                "Kick a client",
                "A connected client gets DISCONNECT 0x98 Administrative action (MQTT 3.1.1: \
                 the connection is closed); its session stays if it has an expiry. A session \
                 whose client is not connected is discarded.",
                json!([clientid_param()]),
                None,
                ("204", json!({ "description": "Kicked or discarded" })),
                std::slice::from_ref(&no_client),
            ),
        }),
    );
    paths.insert(
        "/api/v5/clients/{clientid}/subscriptions".into(),
        json!({ "get": op(
            "listClientSubscriptions",
            "Subscriptions of a client",
            "Every subscription of one session, sorted by filter.",
            json!([clientid_param()]),
            None,
            ("200", ok("The subscriptions", json!({ "type": "array", "items": schema_ref("SubscriptionInfo") }))),
            &[no_client],
        ) }),
    );
    let mut sub_params = paging_params();
    sub_params.extend([
        query_param(
            "clientid",
            "Only this client's subscriptions",
            json!({ "type": "string" }),
        ),
        query_param(
            "topic",
            "Only this exact filter",
            json!({ "type": "string" }),
        ),
        query_param(
            "match_topic",
            "Only filters that contain this text",
            json!({ "type": "string" }),
        ),
        query_param(
            "qos",
            "Only this QoS",
            json!({ "type": "integer", "minimum": 0, "maximum": 2 }),
        ),
    ]);
    paths.insert(
        "/api/v5/subscriptions".into(),
        json!({ "get": op(
            "listSubscriptions",
            "List subscriptions",
            "Every subscription of every session, sorted by client id and filter, a page at a time.",
            Value::Array(sub_params),
            None,
            ("200", ok("A page of subscriptions", schema_ref("SubscriptionList"))),
            &[bad_query],
        ) }),
    );
    paths.insert(
        "/api/v5/status".into(),
        json!({ "get": {
            "operationId": "getStatus",
            "summary": "Health check",
            "description": "For load balancers and supervisors: 200 while the broker serves; 503 once it shuts down, or while its log refuses writes after a storage error (the text says why; restart the broker once the cause is fixed). No token.",
            "tags": ["broker"],
            "security": [],
            "parameters": [],
            "responses": {
                "200": { "description": "Running", "content": { "text/plain": { "schema": { "type": "string" } } } },
                "503": { "description": "Shutting down, or the log refuses writes (storage failure)", "content": { "text/plain": { "schema": { "type": "string" } } } }
            }
        } }),
    );
}

fn publish_paths(paths: &mut Map<String, Value>) {
    let accepted = (
        "202",
        ok(
            "Stored; no subscription matched (reason code 16)",
            schema_ref("PublishResult"),
        ),
    );
    let denied = (
        "403",
        err("The ACL denies `user:api` this topic", &["NOT_AUTHORIZED"]),
    );
    paths.insert(
        "/api/v5/publish".into(),
        json!({ "post": op(
            "publishMessage",
            "Publish a message",
            "Publishes as the `api` identity (username and client id `api`, address 127.0.0.1): \
             the ACL and the checks of a client's PUBLISH apply. The answer comes once the \
             message is stored (durable under the store's fsync policy) and routed.",
            json!([]),
            Some(schema_ref("PublishRequest")),
            ("200", ok("Stored and delivered", schema_ref("PublishResult"))),
            &[accepted, denied],
        ) }),
    );
    paths.insert(
        "/api/v5/publish/bulk".into(),
        json!({ "post": op(
            "publishBulk",
            "Publish several messages",
            "Up to 1000 messages, checked before any is published, then published in order. \
             One result per message: `{id}`, `{id, message, reason_code: 16}` or `{code, message}`.",
            json!([]),
            Some(json!({ "type": "array", "items": schema_ref("PublishRequest"), "minItems": 1, "maxItems": 1000 })),
            ("200", ok("One result per message", json!({ "type": "array", "items": { "type": "object" } }))),
            &[],
        ) }),
    );
}

fn retainer_paths(paths: &mut Map<String, Value>) {
    let topic = json!({
        "name": "topic", "in": "path", "required": true,
        "description": "The topic; its `/` as they are or url-encoded",
        "schema": { "type": "string" }
    });
    let missing = (
        "404",
        err("No retained message on that topic", &["NOT_FOUND"]),
    );
    let mut params = paging_params();
    params.push(query_param(
        "topic",
        "Only topics that match this MQTT filter",
        json!({ "type": "string", "pattern": FILTER }),
    ));
    paths.insert(
        "/api/v5/mqtt/retainer/messages".into(),
        json!({ "get": op(
            "listRetainedMessages",
            "List retained messages",
            "Retained messages sorted by topic, without payloads, a page at a time.",
            Value::Array(params),
            None,
            ("200", ok("A page of retained messages", json!({ "type": "object" }))),
            &[("400", err("Invalid `page`, `limit` or `topic` filter", &["BAD_REQUEST"]))],
        ) }),
    );
    paths.insert(
        "/api/v5/mqtt/retainer/message/{topic}".into(),
        json!({
            "get": op(
                "getRetainedMessage",
                "Show a retained message",
                "The retained message of a topic, its payload in base64.",
                json!([topic.clone()]),
                None,
                ("200", ok("The message", schema_ref("RetainedMessage"))),
                std::slice::from_ref(&missing),
            ),
            "delete": op(
                "deleteRetainedMessage",
                "Delete a retained message",
                "Removes the retained message of a topic; nothing is published.",
                json!([topic]),
                None,
                ("204", json!({ "description": "Deleted" })),
                &[missing],
            ),
        }),
    );
}

fn publish_schemas(s: &mut Value) {
    s["RetainedMessage"] = json!({
        "type": "object",
        "required": ["topic", "msgid", "qos", "from_clientid", "publish_at", "payload_bytes"],
        "properties": {
            "topic": { "type": "string" },
            "msgid": { "type": "string", "description": "The message's log offset" },
            "qos": { "type": "integer", "enum": [0, 1, 2] },
            "from_clientid": { "type": "string" },
            "from_username": { "type": "string", "nullable": true },
            "publish_at": { "type": "integer", "description": "Milliseconds since the epoch" },
            "payload_bytes": { "type": "integer" },
            "payload": { "type": "string", "description": "base64 (GET of one message only)" }
        }
    });
    s["PublishRequest"] = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["topic"],
        "oneOf": [
            { "required": ["payload_encoding"],
              "properties": { "payload_encoding": { "enum": ["base64"] },
                              "payload": { "type": "string", "pattern": BASE64 } } },
            { "properties": { "payload_encoding": { "enum": ["plain", null], "nullable": true } } }
        ],
        "properties": {
            "topic": { "type": "string", "pattern": TOPIC_NAME },
            "payload": { "type": "string", "default": "",
                         "description": "the payload as text, or base64 (padded) when payload_encoding is base64" },
            "payload_encoding": { "type": "string", "enum": ["plain", "base64", null], "nullable": true, "default": "plain" },
            "qos": { "type": "integer", "enum": [0, 1, 2], "default": 0 },
            "retain": { "type": "boolean", "default": false },
            "clientid": { "type": "string", "nullable": true, "description": "Accepted and ignored (EMQX compatibility)" },
            "properties": {
                "type": "object",
                "nullable": true,
                "additionalProperties": false,
                "properties": {
                    "payload_format_indicator": { "type": "integer", "enum": [0, 1, null], "nullable": true },
                    "message_expiry_interval": { "type": "integer", "minimum": 0, "maximum": u32::MAX, "nullable": true },
                    "content_type": { "type": "string", "nullable": true },
                    "response_topic": { "type": "string", "nullable": true },
                    "correlation_data": { "type": "string", "nullable": true },
                    "user_properties": { "type": "object", "additionalProperties": { "type": "string" } }
                }
            }
        }
    });
    s["PublishResult"] = json!({
        "type": "object",
        "required": ["id"],
        "properties": {
            "id": { "type": "string", "description": "The message's log offset" },
            "message": { "type": "string", "enum": ["no_matched_subscribers"] },
            "reason_code": { "type": "integer", "enum": [16] }
        }
    });
}

fn clients_schemas(s: &mut Value) {
    let page_meta = json!({
        "type": "object",
        "required": ["page", "limit", "count", "hasnext"],
        "properties": {
            "page": { "type": "integer" },
            "limit": { "type": "integer" },
            "count": { "type": "integer", "description": "Matching items on all pages" },
            "hasnext": { "type": "boolean" }
        }
    });
    s["ClientInfo"] = json!({
        "type": "object",
        "required": ["clientid", "connected", "proto_ver", "proto_name", "expiry_interval",
                     "subscriptions_cnt", "mqueue_len", "inflight_cnt", "mqueue_dropped"],
        "properties": {
            "clientid": { "type": "string" },
            "username": { "type": "string", "nullable": true },
            "ip_address": { "type": "string", "nullable": true, "description": "Of the current or last connection" },
            "connected": { "type": "boolean" },
            "connected_at": { "type": "integer", "nullable": true, "description": "Milliseconds since the epoch, current or last connection" },
            "proto_ver": { "type": "integer", "enum": [3, 4, 5] },
            "proto_name": { "type": "string", "enum": ["MQIsdp", "MQTT"] },
            "expiry_interval": { "type": "integer", "description": "Session Expiry Interval, seconds" },
            "subscriptions_cnt": { "type": "integer" },
            "mqueue_len": { "type": "integer", "description": "Messages queued for the client" },
            "inflight_cnt": { "type": "integer", "description": "QoS 1/2 deliveries not yet acknowledged" },
            "mqueue_dropped": { "type": "integer", "description": "Messages dropped for this session" }
        }
    });
    s["SubscriptionInfo"] = json!({
        "type": "object",
        "required": ["clientid", "topic", "qos", "nl", "rap", "rh"],
        "properties": {
            "clientid": { "type": "string" },
            "topic": { "type": "string", "description": "The filter as subscribed" },
            "qos": { "type": "integer", "enum": [0, 1, 2] },
            "nl": { "type": "integer", "enum": [0, 1], "description": "No Local" },
            "rap": { "type": "integer", "enum": [0, 1], "description": "Retain As Published" },
            "rh": { "type": "integer", "enum": [0, 1, 2], "description": "Retain Handling" }
        }
    });
    s["ClientList"] = json!({
        "type": "object", "required": ["data", "meta"],
        "properties": { "data": { "type": "array", "items": schema_ref("ClientInfo") }, "meta": page_meta.clone() }
    });
    s["SubscriptionList"] = json!({
        "type": "object", "required": ["data", "meta"],
        "properties": { "data": { "type": "array", "items": schema_ref("SubscriptionInfo") }, "meta": page_meta }
    });
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
    paths.insert(
        "/api/v5/stream/{name}/messages".into(),
        stream_messages_item(false),
    );
    paths.insert(
        "/api/v5/message_streams/streams/{name}/messages".into(),
        stream_messages_item(true),
    );
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
    lanes_paths(&mut paths);
    clients_paths(&mut paths);
    publish_paths(&mut paths);
    retainer_paths(&mut paths);
    let mut schemas = schemas();
    lanes_schemas(&mut schemas);
    clients_schemas(&mut schemas);
    publish_schemas(&mut schemas);
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
                            `/streams/config` paths. `/lite/...`: lite parents, their lanes, \
                            consumer groups and metrics (docs/lanes.md). `/clients`, \
                            `/subscriptions`: sessions and subscriptions (EMQX shapes), kick. \
                            `/status` is the one path without a token (health check)."
        },
        "servers": [{ "url": "/" }],
        "security": [{ "bearer": [] }],
        "tags": [{ "name": "streams" }, { "name": "lanes" }, { "name": "clients" }, { "name": "broker" }],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": schemas,
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
