//! One line of a DynamoDB JSON item file, as S3 exports write it and sample
//! files may: a pure parser, here so that both the export reader (`aws`)
//! and the sample files (`state::itemfile`) read lines the same way without
//! either importing the other's layer.

use serde::Deserialize;

use crate::core::value::Item;

#[derive(Deserialize)]
struct Wrapped {
    #[serde(rename = "Item")]
    item: Item,
}

/// Parse one line: a wrapped export item or a bare item.
pub fn parse_line(line: &str) -> Result<Item, String> {
    if let Ok(w) = serde_json::from_str::<Wrapped>(line) {
        return Ok(w.item);
    }
    serde_json::from_str::<Item>(line).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::parse_line;

    #[test]
    fn reads_a_wrapped_or_a_bare_item() {
        let wrapped = parse_line("{\"Item\":{\"PK\":{\"S\":\"a\"}}}").unwrap();
        let bare = parse_line("{\"PK\":{\"S\":\"a\"}}").unwrap();
        assert_eq!(wrapped, bare);
        assert!(
            parse_line("{\"PK\":{\"Q\":\"c\"}}")
                .unwrap_err()
                .contains("unknown DynamoDB type tag `Q`")
        );
    }
}
