//! Notifiers (`[notify.NAME]`), of a workflow or of the user's config file: what each kind
//! needs (RF067), values that cannot work (RF068), and secrets written inline (RF069).
//!
//! The user's config file (`$XDG_CONFIG_HOME/ralph-flow/config.toml`) goes through the same
//! shape check and the same rules ([`user_config`]); the caller reads it (at a run's start),
//! so the checker still reads nothing but the files it is handed.

use std::path::Path;

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Count, Dur, Notify, NotifyKind, Text};
use crate::source::Sources;

/// Checks every notifier of a workflow.
pub(super) fn check(notify: &[Notify], diags: &mut Diagnostics) {
    for n in notify {
        check_one(n, diags);
    }
}

/// Parses, shape-checks and checks the user's config file (`text`, read from `path`, added
/// to `sources` so that its diagnostics point into it). Returns its notifiers, or every
/// problem of the file when there is an error; warnings are added to `diags`.
pub fn user_config(
    sources: &mut Sources,
    path: &Path,
    text: &str,
    diags: &mut Diagnostics,
) -> Option<Vec<Notify>> {
    let file = sources.add(path, text);
    let mut found = Diagnostics::default();
    let root = crate::syntax::parse(file, text, crate::syntax::Format::Toml, &mut found);
    let mut shape = Diagnostics::default();
    let notify = crate::model::lower::lower_user_config(&root, &mut shape);
    for mut d in shape.into_sorted() {
        if d.span.is_none() {
            d.span = Some(crate::source::Span::new(file, 0..0));
        }
        found.push(d);
    }
    check(&notify, &mut found);
    let failed = found.has_errors();
    for d in found.into_sorted() {
        diags.push(d);
    }
    (!failed).then_some(notify)
}

fn check_one(n: &Notify, diags: &mut Diagnostics) {
    let name = &n.name.value;
    let kind = n.kind.value;
    match kind {
        NotifyKind::Webhook | NotifyKind::Slack | NotifyKind::Ntfy => {
            match (&n.url, &n.url_env) {
                (None, None) => diags.push(
                    Diagnostic::new(
                        Code::NotifierIncomplete,
                        n.name.span,
                        format!(
                            "notifier `{name}` of kind `{}` has no `url` or `url_env`",
                            kind.as_str()
                        ),
                    )
                    .label("where does it post?")
                    .help_syntax(
                        "name the environment variable that holds the URL, such as url_env = \"SLACK_WEBHOOK_URL\", or write url = \"https://...\" when it is no secret",
                        "name the environment variable that holds the URL, such as url_env \"SLACK_WEBHOOK_URL\", or write url \"https://...\" when it is no secret",
                    ),
                ),
                (Some(url), Some(env)) => diags.push(
                    Diagnostic::new(
                        Code::NotifierIncomplete,
                        env.span,
                        format!("notifier `{name}` has both `url` and `url_env`"),
                    )
                    .label("the URL is written here too")
                    .related(url.span, "and here")
                    .help("keep one: `url_env` when the URL is a secret (a Slack webhook, a private topic), else `url`"),
                ),
                (Some(url), None) => check_url(name, kind, url, diags),
                (None, Some(env)) => check_env_name("url_env", env, diags),
            }
        }
        NotifyKind::Command => match &n.argv {
            None => diags.push(
                Diagnostic::new(
                    Code::NotifierIncomplete,
                    n.name.span,
                    format!("notifier `{name}` of kind `command` has no `argv`"),
                )
                .label("which program does it run?")
                .help_syntax(
                    "give the program and its arguments as a list, such as argv = [\"notify-send\", \"ralph-flow\"]; it reads the event as JSON on stdin",
                    "give the program and its arguments, such as argv \"notify-send\" \"ralph-flow\"; it reads the event as JSON on stdin",
                ),
            ),
            Some(argv) if argv.is_empty() || argv[0].value.trim().is_empty() => diags.push(
                Diagnostic::new(
                    Code::NotifierIncomplete,
                    argv.first().map(|a| a.span).or(n.argv_span),
                    format!("the `argv` of notifier `{name}` names no program"),
                )
                .label("empty")
                .help("write the program first, then its arguments, each one item"),
            ),
            Some(_) => {}
        },
    }
    for (header, env) in &n.headers_env {
        if !is_header_name(&header.value) {
            diags.push(
                Diagnostic::new(
                    Code::NotifierValue,
                    header.span,
                    format!(
                        "`{}` in the `headers_env` of notifier `{name}` is not an HTTP header name",
                        header.value
                    ),
                )
                .label("not a header name")
                .help("a header name is letters, digits and `-` (such as `Authorization` or `X-Token`), mapped to the environment variable that holds its value"),
            );
        }
        check_env_name("headers_env", env, diags);
    }
    if let Some(on) = &n.on {
        if on.is_empty() {
            diags.push(
                Diagnostic::new(
                    Code::NotifierIncomplete,
                    n.name.span,
                    format!("notifier `{name}` announces nothing: its `on` is empty"),
                )
                .help("list what it announces: \"gate\", \"finished\", \"failed\", \"cancelled\"; or leave `on` out for gates only"),
            );
        }
    }
    if let Some(r) = &n.retries {
        if let Count::Template(_) = r.value {
            diags.push(literal_needed(
                name,
                "retries",
                r.span,
                "a number such as 5",
            ));
        }
    }
    if let Some(t) = &n.timeout {
        if let Dur::Template(_) = t.value {
            diags.push(literal_needed(
                name,
                "timeout",
                t.span,
                "a duration such as \"10s\"",
            ));
        }
    }
    if let Some(m) = &n.monitor_url {
        if http_url(&m.value).is_err() {
            diags.push(
                Diagnostic::new(
                    Code::NotifierValue,
                    m.span,
                    format!("the `monitor_url` of notifier `{name}` is not an http(s) URL"),
                )
                .label("expected http:// or https://")
                .help("write the address `ralph-flow serve` is reached at, such as \"http://build-box:8080\""),
            );
        }
    }
}

