//! What the stand-in says: rules matched against the latest user message, and a default.

use std::time::Duration;

use serde::Deserialize;

use crate::StandInError;

/// How a rule recognises a prompt.
#[derive(Debug, Clone)]
pub enum Matcher {
    /// The prompt contains this text (case-sensitive).
    Contains(String),
    /// The prompt matches this regular expression (anywhere in it).
    Regex(regex::Regex),
    /// The latest user message carries a tool's result containing this text: the model is
    /// answered after its tool ran (Claude Code's `tool_result` blocks, which the prompt text
    /// leaves out; on the other APIs the prompt text holds the tool's output).
    ToolResult(String),
}

impl Matcher {
    fn matches(&self, text: &str, tool_result: &str) -> bool {
        match self {
            Self::Contains(s) => text.contains(s.as_str()),
            Self::Regex(r) => r.is_match(text),
            Self::ToolResult(s) => tool_result.contains(s.as_str()),
        }
    }
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The rule's name, recorded in the log for the requests it answered.
    pub name: String,
    /// When it applies.
    pub matcher: Matcher,
    /// The assistant's whole reply text.
    pub reply: String,
    /// Held back this long before the reply starts, so the agent looks busy (spinner).
    pub delay: Duration,
    /// Held back until the test calls [`crate::StandIn::release`]: busy for exactly as long
    /// as a test needs, with no guessing at durations.
    pub hold: bool,
    /// A thinking block streamed before the reply (Anthropic API only).
    pub thinking: Option<String>,
    /// A tool call after the reply's text (any of the three APIs): the tool's name and its input
    /// as JSON text. The agent runs the tool and sends its result as the next user message.
    pub tool_use: Option<(String, String)>,
}

impl Rule {
    /// A rule answering `reply` to any prompt containing `needle`; named after the needle.
    pub fn contains(needle: &str, reply: &str) -> Self {
        Self {
            name: needle.to_owned(),
            matcher: Matcher::Contains(needle.to_owned()),
            reply: reply.to_owned(),
            delay: Duration::ZERO,
            hold: false,
            thinking: None,
            tool_use: None,
        }
    }

    /// A rule answering `reply` when the latest user message is a tool's result containing
    /// `needle` (see [`Matcher::ToolResult`]); named after the needle.
    pub fn after_tool_result(needle: &str, reply: &str) -> Self {
        Self {
            matcher: Matcher::ToolResult(needle.to_owned()),
            ..Self::contains(needle, reply)
        }
    }

    /// A rule answering `reply` to any prompt matching `pattern`; named after the pattern.
    ///
    /// # Errors
    /// [`StandInError::Regex`] when the pattern does not compile.
    pub fn regex(pattern: &str, reply: &str) -> Result<Self, StandInError> {
        let re = regex::Regex::new(pattern).map_err(|e| StandInError::Regex(e.to_string()))?;
        Ok(Self {
            name: pattern.to_owned(),
            matcher: Matcher::Regex(re),
            reply: reply.to_owned(),
            delay: Duration::ZERO,
            hold: false,
            thinking: None,
            tool_use: None,
        })
    }

    /// The same rule, answering only after `delay`.
    #[must_use]
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The same rule, answering only once the test releases it ([`crate::StandIn::release`]).
    #[must_use]
    pub fn held(mut self) -> Self {
        self.hold = true;
        self
    }

    /// The same rule, thinking `thought` before it answers.
    #[must_use]
    pub fn thinking(mut self, thought: &str) -> Self {
        self.thinking = Some(thought.to_owned());
        self
    }

    /// The same rule, calling tool `name` with `input` after its text (on each API: a
    /// `tool_use` block, a Responses `function_call` item, a Gemini `functionCall` part; the
    /// name is the one the CLI gave the tool, e.g. Claude Code's `mcp__SERVER__TOOL`, Gemini
    /// CLI's `mcp_SERVER_TOOL`; on the Responses API `NAMESPACE/TOOL` calls a tool in a
    /// namespace, as Codex CLI's `mcp__SERVER/TOOL`).
    #[must_use]
    pub fn calling(mut self, name: &str, input: &serde_json::Value) -> Self {
        self.tool_use = Some((name.to_owned(), input.to_string()));
        self
    }

    /// The same rule under another name.
    #[must_use]
    pub fn named(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }
}

/// The rules in order (the first that matches answers) and the reply when none does.
#[derive(Debug, Clone)]
pub struct Script {
    /// Tried in order.
    pub rules: Vec<Rule>,
    /// The reply when no rule matches.
    pub default: String,
    /// The reply to side requests (session titles): Claude Code asks for a JSON object with a
    /// `title`, and the rules are kept for the turns a person sees.
    pub side: String,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            default: "OK.".to_owned(),
            side: r#"{"title": "Stand-in session"}"#.to_owned(),
        }
    }
}

