//! The HTTP backends (`openai`, `anthropic`) against a local mock server.
//!
//! Keys cannot be set in the environment here (`set_var` is unsafe), so `api_key_env` names a
//! variable every environment has (`PATH`) as a stand-in key, and a surely unset name for
//! the missing case.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use ralph_flow::backend::{AgentCall, AgentConfig, AgentReply, CallError, Usage, build};
use ralph_flow::model::AgentKind;
use serde_json::{Value, json};
use tempfile::TempDir;
use wiremock::matchers::{body_json, body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

/// The variable whose value stands in for an API key.
const KEY_ENV: &str = "PATH";
/// A variable no environment sets.
const UNSET_ENV: &str = "RF_TEST_HTTP_SURELY_UNSET_KEY_7f3a";

fn key() -> String {
    std::env::var(KEY_ENV).unwrap()
}

fn config(kind: AgentKind, server: &MockServer) -> AgentConfig {
    AgentConfig {
        name: "llm".into(),
        kind,
        model: Some("model-1".into()),
        base_url: Some(format!("{}/v1/", server.uri())),
        api_key_env: Some(KEY_ENV.into()),
        ..AgentConfig::default()
    }
}

fn openai(server: &MockServer, api: &str) -> AgentConfig {
    AgentConfig {
        api: ralph_flow::model::OpenAiApi::parse(api).expect("chat or responses"),
        ..config(AgentKind::OpenAi, server)
    }
}

fn call(dir: &Path) -> AgentCall {
    AgentCall {
        stage: "plan".into(),
        scope: String::new(),
        attempt: 1,
        prompt: "Say hi".into(),
        model: None,
        args: Vec::new(),
        env: Vec::new(),
        cwd: dir.to_path_buf(),
        dir: dir.to_path_buf(),
        timeout: None,
        idle_timeout: None,
        schema: None,
        max_tokens: None,
        ..AgentCall::default()
    }
}

async fn run(config: &AgentConfig, call: &AgentCall) -> Result<AgentReply, CallError> {
    build(config).unwrap().call(call).await
}

/// Answers every POST with this response.
async fn answer(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .respond_with(response)
        .mount(server)
        .await;
}

fn chat_response() -> Value {
    json!({
        "id": "chatcmpl-1",
        "model": "model-1-2025",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}}],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 8}
        }
    })
}

#[tokio::test]
async fn chat_sends_the_prompt_and_reads_the_reply() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", format!("Bearer {}", key())))
        .and(header("content-type", "application/json"))
        .and(body_json(json!({
            "model": "model-2",
            "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 100,
            "stream": true,
            "stream_options": {"include_usage": true}
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(chat_response()))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let config = AgentConfig {
        max_tokens: Some(100),
        ..openai(&server, "chat")
    };
    let call = AgentCall {
        model: Some("model-2".into()),
        ..call(dir.path())
    };
    let backend = build(&config).unwrap();
    let reply = backend.call(&call).await.unwrap();
    assert_eq!(reply.text, "Hi!");
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 12,
            output_tokens: 3,
            cached_tokens: 8,
            cost_usd: None,
            unreported: 0
        }
    );
    assert_eq!(reply.session_id.as_deref(), Some("chatcmpl-1"));
    assert_eq!(reply.model.as_deref(), Some("model-1-2025"));
    assert_eq!(
        serde_json::from_str::<Value>(&reply.raw).unwrap(),
        chat_response()
    );
}

#[tokio::test]
async fn responses_sends_input_and_joins_output_text() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/responses"))
        .and(header("authorization", format!("Bearer {}", key())))
        .and(body_json(json!({
            "model": "model-1",
            "input": "Say hi",
            "max_output_tokens": 50,
            "stream": true
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "resp_1",
            "model": "model-1",
            "output": [
                {"type": "reasoning", "summary": []},
                {"type": "message", "content": [
                    {"type": "output_text", "text": "Hello, "},
                    {"type": "refusal", "refusal": "no"},
                    {"type": "output_text", "text": "world"}
                ]}
            ],
            "usage": {
                "input_tokens": 20,
                "output_tokens": 5,
                "input_tokens_details": {"cached_tokens": 4}
            }
        })))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let call = AgentCall {
        max_tokens: Some(50),
        ..call(dir.path())
    };
    let reply = run(&openai(&server, "responses"), &call).await.unwrap();
    assert_eq!(reply.text, "Hello, world");
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 20,
            output_tokens: 5,
            cached_tokens: 4,
            cost_usd: None,
            unreported: 0
        }
    );
    assert_eq!(reply.session_id.as_deref(), Some("resp_1"));
}