fn literal_needed(name: &str, key: &str, span: crate::source::Span, what: &str) -> Diagnostic {
    Diagnostic::new(
        Code::NotifierValue,
        span,
        format!("the `{key}` of notifier `{name}` is a template"),
    )
    .label("a template over params")
    .help(format!(
        "a notifier also serves the user's config, which has no params: write {what}"
    ))
}

/// Checks a URL written inline: http(s), and no secret in it.
fn check_url(name: &str, kind: NotifyKind, url: &Text, diags: &mut Diagnostics) {
    if let Err(why) = http_url(&url.value) {
        diags.push(
            Diagnostic::new(
                Code::NotifierValue,
                url.span,
                format!("the `url` of notifier `{name}` {why}"),
            )
            .label("expected http:// or https://")
            .help(match kind {
                NotifyKind::Ntfy => {
                    "write the topic's full URL, such as \"https://ntfy.sh/my-builds\""
                }
                _ => "write the full URL it posts to, starting with https:// (or http://)",
            }),
        );
        return;
    }
    let lower = url.value.to_ascii_lowercase();
    let why = if kind == NotifyKind::Slack || lower.contains("hooks.slack.com/") {
        Some("a Slack incoming-webhook URL is a secret: anyone who has it can post to the channel")
    } else if has_password(&url.value) {
        Some("this URL holds a password")
    } else if [
        "token=",
        "key=",
        "secret=",
        "password=",
        "sig=",
        "signature=",
    ]
    .iter()
    .any(|k| query_has(&lower, k))
    {
        Some("this URL's query holds what looks like a token")
    } else {
        None
    };
    if let Some(why) = why {
        let var = match kind {
            NotifyKind::Slack => "SLACK_WEBHOOK_URL",
            NotifyKind::Ntfy => "NTFY_TOPIC_URL",
            _ => "HOOK_URL",
        };
        diags.push(
            Diagnostic::new(
                Code::InlineSecret,
                url.span,
                format!("the `url` of notifier `{name}` is written inline: {why}"),
            )
            .label("a secret in the workflow file")
            .help_syntax(
                format!("put the URL in an environment variable and name it instead, such as url_env = \"{var}\"; its value is then masked in everything the run writes"),
                format!("put the URL in an environment variable and name it instead, such as url_env \"{var}\"; its value is then masked in everything the run writes"),
            ),
        );
    }
}

fn query_has(url: &str, key: &str) -> bool {
    url.split_once('?')
        .is_some_and(|(_, q)| q.split('&').any(|p| p.starts_with(key)))
}

/// Whether the URL's authority holds `user:password@`.
fn has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// `Ok` for an http(s) URL with a host; else what is wrong with it.
pub fn http_url(url: &str) -> Result<(), &'static str> {
    let lower = url.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"));
    let Some(rest) = rest else {
        return Err(if lower.contains("://") {
            "is not an http(s) URL"
        } else {
            "is not a URL"
        });
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() || host.starts_with(':') {
        return Err("has no host");
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("holds a space or a control character");
    }
    Ok(())
}

/// Whether `name` can be the name of an environment variable as shells write them.
pub fn is_env_name(name: &str) -> bool {
    name.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn check_env_name(key: &str, env: &Text, diags: &mut Diagnostics) {
    if is_env_name(&env.value) {
        return;
    }
    // A name cannot hold these; a URL, a `Bearer ...` header or a long token can.
    let value_itself = env.value.contains("://")
        || env.value.contains(char::is_whitespace)
        || env.value.len() >= 16;
    let d = Diagnostic::new(
        Code::NotifierValue,
        env.span,
        if value_itself {
            format!("`{key}` holds what looks like the value itself, not the name of an environment variable")
        } else {
            format!("`{key}` names no environment variable: `{}`", env.value)
        },
    )
    .label("expected a variable name")
    .help(format!(
        "`{key}` names the environment variable that holds the value (letters, digits and `_`, such as HOOK_TOKEN); set the value in the environment, where it is masked as a secret"
    ));
    diags.push(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_with_a_host() {
        assert_eq!(http_url("https://hooks.example.com/x"), Ok(()));
        assert_eq!(http_url("HTTP://127.0.0.1:9"), Ok(()));
        assert_eq!(http_url("ftp://x/y"), Err("is not an http(s) URL"));
        assert_eq!(http_url("hooks.example.com"), Err("is not a URL"));
        assert_eq!(http_url("https:///topic"), Err("has no host"));
        assert_eq!(http_url("https://user@:80/"), Err("has no host"));
        assert_eq!(
            http_url("https://x/a b"),
            Err("holds a space or a control character")
        );
    }

    #[test]
    fn passwords_and_tokens_in_urls_are_found() {
        assert!(has_password("https://ops:hunter22@example.com/x"));
        assert!(!has_password("https://ops@example.com/x"));
        assert!(!has_password("https://example.com/a:b@c"));
        assert!(query_has("https://x/y?a=1&token=t", "token="));
        assert!(!query_has("https://x/token=t", "token="));
    }

    #[test]
    fn env_and_header_names() {
        assert!(is_env_name("HOOK_TOKEN"));
        assert!(is_env_name("_x1"));
        assert!(!is_env_name("1X"));
        assert!(!is_env_name("SLACK-URL"));
        assert!(!is_env_name(""));
        assert!(is_header_name("X-Token"));
        assert!(!is_header_name("X Token"));
        assert!(!is_header_name(""));
    }
}
