//! An agent's labels as the fleet sees them: what the agent reports (agent.toml, its
//! `--label`s), what operators set on the server (which win on the same key), and the
//! built-in labels every agent has (`platform`, `os`, `arch`, `group`, `version`),
//! which win over both. The spelling rules are agent-protocol's ([`agent_protocol::labels`]).
//!
//! Pure: the rows that keep them are `db`'s (`Db::set_server_labels`, and
//! `AgentRow::labels_as_seen` puts a row's together).

use std::collections::BTreeMap;

pub use agent_protocol::labels::{
    BUILT_IN, Labels, MAX_KEY, MAX_LABELS, MAX_VALUE, check, check_key, check_label, check_value,
    is_built_in, parse_assignment,
};

/// The built-in labels of an agent of `platform` (a target triple), `group` (empty: the
/// default group) and `version`.
pub fn built_in(platform: &str, group: &str, version: &str) -> Labels {
    let (os, arch) = os_arch(platform);
    BTreeMap::from([
        ("platform".to_owned(), platform.to_owned()),
        ("os".to_owned(), os.to_owned()),
        ("arch".to_owned(), arch.to_owned()),
        ("group".to_owned(), group.to_owned()),
        ("version".to_owned(), version.to_owned()),
    ])
}

/// The operating system and architecture of a target triple (`x86_64-pc-windows-gnu` is
/// `windows`, `x86_64`; `aarch64-apple-darwin` is `macos`, `aarch64`); `unknown` for a
/// platform that is not a triple.
fn os_arch(platform: &str) -> (&str, &str) {
    if !agent_protocol::platform::is_target(platform) {
        return ("unknown", "unknown");
    }
    let parts: Vec<&str> = platform.split('-').collect();
    let os = parts
        .iter()
        .skip(1)
        .find_map(|p| match *p {
            "linux" | "windows" | "freebsd" | "netbsd" | "openbsd" | "android" | "ios" => Some(*p),
            "darwin" => Some("macos"),
            _ => None,
        })
        .unwrap_or_else(|| parts.get(2).copied().unwrap_or("unknown"));
    (os, agent_protocol::platform::arch(platform))
}

/// What the agent says, overlaid by the server's own, overlaid by the built-ins.
pub fn effective(reported: &Labels, server: &Labels, built_in: Labels) -> Labels {
    let mut labels = reported.clone();
    labels.extend(server.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels.extend(built_in);
    labels
}

/// An agent's effective labels from its row's columns: its own and the server's labels as
/// stored (JSON text), and the built-ins of its platform, group and version.
pub fn of_columns(
    own: Option<&str>,
    server: Option<&str>,
    platform: &str,
    group: &str,
    version: &str,
) -> Labels {
    effective(
        &from_json(own),
        &from_json(server),
        built_in(platform, group, version),
    )
}

/// A change to an agent's server labels: `{"set": {…}, "remove": […]}` of
/// `POST /admin/agents/<id>/labels`, or `k=v k2-` of `update-server agent label`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    #[serde(default)]
    pub set: Labels,
    #[serde(default)]
    pub remove: Vec<String>,
}

impl Edit {
    /// `key=value` sets, `key-` removes (as `kubectl label`).
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Self, String> {
        let mut edit = Edit::default();
        for arg in args {
            let arg = arg.as_ref();
            if let Some(key) = arg.strip_suffix('-')
                && !arg.contains('=')
            {
                check_key(key)?;
                edit.remove.push(key.to_owned());
            } else if arg.contains('=') {
                let (k, v) = parse_assignment(arg)?;
                edit.set.insert(k, v);
            } else {
                return Err(format!(
                    "{arg:?} is neither KEY=VALUE (to set a label) nor KEY- (to remove one)"
                ));
            }
        }
        if edit.set.is_empty() && edit.remove.is_empty() {
            return Err("no label to set (KEY=VALUE) or remove (KEY-)".to_owned());
        }
        Ok(edit)
    }

    /// The server labels `current` becomes, checked: every key and value well spelled,
    /// none built in, a key not both set and removed, at most [`MAX_LABELS`].
    pub fn apply(&self, current: &Labels) -> Result<Labels, String> {
        for (k, v) in &self.set {
            check_label(k, v)?;
        }
        for k in &self.remove {
            check_key(k)?;
            if is_built_in(k) {
                return Err(format!("label {k} is built in: it cannot be removed"));
            }
            if self.set.contains_key(k) {
                return Err(format!("label {k} is both set and removed"));
            }
        }
        let mut next = current.clone();
        for k in &self.remove {
            next.remove(k);
        }
        next.extend(self.set.iter().map(|(k, v)| (k.clone(), v.clone())));
        if next.len() > MAX_LABELS {
            let added = self.set.keys().find(|k| !current.contains_key(*k));
            return Err(format!(
                "label {}: the agent would have {} server labels, and at most {MAX_LABELS} are allowed",
                added.map_or("?", String::as_str),
                next.len()
            ));
        }
        Ok(next)
    }
}

/// What an OpAMP agent reports as labels: its non-identifying attributes (of the
/// stored view's JSON, `description.non_identifying`) that are well-spelled labels and
/// not built in, the first [`MAX_LABELS`] by key. An attribute that is not a label
/// (`host.name = "web 1"`) is left out.
pub fn from_opamp_view(view: &str) -> Labels {
    let view: serde_json::Value = serde_json::from_str(view).unwrap_or_default();
    let Some(attributes) = view["description"]["non_identifying"].as_object() else {
        return Labels::new();
    };
    from_attributes(
        attributes
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))),
    )
}

