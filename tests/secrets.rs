//! Secrets never reach a sink: every kind of secret a run knows of, printed by its stages
//! (an agent's answer, a command that succeeds, one that fails and ends the run), is found in
//! none of the bytes of the state directory (the SQLite file and its log included), nor in
//! what `run`, `logs`, `status`, `runs` and `export` print or write, nor in the monitor's
//! pages, API and metrics. Readers that know a secret the run did not mask it too. And the
//! `secrets` key: its shape, its names, its merging, its too-short values.
#![allow(clippy::unwrap_used)]

mod common;
mod monitor_support;

use std::path::Path;

use common::Project;
use monitor_support::Server;

/// (variable, value, what the value is): one of each kind of secret.
const SECRETS: &[(&str, &str)] = &[
    // Named by an HTTP agent's `api_key_env` (a name of no well-known form).
    ("SERVICE_CREDENTIAL", "svc-cred-7f3a9b2c4d5e6f70"),
    // Well-known names.
    ("GITHUB_TOKEN", "ghp_TestToken0123456789abcdefABCDEF"),
    (
        "AWS_SECRET_ACCESS_KEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    (
        "DATABASE_URL",
        "postgres://app:Db-pass-w0rd-91f2@db.internal:5432/prod",
    ),
    // The key the claude CLI reads.
    ("ANTHROPIC_API_KEY", "sk-ant-test-00112233445566778899"),
    // Listed in the workflow's `secrets`.
    ("DEPLOY_PASSPHRASE", "correct-horse-battery-staple-42"),
];

/// The password of `DATABASE_URL`, which must not appear alone either.
const DB_PASSWORD: &str = "Db-pass-w0rd-91f2";

/// Every raw value that must appear nowhere, with the forms it takes escaped for HTML.
fn forbidden() -> Vec<String> {
    let mut out: Vec<String> = SECRETS
        .iter()
        .filter(|(name, _)| *name != "DATABASE_URL")
        .map(|(_, v)| v.to_string())
        .collect();
    out.push(DB_PASSWORD.to_string());
    out.push("wJalrXUtnFEMI&#x2f;K7MDENG&#x2f;bPxRfiCYEXAMPLEKEY".to_string());
    out
}

fn assert_clean(what: &str, text: &str) {
    for secret in forbidden() {
        assert!(
            !text.contains(&secret),
            "{what} holds the secret {secret:?}:\n{text}"
        );
    }
}

/// Every file under `dir`, read as bytes: none holds a raw value.
fn assert_files_clean(dir: &Path) -> usize {
    let mut seen = 0;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            seen += 1;
            for secret in forbidden() {
                let needle = secret.as_bytes();
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle),
                    "{} holds the secret {secret:?}",
                    path.display()
                );
            }
        }
    }
    seen
}

const PRINT_ALL: &str = "printf '%s\\n' \"$SERVICE_CREDENTIAL\" \"$GITHUB_TOKEN\" \"$AWS_SECRET_ACCESS_KEY\" \"$DATABASE_URL\" \"password=Db-pass-w0rd-91f2\" \"$ANTHROPIC_API_KEY\" \"$DEPLOY_PASSPHRASE\"";

fn leaking_workflow() -> String {
    format!(
        r#"name = "leak"
secrets = ["DEPLOY_PASSPHRASE"]

[agents.claude]
kind = "claude"

[agents.api]
kind = "openai"
model = "m"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "SERVICE_CREDENTIAL"

[stages.ask]
kind = "agent"
agent = "claude"
prompt = "Say what you know."

[stages.show]
kind = "command"
needs = ["ask"]
argv = ["sh", "-c", '''{PRINT_ALL}''']

[stages.leak]
kind = "command"
needs = ["show"]
argv = ["sh", "-c", '''{PRINT_ALL}; {PRINT_ALL} >&2; exit 3''']
"#
    )
}

fn secret_env() -> Vec<(&'static str, String)> {
    let mut env: Vec<(&str, String)> = SECRETS
        .iter()
        .map(|(k, v)| (*k, (*v).to_string()))
        .collect();
    // The agent answers with every secret.
    let reply: Vec<&str> = SECRETS.iter().map(|(_, v)| *v).collect();
    env.push(("FAKE_REPLY", reply.join(" ")));
    env
}