#[tokio::test]
async fn responses_prefers_output_text() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(200).set_body_json(json!({
            "id": "resp_2",
            "output_text": "All of it",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "All"}]}]
        })),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let reply = run(&openai(&server, "responses"), &call(dir.path()))
        .await
        .unwrap();
    assert_eq!(reply.text, "All of it");
    assert_eq!(reply.model.as_deref(), Some("model-1"));
}

#[tokio::test]
async fn anthropic_sends_its_headers_and_joins_text_blocks() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", key()))
        .and(header("anthropic-version", "2023-06-01"))
        .and(|request: &Request| !request.headers.contains_key("authorization"))
        .and(body_json(json!({
            "model": "model-1",
            "max_tokens": 8192,
            "messages": [{"role": "user", "content": "Say hi"}],
            "stream": true
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "msg_1",
            "type": "message",
            "model": "claude-x",
            "content": [
                {"type": "text", "text": "Part one. "},
                {"type": "tool_use", "id": "t", "name": "n", "input": {}},
                {"type": "text", "text": "Part two."}
            ],
            "stop_reason": "max_tokens",
            "usage": {"input_tokens": 30, "output_tokens": 8192, "cache_read_input_tokens": 25}
        })))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let config = config(AgentKind::Anthropic, &server);
    let backend = build(&config).unwrap();
    let call = AgentCall {
        schema: Some(json!({"type": "object"})),
        ..call(dir.path())
    };
    let reply = backend.call(&call).await.unwrap();
    assert_eq!(reply.text, "Part one. Part two.");
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 30,
            output_tokens: 8192,
            cached_tokens: 25,
            cost_usd: None,
            unreported: 0
        }
    );
    assert_eq!(reply.session_id.as_deref(), Some("msg_1"));
    assert_eq!(reply.model.as_deref(), Some("claude-x"));
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
}

#[tokio::test]
async fn chat_sends_the_schema_as_response_format() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema(), "strict": false}
            }
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(chat_response()))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let call = AgentCall {
        schema: Some(schema()),
        ..call(dir.path())
    };
    run(&openai(&server, "chat"), &call).await.unwrap();
}

#[tokio::test]
async fn responses_sends_the_schema_as_text_format() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_partial_json(json!({
            "text": {"format": {
                "type": "json_schema",
                "name": "output",
                "schema": schema(),
                "strict": false
            }}
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"output_text": "{}"})))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let call = AgentCall {
        schema: Some(schema()),
        ..call(dir.path())
    };
    run(&openai(&server, "responses"), &call).await.unwrap();
}

#[tokio::test]
async fn rate_limit_passes_retry_after_on() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(429)
            .insert_header("retry-after", "7")
            .set_body_json(json!({"error": {"message": "Rate limit reached", "type": "requests"}})),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let error = run(&openai(&server, "chat"), &call(dir.path()))
        .await
        .unwrap_err();
    let CallError::RateLimited {
        message,
        retry_after,
    } = error
    else {
        panic!("expected RateLimited, got {error:?}");
    };
    assert_eq!(retry_after, Some(Duration::from_secs(7)));
    assert!(message.contains("Rate limit reached"), "{message}");
}

#[tokio::test]
async fn insufficient_quota_is_a_rate_limit() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(429).set_body_json(json!({"error": {
            "message": "You exceeded your current quota",
            "type": "insufficient_quota",
            "code": "insufficient_quota"
        }})),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let error = run(&openai(&server, "chat"), &call(dir.path()))
        .await
        .unwrap_err();
    let CallError::RateLimited { message, .. } = error else {
        panic!("expected RateLimited, got {error:?}");
    };
    assert!(message.contains("quota"), "{message}");
}

