//! Access control: every request carries the monitor's token, as Jupyter does. The URL
//! printed at start holds it (`?token=...`); the first visit trades it for an HttpOnly,
//! SameSite=Strict cookie and a redirect to the same page without it. Scripts and `curl` may
//! send `Authorization: Bearer TOKEN` instead.
//!
//! Requests that change something (answering a gate) need, besides, the CSRF token of the
//! pages (a hash of the access token) in a form field or an `X-CSRF-Token` header when they
//! are authorized by the cookie, and are refused when their `Origin` is another site.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::Monitor;

/// The cookie that holds the token after the first visit.
const COOKIE: &str = "ralph_flow_token";

/// The monitor's access token and the CSRF token derived from it.
pub(crate) struct Token {
    secret: String,
    csrf: String,
}

impl Token {
    /// A token given by the user.
    pub(crate) fn new(secret: String) -> Token {
        let csrf = format!("{:x}", Sha256::digest(format!("csrf:{secret}").as_bytes()));
        Token { secret, csrf }
    }

    /// A random token (24 bytes from the system's generator, as hex).
    pub(crate) fn random() -> Result<Token, getrandom::Error> {
        let mut bytes = [0u8; 24];
        getrandom::fill(&mut bytes)?;
        let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Token::new(secret))
    }

    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    /// The token the pages put in their forms.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Compares in time independent of where the first difference is.
    fn matches(&self, given: &str) -> bool {
        constant_eq(given.as_bytes(), self.secret.as_bytes())
    }

    /// Whether `given` is the CSRF token.
    pub(crate) fn csrf_matches(&self, given: &str) -> bool {
        constant_eq(given.as_bytes(), self.csrf.as_bytes())
    }
}

/// Why a token given by the user (`RALPH_FLOW_TOKEN`) is refused: it guards every run's
/// prompts and answers and the gates' buttons, so it must not be guessable, and it travels
/// in the printed URL and in a cookie, so it must pass through both unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WeakToken {
    #[error("is only whitespace")]
    Blank,
    #[error("holds whitespace")]
    Whitespace,
    #[error(
        "holds {0:?}, which a URL or a cookie would change (use letters, digits, `-`, `.`, `_` and `~`)"
    )]
    Character(char),
    #[error("is {0} characters long, fewer than {MIN_TOKEN_LEN}")]
    Short(usize),
    #[error("is one character repeated")]
    Repeated,
}

/// The fewest characters a token given by the user may have.
pub const MIN_TOKEN_LEN: usize = 16;

/// Tells what makes a token given by the user unfit, if anything does.
pub(crate) fn weakness(secret: &str) -> Option<WeakToken> {
    if secret.chars().all(char::is_whitespace) {
        return Some(WeakToken::Blank);
    }
    if secret.chars().any(char::is_whitespace) {
        return Some(WeakToken::Whitespace);
    }
    // The URL's unreserved characters: the printed `?token=` and the cookie carry them as
    // they are (a `+` would be read as a space, a `;` would end the cookie).
    if let Some(c) = secret
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~')))
    {
        return Some(WeakToken::Character(c));
    }
    let len = secret.chars().count();
    if len < MIN_TOKEN_LEN {
        return Some(WeakToken::Short(len));
    }
    let mut chars = secret.chars();
    let first = chars.next();
    if chars.all(|c| Some(c) == first) {
        return Some(WeakToken::Repeated);
    }
    None
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How a request proved it may be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Authorized {
    /// By the cookie: a browser, which a foreign page could make send it (CSRF applies).
    Cookie,
    /// By an `Authorization: Bearer` header, which no foreign page can set.
    Bearer,
}

fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn query_token(query: &str) -> Option<String> {
    form_pairs(query)
        .into_iter()
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v)
}

/// The pairs of a query string or form body, decoded.
pub(crate) fn form_pairs(text: &str) -> Vec<(String, String)> {
    serde_urlencoded::from_str::<Vec<(String, String)>>(text).unwrap_or_default()
}

fn refuse(status: StatusCode, text: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
        .into_response()
}

