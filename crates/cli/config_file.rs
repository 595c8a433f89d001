//! The project configuration file, `.agent-relay/config.toml` at the project root (or the file
//! `$AGENT_RELAY_CONFIG` names):
//!
//! ```toml
//! [up]                   # any `up` setting, named as its option (kebab-case; `_` also)
//! inbox-ttl = "10m"
//! rate-override = ["ci-bot=1000"]
//!
//! [profiles.claude]      # any field of a wrapper profile, named as in profiles/*.toml (`-` also)
//! quiet_ms = 800
//!
//! [people.human]         # a person reached through adapters (relay_people::config)
//! telegram = 123456789
//!
//! [adapters.telegram]    # the adapters: webhook, telegram
//! token_file = "~/.config/agent-relay/telegram.token"
//! ```
//!
//! Everything is checked when the file is read: an unknown table or key, or a value of the
//! wrong kind, is an error (exit 2) naming the file, line and column and saying what is
//! allowed. Values are resolved in `settings.rs`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use relay_wrap::profile::{Overrides, Profile, ProfileError};
use serde::Deserialize;
use toml::Spanned;

use crate::settings::{self, Value};

/// Where the file is, relative to the project root.
pub(crate) const RELATIVE: &str = ".agent-relay/config.toml";

/// A valid configuration file.
#[derive(Debug)]
pub(crate) struct ConfigFile {
    /// Where it was read from.
    pub(crate) path: PathBuf,
    /// How sources name it: [`RELATIVE`], or the path `$AGENT_RELAY_CONFIG` gave.
    pub(crate) shown: String,
    /// `[up]`: each setting given, by name, with its line.
    pub(crate) up: BTreeMap<&'static str, (Value, usize)>,
    /// `[profiles.NAME]`: each profile's fields, in the file's order.
    pub(crate) profiles: BTreeMap<String, ProfileTable>,
    /// `[people.NAME]` and `[adapters.*]`: who is reached through which adapter.
    pub(crate) people: relay_people::PeopleConfig,
}

/// One `[profiles.NAME]` table.
#[derive(Debug, Default)]
pub(crate) struct ProfileTable {
    /// Its fields together, to overlay on the profile.
    pub(crate) overrides: Overrides,
    /// Each field: name, value as written (TOML), line.
    pub(crate) fields: Vec<(String, String, usize)>,
}

impl ConfigFile {
    /// The overrides of profile `name`, with the text that says where they come from.
    pub(crate) fn profile(&self, name: &str) -> Option<(&Overrides, String)> {
        let table = self.profiles.get(name)?;
        Some((
            &table.overrides,
            format!("{} [profiles.{name}]", self.path.display()),
        ))
    }
}

/// The file as serde sees it: every key and value with its place in the text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    #[serde(default)]
    up: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    #[serde(default)]
    profiles: BTreeMap<Spanned<String>, BTreeMap<Spanned<String>, Spanned<toml::Value>>>,
    // Read, with their own spans, by `relay_people::config::parse`.
    #[serde(default, rename = "people")]
    _people: Option<toml::Value>,
    #[serde(default, rename = "adapters")]
    _adapters: Option<toml::Value>,
}

/// Line and column (from 1) of byte offset `at` in `text`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Reads the project's configuration file: `$AGENT_RELAY_CONFIG` if set (it must exist),
/// else [`RELATIVE`] under `root` (none there is no error: everything has a default).
///
/// # Errors
/// Exit 2 for a file that cannot be read or is not valid.
pub(crate) fn load(
    root: &Path,
    env: impl Fn(&str) -> Option<OsString>,
) -> anyhow::Result<Option<ConfigFile>> {
    let chosen = env("AGENT_RELAY_CONFIG").filter(|p| !p.is_empty());
    let (path, shown) = match &chosen {
        Some(p) => (PathBuf::from(p), PathBuf::from(p).display().to_string()),
        None => (root.join(RELATIVE), RELATIVE.to_owned()),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e)
            if chosen.is_none()
                && matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
        {
            return Ok(None);
        }
        Err(e) => {
            return Err(crate::exit::usage(format!(
                "cannot read the configuration file {}{}: {e}",
                path.display(),
                if chosen.is_some() {
                    " (named by AGENT_RELAY_CONFIG)"
                } else {
                    ""
                }
            )));
        }
    };
    parse(&text, &path, shown).map(Some)
}