#[tokio::test]
async fn server_errors_are_transient() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(500)
            .set_body_json(json!({"error": {"message": "The server had an error"}})),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let error = run(&openai(&server, "chat"), &call(dir.path()))
        .await
        .unwrap_err();
    let CallError::Transient { message, .. } = error else {
        panic!("expected Transient, got {error:?}");
    };
    assert!(message.contains("500"), "{message}");
    assert!(message.contains("The server had an error"), "{message}");
}

#[tokio::test]
async fn anthropic_overload_is_transient() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(529)
            .insert_header("retry-after", "3")
            .set_body_json(json!({
                "type": "error",
                "error": {"type": "overloaded_error", "message": "Overloaded"}
            })),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let error = run(&config(AgentKind::Anthropic, &server), &call(dir.path()))
        .await
        .unwrap_err();
    assert_eq!(
        error,
        CallError::Transient {
            message: format!(
                "HTTP 529 Overloaded from {}/v1/messages: Overloaded",
                server.uri()
            ),
            retry_after: Some(Duration::from_secs(3)),
        }
    );
}

#[tokio::test]
async fn unauthorized_names_the_variable_not_the_key() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(401).set_body_json(json!({"error": {
            "message": format!("Incorrect API key provided: {}", key()),
            "type": "invalid_request_error",
            "code": "invalid_api_key"
        }})),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let error = run(&openai(&server, "chat"), &call(dir.path()))
        .await
        .unwrap_err();
    let CallError::Failed { message } = error else {
        panic!("expected Failed, got {error:?}");
    };
    assert!(message.contains(&format!("`{KEY_ENV}`")), "{message}");
    assert!(!message.contains(&key()), "{message}");
}

#[tokio::test]
async fn other_client_errors_fail_with_the_api_message() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(400).set_body_json(json!({
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "model: not found"}
        })),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let error = run(&config(AgentKind::Anthropic, &server), &call(dir.path()))
        .await
        .unwrap_err();
    let CallError::Failed { message } = error else {
        panic!("expected Failed, got {error:?}");
    };
    assert!(message.contains("400"), "{message}");
    assert!(message.contains("model: not found"), "{message}");
}

#[tokio::test]
async fn an_unreadable_success_is_transient() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(200).set_body_string("<html>bad gateway</html>"),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let error = run(&openai(&server, "chat"), &call(dir.path()))
        .await
        .unwrap_err();
    let CallError::Transient { message, .. } = error else {
        panic!("expected Transient, got {error:?}");
    };
    assert!(message.contains("<html>bad gateway</html>"), "{message}");
}

#[tokio::test]
async fn a_refused_connection_is_transient() {
    // A port that was just free: nothing listens there any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempDir::new().unwrap();
    let config = AgentConfig {
        name: "llm".into(),
        kind: AgentKind::OpenAi,
        model: Some("m".into()),
        base_url: Some(format!("http://127.0.0.1:{port}/v1")),
        api_key_env: Some(KEY_ENV.into()),
        ..AgentConfig::default()
    };
    let error = run(&config, &call(dir.path())).await.unwrap_err();
    assert!(
        matches!(error, CallError::Transient { .. }),
        "expected Transient, got {error:?}"
    );
}

#[tokio::test]
async fn an_unset_key_variable_is_missing() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(chat_response()))
        .expect(0)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    for kind in [AgentKind::OpenAi, AgentKind::Anthropic] {
        let config = AgentConfig {
            api_key_env: Some(UNSET_ENV.into()),
            ..config(kind, &server)
        };
        let error = run(&config, &call(dir.path())).await.unwrap_err();
        let CallError::Missing { message } = error else {
            panic!("expected Missing, got {error:?}");
        };
        assert!(message.contains(UNSET_ENV), "{message}");
    }
}