/// The middleware in front of every route.
pub(crate) async fn guard(
    State(monitor): State<Arc<Monitor>>,
    mut req: Request,
    next: Next,
) -> Response {
    let token = &monitor.token;
    let headers = req.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| token.matches(t.trim()));
    let cookie = cookie_value(headers, COOKIE).is_some_and(|t| token.matches(t));
    let in_query = req.uri().query().and_then(query_token);
    if let Some(given) = in_query {
        if !token.matches(&given) {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "wrong access token: open the URL that `ralph-flow serve` printed",
            );
        }
        if req.method() == Method::GET {
            // Trade the token in the URL for a cookie, and drop it from the address bar.
            let rest: Vec<(String, String)> = req
                .uri()
                .query()
                .map(form_pairs)
                .unwrap_or_default()
                .into_iter()
                .filter(|(k, _)| k != "token")
                .collect();
            let mut location = req.uri().path().to_string();
            if !rest.is_empty() {
                location.push('?');
                location.push_str(&serde_urlencoded::to_string(&rest).unwrap_or_default());
            }
            let cookie = format!(
                "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
                token.secret()
            );
            let mut resp = StatusCode::SEE_OTHER.into_response();
            if let (Ok(loc), Ok(c)) = (
                HeaderValue::from_str(&location),
                HeaderValue::from_str(&cookie),
            ) {
                resp.headers_mut().insert(header::LOCATION, loc);
                resp.headers_mut().insert(header::SET_COOKIE, c);
                resp.headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            }
            return resp;
        }
    }
    let how = if bearer {
        Authorized::Bearer
    } else if cookie {
        Authorized::Cookie
    } else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "this ralph-flow monitor needs its access token: open the URL that `ralph-flow serve` printed (it ends in ?token=...), or send `Authorization: Bearer TOKEN`",
        );
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            let same = origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://"))
                .is_some_and(|(_, rest)| rest == host);
            if !same {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "refused: this request comes from another site",
                );
            }
        }
    }
    req.extensions_mut().insert(how);
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    );
    h.insert(
        header::HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'",
        ),
    );
    h.insert(
        header::HeaderName::from_static("referrer-policy"),
        // Not no-referrer: under it a browser sends `Origin: null` with its own forms.
        HeaderValue::from_static("same-origin"),
    );
    resp
}

/// Whether a state-changing request carries what CSRF protection asks of it.
pub(crate) fn csrf_ok(monitor: &Monitor, how: Authorized, given: Option<&str>) -> bool {
    how == Authorized::Bearer || given.is_some_and(|g| monitor.token.csrf_matches(g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole_and_csrf_differs_from_the_secret() {
        let t = Token::new("0123456789abcdef0123".into());
        assert!(t.matches("0123456789abcdef0123"));
        assert!(!t.matches("0123456789abcdef012"));
        assert!(!t.matches("0123456789abcdef0124"));
        assert_ne!(t.csrf(), t.secret());
        assert!(t.csrf_matches(t.csrf().to_string().as_str()));
        let r = Token::random().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.secret().len(), 48);
        assert_ne!(
            r.secret(),
            Token::random().unwrap_or_else(|e| panic!("{e}")).secret()
        );
    }

    #[test]
    fn weak_tokens_are_told_apart_and_strong_ones_pass() {
        assert_eq!(weakness(&" ".repeat(16)), Some(WeakToken::Blank));
        assert_eq!(weakness(""), Some(WeakToken::Blank));
        assert_eq!(weakness("0123456789 abcdef0"), Some(WeakToken::Whitespace));
        assert_eq!(weakness("0123456789abcdef\t"), Some(WeakToken::Whitespace));
        assert_eq!(
            weakness("0123456789abcdef+/"),
            Some(WeakToken::Character('+'))
        );
        assert_eq!(weakness("short"), Some(WeakToken::Short(5)));
        assert_eq!(weakness(&"a".repeat(40)), Some(WeakToken::Repeated));
        assert_eq!(weakness("0123456789abcdef"), None);
        assert_eq!(weakness("a1B2-c3.d4_e5~f6"), None);
        let r = Token::random().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(weakness(r.secret()), None, "the random token passes");
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; ralph_flow_token=xyz; b=2"),
        );
        assert_eq!(cookie_value(&h, COOKIE), Some("xyz"));
        assert_eq!(query_token("x=1&token=ab%2Bc"), Some("ab+c".into()));
    }
}
