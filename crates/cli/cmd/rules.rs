//! `agent-relay rules`: list, add and remove access rules. The rules live in a file in the data
//! directory; the daemon reloads it within a second of a change, so no restart is needed.

use std::path::Path;

use anyhow::Context;
use relay_client::paths::Paths;
use relay_daemon::rules::{Action, Pattern, Rule, Rules};
use relay_protocol::file::{Durability, write_atomic};

use crate::args::{RulesAction, RulesArgs};
use crate::out::{json, line};

/// The rules file's name in the data directory.
pub(crate) const FILE: &str = "rules.json";

fn load(path: &Path) -> anyhow::Result<Rules> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Rules::default()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    Rules::parse(&text).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e}. Fix the file (the relay keeps using the rules it had until it parses)",
            path.display()
        )
    })
}

/// Writes the file whole, through a private temporary file and a rename, so the daemon never
/// reads half of it.
fn save(path: &Path, rules: &Rules) -> anyhow::Result<()> {
    write_atomic(path, rules.to_text().as_bytes(), Durability::PowerLoss)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `agent-relay rules`.
pub(crate) fn run(paths: &Paths, args: RulesArgs) -> anyhow::Result<()> {
    let path = paths.data_dir.join(FILE);
    match args.action.unwrap_or(RulesAction::List) {
        RulesAction::List => {
            let rules = load(&path)?;
            if args.json {
                return json(&rules);
            }
            if rules.rules.is_empty() {
                line(format!(
                    "no access rules: every agent may send to every other ({})",
                    path.display()
                ))?;
                return Ok(());
            }
            line(format!(
                "{:>3}  {:>8}  {:<13} {:<24} TO",
                "#", "PRIORITY", "ACTION", "FROM"
            ))?;
            for (i, r) in rules.rules.iter().enumerate() {
                let action = r.action.as_str();
                line(format!(
                    "{:>3}  {:>8}  {:<13} {:<24} {}",
                    i + 1,
                    r.priority,
                    action,
                    r.from.as_str(),
                    r.to.as_str()
                ))?;
            }
            line("The matching rule with the highest priority decides; none matching: allowed.")?;
            Ok(())
        }
        RulesAction::Add {
            from,
            to,
            action,
            priority,
        } => {
            let to = match to {
                Some(t) => t,
                None if action == "deny-spawn" || action == "allow-release" => "*".to_owned(),
                None => {
                    return Err(crate::exit::usage(format!(
                        "--action {action} needs --to (a recipient name or pattern; '*' for any)"
                    )));
                }
            };
            let mut rules = load(&path)?;
            let rule = Rule {
                from: Pattern::new(&from).map_err(crate::exit::usage)?,
                to: Pattern::new(&to).map_err(crate::exit::usage)?,
                action: match action.as_str() {
                    "deny" => Action::Deny,
                    "deny-spawn" => Action::DenySpawn,
                    "allow-release" => Action::AllowRelease,
                    _ => Action::Allow,
                },
                priority,
            };
            rules.rules.push(rule);
            std::fs::create_dir_all(&paths.data_dir)?;
            save(&path, &rules)?;
            if args.json {
                return json(&rules);
            }
            line(format!(
                "rule {} added: {action} {from} -> {to} (priority {priority}); the relay applies it within a second",
                rules.rules.len()
            ))?;
            Ok(())
        }
        RulesAction::Remove { number } => {
            let mut rules = load(&path)?;
            if number == 0 || number > rules.rules.len() {
                return Err(crate::exit::not_found(format!(
                    "there is no rule {number}; `agent-relay rules list` numbers them from 1"
                )));
            }
            rules.rules.remove(number - 1);
            save(&path, &rules)?;
            if args.json {
                return json(&rules);
            }
            line(format!("rule {number} removed"))?;
            Ok(())
        }
    }
}