#[tokio::test]
async fn the_default_key_is_required_by_the_default_base_url() {
    // Only when the default variables are unset here: otherwise this would reach the network.
    let dir = TempDir::new().unwrap();
    for (kind, var) in [
        (AgentKind::OpenAi, "OPENAI_API_KEY"),
        (AgentKind::Anthropic, "ANTHROPIC_API_KEY"),
    ] {
        if std::env::var_os(var).is_some() {
            continue;
        }
        let config = AgentConfig {
            name: "llm".into(),
            kind,
            model: Some("m".into()),
            ..AgentConfig::default()
        };
        let error = run(&config, &call(dir.path())).await.unwrap_err();
        let CallError::Missing { message } = error else {
            panic!("expected Missing, got {error:?}");
        };
        assert!(message.contains(var), "{message}");
    }
}

#[tokio::test]
async fn a_custom_base_url_without_a_key_sends_no_authorization() {
    if std::env::var_os("OPENAI_API_KEY").is_some() {
        eprintln!("skipped: OPENAI_API_KEY is set");
        return;
    }
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(|request: &Request| !request.headers.contains_key("authorization"))
        .respond_with(ResponseTemplate::new(200).set_body_json(chat_response()))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let config = AgentConfig {
        api_key_env: None,
        ..openai(&server, "chat")
    };
    let reply = run(&config, &call(dir.path())).await.unwrap();
    assert_eq!(reply.text, "Hi!");
}

#[tokio::test]
async fn a_model_is_needed() {
    let server = MockServer::start().await;
    let dir = TempDir::new().unwrap();
    let config = AgentConfig {
        model: None,
        ..openai(&server, "chat")
    };
    let error = run(&config, &call(dir.path())).await.unwrap_err();
    let CallError::Failed { message } = error else {
        panic!("expected Failed, got {error:?}");
    };
    assert!(message.contains("needs a `model`"), "{message}");
}