/// What the script answers to one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The rule's name; `None` for the default.
    pub rule: Option<String>,
    /// The reply text.
    pub reply: String,
    /// Held back this long first.
    pub delay: Duration,
    /// Held back until released.
    pub hold: bool,
    /// A thinking block before the reply.
    pub thinking: Option<String>,
    /// A tool call after the reply: (name, input as JSON text).
    pub tool_use: Option<(String, String)>,
}

impl Script {
    /// A script with these rules and the default reply `OK.`.
    pub fn new(rules: Vec<Rule>) -> Self {
        Self {
            rules,
            ..Self::default()
        }
    }

    /// The answer to `prompt`: the first matching rule's, or the default.
    pub fn choose(&self, prompt: &str) -> Choice {
        self.choose_after(prompt, "")
    }

    /// The answer to `prompt` when the latest user message also carries a tool's result
    /// (`tool_result`: its text): the first matching rule's, or the default.
    pub fn choose_after(&self, prompt: &str, tool_result: &str) -> Choice {
        self.rules
            .iter()
            .find(|r| r.matcher.matches(prompt, tool_result))
            .map_or_else(
                || Choice {
                    rule: None,
                    reply: self.default.clone(),
                    delay: Duration::ZERO,
                    hold: false,
                    thinking: None,
                    tool_use: None,
                },
                |r| Choice {
                    rule: Some(r.name.clone()),
                    reply: r.reply.clone(),
                    delay: r.delay,
                    hold: r.hold,
                    thinking: r.thinking.clone(),
                    tool_use: r.tool_use.clone(),
                },
            )
    }

    /// Reads a script from JSON: `{"default": "...", "rules": [{"match": "text",
    /// "regex": false, "reply": "...", "delay_ms": 0, "name": "...", "thinking": "..."}]}`
    /// (for the binary).
    ///
    /// # Errors
    /// [`StandInError::Script`] for malformed JSON, [`StandInError::Regex`] for a bad pattern.
    pub fn from_json(json: &str) -> Result<Self, StandInError> {
        #[derive(Deserialize)]
        struct RuleSpec {
            #[serde(rename = "match")]
            pattern: String,
            #[serde(default)]
            regex: bool,
            reply: String,
            #[serde(default)]
            delay_ms: u64,
            name: Option<String>,
            thinking: Option<String>,
        }
        #[derive(Deserialize)]
        struct Spec {
            #[serde(default)]
            rules: Vec<RuleSpec>,
            default: Option<String>,
        }
        let spec: Spec =
            serde_json::from_str(json).map_err(|e| StandInError::Script(e.to_string()))?;
        let mut script = Self::default();
        if let Some(d) = spec.default {
            script.default = d;
        }
        for r in spec.rules {
            let mut rule = if r.regex {
                Rule::regex(&r.pattern, &r.reply)?
            } else {
                Rule::contains(&r.pattern, &r.reply)
            };
            rule.delay = Duration::from_millis(r.delay_ms);
            if let Some(n) = r.name {
                rule.name = n;
            }
            rule.thinking = r.thinking;
            script.rules.push(rule);
        }
        Ok(script)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_rule_answers_else_the_default() {
        let script = Script::new(vec![
            Rule::contains("review", "asking Bob").delayed(Duration::from_secs(2)),
            Rule::regex(r"^ping\b", "pong").unwrap().named("ping"),
            Rule::contains("review auth", "never: the earlier rule wins"),
        ]);
        let c = script.choose("please review auth.ts");
        assert_eq!(c.rule.as_deref(), Some("review"));
        assert_eq!(c.reply, "asking Bob");
        assert_eq!(c.delay, Duration::from_secs(2));
        assert_eq!(script.choose("ping Bob").rule.as_deref(), Some("ping"));
        assert_eq!(script.choose("say ping").rule, None, "anchored regex");
        let d = script.choose("Review");
        assert_eq!((d.rule, d.reply.as_str()), (None, "OK."), "case-sensitive");
    }

    #[test]
    fn a_script_reads_from_json_and_reports_bad_input() {
        let s = Script::from_json(
            r#"{"default": "fine", "rules": [
                {"match": "a+b", "regex": true, "reply": "R", "delay_ms": 5, "name": "ab"},
                {"match": "a+b", "reply": "literal", "thinking": "hmm"}]}"#,
        )
        .unwrap();
        assert_eq!(s.default, "fine");
        assert_eq!(s.choose("x a+b").thinking.as_deref(), Some("hmm"));
        assert_eq!(s.choose("aaab").thinking, None);
        let c = s.choose("aaab");
        assert_eq!(
            (c.rule.as_deref(), c.delay),
            (Some("ab"), Duration::from_millis(5))
        );
        assert_eq!(
            s.choose("x a+b").reply,
            "literal",
            "no 'ab' in it for the regex"
        );
        assert!(matches!(
            Script::from_json(r#"{"rules": [{"match": "(", "regex": true, "reply": ""}]}"#),
            Err(StandInError::Regex(_))
        ));
        assert!(matches!(
            Script::from_json("[1]"),
            Err(StandInError::Script(_))
        ));
    }
}