/// An OpAMP agent's labels from its non-identifying attributes: those that are
/// well-formed labels, at most [`MAX_LABELS`].
pub fn from_attributes<'a>(attributes: impl Iterator<Item = (&'a str, &'a str)>) -> Labels {
    attributes
        .filter(|(k, v)| check_label(k, v).is_ok())
        .take(MAX_LABELS)
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Labels kept as JSON text in the fleet database; what does not read as labels (a row
/// from before labels) reads as none.
pub fn from_json(text: Option<&str>) -> Labels {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// Labels as the fleet database keeps them.
pub fn to_json(labels: &Labels) -> String {
    serde_json::to_string(labels).unwrap_or_else(|_| "{}".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn built_ins_come_from_the_platform_group_and_version() {
        let b = built_in("x86_64-unknown-linux-musl", "canary", "1.2.0+7");
        assert_eq!(
            b,
            l(&[
                ("arch", "x86_64"),
                ("group", "canary"),
                ("os", "linux"),
                ("platform", "x86_64-unknown-linux-musl"),
                ("version", "1.2.0+7"),
            ])
        );
        assert_eq!(os_arch("x86_64-pc-windows-gnu"), ("windows", "x86_64"));
        assert_eq!(os_arch("aarch64-apple-darwin"), ("macos", "aarch64"));
        assert_eq!(os_arch("linux"), ("unknown", "unknown"));
        assert_eq!(built_in("p", "", "1")["group"], "");
    }

    #[test]
    fn the_servers_labels_win_over_the_agents_and_built_ins_over_both() {
        let reported = l(&[("env", "dev"), ("region", "eu"), ("os", "plan9")]);
        let server = l(&[("env", "prod"), ("tier", "web")]);
        let e = effective(
            &reported,
            &server,
            built_in("x86_64-unknown-linux-gnu", "", "1.0.0+1"),
        );
        assert_eq!(e["env"], "prod");
        assert_eq!(e["region"], "eu");
        assert_eq!(e["tier"], "web");
        assert_eq!(e["os"], "linux");
    }

    #[test]
    fn an_edit_reads_like_kubectl_label() {
        let edit = Edit::parse(&["tier=web", "env-"]).unwrap();
        assert_eq!(edit.set, l(&[("tier", "web")]));
        assert_eq!(edit.remove, vec!["env".to_owned()]);
        assert_eq!(
            edit.apply(&l(&[("env", "prod"), ("a", "b")])).unwrap(),
            l(&[("a", "b"), ("tier", "web")])
        );
        // A value that ends with `-` is a value.
        assert_eq!(Edit::parse(&["x=a-"]).unwrap().set["x"], "a-");
        assert!(Edit::parse::<&str>(&[]).is_err());
        let e = Edit::parse(&["tier"]).unwrap_err();
        assert!(e.contains("\"tier\""), "{e}");
    }

    #[test]
    fn an_edit_refuses_built_ins_bad_names_and_a_33rd_label_naming_it() {
        let e = Edit::parse(&["version=2"]).unwrap_err();
        assert!(e.starts_with("label version is built in"), "{e}");
        let e = Edit::parse(&["Env=prod"]).unwrap_err();
        assert!(e.contains("\"Env\""), "{e}");
        let e = Edit::parse(&["env=pr/od"]).unwrap_err();
        assert!(e.contains("env"), "{e}");
        let body: Edit = serde_json::from_str(r#"{"set": {"group": "x"}, "remove": []}"#).unwrap();
        assert!(body.apply(&Labels::new()).unwrap_err().contains("group"));
        let body: Edit = serde_json::from_str(r#"{"remove": ["os"]}"#).unwrap();
        assert!(body.apply(&Labels::new()).unwrap_err().contains("os"));
        let body: Edit = serde_json::from_str(r#"{"set": {"a": "1"}, "remove": ["a"]}"#).unwrap();
        assert!(body.apply(&Labels::new()).is_err());
        assert!(serde_json::from_str::<Edit>(r#"{"sett": {}}"#).is_err());
        let full: Labels = (0..32).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        let e = Edit::parse(&["one=more"])
            .unwrap()
            .apply(&full)
            .unwrap_err();
        assert!(e.contains("at most 32"), "{e}");
        // Replacing one of 32 is fine.
        assert!(Edit::parse(&["k0=w"]).unwrap().apply(&full).is_ok());
    }

    #[test]
    fn an_opamp_agents_non_identifying_attributes_that_are_labels_become_its_labels() {
        let view = r#"{"description": {"identifying": {"service.name": "otel"},
            "non_identifying": {"env": "prod", "os.type": "linux", "host.name": "web 1", "os": "x"}}}"#;
        assert_eq!(
            from_opamp_view(view),
            l(&[("env", "prod"), ("os.type", "linux")])
        );
        assert_eq!(from_opamp_view("{}"), Labels::new());
        assert_eq!(from_opamp_view("not json"), Labels::new());
    }

    #[test]
    fn stored_labels_read_back_and_a_row_without_any_reads_as_none() {
        let labels = l(&[("env", "prod")]);
        assert_eq!(from_json(Some(&to_json(&labels))), labels);
        assert_eq!(from_json(None), Labels::new());
        assert_eq!(from_json(Some("not json")), Labels::new());
    }
}