#[tokio::test]
async fn the_timeout_bounds_the_whole_request() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(200)
            .set_body_json(chat_response())
            .set_delay(Duration::from_secs(5)),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let call = AgentCall {
        timeout: Some(Duration::from_millis(200)),
        idle_timeout: Some(Duration::from_secs(60)),
        ..call(dir.path())
    };
    let error = run(&openai(&server, "chat"), &call).await.unwrap_err();
    assert!(
        matches!(error, CallError::Timeout { after, idle: false, .. } if after == Duration::from_millis(200)),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_idle_timeout_bounds_the_wait_for_headers() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(200)
            .set_body_json(chat_response())
            .set_delay(Duration::from_secs(5)),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let call = AgentCall {
        timeout: Some(Duration::from_secs(60)),
        idle_timeout: Some(Duration::from_millis(200)),
        ..call(dir.path())
    };
    let error = run(&openai(&server, "chat"), &call).await.unwrap_err();
    assert!(
        matches!(error, CallError::Timeout { idle: true, .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_idle_timeout_bounds_a_stalled_body() {
    use std::io::{Read, Write};
    // A server that sends the headers and the start of the body, then stalls.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request).unwrap();
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                  content-length: 1000\r\n\r\n{\"id\": \"partial",
            )
            .unwrap();
        stream.flush().unwrap();
        std::thread::sleep(Duration::from_secs(1));
    });
    let dir = TempDir::new().unwrap();
    let config = AgentConfig {
        name: "llm".into(),
        kind: AgentKind::OpenAi,
        model: Some("m".into()),
        base_url: Some(format!("http://127.0.0.1:{port}/v1")),
        api_key_env: Some(KEY_ENV.into()),
        ..AgentConfig::default()
    };
    let call = AgentCall {
        idle_timeout: Some(Duration::from_millis(300)),
        ..call(dir.path())
    };
    let error = run(&config, &call).await.unwrap_err();
    let CallError::Timeout { idle, tail, .. } = error else {
        panic!("expected Timeout, got {error:?}");
    };
    assert!(idle);
    assert_eq!(tail, r#"{"id": "partial"#);
    server.join().unwrap();
}

#[tokio::test]
async fn request_and_response_are_written_without_the_key() {
    let server = MockServer::start().await;
    answer(
        &server,
        ResponseTemplate::new(200).set_body_json(chat_response()),
    )
    .await;
    let dir = TempDir::new().unwrap();
    run(&openai(&server, "chat"), &call(dir.path()))
        .await
        .unwrap();
    let request = std::fs::read_to_string(dir.path().join("request.json")).unwrap();
    assert!(!request.contains(&key()), "{request}");
    assert_eq!(
        serde_json::from_str::<Value>(&request).unwrap(),
        json!({
            "model": "model-1",
            "messages": [{"role": "user", "content": "Say hi"}],
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
    let response = std::fs::read_to_string(dir.path().join("response.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&response).unwrap(),
        chat_response()
    );
}

#[test]
fn bad_settings_are_refused_at_build() {
    let config = AgentConfig {
        name: "llm".into(),
        kind: AgentKind::Anthropic,
        base_url: Some("localhost:8000".into()),
        ..AgentConfig::default()
    };
    let error = build(&config).err().unwrap().to_string();
    assert!(error.contains("not an http(s) URL"), "{error}");
}

// ---- llama-cpp-python's dialect, from captured exchanges -------------------------------

/// A captured exchange of llama-cpp-python's server (tests/fixtures/servers/).
fn capture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/servers/llama-cpp-python")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The captured answer, with its status, content type and raw body.
fn replay(name: &str) -> ResponseTemplate {
    let c = capture(name);
    let content_type = c["headers"]["content-type"]
        .as_str()
        .unwrap_or("application/json")
        .to_string();
    ResponseTemplate::new(u16::try_from(c["status"].as_u64().unwrap()).unwrap())
        .insert_header("content-type", content_type.as_str())
        .set_body_string(c["raw"].as_str().unwrap())
}

/// The text a captured stream carries, joined from its deltas.
fn streamed_text(name: &str) -> String {
    capture(name)["raw"]
        .as_str()
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

fn verdict_schema() -> Value {
    json!({"type": "object", "required": ["verdict"], "properties": {"verdict": {"type": "string"}}})
}

fn local(server: &MockServer) -> AgentConfig {
    AgentConfig {
        base_url: Some(format!("{}/v1", server.uri())),
        api_key_env: None,
        ..openai(server, "chat")
    }
}

#[tokio::test]
async fn a_captured_llama_stream_is_read_whole() {
    for name in ["stream", "stream_long", "stream_json_object_schema"] {
        let server = MockServer::start().await;
        answer(&server, replay(name)).await;
        let dir = TempDir::new().unwrap();
        let reply = run(&local(&server), &call(dir.path())).await.unwrap();
        let expected = streamed_text(name);
        assert!(!expected.is_empty(), "{name}");
        assert_eq!(reply.text, expected, "{name}");
        assert_eq!(
            reply.model.as_deref(),
            Some("gemma-3-270m-q4_k_m"),
            "{name}"
        );
        // llama-cpp-python sends no usage in streams: the call's usage is unknown, not 0.
        assert_eq!(reply.usage, Usage::unreported_call(), "{name}");
        assert!(reply.usage.is_unknown(), "{name}");
    }
}

/// A stream as OpenAI sends it with `stream_options.include_usage`: the text, the finish,
/// then a chunk with no choices and the usage.
fn stream_with_usage(usage: Value) -> String {
    let chunk = |v: Value| format!("data: {v}\n\n");
    [
        chunk(json!({"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hi"}}]})),
        chunk(json!({"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})),
        chunk(json!({"id": "c1", "model": "m", "choices": [], "usage": usage})),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat()
}

fn sse(body: String) -> ResponseTemplate {
    ResponseTemplate::new(200)
        .insert_header("content-type", "text/event-stream")
        .set_body_string(body)
}

#[tokio::test]
async fn a_stream_that_reports_zero_tokens_is_told_from_one_that_reports_none() {
    let server = MockServer::start().await;
    answer(
        &server,
        sse(stream_with_usage(
            json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
        )),
    )
    .await;
    let dir = TempDir::new().unwrap();
    let reply = run(&local(&server), &call(dir.path())).await.unwrap();
    assert_eq!(reply.text, "Hi");
    assert_eq!(reply.usage, Usage::default(), "reported, as 0");
    assert!(!reply.usage.is_unknown());

    // vLLM sends `"usage": null` on every chunk but the last when asked; without the last,
    // nothing was reported.
    let server = MockServer::start().await;
    let nulls = stream_with_usage(Value::Null);
    answer(&server, sse(nulls)).await;
    let reply = run(&local(&server), &call(dir.path())).await.unwrap();
    assert_eq!(reply.usage, Usage::unreported_call());

    let server = MockServer::start().await;
    answer(
        &server,
        sse(stream_with_usage(
            json!({"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}),
        )),
    )
    .await;
    let reply = run(&local(&server), &call(dir.path())).await.unwrap();
    assert_eq!(
        (
            reply.usage.input_tokens,
            reply.usage.output_tokens,
            reply.usage.unreported
        ),
        (9, 2, 0)
    );
}

#[tokio::test]
async fn a_whole_answer_without_usage_has_its_usage_unknown() {
    // A server that does not stream (it ignores `stream: true`) and sends no `usage`, for
    // each API.
    let cases = [
        (
            openai as fn(&MockServer, &str) -> AgentConfig,
            "chat",
            json!({"id": "c", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}]}),
        ),
        (openai, "responses", json!({"id": "r", "output_text": "Hi"})),
        (
            |s: &MockServer, _: &str| config(AgentKind::Anthropic, s),
            "messages",
            json!({"id": "m", "content": [{"type": "text", "text": "Hi"}]}),
        ),
    ];
    for (make, api, body) in cases {
        let server = MockServer::start().await;
        answer(&server, ResponseTemplate::new(200).set_body_json(body)).await;
        let dir = TempDir::new().unwrap();
        let reply = run(&make(&server, api), &call(dir.path())).await.unwrap();
        assert_eq!(reply.text, "Hi", "{api}");
        assert_eq!(reply.usage, Usage::unreported_call(), "{api}");
    }
}

#[tokio::test]
async fn a_streamed_answer_of_each_api_reports_its_usage_or_none() {
    // Responses: the usage comes with `response.completed`; a server may leave it out.
    let completed = |usage: Value| {
        let mut response = json!({"id": "r", "model": "m"});
        if !usage.is_null() {
            response["usage"] = usage;
        }
        format!(
            "data: {}\n\ndata: {}\n\n",
            json!({"type": "response.output_text.delta", "delta": "Hi"}),
            json!({"type": "response.completed", "response": response})
        )
    };
    // Anthropic: the input count comes with `message_start`, the output with
    // `message_delta`.
    let messages = |usage: Value| {
        let mut message = json!({"id": "m", "model": "m"});
        if !usage.is_null() {
            message["usage"] = usage;
        }
        format!(
            "data: {}\n\ndata: {}\n\ndata: {}\n\n",
            json!({"type": "message_start", "message": message}),
            json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "message_stop"})
        )
    };
    let cases: [(AgentKind, &str, String, Usage); 4] = [
        (
            AgentKind::OpenAi,
            "responses",
            completed(json!({"input_tokens": 7, "output_tokens": 1})),
            Usage {
                input_tokens: 7,
                output_tokens: 1,
                ..Usage::default()
            },
        ),
        (
            AgentKind::OpenAi,
            "responses",
            completed(Value::Null),
            Usage::unreported_call(),
        ),
        (
            AgentKind::Anthropic,
            "chat",
            messages(json!({"input_tokens": 5, "output_tokens": 1})),
            Usage {
                input_tokens: 5,
                output_tokens: 1,
                ..Usage::default()
            },
        ),
        (
            AgentKind::Anthropic,
            "chat",
            messages(Value::Null),
            Usage::unreported_call(),
        ),
    ];
    for (kind, api, stream, expected) in cases {
        let server = MockServer::start().await;
        answer(&server, sse(stream)).await;
        let dir = TempDir::new().unwrap();
        let config = AgentConfig {
            api: ralph_flow::model::OpenAiApi::parse(api).unwrap(),
            ..config(kind, &server)
        };
        let reply = run(&config, &call(dir.path())).await.unwrap();
        assert_eq!(reply.text, "Hi", "{kind:?} {api}");
        assert_eq!(reply.usage, expected, "{kind:?} {api}");
    }
}

#[tokio::test]
async fn auto_steps_down_from_a_rejected_json_schema_once_per_run() {
    let server = MockServer::start().await;
    // The server's real answers: 500 to json_schema, a stream to json_object + schema.
    Mock::given(method("POST"))
        .and(body_partial_json(
            json!({"response_format": {"type": "json_schema"}}),
        ))
        .respond_with(replay("json_schema_loose"))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(body_partial_json(
            json!({"response_format": {"type": "json_object", "schema": verdict_schema()}}),
        ))
        .respond_with(replay("stream_json_object_schema"))
        .expect(2)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let backend = build(&local(&server)).unwrap();
    let call = AgentCall {
        schema: Some(verdict_schema()),
        ..call(dir.path())
    };
    let first = backend.call(&call).await.unwrap();
    assert_eq!(first.text, streamed_text("stream_json_object_schema"));
    assert_eq!(first.warnings.len(), 1, "{:?}", first.warnings);
    assert!(
        first.warnings[0].contains("Input should be 'text' or 'json_object'")
            && first.warnings[0].contains("set `structured_output = \"json_object\"`"),
        "{}",
        first.warnings[0]
    );
    // The next call of the run goes straight to the mode that works, with no warning.
    let second = backend.call(&call).await.unwrap();
    assert!(second.warnings.is_empty(), "{:?}", second.warnings);
}

#[tokio::test]
async fn an_explicit_mode_the_server_rejects_fails_at_once() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(replay("json_schema_loose"))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let config = AgentConfig {
        structured_output: ralph_flow::model::StructuredOutput::JsonSchema,
        ..local(&server)
    };
    let call = AgentCall {
        schema: Some(verdict_schema()),
        ..call(dir.path())
    };
    let error = run(&config, &call).await.unwrap_err();
    let CallError::Failed { message } = error else {
        panic!("expected a permanent failure, not a transient one: {error:?}");
    };
    assert!(
        message.contains("does not accept structured output `json_schema`")
            && message.contains("`json_object` for llama-cpp-python"),
        "{message}"
    );
}

#[tokio::test]
async fn the_prompt_mode_writes_the_schema_into_the_prompt() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(|request: &Request| {
            let body: Value = serde_json::from_slice(&request.body).unwrap();
            let prompt = body["messages"][0]["content"].as_str().unwrap_or("");
            body.get("response_format").is_none()
                && prompt.starts_with("Say hi")
                && prompt.contains("\"required\": [\n    \"verdict\"\n  ]")
        })
        .respond_with(replay("stream"))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().unwrap();
    let config = AgentConfig {
        structured_output: ralph_flow::model::StructuredOutput::Prompt,
        ..local(&server)
    };
    let call = AgentCall {
        schema: Some(verdict_schema()),
        ..call(dir.path())
    };
    run(&config, &call).await.unwrap();
}

#[tokio::test]
async fn the_idle_timeout_measures_silence_not_generation_time() {
    use std::io::{Read, Write};
    // A stream whose whole answer takes longer than the idle timeout, with no silence as
    // long as it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let raw = capture("stream_json_object_schema")["raw"]
        .as_str()
        .unwrap()
        .to_string();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 8192];
        let _ = stream.read(&mut request).unwrap();
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                  connection: close\r\n\r\n",
            )
            .unwrap();
        for event in raw.split_inclusive("\n\n") {
            std::thread::sleep(Duration::from_millis(60));
            stream.write_all(event.as_bytes()).unwrap();
            stream.flush().unwrap();
        }
    });
    let dir = TempDir::new().unwrap();
    let config = AgentConfig {
        name: "llm".into(),
        kind: AgentKind::OpenAi,
        model: Some("m".into()),
        base_url: Some(format!("http://127.0.0.1:{port}/v1")),
        ..AgentConfig::default()
    };
    let events = streamed_text("stream_json_object_schema").len();
    assert!(events > 0);
    let call = AgentCall {
        idle_timeout: Some(Duration::from_millis(400)),
        ..call(dir.path())
    };
    let started = std::time::Instant::now();
    let reply = run(&config, &call).await.unwrap();
    assert!(
        started.elapsed() > Duration::from_millis(400),
        "the answer took longer than the idle timeout"
    );
    assert_eq!(reply.text, streamed_text("stream_json_object_schema"));
    server.join().unwrap();
}
