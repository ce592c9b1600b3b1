//! The JSON types of a request body checked against its schema in the OpenAPI document
//! ([`crate::openapi::document`]) before serde sees it.
//!
//! serde's derived `Deserialize` takes a struct from a JSON array too (the fields in order:
//! `["a", "t/#"]` is a stream definition, `"limits": []` is the default limits) and an enum
//! variant from a one-key object (`"mode": {"shared": null}`). The document says object, and
//! string; this check makes the handlers say the same. Only the types are checked (`type`,
//! `nullable`, `properties`, `additionalProperties`, `items`, `oneOf`/`anyOf`/`allOf`,
//! `$ref`): ranges, patterns, enums, unknown fields and every other rule stay with serde and
//! the validators, whose messages are the better ones.

use std::sync::OnceLock;

use serde_json::Value;

fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(crate::openapi::document)
}

/// `{"$ref": "#/components/schemas/<name>"}`.
pub(crate) fn schema_ref(name: &str) -> Value {
    serde_json::json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn resolve<'a>(schema: &'a Value, doc: &'a Value) -> &'a Value {
    let mut s = schema;
    // A chain of references ends within a few steps; a cycle would be a broken document.
    for _ in 0..8 {
        match s
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
        {
            Some(name) => s = &doc["components"]["schemas"][name],
            None => break,
        }
    }
    s
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "a JSON array",
        Value::Object(_) => "a JSON object",
    }
}

fn has_type(v: &Value, ty: &str) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => true,
    }
}

fn field(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn check_at(v: &Value, schema: &Value, doc: &Value, path: &str) -> Result<(), String> {
    let s = resolve(schema, doc);
    if v.is_null() && s.get("nullable").and_then(Value::as_bool) == Some(true) {
        return Ok(());
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for sub in all {
            check_at(v, sub, doc, path)?;
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = s.get(key).and_then(Value::as_array) {
            let mut first_err = None;
            for sub in alts {
                match check_at(v, sub, doc, path) {
                    Ok(()) => {
                        first_err = None;
                        break;
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
        }
    }
    if let Some(ty) = s.get("type").and_then(Value::as_str) {
        if !has_type(v, ty) {
            let what = if path.is_empty() { "the body" } else { path };
            let want = match ty {
                "object" => "a JSON object",
                "array" => "a JSON array",
                "integer" => "an integer",
                "string" => "a string",
                "boolean" => "a boolean",
                _ => "a number",
            };
            return Err(format!("{what}: expected {want}, got {}", type_name(v)));
        }
    }
    match v {
        Value::Object(map) => {
            let props = s.get("properties").and_then(Value::as_object);
            let extra = s.get("additionalProperties").filter(|a| a.is_object());
            for (k, item) in map {
                if let Some(sub) = props.and_then(|p| p.get(k)).or(extra) {
                    check_at(item, sub, doc, &field(path, k))?;
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_at(item, sub, doc, &format!("{path}[{i}]"))?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether the JSON types of `v` are those of `schema` (a schema of the OpenAPI document,
/// typically a [`schema_ref`]). `Err`: the first field that differs, and how.
pub(crate) fn check(v: &Value, schema: &Value) -> Result<(), String> {
    check_at(v, schema, document(), "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arrays_are_not_objects() {
        let def = schema_ref("StreamDef");
        assert!(check(&json!({ "name": "a", "topic_filter": "t/#" }), &def).is_ok());
        let e = check(&json!(["a", "t/#"]), &def).expect_err("a type mismatch");
        assert_eq!(e, "the body: expected a JSON object, got a JSON array");
        let e = check(&json!({ "name": "a", "limits": [] }), &def).expect_err("a type mismatch");
        assert_eq!(e, "limits: expected a JSON object, got a JSON array");
    }

    #[test]
    fn one_of_and_nullable() {
        let settings = schema_ref("GlobalSettings");
        for ok in [
            json!({ "gc_interval": "1h", "auto_create": { "lastvalue": false } }),
            json!({ "gc_interval": 1000, "auto_create": { "lastvalue": {} } }),
        ] {
            assert!(check(&ok, &settings).is_ok(), "{ok}");
        }
        let e = check(&json!({ "auto_create": { "lastvalue": [] } }), &settings)
            .expect_err("a type mismatch");
        assert!(e.starts_with("auto_create.lastvalue: expected a"), "{e}");
        assert!(check(&json!({ "gc_interval": [1] }), &settings).is_err());

        let publish = schema_ref("PublishRequest");
        assert!(check(&json!({ "topic": "t", "properties": null }), &publish).is_ok());
        assert!(check(&json!({ "topic": "t", "properties": [] }), &publish).is_err());
        let e = check(
            &json!({ "topic": "t", "properties": { "user_properties": { "k": 1 } } }),
            &publish,
        )
        .expect_err("a type mismatch");
        assert_eq!(
            e,
            "properties.user_properties.k: expected a string, got an integer"
        );
    }

    #[test]
    fn enums_are_strings_not_objects() {
        let parent = schema_ref("LiteParentDef");
        let ok = json!({ "name": "p", "pattern": "a/{lane}", "mode": "shared" });
        assert!(check(&ok, &parent).is_ok());
        let e = check(
            &json!({ "name": "p", "pattern": "a/{lane}", "mode": { "shared": null } }),
            &parent,
        )
        .expect_err("a type mismatch");
        assert_eq!(e, "mode: expected a string, got a JSON object");
        // Arrays of documented items are checked item by item.
        let bulk = json!({ "type": "array", "items": schema_ref("PublishRequest") });
        assert!(check(&json!([{ "topic": "a" }, ["b"]]), &bulk)
            .expect_err("a type mismatch")
            .starts_with("[1]: expected a JSON object"));
    }
}