#[test]
fn every_kind_of_secret_is_masked_in_every_sink() {
    let p = Project::new();
    p.workflow("w.toml", &leaking_workflow());
    let env = secret_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = p.run_env(&["run", "w.toml", "--json"], &env);
    assert_ne!(out.code, 0, "the last stage fails: {}", out.stderr);
    assert!(
        out.stderr.contains("[REDACTED]"),
        "the failure is shown, masked: {}",
        out.stderr
    );
    assert_clean("run's stdout", &out.stdout);
    assert_clean("run's stderr", &out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();

    // The readers run without the secrets: what they show is what was stored.
    let mut printed = Vec::new();
    for args in [
        vec!["logs", run.as_str()],
        vec!["logs", run.as_str(), "--json"],
        vec!["logs", run.as_str(), "--stage", "leak"],
        vec!["logs", run.as_str(), "--stage", "ask", "--json"],
        vec!["status", run.as_str()],
        vec!["status", run.as_str(), "--json"],
        vec!["runs", "--json"],
    ] {
        let o = p.run(&args);
        assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
        assert_clean(&format!("{args:?}"), &format!("{}{}", o.stdout, o.stderr));
        printed.push(o.stdout);
    }
    let logs = &printed[1];
    assert!(
        logs.contains("\"kind\": \"finished\"") && logs.contains("[REDACTED]"),
        "the final event is there, masked: {logs}"
    );
    assert!(
        logs.contains("postgres://app:[REDACTED]@db.internal"),
        "a URL keeps all but its password: {logs}"
    );

    let exported = p.dir().join("exported");
    let o = p.run(&["export", &run, "--out", exported.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        assert_files_clean(&exported) >= 5,
        "the records were exported"
    );
    // The whole state directory, the store and its log included, as bytes.
    assert!(assert_files_clean(&p.dir().join(".ralph-flow")) >= 5);
    let raw = p.read(&format!(".ralph-flow/runs/{run}/artifacts.jsonl"));
    assert!(raw.contains("[REDACTED]"), "the answer was recorded: {raw}");

    // The monitor, without the secrets in its environment.
    let s = Server::start(p.dir(), &[]);
    let mut paths = vec![
        "/".to_string(),
        "/api/runs".to_string(),
        "/metrics".to_string(),
        format!("/runs/{run}"),
        format!("/api/runs/{run}"),
        format!("/api/runs/{run}/events"),
        format!("/api/runs/{run}/artifacts"),
        format!("/live/runs/{run}"),
    ];
    for stage in ["ask", "show", "leak"] {
        paths.push(format!("/runs/{run}/stage?node={stage}"));
    }
    for record in s
        .json(&format!("/api/runs/{run}/artifacts"))
        .as_array()
        .unwrap()
    {
        let record = record.as_str().unwrap().replace('#', "%23");
        paths.push(format!("/api/runs/{run}/artifacts/{record}"));
    }
    for path in &paths {
        let r = s.get(path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_clean(path, &r.body);
    }
    let stage = s.get(&format!("/runs/{run}/stage?node=leak"));
    assert!(stage.body.contains("[REDACTED]"), "{}", stage.body);
}

#[test]
fn readers_mask_the_secrets_they_know_that_the_run_did_not() {
    // The run knew none of these (not set in its environment); `logs`, `status`, `export`
    // and the monitor, started with them, mask them.
    let p = Project::new();
    let token = "ghp_ReaderOnlyToken0123456789abcdef";
    let aws = "aws/Reader+Only/Secret/0123456789";
    p.workflow(
        "w.toml",
        &format!(
            "name = \"late\"\n[stages.say]\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo {token} {aws}; exit 1\"]\n"
        ),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_ne!(out.code, 0);
    let run = out.json["run"].as_str().unwrap().to_string();
    assert!(p.store_text().contains(token), "the run did not know it");
    let env = [("GITHUB_TOKEN", token), ("AWS_SECRET_ACCESS_KEY", aws)];
    for args in [
        vec!["logs", run.as_str()],
        vec!["logs", run.as_str(), "--json"],
        vec!["status", run.as_str(), "--json"],
    ] {
        let o = p.run_env(&args, &env);
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert!(!o.stdout.contains(token), "{args:?}: {}", o.stdout);
        assert!(!o.stdout.contains(aws), "{args:?}: {}", o.stdout);
        assert!(o.stdout.contains("[REDACTED]"), "{args:?}: {}", o.stdout);
    }
    let exported = p.dir().join("exported");
    let o = p.run_env(&["export", &run, "--out", exported.to_str().unwrap()], &env);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mut files = vec![exported];
    while let Some(f) = files.pop() {
        if f.is_dir() {
            files.extend(std::fs::read_dir(&f).unwrap().map(|e| e.unwrap().path()));
        } else {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(
                !text.contains(token) && !text.contains(aws),
                "{}",
                f.display()
            );
        }
    }
    let s = Server::start(p.dir(), &env);
    for path in [
        format!("/runs/{run}"),
        format!("/runs/{run}/stage?node=say"),
        format!("/api/runs/{run}"),
        format!("/api/runs/{run}/events"),
    ] {
        let r = s.get(&path);
        assert_eq!(r.status, 200, "{path}");
        assert!(!r.body.contains(token), "{path}: {}", r.body);
        assert!(
            !r.body.contains(aws) && !r.body.contains("aws&#x2f;Reader+Only"),
            "{path}: {}",
            r.body
        );
    }
}

#[test]
fn a_urls_password_is_masked_in_its_url_whatever_its_length_and_known_or_not() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "urls"
[stages.say]
kind = "command"
argv = ["sh", "-c", "echo \"$CACHE_URL\"; echo https://bot:unlisted-pass-77@git.example.com/r.git"]
"#,
    );
    let out = p.run_env(
        &["run", "w.toml", "--json"],
        &[("CACHE_URL", "redis://user:pw9@cache.internal:6379/0")],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let stdout = out.json["outputs"]["say"]["stdout"].as_str().unwrap();
    assert_eq!(
        stdout,
        "redis://user:[REDACTED]@cache.internal:6379/0\nhttps://bot:[REDACTED]@git.example.com/r.git\n"
    );
    let stored = p.store_text();
    assert!(!stored.contains(":pw9@"), "{stored}");
    assert!(!stored.contains("unlisted-pass-77"), "{stored}");
}

#[test]
fn a_secret_too_short_to_mask_is_named_in_a_warning_never_shown() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"short\"\nsecrets = [\"TINY_SECRET\", \"UNSET_SECRET_Q\"]\n[stages.say]\nkind = \"command\"\nargv = [\"true\"]\n",
    );
    let out = p.run_env(&["run", "w.toml"], &[("TINY_SECRET", "q7zx")]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("TINY_SECRET")
            && out.stderr.contains("shorter than 8 characters")
            && !out.stderr.contains("q7zx"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("UNSET_SECRET_Q"),
        "an unset one is no warning: {}",
        out.stderr
    );
    let logs = p.run(&["logs", &p.wait_for_run()]);
    assert!(logs.stdout.contains("TINY_SECRET"), "{}", logs.stdout);
}

#[test]
fn the_secrets_key_is_a_list_of_variable_names_merged_across_files() {
    let p = Project::new();
    for (text, code) in [
        ("secrets = 3", "RF003"),
        ("secrets = [1]", "RF003"),
        ("secrets = { A = 1 }", "RF003"),
        ("secrets = [\"NOT A NAME\"]", "RF005"),
        ("secrets = [\"9LIVES\"]", "RF005"),
    ] {
        p.workflow(
            "bad.toml",
            &format!("name = \"bad\"\n{text}\n[stages.a]\nkind = \"command\"\nargv = [\"true\"]\n"),
        );
        let out = p.run(&["check", "bad.toml"]);
        assert_eq!(out.code, 3, "{text}: {}", out.stderr);
        assert!(out.stderr.contains(code), "{text}: {}", out.stderr);
    }
    p.workflow(
        "k.kdl",
        "name \"k\"\nsecrets \"A_KEY\" \"B_KEY\"\nstage \"a\" kind=\"command\" {\n  argv \"true\"\n}\n",
    );
    let out = p.run(&["check", "k.kdl"]);
    assert_eq!(out.code, 0, "{}", out.stderr);

    // A base's and an include's secrets are the extending file's too.
    p.workflow(
        "base.toml",
        "name = \"base\"\nsecrets = [\"BASE_ONLY_SECRET\"]\n[stages.a]\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo $BASE_ONLY_SECRET $PART_ONLY_SECRET\"]\n",
    );
    p.workflow(
        "part.toml",
        "name = \"part\"\nsecrets = [\"PART_ONLY_SECRET\"]\n",
    );
    p.workflow(
        "child.toml",
        "name = \"child\"\nextends = \"base.toml\"\ninclude = [\"part.toml\"]\n",
    );
    let out = p.run_env(
        &["run", "child.toml", "--json"],
        &[
            ("BASE_ONLY_SECRET", "base-secret-value-1234"),
            ("PART_ONLY_SECRET", "part-secret-value-5678"),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json["outputs"]["a"]["stdout"], "[REDACTED] [REDACTED]\n",
        "{}",
        out.stdout
    );
    let stored = p.store_text();
    assert!(!stored.contains("base-secret-value-1234"), "{stored}");
    assert!(!stored.contains("part-secret-value-5678"), "{stored}");
}