/// Checks and reads the text of a configuration file at `path`.
///
/// # Errors
/// Exit 2, the message starting `PATH:LINE:COLUMN:`.
pub(crate) fn parse(text: &str, path: &Path, shown: String) -> anyhow::Result<ConfigFile> {
    let at = |offset: usize, message: String| {
        let (line, col) = line_col(text, offset);
        crate::exit::usage(format!("{}:{line}:{col}: {message}", path.display()))
    };
    let doc: Doc = toml::from_str(text).map_err(|e| {
        let message = e.message().trim_end().replace(
            "expected one of `up`, `profiles`, `people`, `adapters`",
            "expected [up] (the settings of `agent-relay up`), [profiles.NAME] (wrapper \
             profile fields), [people.NAME] or [adapters.webhook|telegram]; see `agent-relay config --help`",
        );
        at(e.span().map_or(0, |s| s.start), message)
    })?;
    let mut up = BTreeMap::new();
    for (key, value) in &doc.up {
        let name = key.get_ref();
        // Written as up's options (`no-dashboard`) or with underscores (`no_dashboard`, as
        // the [profiles] keys are): both are the same setting.
        let Some(setting) =
            settings::find(name).or_else(|| settings::find(&name.replace('_', "-")))
        else {
            return Err(at(
                key.span().start,
                format!(
                    "unknown setting {:?} in [up]; the settings are: {}",
                    relay_protocol::text::one_line(name, 60),
                    settings::names()
                ),
            ));
        };
        let parsed = setting.parse_toml(value.get_ref()).map_err(|e| {
            at(
                value.span().start,
                format!("{} = {}: {e}", setting.name, short(value.get_ref())),
            )
        })?;
        up.insert(setting.name, (parsed, line_col(text, key.span().start).0));
    }
    let mut profiles = BTreeMap::new();
    for (name, fields) in &doc.profiles {
        let pname = name.get_ref();
        if !Profile::NAMES.contains(&pname.as_str()) {
            return Err(at(
                name.span().start,
                format!(
                    "unknown profile {:?} in [profiles.{0}]; the profiles are: {}",
                    relay_protocol::text::one_line(pname, 60),
                    Profile::NAMES.join(", ")
                ),
            ));
        }
        let mut table = ProfileTable::default();
        let mut ordered: Vec<_> = fields.iter().collect();
        ordered.sort_by_key(|(k, _)| k.span().start);
        for (key, value) in ordered {
            // Written as in profiles/*.toml (`quiet_ms`) or with dashes (`quiet-ms`, as the
            // [up] keys are): both are the same field.
            let one = toml::Value::Table(toml::Table::from_iter([(
                key.get_ref().replace('-', "_"),
                value.get_ref().clone(),
            )]));
            let field: Overrides = one.try_into().map_err(|e: toml::de::Error| {
                let message = e.message().trim_end().to_owned();
                let offset = if message.starts_with("unknown field") {
                    key.span().start
                } else {
                    value.span().start
                };
                at(
                    offset,
                    format!(
                        "[profiles.{pname}] {}: {message}",
                        relay_protocol::text::one_line(key.get_ref(), 60)
                    ),
                )
            })?;
            // A pattern that does not compile, or an unknown parser, is caught here too.
            if let Err(e) = Profile::load_with(pname, Some((&field, "")), None) {
                let message = match e {
                    ProfileError::Invalid { message, .. } => message,
                    other => other.to_string(),
                };
                return Err(at(
                    value.span().start,
                    format!("[profiles.{pname}] {}: {message}", key.get_ref()),
                ));
            }
            table.overrides.overlay(field);
            table.fields.push((
                key.get_ref().replace('-', "_"),
                written(value.get_ref()),
                line_col(text, key.span().start).0,
            ));
        }
        profiles.insert(pname.clone(), table);
    }
    // Relative file names in [adapters.*] are the project's: the directory holding
    // `.agent-relay/`, or the file's own directory for a file named by AGENT_RELAY_CONFIG.
    let dir = path.parent().unwrap_or(Path::new("."));
    let root = if dir.ends_with(".agent-relay") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let people = relay_people::config::parse(text, root, home.as_deref())
        .map_err(|e| at(e.offset, e.message))?;
    Ok(ConfigFile {
        path: path.to_path_buf(),
        shown,
        up,
        profiles,
        people,
    })
}

/// A value as written, cut short for a message.
fn short(v: &toml::Value) -> String {
    relay_protocol::text::one_line(&written(v), 60)
}

