//! Configuration merge on update: the operator's `conf/agent.toml` keeps every value it
//! sets, keys new in the new version's defaults are added (with their comments), and
//! formatting and comments of the operator's file are kept.

use toml_edit::{DocumentMut, Item};

/// Returns the merged text and the dotted names of the keys that were added.
pub fn merge(operator: &str, new_defaults: &str) -> Result<(String, Vec<String>), String> {
    let mut doc: DocumentMut = operator
        .parse()
        .map_err(|e| format!("conf/agent.toml does not parse: {e}"))?;
    let defaults: DocumentMut = new_defaults
        .parse()
        .map_err(|e| format!("the new version's conf.default/agent.toml does not parse: {e}"))?;
    let mut added = Vec::new();
    merge_table(doc.as_table_mut(), defaults.as_table(), "", &mut added);
    Ok((doc.to_string(), added))
}

fn merge_table(
    ours: &mut toml_edit::Table,
    theirs: &toml_edit::Table,
    path: &str,
    added: &mut Vec<String>,
) {
    for (key, item) in theirs.iter() {
        let name = if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        };
        match (ours.get_mut(key), item) {
            (None, _) => {
                ours.insert(key, item.clone());
                added.push(name);
            }
            (Some(Item::Table(mine)), Item::Table(t)) => merge_table(mine, t, &name, added),
            // The operator set it (possibly to another type): theirs wins.
            (Some(_), _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_operator_values_and_comments_adds_new_keys() {
        let operator = "# my servers\n[server]\nurls = [\"http://prod:7080\"] # failover later\n\n[agent]\nheartbeat = \"5s\"\n";
        let defaults = "[server]\nurls = [\"http://127.0.0.1:7080\"]\n[agent]\nheartbeat = \"30s\"\n# new in 2.0\nlabels = \"none\"\n[metrics]\nport = 9100\n";
        let (merged, added) = merge(operator, defaults).unwrap();
        assert!(merged.contains("# my servers"));
        assert!(merged.contains("\"http://prod:7080\"] # failover later"));
        assert!(merged.contains("heartbeat = \"5s\""));
        assert!(merged.contains("labels = \"none\""));
        assert!(merged.contains("port = 9100"));
        assert_eq!(added, ["agent.labels", "metrics"]);
        let (again, none) = merge(&merged, defaults).unwrap();
        assert_eq!(again, merged);
        assert!(none.is_empty());
    }

    #[test]
    fn broken_operator_file_is_an_error() {
        assert!(merge("[server\n", "").is_err());
    }
}
