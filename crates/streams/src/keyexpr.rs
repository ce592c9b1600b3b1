//! Key expressions (placeholder: the helper implementing this module replaces it).

/// What a key expression can look at.
#[derive(Debug, Clone, Copy)]
pub struct KeyInput<'a> {
    pub topic: &'a str,
    /// Publisher's client id.
    pub client_id: &'a str,
    pub username: Option<&'a str>,
    pub qos: u8,
    pub user_properties: &'a [(String, String)],
    pub payload: &'a [u8],
}

/// A parsed key expression.
#[derive(Debug, Clone)]
pub struct KeyExpr {
    _src: String,
}

impl KeyExpr {
    /// Parse; the error is the reason, for a 400 response.
    pub fn parse(src: &str) -> Result<KeyExpr, String> {
        Ok(KeyExpr {
            _src: src.to_string(),
        })
    }

    /// The key of a message, or `None` when it cannot be extracted.
    pub fn eval(&self, _m: &KeyInput<'_>) -> Option<String> {
        None
    }
}