/// A value in TOML syntax (near enough for showing it: strings quoted with escapes).
pub(crate) fn written(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Array(items) => format!(
            "[{}]",
            items.iter().map(written).collect::<Vec<_>>().join(", ")
        ),
        toml::Value::Table(t) => format!(
            "{{ {} }}",
            t.iter()
                .map(|(k, v)| format!("{k} = {}", written(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        let e = parse(text, Path::new("/p/config.toml"), RELATIVE.into()).unwrap_err();
        assert_eq!(crate::exit::code_of(&e), 2);
        e.to_string()
    }

    #[test]
    fn errors_name_the_line_and_column_and_what_is_allowed() {
        let e = err("[up]\nmax-hops = 3\ninbox-tll = 10\n");
        assert!(
            e.starts_with("/p/config.toml:3:1: unknown setting \"inbox-tll\" in [up];")
                && e.contains("max-hops, max-spawned, max-spawn-depth, rate-limit"),
            "{e}"
        );
        let e = err("[up]\n\n  max-hops = \"ten\"\n");
        assert!(
            e.starts_with("/p/config.toml:3:14: max-hops = \"ten\": expected a whole number"),
            "{e}"
        );
        let e = err("[up]\ninbox-ttl = \"ten minutes\"\n");
        assert!(e.starts_with("/p/config.toml:2:13: inbox-ttl = "), "{e}");
        assert!(e.contains("10m"), "{e}");
        let e = err("[up]\nstorage = \"disk\"\n");
        assert!(e.contains("\"sqlite\", \"memory\""), "{e}");
        let e = err("[cluster]\nurls = 1\n");
        assert!(
            e.starts_with("/p/config.toml:1:2: unknown field `cluster`"),
            "{e}"
        );
        let e = err("[up\n");
        assert!(e.starts_with("/p/config.toml:1:"), "{e}");
        let e = err("[profiles.vim]\nquiet_ms = 1\n");
        assert!(e.starts_with("/p/config.toml:1:11: unknown profile"), "{e}");
        let e = err("[profiles.claude]\nquiet_ms = 1\nquiet = 2\n");
        assert!(
            e.starts_with("/p/config.toml:3:1: [profiles.claude] quiet: unknown field `quiet`")
                && e.contains("quiet_ms"),
            "{e}"
        );
        let e = err("[profiles.claude]\nquiet_ms = \"x\"\n");
        assert!(
            e.starts_with("/p/config.toml:2:12: [profiles.claude] quiet_ms"),
            "{e}"
        );
        // People and adapters (relay_people::config) name their line too.
        let e = err("[up]\nmax-hops = 3\n\n[people.human]\ntelegram = 1\ncolour = 2\n");
        assert!(
            e.starts_with("/p/config.toml:6:1: unknown field `colour`"),
            "{e}"
        );
        let e = err(
            "[people.human]\ntelegram = 1\n[adapters.telegram]\ntoken_file = \"t\"\nengage = \"always\"\n",
        );
        assert!(
            e.starts_with("/p/config.toml:5:10: unknown variant `always`")
                && e.contains("mention-sticky"),
            "{e}"
        );
        let e = err("[profiles.claude]\nprompt = \"(\"\n");
        assert!(
            e.starts_with("/p/config.toml:2:10: [profiles.claude] prompt"),
            "{e}"
        );
    }

    #[test]
    fn settings_and_profile_fields_are_read_with_their_lines() {
        let f = parse(
            "# c\n[up]\nrate-override = [\"ci=5\"]\nno-dashboard = true\n\n[profiles.generic]\nbusy = []\nquiet_ms = 50\n",
            Path::new("/p/config.toml"),
            RELATIVE.into(),
        )
        .unwrap();
        assert_eq!(
            f.up["rate-override"],
            (Value::Pairs(vec![("ci".into(), 5)]), 3)
        );
        assert_eq!(f.up["no-dashboard"], (Value::Bool(true), 4));
        let g = &f.profiles["generic"];
        assert_eq!(
            g.fields,
            [
                ("busy".to_owned(), "[]".to_owned(), 7),
                ("quiet_ms".to_owned(), "50".to_owned(), 8)
            ]
        );
        let (o, _) = f.profile("generic").unwrap();
        let p = Profile::load_with("generic", Some((o, "x")), None).unwrap();
        assert_eq!(p.quiet, std::time::Duration::from_millis(50));
    }
}
